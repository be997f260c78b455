"""Typed configuration of a training job; tyro turns each config into a command line.

- `JobConfig`: what every trainer here takes (model, batch, steps, AdamW, seeds, outputs).
- `TrainConfig`: the FSDP2 job (`train`): a `JobConfig` plus mixed precision, activation
  checkpointing, compile, the attention backend, resharding and profiling.
- `DeepSpeedConfig`: the DeepSpeed ZeRO-3 job (`deepspeed`): a `JobConfig` plus its precision.

The harnesses (`scaling`, `sweep`, `compare`) hold a `TrainConfig` as a `Nested` field: its flags
keep their own names on their command lines (`--preset`, `--global-batch`, `--compile`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Annotated, Literal, get_args

import tyro

from shared.model import PRESETS, ModelArgs

DTypeName = Literal["bfloat16", "float32"]
# The training recipes of `--precision`. fp64 trains without mixed precision, parameters and
# gradient reduction in float64: the CPU equivalence tests use it so reduction-order rounding
# stays far below their tolerance.
PrecisionName = Literal["bf16", "fp8-tensorwise", "fp8-rowwise", "fp16", "fp32", "fp64"]
# What DeepSpeed runs here: its bf16 mode, or plain float32.
DeepSpeedPrecisionName = Literal["bf16", "fp32"]
# The FSDP2 MixedPrecisionPolicy parameter dtype of each recipe: fp8 recipes keep bf16 for what
# is not a float8 linear (attention, norms, the output head); None is no policy (fp64).
PARAM_DTYPE: dict[str, str | None] = {
    "bf16": "bfloat16",
    "fp8-tensorwise": "bfloat16",
    "fp8-rowwise": "bfloat16",
    "fp16": "float16",
    "fp32": "float32",
    "fp64": None,
}
# Older records (before --precision) named the parameter dtype instead.
_LEGACY_PRECISION = {"bfloat16": "bf16", "float32": "fp32", "float64": "fp64"}


def record_precision(config: dict) -> str:
    """The recipe of a job from its record's config (or a compare run), old records too."""
    if "precision" in config:
        return config["precision"]
    return _LEGACY_PRECISION[config["param_dtype"]]


AttentionName = Literal["sdpa", "cudnn", "flash"]
CompileModeName = Literal["default", "max-autotune-no-cudagraphs"]
DeviceName = Literal["auto", "cuda", "cpu"]

# A config held by another: its flags appear without the field's prefix (--preset, not
# --train.preset), so a harness takes the same training flags as `train` itself.
Nested = tyro.conf.OmitArgPrefixes


@dataclass
class JobConfig:
    """A training job of the shared Llama-style transformer on synthetic tokens: one process per
    GPU under torchrun, or CPU processes over gloo."""

    preset: str = "tiny"
    """model preset: tiny (CPU tests), 125m, 1b (~1.1 B parameters)"""
    n_layers: int = 0
    """transformer blocks; 0 takes the preset's (more blocks give a pipeline more stages)"""
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
    """AdamW's first-moment decay"""
    beta2: float = 0.95
    """AdamW's second-moment decay"""
    grad_clip: float = 1.0
    """clip the global gradient norm to this; 0 disables clipping"""
    device: DeviceName = "auto"
    """cuda when a GPU is visible, else cpu"""
    seed: int = 0
    """model initialisation seed"""
    data_seed: int = 0
    """seed of the synthetic token stream"""
    bf16_rounded_init: bool = False
    """start from the bfloat16 image of the initial weights (kept as float32 master weights):
    where DeepSpeed's bf16 mode starts its master copy; `compare` sets it on both sides of a
    bf16 pair so that both start from the same weights"""
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
        if self.n_layers < 0:
            raise ValueError(f"n_layers must be >= 0 (0 = the preset's), got {self.n_layers}")
        extra = {"n_layers": self.n_layers} if self.n_layers else {}
        return ModelArgs.from_preset(self.preset, **extra)

    def resolved_seq_len(self) -> int:
        return self.seq_len or self.model_args().max_seq_len

    def local_batch(self, world_size: int) -> int:
        return self.global_batch // world_size

    def resolved_micro_batch(self, world_size: int) -> int:
        return self.micro_batch or self.local_batch(world_size)

    def grad_accum_steps(self, world_size: int) -> int:
        return self.local_batch(world_size) // self.resolved_micro_batch(world_size)

    def total_steps(self) -> int:
        return self.warmup_steps + self.steps

    def validate(self, world_size: int = 1) -> JobConfig:
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
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
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
        _check_choice(self, "device", DeviceName)
        return self

    def check_outputs(self) -> JobConfig:
        """Raise ValueError naming the flag when an output path cannot be written: called before
        training, so that a typo costs seconds, not the run."""
        from shared.cli import writable_file

        for name in ("out", "save_params"):
            if getattr(self, name):
                writable_file("--" + name.replace("_", "-"), getattr(self, name))
        return self

    def to_dict(self) -> dict:
        return portable(dataclasses.asdict(self))


