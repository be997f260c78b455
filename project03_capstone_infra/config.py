"""The training run's configuration: one typed dataclass, turned into a command line by tyro.

`config_hash()` covers the fields that decide the trajectory (model, data, optimiser, schedule,
seed, precision); it goes into every checkpoint manifest so that a checkpoint of another run is
recognised when it is resumed. Paths, checkpoint cadence, ports and fault handling are left out:
changing them does not change the numbers. So is `deterministic`: it picks other kernels for the
same arithmetic (a run may switch it on or off across a resume; each launch records it).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, fields
from typing import Literal

# Exit codes a launcher can act on (sysexits.h where one fits).
EXIT_OK = 0
EXIT_NAN_ABORT = 65  # EX_DATAERR: non-finite loss beyond the retry budget
EXIT_PREFLIGHT = 69  # EX_UNAVAILABLE: a health check failed before training started
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: SIGTERM/SIGUSR1 received, checkpoint saved: requeue and resume
EXIT_COLLECTIVE = 76  # EX_PROTOCOL: a collective timed out or a peer vanished: restart the job


@dataclass
class TrainConfig:
    """Fault-tolerant FSDP training of the shared reference transformer."""

    preset: Literal["tiny", "125m", "1b"] = "tiny"
    """model size (shared.model presets)"""
    steps: int = 40
    """total optimiser steps of the run"""
    stop_after: int = 0
    """end this launch after that step, saved; schedule still over --steps"""
    global_batch: int = 8
    """sequences per step, over all ranks"""
    seq_len: int = 0
    """0: the preset's max_seq_len"""
    seed: int = 0
    """initial weights and data stream"""
    lr: float = 3e-3
    """peak AdamW learning rate"""
    warmup_steps: int = 5
    """linear warm-up, then cosine decay to min_lr_ratio * lr"""
    min_lr_ratio: float = 0.1
    """final learning rate as a fraction of lr"""
    weight_decay: float = 0.1
    """AdamW (decoupled) weight decay"""
    grad_clip: float = 1.0
    """max global gradient norm; 0 disables clipping"""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """auto: CUDA when torch sees a GPU"""
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """auto: bf16 on GPU, fp32 on CPU"""
    activation_checkpointing: bool = False
    """recompute block activations in backward"""
    deterministic: bool = False
    """GPU runs repeat bit for bit (slower): shared.determinism"""
    run_dir: str = ".scratch/project03_capstone_infra/run"
    """checkpoints/ and events.jsonl"""
    resume: str = "auto"
    """"auto" (newest good checkpoint, else fresh), "never", or a step dir"""
    ckpt_every: int = 10
    """steps between checkpoints; the last step is always saved"""
    ckpt_mode: Literal["sync", "async"] = "async"
    """async: written in the background"""
    keep_last: int = 3
    """retention: the newest checkpoints kept"""
    milestone_every: int = 0
    """also keep every step that is a multiple of this (0: none)"""
    ckpt_write_threads: int = 1
    """files per rank written in parallel"""
    nan_policy: Literal["rollback", "skip", "abort"] = "rollback"
    """on a non-finite loss"""
    max_nan_retries: int = 3
    """rollbacks at one step (or consecutive skips) before giving up"""
    pg_timeout_s: float = 300.0
    """a collective hung this long ends the job (EXIT_COLLECTIVE)"""
    sigterm_deadline_s: float = 25.0
    """the preemption save must finish within this"""
    metrics_port: int = -1
    """Prometheus endpoint on local rank 0; -1 off, 0 any free port"""
    metrics_addr: str = "127.0.0.1"
    """metrics bind address; no auth: 0.0.0.0 = every interface"""
    fault_injection: bool = False
    """act on P03_FAULTS (tests, chaos): the run harms itself"""
    preflight: bool = True
    """GPU and disk checks before training; a failure stops the launch"""
    log_every: int = 10
    """steps between log lines"""

    def validate(self) -> TrainConfig:
        positive = (
            "steps",
            "global_batch",
            "ckpt_every",
            "keep_last",
            "log_every",
            "ckpt_write_threads",
        )
        for name in positive:
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"TrainConfig.{name} must be a positive int, got {v!r}")
        for name in ("seq_len", "warmup_steps", "milestone_every", "max_nan_retries", "stop_after"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"TrainConfig.{name} must be a non-negative int, got {v!r}")
        for name in (
            "lr",
            "min_lr_ratio",
            "weight_decay",
            "grad_clip",
            "pg_timeout_s",
            "sigterm_deadline_s",
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"TrainConfig.{name} must be a finite number, got {v!r}")
        for name in ("lr", "pg_timeout_s", "sigterm_deadline_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"TrainConfig.{name} must be > 0, got {getattr(self, name)!r}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"TrainConfig.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        for name in ("weight_decay", "grad_clip"):
            if getattr(self, name) < 0:
                raise ValueError(f"TrainConfig.{name} must be >= 0, got {getattr(self, name)}")
        if not str(self.run_dir).strip():
            raise ValueError("TrainConfig.run_dir: expected a folder, got an empty path")
        if not self.metrics_addr.strip():
            raise ValueError("TrainConfig.metrics_addr: expected an address, got an empty string")
        if self.metrics_port < -1 or self.metrics_port > 65535:
            raise ValueError(
                f"TrainConfig.metrics_port must be -1 (off), 0 (any) or a port, got {self.metrics_port}"
            )
        choices = {
            "preset": ("tiny", "125m", "1b"),
            "device": ("auto", "cpu", "cuda"),
            "dtype": ("auto", "float32", "bfloat16"),
            "ckpt_mode": ("sync", "async"),
            "nan_policy": ("rollback", "skip", "abort"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"TrainConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}"
                )
        if not str(self.resume).strip():
            raise ValueError("TrainConfig.resume must be 'auto', 'never' or a checkpoint directory")
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown TrainConfig fields: {sorted(unknown)}")
        return cls(**d).validate()


# The fields that change the numbers a run produces.
TRAJECTORY_FIELDS = (
    "preset",
    "steps",
    "global_batch",
    "seq_len",
    "seed",
    "lr",
    "warmup_steps",
    "min_lr_ratio",
    "weight_decay",
    "grad_clip",
    "dtype",
)


def config_hash(cfg: TrainConfig) -> str:
    blob = json.dumps({k: getattr(cfg, k) for k in TRAJECTORY_FIELDS}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
