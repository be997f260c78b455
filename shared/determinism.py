"""Deterministic mode: the same run on the same hardware gives the same bits, CPU or GPU.

On CPU the kernels already are deterministic for a fixed thread count. On GPUs they are not by
default: attention's backward accumulates dQ with atomics, cuBLAS may pick a split-K reduction
whose order depends on its workspace, and NCCL picks its algorithm and protocol per message size
and topology. Two uninterrupted 2-GPU runs of the same job then end apart (by up to 0.05 in a
weight after a few dozen steps of project03's trainer, determinism_cost.json). `enable_determinism` turns every such choice into
a fixed one, at a cost in speed (measured by project03's `determinism_cost`):

- `torch.use_deterministic_algorithms(True)`: a deterministic kernel wherever PyTorch has one,
  and an error (never a silent fallback) where it has none. It also fills memory returned by
  `torch.empty` with NaN (`torch.utils.deterministic.fill_uninitialized_memory`), so a kernel
  that read uninitialised memory could not hide.
- cuDNN: `deterministic=True`, `benchmark=False` (no autotuning, whose winner can vary).
- Attention: only the FLASH and MATH backends of `scaled_dot_product_attention`. Flash's
  backward runs its deterministic variant (dQ accumulated per key block, then reduced in a
  fixed order) when deterministic algorithms are on; MATH is matmuls and a softmax,
  deterministic under the cuBLAS setting below. PyTorch itself refuses cuDNN attention in this
  mode. The memory-efficient backend is switched off: how its backward honours the mode has
  varied between releases (an error in some, a single key split in others), and flash or math
  covers every shape the reference model produces.
- The environment (`deterministic_env`): `CUBLAS_WORKSPACE_CONFIG=:4096:8` (cuBLAS reads it
  when its first handle is made, so before the first matmul), `NCCL_ALGO=Ring` and
  `NCCL_PROTO=Simple` (one reduction order for every message size; NCCL reads them when a
  communicator is created), `NCCL_NVLS_ENABLE=0` (no NVLink SHARP reductions in the switch:
  NVLink multicast stays off), and `PYTHONHASHSEED=0` (string hashing, hence set iteration
  order, fixed; Python reads it only at start-up, so a launcher must set it).
- Seeds: Python, NumPy and torch (CPU and every CUDA device) seeded with `seed + rank`, so each
  rank draws its own stream and every run draws the same ones.

`torch.compile` is not covered: the code that uses this mode (project03's trainer) runs eager.
A compiled model would need Inductor's own deterministic setting as well.

    env = {**os.environ, **deterministic_env()}        # a launcher, for its worker processes
    state = enable_determinism(seed, rank, device_type="cuda")   # each worker, before CUDA work
    ...
    state.restore()                                    # in-process callers (tests) put it back
"""

from __future__ import annotations

import os
import random
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

# Values that are equivalent for determinism (cuBLAS documents both workspace settings).
_ALTERNATIVES = {"CUBLAS_WORKSPACE_CONFIG": (":4096:8", ":16:8")}
# Read once at interpreter start: setting them later does not change this process.
_STARTUP_ONLY = ("PYTHONHASHSEED",)


def deterministic_env() -> dict[str, str]:
    """The environment variables deterministic mode needs, to be set before a worker process
    starts (some are read at start-up or before the first CUDA call). A launcher adds them to
    its workers' environment; `enable_determinism` checks them in the worker."""
    return {
        "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
        "NCCL_ALGO": "Ring",
        "NCCL_PROTO": "Simple",
        "NCCL_NVLS_ENABLE": "0",
        "PYTHONHASHSEED": "0",
    }


def _matches(name: str, value: str, wanted: str) -> bool:
    allowed = _ALTERNATIVES.get(name, (wanted,))
    if name.startswith("NCCL_"):  # NCCL reads its names case-insensitively
        return value.strip().lower() in {a.lower() for a in allowed}
    return value.strip() in allowed


def check_env(environ: dict[str, str] | None = None) -> dict[str, str | None]:
    """The deterministic-mode variables as `environ` (default: this process's) holds them;
    ValueError naming the first one set to a value that would break determinism."""
    environ = os.environ if environ is None else environ
    seen = {}
    for name, wanted in deterministic_env().items():
        value = environ.get(name)
        if value is not None and not _matches(name, value, wanted):
            raise ValueError(
                f"deterministic mode needs {name}={wanted}, but the environment has "
                f"{name}={value!r}: unset it or run without --deterministic"
            )
        seen[name] = value
    return seen


