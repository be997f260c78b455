"""Where a decode step's time goes: torch.profiler over engine steps at one batch and context.

    python -m project04_llm_inference.bench.profile_step --batch 256 --context 1024
    python -m project04_llm_inference.bench.profile_step --batch 1 --context 256 \
        --model runs/spec-models/target --speculative-method draft \
        --speculative-model runs/spec-models/draft --num-speculative-tokens 2

Prints the GPU kernels by total time and the host/GPU split of a step (a GPU that idles while
the host prepares the next step shows up as step wall time above the kernels' sum), and writes
one record (`profile_step_b<batch>_c<context>[_k<steps>][_sync].json`: wall time, kernels launched, busy and idle device time per
decode step, the host's CPU model in the environment) so a host difference is measured. With
programmatic dependent launch a kernel starts before the one ahead of it ends and waits, so its
own duration overstates it: the critical-path table charges each kernel only for the time from
the end of everything before it to its own end, and counts the GPU's idle gaps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass
class ProfileConfig:
    batch: int = 256
    """Sequences decoding together."""
    context: int = 1024
    """Prompt length of each (the context the decode steps read)."""
    steps: int = 20
    """Decode steps profiled (after the prefill and a warm-up)."""
    shape: str = "llama-3.2-1b"
    """Dummy-weight shape."""
    num_scheduler_steps: int = 1
    """Decode steps per host round trip (8: multi-step, as the benchmarks' headline runs)."""
    async_scheduling: bool = True
    """Queue each step before reading the last one's tokens (the engine's default); off: the
    GPU's idle gaps while the host bookkeeps show up between steps."""
    model: str | None = None
    """A model folder to profile instead of dummy weights of `shape` (e.g. spec.train_corpus's
    target, to profile speculative steps with a draft that shares its vocabulary)."""
    speculative_method: str | None = None
    """'draft' or 'ngram': profile speculative steps (one step = proposals + verification)."""
    speculative_model: str | None = None
    """The draft model's folder (speculative_method 'draft')."""
    num_speculative_tokens: int = 4
    """Tokens proposed per step when speculating."""
    reports_dir: str = ""
    """folder of the JSON record (under <reports_dir>/project04_llm_inference/); empty:
    runs/<UTC time>/"""


def engine_kwargs(cfg: ProfileConfig) -> dict:
    """The `LLM` arguments of a profile run."""
    kw = dict(
        max_model_len=cfg.context + 256,
        max_num_batched_tokens=32768,
        max_num_seqs=max(cfg.batch, 1),
        num_scheduler_steps=cfg.num_scheduler_steps,
        async_scheduling=cfg.async_scheduling,
    )
    if cfg.model is None:
        kw |= dict(load_format="dummy", dummy_shape=cfg.shape)
    else:
        kw |= dict(model=cfg.model)
    if cfg.speculative_method is not None:
        kw |= dict(
            speculative_method=cfg.speculative_method,
            speculative_model=cfg.speculative_model,
            num_speculative_tokens=cfg.num_speculative_tokens,
        )
    return kw


def run(cfg: ProfileConfig) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from project04_llm_inference import LLM, SamplingParams

    llm = LLM(**engine_kwargs(cfg))
    eng = llm.engine
    g = torch.Generator().manual_seed(0)
    for i in range(cfg.batch):
        ids = torch.randint(0, min(1000, eng.vocab_size), (cfg.context,), generator=g).tolist()
        eng.add_request(
            str(i),
            ids,
            SamplingParams(
                max_tokens=(cfg.steps + 6) * cfg.num_scheduler_steps + 16,
                temperature=0,
                ignore_eos=True,
            ),
        )
    while eng.scheduler.waiting or any(
        s.num_computed_tokens < len(s.prompt_token_ids) for s in eng.scheduler.running
    ):
        eng.step()
    for _ in range(5):
        eng.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(cfg.steps):
            eng.step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / cfg.steps * 1e3
    events = [
        e
        for e in prof.key_averages()
        if e.device_type.name == "CUDA" or getattr(e, "self_device_time_total", 0) > 0
    ]
    gpu_total = sum(getattr(e, "self_device_time_total", 0) for e in events) / 1e3 / cfg.steps
    print(
        prof.key_averages().table(
            sort_by="self_cuda_time_total", row_limit=18, max_name_column_width=60
        )
    )
    print(
        f"batch {cfg.batch}, context {cfg.context}: step wall {wall:.2f} ms, GPU kernels {gpu_total:.2f} ms/step"
    )
    decode_steps = cfg.steps * cfg.num_scheduler_steps
    path = print_critical_path(prof, decode_steps)
    res = {
        "batch": cfg.batch,
        "context": cfg.context,
        "wall_ms_per_call": wall,  # one engine step() (num_scheduler_steps decode steps)
        "wall_ms_per_decode_step": wall / cfg.num_scheduler_steps,
        "kernel_ms_per_decode_step": gpu_total / cfg.num_scheduler_steps,
        **path,
    }
    from dataclasses import asdict

    from shared.results import output_root, save_result

    cfg.reports_dir = str(output_root(cfg.reports_dir))
    name = f"profile_step_b{cfg.batch}_c{cfg.context}"
    name += f"_k{cfg.num_scheduler_steps}" if cfg.num_scheduler_steps > 1 else ""
    name += "" if cfg.async_scheduling else "_sync"
    out = save_result(
        "project04_llm_inference",
        name,
        res,
        config=asdict(cfg),
        reports_dir=cfg.reports_dir,
    )
    print(f"wrote {out}")
    return res


def print_critical_path(prof, steps: int, top: int = 16) -> dict:
    """Each kernel charged for end - max(start, end of every kernel before it); gaps as idle.
    Returns per decode step: kernels launched, busy and idle ms, idle share, top kernels."""
    kernels = sorted(
        (e for e in prof.events() if e.device_type.name == "CUDA"),
        key=lambda e: e.time_range.start,
    )
    charged: dict[str, float] = {}
    idle, last_end = 0.0, None
    for e in kernels:
        start, end = e.time_range.start, e.time_range.end
        if last_end is not None:
            idle += max(0.0, start - last_end)
            start = max(start, last_end)
        if end > start:
            charged[e.name] = charged.get(e.name, 0.0) + end - start
        last_end = end if last_end is None else max(last_end, end)
    busy = sum(charged.values())
    print(
        f"critical path per decode step: busy {busy / steps / 1e3:.3f} ms, idle {idle / steps / 1e3:.3f} ms"
    )
    ranked = sorted(charged.items(), key=lambda kv: -kv[1])
    for name, us in ranked[:top]:
        print(f"  {us / steps:8.1f} us  {100 * us / max(busy, 1e-9):5.1f}%  {name[:90]}")
    return {
        "kernels_per_decode_step": len(kernels) / steps,
        "busy_ms_per_decode_step": busy / steps / 1e3,
        "idle_ms_per_decode_step": idle / steps / 1e3,
        "idle_share": idle / max(busy + idle, 1e-9),
        "top_kernels_us_per_step": {name[:120]: us / steps for name, us in ranked[:top]},
    }


def main(argv: list[str] | None = None) -> None:
    import tyro

    prog = "python -m project04_llm_inference.bench.profile_step"
    run(tyro.cli(ProfileConfig, args=argv, prog=prog, description=__doc__.split("\n\n")[0]))


if __name__ == "__main__":
    main()
