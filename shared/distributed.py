"""Process-group set-up from torchrun's variables, and rank-aware logging.

One code path for every tier: under `torchrun` the variables RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT come from the launcher (one node or a multi-node rendezvous); a plain
`python -m ...` becomes a world of one with an in-process store (nothing listens on the network
for the rendezvous), so FSDP code runs unchanged.
NCCL on GPUs, gloo on CPU.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import sys
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int
    local_rank: int
    world_size: int
    backend: str
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def init_distributed(
    backend: str | None = None,
    timeout_s: float = 600.0,
    device: str | None = None,
    *,
    restart_scoped_store: bool = False,
) -> DistInfo:
    """Initialise (or reuse) the default process group and pick this rank's device.

    backend: "nccl", "gloo" or None (NCCL when CUDA is available, else gloo).
    timeout_s: collective timeout; a hung collective ends the job with an error after this long,
    so a launcher can restart it instead of waiting forever.
    device: "cuda" or "cpu" to force one; default CUDA when available.
    restart_scoped_store: under `torchrun --max-restarts`, rendezvous on keys scoped to the
    restart attempt (see `_restart_scoped_store`); for jobs that the launcher restarts.
    """
    use_cuda = torch.cuda.is_available() if device is None else device == "cuda"
    if use_cuda and not torch.cuda.is_available():
        raise RuntimeError("device='cuda' was asked for but no CUDA GPU is visible")
    backend = backend or ("nccl" if use_cuda else "gloo")
    if backend not in ("nccl", "gloo"):
        raise ValueError(f"backend must be 'nccl' or 'gloo', got {backend!r}")
    if backend == "nccl" and not use_cuda:
        raise ValueError("the nccl backend needs CUDA GPUs; use gloo on CPU")

    alone = "RANK" not in os.environ
    if alone:  # not under torchrun: a world of one
        os.environ.update(
            RANK="0",
            LOCAL_RANK="0",
            WORLD_SIZE="1",
            MASTER_ADDR=os.environ.get("MASTER_ADDR", "127.0.0.1"),
            MASTER_PORT=os.environ.get("MASTER_PORT", str(_free_port())),
        )
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", 0)
    world_size = _env_int("WORLD_SIZE", 1)

    if use_cuda:
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(
                f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPUs are visible"
            )
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")

    if not dist.is_initialized():
        kwargs = {}
        if backend == "nccl":
            kwargs["device_id"] = dev  # eager NCCL init: errors show at start, not first step
        store = _restart_scoped_store(rank, world_size, timeout_s) if restart_scoped_store else None
        if alone and world_size == 1:
            # a world of one rendezvouses with itself: an in-process store, where the default
            # (env://) TCPStore would listen on every network interface
            store = dist.HashStore()
        if store is not None:
            kwargs["store"] = store
        dist.init_process_group(
            backend=backend,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
            **kwargs,
        )
    return DistInfo(rank, local_rank, world_size, backend, dev)


def _restart_scoped_store(rank: int, world_size: int, timeout_s: float):
    """Under `torchrun --max-restarts`, a store whose keys are scoped to this restart attempt.

    torchrun's agent keeps one TCPStore across restarts of the worker group, and the default
    group's keys (each rank's gloo/NCCL address) are the same in every attempt: after a restart a
    fast rank can read the dead previous rank 0's address and fail with "Connection refused".
    A per-attempt prefix makes each attempt rendezvous on fresh keys. None outside torchrun.
    """
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None or "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
        return None
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=not agent_store and rank == 0,
        timeout=timedelta(seconds=timeout_s),
    )
    return dist.PrefixStore(f"attempt_{attempt}", store)


def cleanup() -> None:
    """Barrier, then destroy the process group (gloo can abort at teardown without the barrier)."""
    if dist.is_available() and dist.is_initialized():
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()


def exit_under_launcher(code: int) -> None:
    """Under torchrun, end the process with `code` without the interpreter's teardown.

    On CPU a gloo worker occasionally aborts during interpreter finalisation ("terminate called
    without an active exception": a native thread of the process group's backend is still
    joinable when its object is destroyed), after the results are written and the group is gone;
    torchrun then reports the whole job as failed and stops its peers. Call this after
    `cleanup()` and after every file is closed: logging is shut down and stdout/stderr flushed
    here, then `os._exit` skips the rest. Outside torchrun (a plain `python -m`, or a caller in
    the same process) it returns and the caller exits normally."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def is_main() -> bool:
    return rank() == 0


class _RankFilter(logging.Filter):
    def __init__(self, all_ranks: bool) -> None:
        super().__init__()
        self.all_ranks = all_ranks

    def filter(self, record: logging.LogRecord) -> bool:
        r, w = rank(), world_size()
        record.rank_prefix = f"[rank {r}/{w}] " if w > 1 else ""
        # Warnings and errors from every rank; info from rank 0 unless all_ranks.
        return self.all_ranks or r == 0 or record.levelno >= logging.WARNING


def get_logger(name: str, *, all_ranks: bool = False, level: int = logging.INFO) -> logging.Logger:
    """A logger that prefixes the rank and, by default, prints info from rank 0 only."""
    logger = logging.getLogger(name)
    if not any(getattr(h, "_shared_rank_handler", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler._shared_rank_handler = True  # type: ignore[attr-defined]
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(rank_prefix)s%(levelname)s %(name)s: %(message)s")
        )
        handler.addFilter(_RankFilter(all_ranks))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(level)
    return logger


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
