"""Where a decode step's time goes: torch.profiler over engine steps at one batch and context.

    python -m project04_llm_inference.bench.profile_step --batch 256 --context 1024

Prints the GPU kernels by total time and the host/GPU split of a step (a GPU that idles while
the host prepares the next step shows up as step wall time above the kernels' sum)."""

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


def run(cfg: ProfileConfig) -> None:
    from torch.profiler import ProfilerActivity, profile

    from project04_llm_inference import LLM, SamplingParams

    llm = LLM(
        load_format="dummy",
        dummy_shape=cfg.shape,
        max_model_len=cfg.context + 256,
        max_num_batched_tokens=32768,
        max_num_seqs=max(cfg.batch, 1),
    )
    eng = llm.engine
    g = torch.Generator().manual_seed(0)
    for i in range(cfg.batch):
        ids = torch.randint(0, 1000, (cfg.context,), generator=g).tolist()
        eng.add_request(str(i), ids, SamplingParams(max_tokens=200, temperature=0, ignore_eos=True))
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


def main(argv: list[str] | None = None) -> None:
    import tyro

    run(tyro.cli(ProfileConfig, args=argv))


if __name__ == "__main__":
    main()
