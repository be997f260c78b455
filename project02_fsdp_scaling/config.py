"""Typed configuration of a training run, and the command line made from it.

The command line comes from the dataclass fields through `tyro`. Where tyro is not installed (a
bare GPU image), `parse_cli` builds the same flags with argparse from the same fields, so
`--global-batch 64 --compile --no-activation-checkpointing` works on both.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import types
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal, TypeVar, get_args, get_origin

from shared.model import PRESETS, ModelArgs

DTypeName = Literal["bfloat16", "float32"]
# float64 trains without mixed precision, parameters and gradient reduction in float64: the CPU
# equivalence tests use it so reduction-order rounding stays far below their tolerance.
ParamDTypeName = Literal["bfloat16", "float32", "float64"]
AttentionName = Literal["sdpa", "cudnn", "flash"]
DeviceName = Literal["auto", "cuda", "cpu"]


@dataclass
class TrainConfig:
    """FSDP2 training of the shared Llama-style transformer: one process per GPU under torchrun
    (NCCL), or CPU processes over gloo."""

    preset: str = "tiny"
    """model preset: tiny (CPU tests), 125m, 1b (~1.1 B parameters)"""
    seq_len: int = 0
    """tokens per sequence; 0 takes the preset's max_seq_len"""
    global_batch: int = 8
    """sequences per optimizer step summed over all ranks (fixed across world sizes)"""
    micro_batch: int = 0
    """sequences per forward/backward on one rank; 0 = the whole local batch (no accumulation)"""
    steps: int = 10
    """timed optimizer steps (after the warm-up steps)"""
    warmup_steps: int = 2
    """optimizer steps run before timing starts (compilation, allocator warm-up)"""
    lr: float = 3e-4
    """peak learning rate of AdamW"""
    lr_warmup_steps: int = 0
    """linear learning-rate warm-up, in optimizer steps (then constant)"""
    weight_decay: float = 0.1
    """AdamW weight decay on matrices (norm weights are not decayed)"""
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    """clip the global gradient norm to this; 0 disables clipping"""
    param_dtype: ParamDTypeName = "bfloat16"
    """FSDP MixedPrecisionPolicy compute dtype of parameters (float32 = no mixed precision;
    float64 = parameters, gradients and their reduction in float64, for numerics tests)"""
    reduce_dtype: DTypeName = "float32"
    """dtype of the gradient reduce-scatter (with param_dtype float64: float64)"""
    activation_checkpointing: bool = False
    """recompute each block's activations in backward (less memory, ~1/3 more compute)"""
    compile: bool = False
    """torch.compile each block and the loss"""
    attention: AttentionName = "sdpa"
    """SDPA backend: sdpa (PyTorch's choice), cudnn or flash (forced; CUDA only)"""
    reshard_after_forward: bool = True
    """free gathered parameters after forward (ZeRO-3); False keeps them for backward"""
    sync_every_microbatch: bool = False
    """reduce-scatter gradients after every micro-batch instead of once per step"""
    device: DeviceName = "auto"
    """cuda when a GPU is visible, else cpu"""
    seed: int = 0
    """model initialisation seed"""
    data_seed: int = 0
    """seed of the synthetic token stream"""
    profile: bool = False
    """after the timed steps, run profile_steps more under torch.profiler and analyse the trace"""
    profile_steps: int = 1
    """optimizer steps recorded by the profiler (one warm-up step is run before them)"""
    trace_dir: str = ""
    """where the profiler trace goes (default: next to --out)"""
    out: str = ""
    """JSON result file written by rank 0 (empty: print only)"""
    save_params: str = ""
    """write the final full parameters (rank 0; float32, or float64 with --param-dtype float64)
    to this .pt file"""
    log_every: int = 10
    """on a terminal a progress bar; in a log, a progress line every N steps, with rate and
    ETA (and the first and last step); 0: none"""

    # ---- derived values -------------------------------------------------------------------
    def model_args(self) -> ModelArgs:
        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; expected one of {sorted(PRESETS)}")
        return ModelArgs.from_preset(self.preset)

    def resolved_seq_len(self) -> int:
        return self.seq_len or self.model_args().max_seq_len

    def local_batch(self, world_size: int) -> int:
        return self.global_batch // world_size

    def resolved_micro_batch(self, world_size: int) -> int:
        return self.micro_batch or self.local_batch(world_size)

    def grad_accum_steps(self, world_size: int) -> int:
        return self.local_batch(world_size) // self.resolved_micro_batch(world_size)

    def total_steps(self) -> int:
        extra = self.profile_steps + 1 if self.profile else 0
        return self.warmup_steps + self.steps + extra

    def validate(self, world_size: int = 1) -> TrainConfig:
        """Raise ValueError naming the field on a config that cannot run on `world_size` ranks."""
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {world_size!r}")
        args = self.model_args()
        if self.seq_len < 0 or self.seq_len > args.max_seq_len:
            raise ValueError(
                f"seq_len must be in 1..{args.max_seq_len} for preset {self.preset!r} "
                f"(0 = max), got {self.seq_len}"
            )
        if self.global_batch < 1:
            raise ValueError(f"global_batch must be >= 1, got {self.global_batch}")
        if self.global_batch % world_size:
            raise ValueError(
                f"global_batch ({self.global_batch}) must be divisible by the world size "
                f"({world_size}): strong scaling keeps the global batch fixed and splits it evenly"
            )
        local = self.local_batch(world_size)
        if self.micro_batch < 0:
            raise ValueError(
                f"micro_batch must be >= 0 (0 = whole local batch), got {self.micro_batch}"
            )
        if self.micro_batch and local % self.micro_batch:
            raise ValueError(
                f"micro_batch ({self.micro_batch}) must divide the local batch "
                f"(global_batch {self.global_batch} / world size {world_size} = {local})"
            )
        for name in ("steps", "profile_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "lr_warmup_steps", "log_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("lr", "weight_decay", "beta1", "beta2", "grad_clip"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"{name} must be a finite number, got {v!r}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.grad_clip < 0:
            raise ValueError(f"grad_clip must be >= 0 (0 disables clipping), got {self.grad_clip}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ValueError(f"beta1/beta2 must be in [0, 1), got {self.beta1}, {self.beta2}")
        for name, allowed in (
            ("param_dtype", ParamDTypeName),
            ("reduce_dtype", DTypeName),
            ("attention", AttentionName),
            ("device", DeviceName),
        ):
            if getattr(self, name) not in get_args(allowed):
                raise ValueError(
                    f"{name} must be one of {get_args(allowed)}, got {getattr(self, name)!r}"
                )
        if self.param_dtype == "float64" and self.reduce_dtype != "float32":
            raise ValueError(
                f"reduce_dtype {self.reduce_dtype!r} cannot go with param_dtype 'float64' "
                "(gradients are reduced in float64): leave reduce_dtype at float32"
            )
        return self

    def check_outputs(self) -> TrainConfig:
        """Raise ValueError naming the flag when an output path cannot be written: called before
        training, so that a typo costs seconds, not the run."""
        from shared.cli import writable_dir, writable_file

        for name in ("out", "save_params"):
            if getattr(self, name):
                writable_file("--" + name.replace("_", "-"), getattr(self, name))
        if self.profile and self.trace_dir:
            writable_dir("--trace-dir", self.trace_dir)
        return self

    def to_dict(self) -> dict:
        return portable(dataclasses.asdict(self))


_PATH_FIELDS = ("reports_root", "trace_dir", "out", "save_params")


def portable(config: dict) -> dict:
    """A config dict for a result file: machine-specific paths reduced to file names (the
    record sits next to the files it names), folders to a placeholder."""
    out = dict(config)
    for key in _PATH_FIELDS:
        if out.get(key):
            out[key] = Path(out[key]).name if key in ("out", "save_params") else "<given>"
    return out


def env_world_size() -> int:
    """WORLD_SIZE as torchrun sets it (1 outside torchrun); a bad value is named."""
    from shared.cli import env_int

    return env_int("WORLD_SIZE", 1, minimum=1)


def check_preset(preset: str, *, allow_auto: bool = False) -> None:
    allowed = sorted(PRESETS) + (["auto"] if allow_auto else [])
    if preset not in allowed:
        raise ValueError(f"unknown preset {preset!r}; expected one of {allowed}")


def check_name(name: str) -> None:
    """A result file stem: empty (the default) or a plain name."""
    if name and (name != name.strip() or "/" in name or "\\" in name or name.startswith(".")):
        raise ValueError(f"name must be a plain file stem like 'scaling_gpu', got {name!r}")


# ---- command line ----------------------------------------------------------------------------
C = TypeVar("C")


def cli_flags(obj) -> list[str]:
    """Command-line flags that reproduce the dataclass instance `obj` (bools as --x / --no-x,
    empty strings left out) for `parse_cli` of its class."""
    flags = []
    for key, value in dataclasses.asdict(obj).items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + key.replace("_", "-"))
        elif value != "":
            flags += [flag, str(value)]
    return flags


def parse_cli(cls: type[C], argv: list[str] | None = None, *, prog: str | None = None) -> C:
    """Parse `argv` into an instance of the dataclass `cls`: tyro when installed, else argparse.
    A parse error is one `error:` line on stderr and exit code 2 either way."""
    try:
        import tyro  # noqa: F401
    except ImportError:
        return _argparse_cli(cls, argv, prog=prog)
    from shared.cli import parse_dataclass

    return parse_dataclass(cls, argv, prog=prog)


def _field_docs(cls) -> dict[str, str]:
    """Attribute docstrings (the string literal under each field), as tyro reads them."""
    import ast
    import inspect

    try:
        tree = ast.parse(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    docs, body = {}, tree.body[0].body
    for node, nxt in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = nxt.value.value.strip()
    return docs


def _argparse_cli(cls, argv, *, prog=None):
    hints = typing.get_type_hints(cls)
    docs = _field_docs(cls)
    from shared.cli import ArgumentParser

    parser = ArgumentParser(prog=prog, description=(cls.__doc__ or "").strip())
    for f in fields(cls):
        flag = "--" + f.name.replace("_", "-")
        tp, default = hints[f.name], f.default
        help_text = f"{docs.get(f.name, '')} (default: {default})"
        if tp is bool:
            parser.add_argument(
                flag, dest=f.name, default=default, action=argparse.BooleanOptionalAction,
                help=help_text,
            )  # fmt: skip
        elif get_origin(tp) is Literal:
            parser.add_argument(
                flag, dest=f.name, default=default, choices=get_args(tp), help=help_text
            )
        elif tp in (int, float, str):
            parser.add_argument(flag, dest=f.name, default=default, type=tp, help=help_text)
        elif get_origin(tp) in (typing.Union, types.UnionType):
            raise TypeError(f"field {f.name}: optional types are not supported by the fallback CLI")
        else:
            raise TypeError(f"field {f.name}: type {tp} is not supported by the fallback CLI")
    ns = parser.parse_args(argv)
    return cls(**vars(ns))
