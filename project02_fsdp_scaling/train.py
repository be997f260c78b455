"""Training of the shared transformer under any parallel layout: the torchrun entry point.

    torchrun --nproc-per-node 8 -m project02_fsdp_scaling train --preset 1b --global-batch 64 \
        --micro-batch 8 --compile --out runs/train_1b.json
    torchrun --nproc-per-node 8 -m project02_fsdp_scaling train --preset 1b --parallel fsdp-tp --tp 2
    torchrun --nproc-per-node 4 -m project02_fsdp_scaling train --preset 1b --parallel pp \
        --pp-schedule interleaved-1f1b --pp-microbatches 8

One loop for every layout (`--parallel`, `parallel/apply.py`): FSDP2 (the default, and the
tuned path below), DDP, tensor parallel, a pipeline, or a 2-D mesh of them. The layout decides
which ranks share a batch (the data-parallel ones split it), how gradients are synchronised
across micro-batches, and who computes the loss; data, AdamW, clipping, timing and the record
are the same for all. `--save-checkpoint` / `--resume` write and read a DCP checkpoint that
loads under any layout and world size.

One process per GPU (NCCL) or per CPU worker (gloo); a plain `python -m` is a world of one.
Parallelism is applied from outside the model with `shared.parallelize` (torchao float8 linears
under --precision fp8-*, activation checkpointing, per-block compile, then FSDP2 with the recipe's
parameter dtype, bf16 by default, and fp32 gradient reduction); fp16 adds dynamic loss scaling.
A world of one is still wrapped by FSDP, so the one-GPU baseline trains in exactly the precision
of the multi-GPU runs.

The global batch is fixed: each data-parallel rank takes global_batch / dp sequences a step, in
micro-batches with gradient accumulation. Step time is wall time between device synchronisations
(median over the timed steps, after warm-up); MFU uses the dense peak of `shared.hardware` for
the precision the matmuls run in (`mfu_bf16_peak`: against the bf16 peak, whatever the recipe).
"""

from __future__ import annotations

import contextlib
import math
import resource
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from project02_fsdp_scaling.config import TrainConfig, env_world_size
from shared.data import SyntheticTokens
from shared.distributed import DistInfo, cleanup, get_logger, init_distributed, seed_everything
from shared.flops import transformer_train_flops_per_token
from shared.model import ModelArgs, Transformer
from shared.parallelize import (
    ParallelConfig,
    apply_activation_checkpointing,
    apply_compile,
    apply_fsdp,
    float8_all_gather,
    parallelize,
    precompute_float8_scales,
)
from shared.progress import human_count, progress

log = get_logger("project02.train")


# ---- model FLOPs --------------------------------------------------------------------------------
def matmul_params(args: ModelArgs) -> int:
    """Parameters that take part in a matmul per token: all but the input embedding table
    (a lookup, no FLOPs) and the norm weights (elementwise)."""
    d, h, L, V = args.dim, args.ffn_hidden, args.n_layers, args.vocab_size
    return L * (4 * d * d + 3 * d * h) + V * d


def train_flops_per_token(args: ModelArgs, seq_len: int, *, causal: bool = True) -> float:
    """Training FLOPs per token (forward + backward): 6 per matmul parameter plus attention
    scores and values, 12·L·d·S, halved when causal (`shared.flops`, PaLM appendix B)."""
    return float(
        transformer_train_flops_per_token(
            matmul_params(args), args.n_layers, args.dim, seq_len, causal=causal
        )
    )


# MFU's denominator: the dense peak of the precision the matmuls run in (fp8 recipes: the fp8
# peak, though attention and the output head stay bf16; `mfu_bf16_peak` is against bf16).
PEAK_KEY = {
    "bf16": "bf16",
    "fp8-tensorwise": "fp8",
    "fp8-rowwise": "fp8",
    "fp16": "fp16",
    "fp32": "fp32",
}


def float8_linears(model: nn.Module) -> int:
    from torchao.float8.float8_linear import Float8Linear

    return sum(isinstance(m, Float8Linear) for m in model.modules())


# ---- building blocks ----------------------------------------------------------------------------
def resolve_device(cfg: TrainConfig) -> str:
    if cfg.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was asked for but no CUDA GPU is visible")
    return cfg.device


