"""The non-tensor part of a checkpoint: the trainer's JSON state and every rank's RNG states.

Besides the model and optimizer state dicts, a save holds two kinds of entry that DCP stores as
pickled bytes:
- `extra`: the caller's JSON object, as a string (the trainer puts its step, LR schedule, data
  position, counters and world size there; the data stream's position is its step, so a
  resumed run gets exactly the batches an uninterrupted one would);
- `rng.rank_<r>`: the RNG states of Python, NumPy, torch CPU and every CUDA device of rank r,
  as a JSON string.
Both are strings, never objects: `torch.load(weights_only=True)` reads them back (safe_read.py),
so a checkpoint's non-tensor state cannot carry code. A run resumed on more ranks than it was
saved on has no RNG entry for the new ranks: they keep their seeded RNG (the manager says so).
"""

from __future__ import annotations

import base64
import json
import random

import numpy as np
import torch

from .layout import CheckpointError

EXTRA = "extra"


def rng_key(rank: int) -> str:
    """The state dict key of rank `rank`'s RNG states."""
    return f"rng.rank_{rank}"


def with_non_tensor_state(state: dict, extra: dict, rank: int) -> dict:
    """What a save writes: `state` plus the caller's JSON `extra` and this rank's RNG states."""
    full = dict(state)
    full[EXTRA] = json.dumps(extra, sort_keys=True)
    full[rng_key(rank)] = capture_rng_state()
    return full


def load_targets(state: dict, rank: int, saved_keys) -> dict:
    """What a load fills in place: `state` plus string slots for `extra` and, when the
    checkpoint has one (`saved_keys`: its metadata's keys), this rank's RNG states."""
    full = dict(state)
    full[EXTRA] = ""
    if rng_key(rank) in saved_keys:
        full[rng_key(rank)] = ""
    return full


def read_extra(full: dict) -> dict:
    """The caller's JSON object from a loaded state; CheckpointError when it is not one."""
    extra = json.loads(full[EXTRA]) if isinstance(full[EXTRA], str) else None
    if not isinstance(extra, dict):
        raise CheckpointError("its 'extra' entry is not a JSON object")
    return extra


# --- RNG state (per rank), as JSON ------------------------------------------------------------


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.cpu().contiguous().numpy().tobytes()).decode("ascii")


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()


def capture_rng_state() -> str:
    """The RNG states of Python, NumPy, torch CPU and every CUDA device, as a JSON string."""
    np_state = np.random.get_state()
    state = {
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
        "numpy": {
            "kind": np_state[0],
            "key": np_state[1].tolist(),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "gauss": float(np_state[4]),
        },
        "torch_cpu": _b64(torch.get_rng_state()),
        "torch_cuda": (
            [_b64(s) for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_initialized() else []
        ),
    }
    return json.dumps(state)


def restore_rng_state(blob: str) -> None:
    state = json.loads(blob)
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state(
        (n["kind"], np.array(n["key"], dtype=np.uint32), n["pos"], n["has_gauss"], n["gauss"])
    )
    torch.set_rng_state(_unb64(state["torch_cpu"]))
    cuda_states = state.get("torch_cuda") or []
    if cuda_states and torch.cuda.is_available():
        # A run resumed on fewer devices restores the ones it has.
        for i, s in enumerate(cuda_states[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(_unb64(s), device=i)