@dataclass
class DeterminismState:
    """What `enable_determinism` set, and what was in force before (for `restore`)."""

    seed: int
    rank: int
    device_type: str
    env_at_start: dict[str, str | None]  # the variables as this process found them
    env_set_here: list[str]  # the ones this call had to set itself (the launcher did not)
    notes: list[str] = field(default_factory=list)
    _previous: dict = field(default_factory=dict, repr=False)

    def record(self) -> dict:
        """A JSON-ready summary for a run's record."""
        return {
            "enabled": True,
            "seed": self.seed + self.rank,
            "env_at_start": dict(self.env_at_start),
            "env_set_in_process": list(self.env_set_here),
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "sdpa_backends": sdpa_backends(),
            "notes": list(self.notes),
        }

    def restore(self) -> None:
        """Put back the global flags and the variables this call set (not the RNG states)."""
        prev = self._previous
        if not prev:
            return
        torch.use_deterministic_algorithms(prev["algorithms"], warn_only=prev["warn_only"])
        torch.backends.cudnn.deterministic = prev["cudnn_deterministic"]
        torch.backends.cudnn.benchmark = prev["cudnn_benchmark"]
        _set_sdpa(prev["sdpa"])
        for name in self.env_set_here:
            os.environ.pop(name, None)
        self._previous = {}


def sdpa_backends() -> dict[str, bool]:
    """Which scaled_dot_product_attention backends are enabled now."""
    b = torch.backends.cuda
    return {
        "flash": b.flash_sdp_enabled(),
        "mem_efficient": b.mem_efficient_sdp_enabled(),
        "math": b.math_sdp_enabled(),
        "cudnn": b.cudnn_sdp_enabled(),
    }


def _set_sdpa(enabled: dict[str, bool]) -> None:
    b = torch.backends.cuda
    b.enable_flash_sdp(enabled["flash"])
    b.enable_mem_efficient_sdp(enabled["mem_efficient"])
    b.enable_math_sdp(enabled["math"])
    b.enable_cudnn_sdp(enabled["cudnn"])


def enable_determinism(seed: int, rank: int = 0, *, device_type: str = "cpu") -> DeterminismState:
    """Make this process's training reproducible bit for bit (see the module docstring).

    Call it before the first CUDA kernel and before the process group is created: cuBLAS and
    NCCL read their variables then. A variable the launcher did not set is set here (a warning
    says so when CUDA is already initialised, as cuBLAS may then have read it already); one set
    to a conflicting value is a ValueError naming it. Returns the state, whose `record()` goes
    into a run's record and whose `restore()` undoes the global flags.
    """
    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"device_type must be 'cpu' or 'cuda', got {device_type!r}")
    for name, v in (("seed", seed), ("rank", rank)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"enable_determinism: {name} must be a non-negative int, got {v!r}")
    at_start = check_env()
    set_here, notes = [], []
    for name, wanted in deterministic_env().items():
        if at_start[name] is not None:
            continue
        if name in _STARTUP_ONLY:
            notes.append(
                f"{name} was not set at start-up (a launcher must set it); "
                "string hashing in this process stays randomised"
            )
            continue
        os.environ[name] = wanted
        set_here.append(name)
    if (
        device_type == "cuda"
        and "CUBLAS_WORKSPACE_CONFIG" in set_here
        and torch.cuda.is_initialized()
    ):
        msg = (
            "CUBLAS_WORKSPACE_CONFIG was set after CUDA was initialised: a cuBLAS handle made "
            "before this call keeps its non-deterministic workspace"
        )
        notes.append(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=2)

    state = DeterminismState(seed, rank, device_type, at_start, set_here, notes)
    state._previous = {
        "algorithms": torch.are_deterministic_algorithms_enabled(),
        "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "sdpa": sdpa_backends(),
    }
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    _set_sdpa({"flash": True, "mem_efficient": False, "math": True, "cudnn": False})

    rank_seed = seed + rank
    random.seed(rank_seed)
    np.random.seed(rank_seed % 2**32)
    torch.manual_seed(rank_seed)  # CPU and every CUDA device (lazily, if CUDA is not up yet)
    return state