def inductor_options(cfg: TrainConfig) -> contextlib.AbstractContextManager:
    """Inductor's settings for the run (global: the blocks compile lazily, at the first step,
    inside this context); nothing changed without --coordinate-descent-tuning."""
    if not cfg.coordinate_descent_tuning:
        return contextlib.nullcontext()
    import torch._inductor.config as inductor_config

    return inductor_config.patch(coordinate_descent_tuning=True)


@contextlib.contextmanager
def attention_backend(name: str, device: str):
    """Force an SDPA backend for the duration (global flags: torch.compile sees them at trace
    time). Math stays off so an unsupported shape fails loudly instead of running slowly."""
    if name == "sdpa":
        yield
        return
    if device != "cuda":
        raise ValueError(f"attention={name!r} needs a CUDA GPU; use attention='sdpa' on CPU")
    b = torch.backends.cuda
    saved = (
        b.flash_sdp_enabled(),
        b.mem_efficient_sdp_enabled(),
        b.math_sdp_enabled(),
        b.cudnn_sdp_enabled(),
    )
    b.enable_flash_sdp(name == "flash")
    b.enable_cudnn_sdp(name == "cudnn")
    b.enable_mem_efficient_sdp(False)
    b.enable_math_sdp(False)
    try:
        yield
    finally:
        b.enable_flash_sdp(saved[0])
        b.enable_mem_efficient_sdp(saved[1])
        b.enable_math_sdp(saved[2])
        b.enable_cudnn_sdp(saved[3])


def build_cpu_model(args: ModelArgs, seed: int) -> Transformer:
    """The model on the CPU with shared's deterministic init. Built on the meta device first so
    the default nn.Linear init (discarded by init_weights) costs nothing."""
    with torch.device("meta"):
        model = Transformer(args)
    model.to_empty(device="cpu")
    model.init_weights(seed)
    return model


