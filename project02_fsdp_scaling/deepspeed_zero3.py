"""The same training job through DeepSpeed ZeRO-3, for a side-by-side with FSDP2.

    torchrun --nproc-per-node 2 -m project02_fsdp_scaling deepspeed --preset tiny ...

Same model (shared's init), same synthetic data slice per rank, same AdamW (torch's, handed to
DeepSpeed as its client optimizer, same parameter groups), same learning-rate schedule, and
gradient clipping set explicitly from --grad-clip (DeepSpeed would otherwise apply its own
default). bf16 parameters with fp32 master weights and fp32 gradient communication when
--param-dtype bfloat16, plain fp32 otherwise (`DeepSpeedConfig`). DeepSpeed is an optional
extra: `pip install -e ".[deepspeed]"`.
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from project02_fsdp_scaling.config import DeepSpeedConfig, env_world_size
from project02_fsdp_scaling.train import (
    _reduce_max,
    build_cpu_model,
    canonical_name,
    cross_entropy,
    log,
    lr_lambda,
    matmul_params,
    param_groups,
    peak_memory_gib,
    resolve_device,
    round_params_to_bf16_,
    save_tensors,
    summarize_times,
    train_flops_per_token,
    write_json,
)
from shared.cuda_build import clear_stale_lock
from shared.data import SyntheticTokens
from shared.distributed import (
    DistInfo,
    cleanup,
    exit_under_launcher,
    init_distributed,
    seed_everything,
)


def deepspeed_available() -> tuple[bool, str]:
    try:
        import deepspeed  # noqa: F401
    except Exception as e:  # ImportError, or a broken install failing at import
        return False, f"deepspeed is not importable ({type(e).__name__}: {e})"
    return True, ""


def ds_config(cfg: DeepSpeedConfig, world_size: int) -> dict:
    """DeepSpeed's own config for the job `cfg`, equivalent to the FSDP2 job of the same flags."""
    bf16 = cfg.precision == "bf16"
    return {
        "train_batch_size": cfg.global_batch,
        "train_micro_batch_size_per_gpu": cfg.resolved_micro_batch(world_size),
        "gradient_accumulation_steps": cfg.grad_accum_steps(world_size),
        # Explicit: the FSDP path clips at cfg.grad_clip too (0 = no clipping in both).
        "gradient_clipping": float(cfg.grad_clip),
        "zero_optimization": {
            "stage": 3,
            "overlap_comm": True,
            "contiguous_gradients": True,
            "reduce_scatter": True,
        },
        "bf16": {"enabled": bf16},
        "fp16": {"enabled": False},
        "communication_data_type": "fp32",  # as FSDP's reduce_dtype float32
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


def run_deepspeed(
    cfg: DeepSpeedConfig, info: DistInfo
) -> tuple[dict, dict[str, torch.Tensor] | None]:
    """Train cfg.total_steps() steps with ZeRO-3; return (result, full params or None)."""
    import deepspeed

    cfg.validate(info.world_size)
    device = info.device.type
    args = cfg.model_args()
    seq_len = cfg.resolved_seq_len()
    micro = cfg.resolved_micro_batch(info.world_size)
    accum = cfg.grad_accum_steps(info.world_size)
    seed_everything(cfg.seed)
    deepspeed.init_distributed(dist_backend=info.backend)  # reuses the existing process group

    t0 = time.perf_counter()
    model = build_cpu_model(args, cfg.seed)
    if cfg.bf16_rounded_init:  # in bf16 a no-op for the weights DeepSpeed trains: see the flag
        round_params_to_bf16_(model)
    n_params = model.num_params()
    kind = {"fused": True} if device == "cuda" else {"foreach": True}
    opt = torch.optim.AdamW(
        param_groups(model, cfg.weight_decay),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=1e-8,
        **kind,
    )
    engine, _, _, sched = deepspeed.initialize(
        model=model,
        optimizer=opt,
        lr_scheduler=lambda o: torch.optim.lr_scheduler.LambdaLR(o, lr_lambda(cfg)),
        config=ds_config(cfg, info.world_size),
        dist_init_required=False,
    )
    log.info("DeepSpeed ZeRO-3 engine ready in %.1f s", time.perf_counter() - t0)

    data = SyntheticTokens(
        args.vocab_size, seq_len, cfg.global_batch, cfg.data_seed, info.rank, info.world_size
    )
    batches = [data.batch_at(s) for s in range(cfg.total_steps())]
    dev = engine.device

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    losses, norms, times = [], [], []
    compute_dtype = None
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for step in range(cfg.warmup_steps + cfg.steps):
        x_all, y_all = batches[step]
        sync()
        t = time.perf_counter()
        loss_sum = torch.zeros((), device=dev)
        for m in range(accum):
            x = x_all[m * micro : (m + 1) * micro].to(dev)
            y = y_all[m * micro : (m + 1) * micro].to(dev)
            logits = engine(x)
            compute_dtype = compute_dtype or str(logits.dtype).removeprefix("torch.")
            loss = cross_entropy(logits, y)
            engine.backward(loss)  # scaled by 1/accum inside DeepSpeed
            engine.step()  # the optimizer steps at the accumulation boundary only
            loss_sum += loss.detach() / accum
        dist.all_reduce(loss_sum, op=dist.ReduceOp.SUM)
        loss_v = float(loss_sum.item()) / info.world_size
        sync()
        dt = time.perf_counter() - t
        norm = engine.get_global_grad_norm()
        norm = float(norm.item() if torch.is_tensor(norm) else (norm or 0.0))
        losses.append(loss_v)
        norms.append(norm)
        if step >= cfg.warmup_steps:
            times.append(dt)
        if cfg.log_every and step % cfg.log_every == 0:
            log.info("step %d loss %.4f grad-norm %.3f %.3f s", step + 1, loss_v, norm, dt)
        if not math.isfinite(loss_v):
            raise FloatingPointError(f"loss is {loss_v} at step {step}: training diverged")
    del sched

    mem_gib, mem_kind = peak_memory_gib(device)
    mem_gib = _reduce_max(mem_gib, device)
    stats = summarize_times(times)
    stats["median"] = _reduce_max(stats["median"], device)
    tokens_per_s = cfg.global_batch * seq_len / stats["median"]
    result = {
        "kind": "deepspeed_zero3_train",
        "deepspeed_version": deepspeed.__version__,
        "config": cfg.to_dict(),
        "ds_config": ds_config(cfg, info.world_size),
        "model": {
            "preset": cfg.preset,
            "n_params": n_params,
            "n_matmul_params": matmul_params(args),
        },
        "world_size": info.world_size,
        "backend": info.backend,
        "device": device,
        "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
        "seq_len": seq_len,
        "global_batch": cfg.global_batch,
        "micro_batch": micro,
        "grad_accum_steps": accum,
        "tokens_per_step": cfg.global_batch * seq_len,
        "compute_dtype": compute_dtype,
        "flops_per_token": train_flops_per_token(args, seq_len),
        "step_time_s": stats,
        "tokens_per_s": tokens_per_s,
        "tokens_per_s_per_device": tokens_per_s / info.world_size,
        "mfu": None,
        "peak_memory_gib": mem_gib,
        "memory_kind": mem_kind,
        "losses": losses,
        "grad_norms": norms,
        "profile": None,
    }
    final = None
    if cfg.save_params:
        params = list(engine.module.parameters())
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            final = {
                canonical_name(n): p.detach().float().cpu().clone()
                for n, p in engine.module.named_parameters()
            }
    return result, final


def clear_stale_op_build_locks() -> list[Path]:
    """Remove build locks DeepSpeed's killed op builds left behind; returns their folders.

    DeepSpeed compiles some ops on first use (on CPU, its shared-memory allreduce) through
    torch's cpp_extension, in torch's extensions folder. A run killed during that build leaves
    the folder's `lock` file, and every later DeepSpeed run on the machine then waits on it,
    silently and forever. Locks older than any build takes are removed (`clear_stale_lock`)."""
    from torch.utils.cpp_extension import get_default_build_root

    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())
    folders = sorted(root.glob("deepspeed*")) + sorted(root.glob("*/deepspeed*"))
    return [d for d in folders if d.is_dir() and clear_stale_lock(d)]