StrategyName = Literal["fsdp", "ddp", "tp", "fsdp-tp", "pp", "pp-fsdp"]
ScheduleName = Literal["gpipe", "1f1b", "interleaved-1f1b"]
# Strategies whose parameters FSDP2 shards (its mixed precision, resharding and sync flags apply).
FSDP_STRATEGIES = ("fsdp", "fsdp-tp", "pp-fsdp")


@dataclass
class ParallelLayout:
    """How the ranks split the work. fsdp: FSDP2 over every rank (data parallel, sharded
    parameters, gradients and optimizer state). ddp: plain data parallel (every rank holds
    everything; gradients all-reduced). tp: tensor parallel over every rank (Megatron column/row
    split of attention and MLP, always with sequence parallel: the norms and the residual stream
    split along the sequence, an all-gather before each column-parallel linear and a
    reduce-scatter after each row-parallel one). fsdp-tp: a 2-D mesh, FSDP2 across groups of
    --tp tensor-parallel ranks. pp: pipeline parallel over every rank
    (torch.distributed.pipelining). pp-fsdp: a 2-D mesh, --pp pipeline stages, FSDP2 within
    each stage's data-parallel group."""

    parallel: StrategyName = "fsdp"
    """the strategy: fsdp, ddp, tp, fsdp-tp, pp or pp-fsdp"""
    tp: int = 2
    """tensor-parallel degree of fsdp-tp (tp uses every rank)"""
    pp: int = 2
    """pipeline stages' rank count of pp-fsdp (pp uses every rank)"""
    pp_schedule: ScheduleName = "1f1b"
    """pipeline schedule: gpipe (all forwards, then all backwards), 1f1b (one forward, one
    backward in the steady state: fewer activations held), interleaved-1f1b (several stages per
    rank: a smaller bubble for more point-to-point messages)"""
    pp_microbatches: int = 4
    """micro-batches one pipeline step splits its batch into (more: a smaller bubble)"""
    stages_per_rank: int = 0
    """pipeline stages held by each rank; 0: 2 for interleaved-1f1b, else 1"""
    loss_parallel: bool = True
    """tp, fsdp-tp: the output head's logits stay split along the vocabulary into the
    cross-entropy (no all-gather of the (tokens, vocab) logits)"""

    def degrees(self, world_size: int) -> dict[str, int]:
        """Mesh sizes {pp, dp, tp} of the strategy on `world_size` ranks; ValueError names the
        flag that does not divide it."""
        name = self.parallel
        if name not in get_args(StrategyName):
            raise ValueError(f"parallel must be one of {get_args(StrategyName)}, got {name!r}")
        pp = world_size if name == "pp" else self.pp if name == "pp-fsdp" else 1
        tp = world_size if name == "tp" else self.tp if name == "fsdp-tp" else 1
        for flag, n in (("--tp", tp), ("--pp", pp)):
            if n < 1 or world_size % n:
                raise ValueError(
                    f"{flag} ({n}) must be a positive divisor of the world size ({world_size})"
                )
        return {"pp": pp, "dp": world_size // (pp * tp), "tp": tp}

    def resolved_stages_per_rank(self) -> int:
        if self.stages_per_rank:
            return self.stages_per_rank
        return 2 if self.pp_schedule == "interleaved-1f1b" else 1

    def uses_fsdp(self) -> bool:
        return self.parallel in FSDP_STRATEGIES

    def uses_pipeline(self) -> bool:
        return self.parallel in ("pp", "pp-fsdp")

    def uses_tp(self) -> bool:
        return self.parallel in ("tp", "fsdp-tp")

    def validate(self, world_size: int, n_layers: int) -> ParallelLayout:
        degrees = self.degrees(world_size)
        _check_choice(self, "pp_schedule", ScheduleName)
        if self.pp_microbatches < 1 or self.stages_per_rank < 0:
            raise ValueError(
                f"pp_microbatches must be >= 1 and stages_per_rank >= 0, got "
                f"{self.pp_microbatches} and {self.stages_per_rank}"
            )
        v = self.resolved_stages_per_rank()
        if self.uses_pipeline():
            if self.pp_schedule != "interleaved-1f1b" and v != 1:
                raise ValueError(
                    f"--stages-per-rank {v}: {self.pp_schedule} runs one stage per rank; "
                    "several are for interleaved-1f1b"
                )
            if degrees["pp"] * v > n_layers:
                raise ValueError(
                    f"{degrees['pp']} ranks x {v} stages need at least {degrees['pp'] * v} "
                    f"transformer blocks, the model has {n_layers}: raise --n-layers"
                )
            if self.pp_schedule == "interleaved-1f1b" and self.pp_microbatches % degrees["pp"]:
                raise ValueError(
                    f"--pp-microbatches ({self.pp_microbatches}) must be a multiple of the "
                    f"pipeline's ranks ({degrees['pp']}) for interleaved-1f1b"
                )
        return self


@dataclass
class TrainConfig(JobConfig):
    """FSDP2 training of the shared Llama-style transformer: one process per GPU under torchrun
    (NCCL), or CPU processes over gloo."""

    precision: PrecisionName = "bf16"
    """training recipe. bf16: FSDP2 MixedPrecisionPolicy with bf16 parameters for compute,
    float32 master weights and gradient reduction. fp8-tensorwise / fp8-rowwise: as bf16, and
    every block linear a torchao Float8Linear (e4m3 operands, one scale per tensor or per row;
    tensorwise also all-gathers the weights in float8); needs torchao. fp16: float16 compute
    with dynamic loss scaling (torch.amp.GradScaler, inf/NaN found on any shard skips the step
    everywhere). fp32: no mixed precision. fp64: parameters, gradients and their reduction in
    float64, for numerics tests"""
    loss_scaling: bool = True
    """fp16 only: dynamic loss scaling; --no-loss-scaling shows what goes wrong without it"""
    reduce_dtype: DTypeName = "float32"
    """dtype of the gradient reduce-scatter (with precision fp64: float64)"""
    activation_checkpointing: bool = False
    """recompute each block's activations in backward (less memory, ~1/3 more compute)"""
    compile: bool = False
    """torch.compile each block and the loss"""
    compile_mode: CompileModeName = "default"
    """with --compile: torch.compile's mode for the blocks; max-autotune-no-cudagraphs also
    benchmarks Triton GEMM templates and kernel configurations (minutes at the first step)"""
    coordinate_descent_tuning: bool = False
    """with --compile: Inductor tunes each generated kernel's block sizes and warps by
    coordinate descent at the first call (torch._inductor.config.coordinate_descent_tuning)"""
    attention: AttentionName = "sdpa"
    """SDPA backend: sdpa (PyTorch's choice), cudnn or flash (forced; CUDA only)"""
    reshard_after_forward: bool = True
    """free gathered parameters after forward (ZeRO-3); False keeps them for backward, and between
    the micro-batches of a step (one gather per step: ZeRO-2's memory, none of its re-gathers)"""
    sync_every_microbatch: bool = False
    """reduce-scatter gradients after every micro-batch instead of once per step"""
    fused_loss: bool = False
    """the output projection and the cross-entropy together, 4,096 tokens at a time, their
    gradients formed in the forward (shared.fused_loss): the (tokens, vocab) logits and their
    float32 copy are never held. Not with fp16 (its gradients would form before loss scaling)"""
    profile: bool = False
    """after the timed steps, run profile_steps more under torch.profiler and analyse the trace"""
    profile_steps: int = 1
    """optimizer steps recorded by the profiler (one warm-up step is run before them)"""
    trace_dir: str = ""
    """where the profiler trace goes (default: next to --out)"""
    save_checkpoint: str = ""
    """write a torch.distributed.checkpoint (model, optimizer, step) to this folder after the
    last step; it loads under any other --parallel layout and world size"""
    resume: str = ""
    """start from the checkpoint in this folder (written by --save-checkpoint under any
    layout): weights, optimizer state and the step count, the data stream continuing there"""
    layout: Annotated[ParallelLayout, Nested] = field(default_factory=ParallelLayout)

    def total_steps(self) -> int:
        extra = self.profile_steps + 1 if self.profile else 0
        return super().total_steps() + extra

    def dp_size(self, world_size: int) -> int:
        """The data-parallel degree: the ranks that split the global batch."""
        return self.layout.degrees(world_size)["dp"]

    def validate(self, world_size: int = 1) -> TrainConfig:
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {world_size!r}")
        self.layout.validate(world_size, self.model_args().n_layers)
        # The global batch splits over the data-parallel ranks only: tensor- and pipeline-
        # parallel ranks of one group read the same sequences.
        super().validate(self.dp_size(world_size))
        self._validate_strategy(world_size)
        if self.profile_steps < 1:
            raise ValueError(f"profile_steps must be >= 1, got {self.profile_steps}")
        for name, allowed in (
            ("precision", PrecisionName),
            ("reduce_dtype", DTypeName),
            ("attention", AttentionName),
            ("compile_mode", CompileModeName),
        ):
            _check_choice(self, name, allowed)
        if not self.compile and (self.compile_mode != "default" or self.coordinate_descent_tuning):
            raise ValueError(
                "--compile-mode and --coordinate-descent-tuning tune torch.compile's kernels: "
                "they need --compile"
            )
        if self.precision == "fp64" and self.reduce_dtype != "float32":
            raise ValueError(
                f"reduce_dtype {self.reduce_dtype!r} cannot go with precision 'fp64' "
                "(gradients are reduced in float64): leave reduce_dtype at float32"
            )
        if self.fused_loss and self.precision == "fp16":
            raise ValueError(
                "--fused-loss forms the loss gradients before fp16 loss scaling could lift them: "
                "use it with bf16, fp8-*, fp32 or fp64"
            )
        if not self.loss_scaling and self.precision != "fp16":
            raise ValueError(
                f"--no-loss-scaling is for precision fp16 (loss scaling is fp16's), "
                f"got precision {self.precision!r}"
            )
        return self

    def _validate_strategy(self, world_size: int) -> None:
        """What each strategy supports here: the FSDP-only levers are refused elsewhere."""
        layout, name = self.layout, self.layout.parallel
        if name == "fsdp":
            return
        if self.precision not in ("bf16", "fp32", "fp64"):
            raise ValueError(
                f"--parallel {name} trains in bf16, fp32 or fp64; precision "
                f"{self.precision!r} is for --parallel fsdp"
            )
        if self.fused_loss:
            raise ValueError(f"--fused-loss is for --parallel fsdp, not {name}")
        if self.compile and name != "ddp":
            raise ValueError(f"--compile is for --parallel fsdp or ddp, not {name}")
        if not layout.uses_fsdp() and (
            not self.reshard_after_forward or self.sync_every_microbatch
        ):
            raise ValueError(
                "--no-reshard-after-forward and --sync-every-microbatch are FSDP2 levers: "
                f"--parallel {name} has no FSDP"
            )
        if layout.uses_pipeline():
            if self.micro_batch:
                raise ValueError(
                    "--micro-batch: a pipeline splits its batch by --pp-microbatches; leave it 0"
                )
            local = self.local_batch(self.dp_size(world_size))
            if local % layout.pp_microbatches:
                raise ValueError(
                    f"--pp-microbatches ({layout.pp_microbatches}) must divide the local batch "
                    f"({local} sequences per data-parallel rank)"
                )
            if self.profile:
                raise ValueError("--profile is for the non-pipeline strategies")

    def param_dtype(self) -> str | None:
        """The FSDP2 MixedPrecisionPolicy parameter dtype of the recipe (None: fp64, none)."""
        return PARAM_DTYPE[self.precision]

    def float8_recipe(self) -> str | None:
        """torchao's float8 recipe name ('tensorwise', 'rowwise'), or None."""
        return self.precision.removeprefix("fp8-") if self.precision.startswith("fp8-") else None

    def check_outputs(self) -> TrainConfig:
        from shared.cli import writable_dir

        super().check_outputs()
        if self.profile and self.trace_dir:
            writable_dir("--trace-dir", self.trace_dir)
        if self.save_checkpoint:
            writable_dir("--save-checkpoint", self.save_checkpoint)
        if self.resume:
            from shared.cli import input_dir

            input_dir("--resume", self.resume)
        return self


@dataclass
class DeepSpeedConfig(JobConfig):
    """The same training job through DeepSpeed ZeRO-3, for a side-by-side with FSDP2: torch's
    AdamW as its client optimizer, the same parameter groups, learning-rate schedule and
    explicit gradient clipping; eager, SDPA. Needs the deepspeed extra."""

    precision: DeepSpeedPrecisionName = "bf16"
    """bf16: bf16 parameters with fp32 master weights and fp32 gradient communication;
    fp32: plain fp32"""

    def validate(self, world_size: int = 1) -> DeepSpeedConfig:
        super().validate(world_size)
        _check_deepspeed_precision(self.precision)
        return self

    @classmethod
    def from_train(cls, train: TrainConfig) -> DeepSpeedConfig:
        """The DeepSpeed job of an FSDP2 config, for a comparison of the two; a ValueError names
        the FSDP2-only setting that has no DeepSpeed counterpart here."""
        if train.compile or train.activation_checkpointing or train.attention != "sdpa":
            raise ValueError(
                "the DeepSpeed path runs eager with SDPA: use --no-compile, "
                "--no-activation-checkpointing and --attention sdpa"
            )
        if train.profile:
            raise ValueError("profiling is implemented for the FSDP path only: drop --profile")
        _check_deepspeed_precision(train.precision)
        if train.reduce_dtype != "float32":
            raise ValueError(
                "the DeepSpeed path reduces gradients in float32 (communication_data_type fp32): "
                "use --reduce-dtype float32"
            )
        return cls(**{f.name: getattr(train, f.name) for f in fields(cls)})


def _check_deepspeed_precision(precision: str) -> None:
    if precision not in get_args(DeepSpeedPrecisionName):
        raise ValueError(
            f"precision {precision!r} is for the FSDP path only (the DeepSpeed job here runs "
            f"{' or '.join(get_args(DeepSpeedPrecisionName))}): use --precision fp32 or bf16"
        )


def _check_choice(cfg, name: str, allowed) -> None:
    if getattr(cfg, name) not in get_args(allowed):
        raise ValueError(f"{name} must be one of {get_args(allowed)}, got {getattr(cfg, name)!r}")


def set_by_harness(train: TrainConfig, owner: str, names: tuple[str, ...], why: str) -> None:
    """Raise ValueError naming the flag when `train` sets one of `names` away from its default:
    the harness `owner` sets those for every job it runs (`why` says how)."""
    default = TrainConfig()
    for name in names:
        if getattr(train, name) != getattr(default, name):
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag}: {owner} sets it for every job ({why}); leave it out")


_PATH_FIELDS = ("reports_dir", "trace_dir", "out", "save_params", "save_checkpoint", "resume")


def portable(config: dict) -> dict:
    """A config dict for a result file: machine-specific paths reduced to file names (the
    record sits next to the files it names), folders to a placeholder; nested configs too."""
    out = {k: portable(v) if isinstance(v, dict) else v for k, v in config.items()}
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


def check_reports_dir(reports_dir: str | None) -> None:
    """--reports-dir, when given, is a folder that can be written (checked before any work)."""
    from shared.cli import writable_dir

    if reports_dir is not None:
        writable_dir("--reports-dir", reports_dir)


def cli_flags(obj) -> list[str]:
    """Command-line flags that reproduce the config `obj` (bools as --x / --no-x, empty strings
    and None left out; a `Nested` config's flags without its prefix)."""
    flags = []
    for f in fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            flags += cli_flags(value)
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + f.name.replace("_", "-"))
        elif value is not None and value != "":
            flags += [flag, str(value)]
    return flags


Train = Annotated[TrainConfig, Nested]
"""The type of a harness's nested training config."""