@torch.no_grad()
def round_params_to_bf16_(model: nn.Module) -> nn.Module:
    """Replace every parameter by its bfloat16 image, kept in its own dtype: where DeepSpeed's
    bf16 mode starts its float32 master weights (it copies them from the bf16 model)."""
    for p in model.parameters():
        p.copy_(p.to(torch.bfloat16))
    return model


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for p in model.parameters():
        (decay if p.dim() >= 2 else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(model: nn.Module, cfg: TrainConfig, device: str) -> torch.optim.Optimizer:
    # Fused AdamW on GPU: one kernel over all parameters. On CPU the foreach path (the fused
    # CPU kernel gives the same math; foreach is the one tested with DTensor parameters).
    kind = {"fused": True} if device == "cuda" else {"foreach": True}
    return torch.optim.AdamW(
        param_groups(model, cfg.weight_decay),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=1e-8,
        **kind,
    )


def lr_lambda(cfg: TrainConfig):
    def f(step: int) -> float:
        if cfg.lr_warmup_steps and step < cfg.lr_warmup_steps:
            return (step + 1) / cfg.lr_warmup_steps
        return 1.0

    return f


def clip_grad_norm(params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
    """Global gradient norm over all ranks (FSDP grads are sharded DTensors), clipped to
    max_norm when max_norm > 0. Returns the norm before clipping."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, norm_type=2.0, foreach=True)
    if isinstance(total, DTensor):
        total = total.full_tensor()  # sum of squares over the shards
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total, foreach=True)
    return total


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token loss in float32 (float64 for float64 logits) whatever the logits' dtype.
    logits (B, S, V), targets (B, S)."""
    logits = logits.flatten(0, 1)
    return F.cross_entropy(
        logits.to(torch.promote_types(logits.dtype, torch.float32)), targets.flatten(0, 1)
    )


def canonical_name(name: str) -> str:
    """Parameter name without the wrappers' prefixes (checkpoint wrapper, compile)."""
    for junk in ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module."):
        name = name.replace(junk, "")
    return name


def full_params(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter gathered in full, float32 (float64 when trained in float64), on the CPU
    (a collective: call on all ranks)."""
    from torch.distributed.tensor import DTensor

    out = {}
    for name, p in model.named_parameters():
        t = p.full_tensor() if isinstance(p, DTensor) else p
        out[canonical_name(name)] = t.detach().to(torch.promote_types(t.dtype, torch.float32)).cpu()
    return out


def peak_memory_gib(device: str) -> tuple[float, str]:
    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**30, "CUDA max_memory_allocated per GPU"
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return kib / 2**20, "host peak RSS per process"


def summarize_times(times: list[float]) -> dict:
    s = sorted(times)

    def q(p: float) -> float:  # nearest-rank quantile
        return s[min(len(s) - 1, max(0, math.ceil(p * len(s)) - 1))]

    median = s[len(s) // 2] if len(s) % 2 else 0.5 * (s[len(s) // 2 - 1] + s[len(s) // 2])
    return {
        "median": median,
        "p20": q(0.2),
        "p80": q(0.8),
        "min": s[0],
        "mean": sum(s) / len(s),
        "n": len(s),
        "all": times,
        "unit": "s",
    }


def _plain(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (a loss-parallel loss is one), or the tensor itself."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _reduce_max(x: float, device: str) -> float:
    t = torch.tensor([x], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _reduce_mean(x: float, device: str) -> float:
    t = torch.tensor([x], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t.item()) / dist.get_world_size()


# ---- the run ------------------------------------------------------------------------------------
def run_training(
    cfg: TrainConfig,
    info: DistInfo,
    *,
    template: Transformer | None = None,
    on_resume: Callable | None = None,
    on_end: Callable | None = None,
) -> tuple[dict, dict[str, torch.Tensor] | None]:
    """Train `cfg.total_steps()` steps on this rank under `cfg.layout`; return (result, full
    params or None).

    template: an already initialised CPU model to copy (saves the init when one process runs
    several configurations); default builds one from cfg.seed. on_resume(par, optimizer), after
    --resume has loaded, and on_end(par, optimizer), after the last step: called on every rank
    with the `Parallelized` model (tests compare layouts' states through them).
    """
    from project02_fsdp_scaling.parallel import checkpoint
    from project02_fsdp_scaling.parallel.apply import apply_layout
    from project02_fsdp_scaling.parallel.pipeline import bubble_formula

    cfg.validate(info.world_size)
    device = info.device.type
    if cfg.attention != "sdpa" and device != "cuda":
        raise ValueError(f"attention={cfg.attention!r} needs a CUDA GPU; use 'sdpa' on CPU")
    layout = cfg.layout
    degrees = layout.degrees(info.world_size)
    dp = degrees["dp"]  # the ranks that split the global batch
    args = cfg.model_args()
    seq_len = cfg.resolved_seq_len()
    micro = cfg.resolved_micro_batch(dp)
    accum = cfg.grad_accum_steps(dp)
    local = cfg.local_batch(dp)
    seed_everything(cfg.seed)

    t0 = time.perf_counter()
    model = build_cpu_model(args, cfg.seed) if template is None else _copy_model(template)
    if cfg.bf16_rounded_init:
        round_params_to_bf16_(model)
    n_params = model.num_params()
    fp64 = cfg.precision == "fp64"  # no mixed precision: FSDP keeps and reduces float64
    if fp64:
        model.to(torch.float64)
    float8 = cfg.float8_recipe()
    fsdp_config = ParallelConfig(
        param_dtype=cfg.param_dtype(),
        reduce_dtype=None if fp64 else cfg.reduce_dtype,
        reshard_after_forward=cfg.reshard_after_forward,
        activation_checkpointing=cfg.activation_checkpointing,
        compile=cfg.compile,
        compile_mode=cfg.compile_mode,
        float8=float8,
    )

    def fsdp(module: nn.Module, dp_mesh) -> nn.Module:
        if layout.parallel == "fsdp":  # the whole recipe: float8, checkpointing, compile, FSDP2
            return parallelize(module, fsdp_config, mesh=dp_mesh)
        return apply_fsdp(  # a 2-D layout's data-parallel dimension
            module,
            mesh=dp_mesh,
            param_dtype=fsdp_config.param_dtype,
            reduce_dtype=fsdp_config.reduce_dtype,
            reshard_after_forward=fsdp_config.reshard_after_forward,
        )

    outside_fsdp = layout.parallel != "fsdp"  # parallelize() applies them for fsdp itself
    par = apply_layout(
        model,
        layout,
        info.device,
        param_dtype=cfg.param_dtype(),
        fsdp=fsdp,
        loss_fn=cross_entropy,
        compile_blocks=(
            (lambda m: apply_compile(m, cfg.compile_mode)) if cfg.compile and outside_fsdp else None
        ),
        checkpoint_blocks=(
            apply_activation_checkpointing
            if cfg.activation_checkpointing and outside_fsdp
            else None
        ),
    )
    model = par.model
    params = [p for _, p in par.named_parameters()]
    opt = build_optimizer(par.param_container(), cfg, device)
    # fp16: dynamic loss scaling. With FSDP2 the gradients are DTensor shards and the inf/NaN
    # check of `unscale_` is all-reduced over the mesh, so every rank skips the same steps.
    scaler = torch.amp.GradScaler(device) if cfg.precision == "fp16" and cfg.loss_scaling else None
    skipped_steps: list[int] = []
    first_step = 0
    if cfg.resume:
        first_step = checkpoint.load(cfg.resume, par, opt)
        if on_resume is not None:
            on_resume(par, opt)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg))
    if first_step:  # the learning-rate schedule where the checkpoint left it
        sched.last_epoch = first_step
        for group, base in zip(opt.param_groups, sched.base_lrs):
            group["lr"] = base * lr_lambda(cfg)(first_step)
    loss_fn = torch.compile(cross_entropy) if cfg.compile else cross_entropy
    log.info(
        "model %s: %s parameters; world %d (%s), %s %s; global batch %d x %d tokens, "
        "micro-batch %d, %d accumulation steps; build %.1f s",
        cfg.preset,
        human_count(n_params),
        info.world_size,
        info.backend,
        layout.parallel,
        "x".join(f"{k}{v}" for k, v in degrees.items() if v > 1) or "one rank",
        cfg.global_batch,
        seq_len,
        micro,
        accum,
        time.perf_counter() - t0,
    )

    # The whole stream up front (this rank's slice): data generation never lands in step time.
    # Ranks of one tensor- or pipeline-parallel group read the same sequences.
    data = SyntheticTokens(
        args.vocab_size, seq_len, cfg.global_batch, cfg.data_seed, par.mesh.local_rank("dp"), dp
    )
    batches = [data.batch_at(first_step + s) for s in range(cfg.total_steps())]
    if device == "cuda":
        batches = [(x.pin_memory(), y.pin_memory()) for x, y in batches]

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    compute_dtype: list[str] = []
    if layout.uses_pipeline():  # the last stage's logits are the schedule's
        compute_dtype.append(str(cfg.param_dtype() or "float64"))
    busy: list[float] = []  # pipeline: seconds inside stage compute, per step

    def forward_backward(x_all: torch.Tensor, y_all: torch.Tensor) -> torch.Tensor:
        """This rank's share of the step's forward and backward; returns its loss (float64),
        zero on ranks that compute none (pipeline stages before the last)."""
        loss_sum = torch.zeros((), dtype=torch.float64, device=info.device)
        if layout.uses_pipeline():
            par.timer.busy = 0.0
            loss = par.pipeline_step(x_all.to(info.device), y_all.to(info.device))
            busy.append(par.timer.busy)
            return loss_sum if loss is None else loss_sum + loss
        for m in range(accum):
            x = x_all[m * micro : (m + 1) * micro].to(info.device, non_blocking=True)
            y = y_all[m * micro : (m + 1) * micro].to(info.device, non_blocking=True)
            if accum > 1 and not cfg.sync_every_microbatch:
                par.set_grad_sync(m == accum - 1)  # reduce gradients once a step
            if accum > 1 and not cfg.reshard_after_forward:
                model.set_reshard_after_backward(m == accum - 1)  # gathered until the last one
            with par.compute_context(), par.loss_context():
                if cfg.fused_loss:  # projection + loss in chunks: no (micro, S, V) logits
                    loss = model(x, targets=y) / accum
                    dtype = model.compute_dtype
                else:
                    logits = model(x)  # (micro, S, V) in the compute dtype
                    dtype = logits.dtype
                    loss = loss_fn(logits, y) / accum
                if not compute_dtype:
                    compute_dtype.append(str(dtype).removeprefix("torch."))
                (loss if scaler is None else scaler.scale(loss)).backward()
            loss_sum += _plain(loss.detach())
        return loss_sum

    def train_step(step: int) -> tuple[float, float]:
        x_all, y_all = batches[step]
        loss_sum = forward_backward(x_all, y_all)
        if scaler is not None:
            scaler.unscale_(opt)  # the norm and the clipping see true gradients
        if layout.parallel == "fsdp":
            norm = clip_grad_norm(params, cfg.grad_clip)
        else:
            norm = par.clip_grad_norm_(cfg.grad_clip)
        if scaler is None:
            opt.step()
        else:
            scale = scaler.get_scale()
            scaler.step(opt)  # skipped when a gradient is inf/NaN on any rank
            scaler.update()
            if scaler.get_scale() < scale:
                skipped_steps.append(step)
        if float8_all_gather(float8):
            precompute_float8_scales(model)
        sched.step()
        opt.zero_grad(set_to_none=True)
        # The mean over the ranks that computed a loss (all but a pipeline's earlier stages):
        # the global batch's loss.
        owned = torch.stack([loss_sum, loss_sum.new_tensor(float(par.has_last))])
        dist.all_reduce(owned, op=dist.ReduceOp.SUM)
        return float(owned[0].item() / owned[1].item()), float(norm.item())

    losses, norms, times = [], [], []
    n_timed_end = cfg.warmup_steps + cfg.steps
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    tokens_per_step = cfg.global_batch * seq_len
    with (
        attention_backend(cfg.attention, device),
        inductor_options(cfg),
        progress(
            n_timed_end,
            "train",
            unit="step",
            every=cfg.log_every or 1,
            enabled=info.is_main and cfg.log_every > 0,
        ) as bar,
    ):
        for step in range(n_timed_end):
            sync()
            t = time.perf_counter()
            loss, norm = train_step(step)  # .item() synchronises
            sync()
            dt = time.perf_counter() - t
            losses.append(loss)
            norms.append(norm)
            if step >= cfg.warmup_steps:
                times.append(dt)
            tag = "warm-up" if step < cfg.warmup_steps else "timed"
            bar.advance(
                status=f"{tag}: loss {loss:.4f}, grad-norm {norm:.3f}, {dt:.3f} s/step, "
                f"{tokens_per_step / dt:,.0f} tokens/s"
            )
            if not math.isfinite(loss):
                raise FloatingPointError(f"loss is {loss} at step {step}: training diverged")
        profile = None
        if cfg.profile:
            profile = _profile_steps(cfg, info, train_step, n_timed_end, losses, norms, sync)
        underflow = None
        if cfg.precision == "fp16":  # after the timed steps: what loss scaling saved, measured
            x, y = (t[:micro].to(info.device) for t in batches[n_timed_end - 1])
            scale = scaler.get_scale() if scaler is not None else UNDERFLOW_PROBE_SCALE
            underflow = gradient_underflow(model, params, loss_fn, x, y, scale)

    if cfg.save_checkpoint:
        checkpoint.save(cfg.save_checkpoint, par, opt, first_step + n_timed_end)
    if on_end is not None:
        on_end(par, opt)
    bubble = None
    if layout.uses_pipeline():
        # Idle share of each rank's timed steps: the bubble plus point-to-point waits.
        timed = slice(cfg.warmup_steps, n_timed_end)
        share = 1.0 - sum(busy[timed]) / sum(times)
        v = layout.resolved_stages_per_rank()
        bubble = {
            "schedule": layout.pp_schedule,
            "microbatches": layout.pp_microbatches,
            "stages_per_rank": v,
            "measured_idle_share": _reduce_mean(share, device),
            "measured_idle_share_max": _reduce_max(share, device),
            "formula_share": bubble_formula(degrees["pp"], layout.pp_microbatches, v),
            "formula": "(p - 1) / (v m + p - 1)",
        }
    mem_gib, mem_kind = peak_memory_gib(device)
    mem_gib = _reduce_max(mem_gib, device)
    stats = summarize_times(times)
    # Slowest rank's median: a step ends when every rank has finished it.
    stats["median"] = _reduce_max(stats["median"], device)
    tokens_per_s = tokens_per_step / stats["median"]
    fpt = train_flops_per_token(args, seq_len)
    gpu_name, peak, bf16_peak = None, None, None
    if device == "cuda":
        from shared.hardware import detect_gpu

        gpu_name = torch.cuda.get_device_name()
        spec = detect_gpu()
        if spec is not None and not fp64:  # no float64 peak in the table: MFU n/a
            peak = spec.peak_flops(PEAK_KEY[cfg.precision])
            bf16_peak = spec.peak_flops("bf16")
    achieved = tokens_per_s * fpt / info.world_size  # FLOP/s per device
    result = {
        "kind": "fsdp2_train",
        "config": cfg.to_dict(),
        "precision": cfg.precision,
        "preset": cfg.preset,
        "model": {
            "preset": cfg.preset,
            "args": args.to_dict(),
            "n_params": n_params,
            "n_matmul_params": matmul_params(args),
        },
        "world_size": info.world_size,
        "backend": info.backend,
        "device": device,
        "gpu": gpu_name,
        "seq_len": seq_len,
        "global_batch": cfg.global_batch,
        "local_batch": local,
        "micro_batch": micro,
        "grad_accum_steps": accum,
        "tokens_per_step": tokens_per_step,
        "compute_dtype": compute_dtype[0] if compute_dtype else None,
        "flops_per_token": fpt,
        "step_time_s": stats,
        "tokens_per_s": tokens_per_s,
        "tokens_per_s_per_device": tokens_per_s / info.world_size,
        "achieved_tflops_per_device": achieved / 1e12,
        "peak_tflops_per_device": peak / 1e12 if peak else None,
        "mfu": achieved / peak if peak else None,
        "peak_kind": PEAK_KEY.get(cfg.precision) if peak else None,
        "mfu_bf16_peak": achieved / bf16_peak if bf16_peak else None,
        "float8_linears": float8_linears(model) if float8 else 0,
        "loss_scale": scaler.get_scale() if scaler is not None else None,
        "skipped_steps": skipped_steps,
        "peak_memory_gib": mem_gib,
        "memory_kind": mem_kind,
        "losses": losses,
        "grad_norms": norms,
        "profile": profile,
        "fp16_underflow": underflow,
        "parallel": {"strategy": layout.parallel, "degrees": degrees, "bubble": bubble},
        "first_step": first_step,
    }
    final = par.full_params() if cfg.save_params else None
    return result, final


UNDERFLOW_PROBE_SCALE = 2.0**16  # GradScaler's initial scale: the probe's without a scaler


def gradient_underflow(model, params, loss_fn, x, y, scale: float) -> dict:
    """Gradient elements that fp16 flushes to zero without loss scaling, measured on one batch:
    backward of the loss as it is, then of the loss times `scale` (unscaled after); an element
    that is zero the first time and not the second underflowed. Counts are summed over every
    rank's gradient shards (a collective: call on all ranks). The gradients are cleared after;
    parameters and optimizer state are not touched."""
    from torch.distributed.tensor import DTensor

    def grads(multiplier: float) -> list[torch.Tensor]:
        for p in params:
            p.grad = None
        model.set_requires_gradient_sync(True)
        (loss_fn(model(x), y) * multiplier).backward()
        out = []
        for p in params:
            g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            out.append(g.detach().float().clone())
        return out

    plain, scaled = grads(1.0), grads(scale)
    for p in params:
        p.grad = None
    counts = torch.zeros(3, dtype=torch.float64, device=x.device)
    for a, b in zip(plain, scaled):
        nonzero = b != 0
        counts[0] += a.numel()
        counts[1] += nonzero.sum()
        counts[2] += (nonzero & (a == 0)).sum()
    dist.all_reduce(counts)
    total, nonzero, lost = (int(c) for c in counts.tolist())
    return {
        "scale": scale,
        "elements": total,
        "nonzero_with_scaling": nonzero,
        "zero_without_scaling": lost,
        "underflow_share": lost / nonzero if nonzero else None,
    }


def _copy_model(template: Transformer) -> Transformer:
    import copy

    return copy.deepcopy(template)


def _profile_steps(cfg, info, train_step, first_step, losses, norms, sync) -> dict:
    """Run 1 + profile_steps steps under torch.profiler (one warm-up step, then recorded ones),
    export this rank's trace and analyse it: compute vs collective vs exposed communication."""
    from torch.profiler import ProfilerActivity, profile, schedule

    from project02_fsdp_scaling.comm_analysis import analyse_trace, load_trace

    activities = [ProfilerActivity.CPU]
    if info.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    trace_dir = Path(cfg.trace_dir or (Path(cfg.out).parent if cfg.out else "."))
    trace_dir.mkdir(parents=True, exist_ok=True)
    tag = f"ws{info.world_size}_rank{info.rank}"
    trace_path = trace_dir / f"trace_{cfg.preset}_{tag}.json.gz"
    with profile(
        activities=activities,
        schedule=schedule(wait=0, warmup=1, active=cfg.profile_steps, repeat=1),
        record_shapes=False,
        with_stack=False,
    ) as prof:
        for i in range(1 + cfg.profile_steps):
            sync()
            loss, norm = train_step(first_step + i)
            sync()
            losses.append(loss)
            norms.append(norm)
            prof.step()
    prof.export_chrome_trace(str(trace_path))
    summary = analyse_trace(load_trace(trace_path))
    summaries = [None] * info.world_size
    dist.all_gather_object(summaries, summary)
    if info.rank != 0:
        trace_path.unlink(missing_ok=True)  # rank 0's timeline is kept for reading
    return {
        "trace": trace_path.name,
        "rank0": summaries[0],
        "per_rank": summaries,
        "profiled_steps": cfg.profile_steps,
    }


def save_tensors(path: str | Path, tensors: dict) -> None:
    """torch.save to `path` atomically (temporary file, fsync, rename): never half a file."""
    import io

    from shared.results import atomic_write_bytes

    buf = io.BytesIO()
    torch.save(tensors, buf)
    atomic_write_bytes(path, buf.getvalue())


def write_json(path: str | Path, obj: dict) -> None:
    """The result record with the environment it was measured in, written atomically."""
    from shared.results import atomic_write_json, environment

    obj = {**obj, "environment": environment()}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, obj)


def run(cfg: TrainConfig) -> int:
    """`train`: validate, train on this rank, and on rank 0 write the JSON record (--out) and
    the final parameters (--save-params)."""
    cfg.validate(env_world_size())  # a clear error before any process group exists
    cfg.check_outputs()  # and before any training: the output paths can be written
    device = resolve_device(cfg)
    info = init_distributed(device=device)
    try:
        result, final = run_training(cfg, info)
        if info.is_main:
            s = result["step_time_s"]
            mfu = (
                f"{100 * result['mfu']:.1f}%" if result["mfu"] is not None else "n/a (no GPU peak)"
            )
            log.info(
                "world %d: step %.3f s (median of %d; p20 %.3f, p80 %.3f), %.0f tokens/s, "
                "%.0f tokens/s/device, MFU %s, peak memory %.2f GiB (%s), compute dtype %s",
                info.world_size,
                s["median"],
                s["n"],
                s["p20"],
                s["p80"],
                result["tokens_per_s"],
                result["tokens_per_s_per_device"],
                mfu,
                result["peak_memory_gib"],
                result["memory_kind"],
                result["compute_dtype"],
            )
            if cfg.out:
                write_json(cfg.out, result)
                log.info("wrote %s", cfg.out)
            if final is not None:
                save_tensors(cfg.save_params, final)
    finally:
        cleanup()
    return 0


if __name__ == "__main__":  # `python -m <this module>` runs its command of the package
    import sys

    from project02_fsdp_scaling.__main__ import main
    from shared.distributed import exit_under_launcher

    code = main(["train", *sys.argv[1:]])
    exit_under_launcher(code)  # a gloo worker thread can abort the interpreter's teardown
    sys.exit(code)