def run(cfg: DeepSpeedConfig) -> int:
    """`deepspeed`: validate, train on this rank, and on rank 0 write the JSON record (--out) and
    the final parameters (--save-params)."""
    cfg.validate(env_world_size())
    cfg.check_outputs()
    ok, why = deepspeed_available()
    if not ok:
        print(f"{why}; install the extra: pip install -e '.[deepspeed]'", file=sys.stderr)
        return 2
    clear_stale_op_build_locks()
    info = init_distributed(device=resolve_device(cfg))
    try:
        result, final = run_deepspeed(cfg, info)
        if info.is_main:
            s = result["step_time_s"]
            log.info(
                "DeepSpeed ZeRO-3, world %d: step %.3f s (median of %d), %.0f tokens/s, "
                "peak memory %.2f GiB (%s)",
                info.world_size,
                s["median"],
                s["n"],
                result["tokens_per_s"],
                result["peak_memory_gib"],
                result["memory_kind"],
            )
            if cfg.out:
                write_json(cfg.out, result)
            if final is not None:
                save_tensors(cfg.save_params, final)
    finally:
        cleanup()
    if info.world_size > 1:
        exit_under_launcher(0)  # a DeepSpeed CPU worker can abort in the interpreter's teardown
    return 0


if __name__ == "__main__":  # `python -m <this module>` runs its command of the package
    import sys

    from project02_fsdp_scaling.__main__ import main

    sys.exit(main(["deepspeed", *sys.argv[1:]]))
