"""Where a speculative step's time goes at batch 1: plain decode, multi-step decode and
draft-model speculation (the default path, `spec_fused_greedy` and, when asked, its rounds:
`spec_fused_rounds`) on random-weight models.

    python -m project04_llm_inference.bench.spec_profile --out runs/<x>/spec_profile.json
    python -m project04_llm_inference.bench.spec_profile --shape tiny --device cpu --steps 5

The target and the draft are random-weight model folders written to a temporary folder, of the
shapes `spec.train_corpus` trains by default (`--shape spec`: an 88 M target, 12 layers, dim 768,
vocabulary 8192; a 5.8 M draft, 2 layers, dim 256; `--shape spec-197m`: the 197 M target, 16
layers, dim 1024, of the committed speculative records, the same draft), or a tiny pair for the
CPU (`--shape tiny`).
Random drafts are rarely accepted, so compare per-step times (what a step costs), not tokens/s;
`--models-dir` takes spec.train_corpus's trained pair instead (target/ and draft/).

Every engine (batch 1, greedy, ignore_eos, prefix caching off) is built alone, warmed up, then:
1. timed steps: wall time of `LLMEngine.step()`, and per phase (the draft's proposal, the
   scheduler, the target's forward, the acceptance, a fused step or program of rounds) the host
   time and, on a GPU, the device time between CUDA events recorded around it; the host time
   spent blocked in read-backs (`Tensor.tolist/item/cpu`, `Event.synchronize`) and their count
   per step;
2. profiled steps (torch.profiler): device busy time (sum of kernel times on the critical
   path), kernels, graph launches, memcpys and synchronising runtime calls per step; the Chrome
   trace of each engine is written next to the JSON.
The JSON holds every engine's numbers and a summary line per engine is printed: step wall,
ms per token, host blocked in read-backs vs the rest of the host, device busy.
"""

from __future__ import annotations

import contextlib
import gc
import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

# spec.train_corpus's default draft: 5.8 M parameters
SPEC_DRAFT = dict(
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=8192,
)
# HF config fields of the pairs (the target's and the draft's), random weights
PAIRS: dict[str, tuple[dict, dict]] = {
    # spec.train_corpus's defaults: 88 M and 5.8 M parameters
    "spec": (
        dict(
            hidden_size=768,
            intermediate_size=2048,
            num_hidden_layers=12,
            num_attention_heads=12,
            num_key_value_heads=4,
            vocab_size=8192,
        ),
        SPEC_DRAFT,
    ),
    # the pair the committed speculative records were measured with (spec.train_corpus
    # --target-dim 1024 --target-layers 16 --target-heads 16 --target-ffn 2816): 197 M, 5.8 M
    "spec-197m": (
        dict(
            hidden_size=1024,
            intermediate_size=2816,
            num_hidden_layers=16,
            num_attention_heads=16,
            num_key_value_heads=4,
            vocab_size=8192,
        ),
        SPEC_DRAFT,
    ),
    "tiny": (
        dict(
            hidden_size=64,
            intermediate_size=192,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=256,
        ),
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            vocab_size=256,
        ),
    ),
}
COMMON = dict(
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
    rope_theta=10_000.0,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
)


TOP_OPS = 15  # device operations listed per engine, the longest first


@dataclass
class SpecProfileConfig:
    out: str = "spec_profile.json"
    """JSON record; the Chrome traces go next to it (<stem>.<engine>.trace.json)."""
    shape: Literal["spec", "spec-197m", "tiny"] = "spec"
    """Random-weight pair: 'spec' (88 M target, 5.8 M draft), 'spec-197m' (the committed
    speculative records' 197 M target, the same draft) or 'tiny' (CPU tests)."""
    models_dir: str | None = None
    """A trained pair instead (spec.train_corpus's folder: target/ and draft/)."""
    ks: tuple[int, ...] = (2, 4)
    """Draft tokens per step, one speculative engine (each path) per k."""
    paths: tuple[Literal["default", "fused", "rounds"], ...] = ("default", "fused")
    """Speculative paths timed: the unfused step ("default": spec_fused_greedy=False), the
    fused one (EngineArgs.spec_fused_greedy) and, with "rounds", the fused step in programs of
    --fused-rounds rounds (EngineArgs.spec_fused_rounds)."""
    fused_rounds: int = 4
    """Rounds per program of the "rounds" path (>= 2)."""
    multi_step: int = 8
    """Also time plain decoding at this many steps per round trip (0 or 1: skip)."""
    prompt_tokens: int = 256
    """Prompt length (random token ids)."""
    warmup_steps: int = 10
    """Untimed steps after the prefill."""
    steps: int = 100
    """Timed steps per engine."""
    profile_steps: int = 20
    """Steps under torch.profiler per engine (0: no profile, no trace)."""
    device: Literal["auto", "cuda", "cpu"] = "auto"
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    enforce_eager: bool = False
    """No CUDA graphs (to see what the graphs save)."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1 or self.warmup_steps < 0 or self.profile_steps < 0:
            raise ValueError("steps must be >= 1, warmup_steps and profile_steps >= 0")
        if any(not 1 <= k <= 64 for k in self.ks):
            raise ValueError(f"ks: expected values in [1, 64], got {self.ks}")
        if "rounds" in self.paths and self.fused_rounds < 2:
            raise ValueError(
                f"fused_rounds: expected >= 2 with path rounds, got {self.fused_rounds}"
            )
        if self.prompt_tokens < 2:
            raise ValueError(f"prompt_tokens: expected >= 2, got {self.prompt_tokens}")


# --- random-weight model folders ------------------------------------------------------------------


def write_random_model(folder: Path, fields: dict, seed: int) -> Path:
    """A Hugging Face-format folder (config.json, model.safetensors) of random weights with the
    engine's dummy initialisation, readable by `model.loader`."""
    from safetensors.torch import save_file

    from ..model.loader import build_model

    cfg = {**COMMON, **fields}
    cfg.setdefault("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    model = build_model(
        cfg, model_dir=None, dtype=torch.float32, device=torch.device("cpu"), max_positions=16
    )
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            if p.dim() > 1:
                p.normal_(0.0, 0.02, generator=g)
        tensors["model.embed_tokens.weight"] = model.embed_tokens
        tensors["model.norm.weight"] = model.norm
        tensors["lm_head.weight"] = model.lm_head
        for i, layer in enumerate(model.layers):
            pre = f"model.layers.{i}."
            q, kv, f = layer.q_size, layer.kv_size, layer.gate_up_proj.shape[0] // 2
            tensors |= {
                pre + "self_attn.q_proj.weight": layer.qkv_proj[:q],
                pre + "self_attn.k_proj.weight": layer.qkv_proj[q : q + kv],
                pre + "self_attn.v_proj.weight": layer.qkv_proj[q + kv :],
                pre + "self_attn.o_proj.weight": layer.o_proj,
                pre + "mlp.gate_proj.weight": layer.gate_up_proj[:f],
                pre + "mlp.up_proj.weight": layer.gate_up_proj[f:],
                pre + "mlp.down_proj.weight": layer.down_proj,
                pre + "input_layernorm.weight": layer.input_layernorm,
                pre + "post_attention_layernorm.weight": layer.post_attention_layernorm,
            }
    folder.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.detach().contiguous().clone() for k, v in tensors.items()},
        folder / "model.safetensors",
    )
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return folder


# --- timing -------------------------------------------------------------------------------------


class Phases:
    """Host and device time of named calls (wrapped instance methods and module functions),
    and the host time blocked in read-backs."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.host: dict[str, list[float]] = {}
        self.events: dict[str, list[tuple]] = {}
        self.wait_s = 0.0
        self.waits = 0
        self._undo: list = []
        self._depth = 0

    def wrap(self, owner, name: str, label: str) -> None:
        fn = getattr(owner, name)

        def timed(*a, **kw):
            ev = None
            if self.cuda:
                ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                ev[0].record()
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.host.setdefault(label, []).append(time.perf_counter() - t0)
                if ev is not None:
                    ev[1].record()
                    self.events.setdefault(label, []).append(ev)

        setattr(owner, name, timed)
        self._undo.append((owner, name, fn))

    def count_waits(self) -> None:
        """Read-backs: a CUDA tensor's tolist/item/cpu, an event's synchronize."""

        def blocking(fn, only_cuda_tensors: bool):
            def timed(obj, *a, **kw):
                if only_cuda_tensors and not obj.is_cuda or self._depth:
                    return fn(obj, *a, **kw)
                self._depth += 1
                t0 = time.perf_counter()
                try:
                    return fn(obj, *a, **kw)
                finally:
                    self._depth -= 1
                    self.wait_s += time.perf_counter() - t0
                    self.waits += 1

            return timed

        for owner, name, cuda_only in (
            (torch.Tensor, "tolist", True),
            (torch.Tensor, "item", True),
            (torch.Tensor, "cpu", True),
            (torch.cuda.Event, "synchronize", False),
        ):
            fn = getattr(owner, name)
            setattr(owner, name, blocking(fn, cuda_only))
            self._undo.append((owner, name, fn if name in owner.__dict__ else None))

    def restore(self) -> None:
        for owner, name, fn in reversed(self._undo):
            if fn is None:
                delattr(owner, name)  # inherited: the class's own lookup again
            else:
                setattr(owner, name, fn)
        self._undo.clear()

    def summary(self, steps: int) -> dict:
        if self.cuda:
            torch.cuda.synchronize()
        out = {}
        for label, hs in self.host.items():
            row = {"calls_per_step": len(hs) / steps, "host_ms_per_step": 1e3 * sum(hs) / steps}
            evs = self.events.get(label)
            if evs:
                row["device_span_ms_per_step"] = sum(a.elapsed_time(b) for a, b in evs) / steps
            out[label] = row
        return out


API_CALLS = {
    "kernel_launches": (
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
    ),
    "graph_launches": ("cudaGraphLaunch", "cuGraphLaunch"),
    "memcpy_async": ("cudaMemcpyAsync",),
    "sync_calls": (
        "cudaStreamSynchronize",
        "cudaEventSynchronize",
        "cudaDeviceSynchronize",
        "cudaMemcpy",
    ),
    "host_alloc": ("cudaHostAlloc", "cudaMallocHost"),
}


def profile_steps(eng, steps: int, trace: Path | None) -> dict:
    """torch.profiler over `steps` engine steps: per step, device busy (critical path of the
    kernels and copies), their count, and the runtime calls of API_CALLS."""
    from torch.profiler import ProfilerActivity, profile

    cuda = eng.device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for _ in range(steps):
            eng.step()
        if cuda:
            torch.cuda.synchronize()
    if trace is not None:
        prof.export_chrome_trace(str(trace))
    out: dict = {"steps": steps}
    names: dict[str, int] = {}
    for e in prof.key_averages():
        names[e.key] = names.get(e.key, 0) + e.count
    for what, keys in API_CALLS.items():
        out[what + "_per_step"] = sum(names.get(k, 0) for k in keys) / steps
    if cuda:
        dev = sorted(
            (e for e in prof.events() if e.device_type.name == "CUDA"),
            key=lambda e: e.time_range.start,
        )
        busy, last = 0.0, None
        for e in dev:
            start, end = e.time_range.start, e.time_range.end
            if last is not None:
                start = max(start, last)
            busy += max(0.0, end - start)
            last = end if last is None else max(last, end)
        out["device_busy_ms_per_step"] = busy / 1e3 / steps
        out["device_ops_per_step"] = len(dev) / steps
        out["top_device_ops"] = top_ops(dev, steps)
    return out


def top_ops(events, steps: int, n: int = TOP_OPS) -> list[dict]:
    """The `n` device operations (kernels, copies) that took the most time, by name: their
    time (ms) and calls per step, so a step's device time can be told apart by kernel."""
    by: dict[str, list[float]] = {}
    for e in events:
        t = by.setdefault(e.name, [0.0, 0])
        t[0] += max(0.0, e.time_range.end - e.time_range.start)
        t[1] += 1
    rows = sorted(by.items(), key=lambda kv: -kv[1][0])[:n]
    return [
        {"name": name[:120], "ms_per_step": us / 1e3 / steps, "calls_per_step": c / steps}
        for name, (us, c) in rows
    ]


# --- one engine ---------------------------------------------------------------------------------


def engine_plan(cfg: SpecProfileConfig) -> list[tuple[str, dict]]:
    """(name, EngineArgs overrides) of every engine, plain decoding first."""
    plan = [("plain", {})]
    if cfg.multi_step > 1:
        plan.append((f"multi-step-{cfg.multi_step}", dict(num_scheduler_steps=cfg.multi_step)))
    for k in cfg.ks:
        for path in cfg.paths:
            kw = dict(
                speculative_method="draft",
                num_speculative_tokens=k,
                spec_fused_greedy=path != "default",
            )
            if path != "default":  # "fused": the one-round step (rounds are the default)
                kw["spec_fused_rounds"] = cfg.fused_rounds if path == "rounds" else 1
            name = (
                f"draft-k{k}-rounds{cfg.fused_rounds}" if path == "rounds" else f"draft-k{k}-{path}"
            )
            plan.append((name, kw))
    return plan


def measure(
    cfg: SpecProfileConfig, name: str, over: dict, target: Path, draft: Path, out_dir: Path
):
    from ..config import SamplingParams
    from ..engine.llm import LLM
    from ..spec import speculator

    k = over.get("num_speculative_tokens", 0)
    per_step = max(over.get("spec_fused_rounds", 1) * (k + 1), over.get("num_scheduler_steps", 1))
    total = cfg.warmup_steps + cfg.steps + cfg.profile_steps + 4
    max_tokens = total * per_step + 8
    max_len = cfg.prompt_tokens + max_tokens + 16
    blocks = 2 * (-(-max_len // 16)) + 8
    kw = dict(over)
    if "speculative_method" in kw:
        kw["speculative_model"] = str(draft)
    llm = LLM(
        str(target),
        device=cfg.device,
        dtype=cfg.dtype,
        seed=cfg.seed,
        max_model_len=max_len,
        max_num_seqs=1,
        cuda_graph_max_batch=1,
        num_gpu_blocks=blocks,
        enable_prefix_caching=False,
        enforce_eager=cfg.enforce_eager,
        **kw,
    )
    eng = llm.engine
    cuda = eng.device.type == "cuda"
    g = torch.Generator().manual_seed(cfg.seed)
    prompt = torch.randint(3, eng.vocab_size, (cfg.prompt_tokens,), generator=g).tolist()
    eng.add_request(
        "0", prompt, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    )
    while (
        any(s.num_computed_tokens < len(s.prompt_token_ids) for s in eng.scheduler.running)
        or eng.scheduler.waiting
    ):
        eng.step()
    for _ in range(cfg.warmup_steps):
        eng.step()
    if cuda:
        torch.cuda.synchronize()
    c0 = dict(eng.stats())
    log0 = len(eng.step_log)
    f0 = (0, 0) if eng.fused is None else (eng.fused.runs, eng.fused.round_runs)
    ph = Phases(cuda)
    ph.wrap(eng, "step", "step")
    ph.wrap(eng.scheduler, "schedule", "schedule")
    ph.wrap(eng.runner, "run", "target_run")
    ph.wrap(speculator, "verify_groups", "accept")
    if eng.proposer is not None:
        ph.wrap(eng.proposer, "propose", "draft_propose")
    if eng.fused is not None:
        ph.wrap(eng.fused, "run", "fused_run")
    ph.count_waits()
    walls = []
    try:
        for _ in range(cfg.steps):
            t0 = time.perf_counter()
            eng.step()
            walls.append(time.perf_counter() - t0)
        if cuda:
            torch.cuda.synchronize()
    finally:
        ph.restore()
    c1 = eng.stats()
    emitted = c1["decode_tokens"] - c0["decode_tokens"]
    records = eng.step_log[log0:]
    engine_steps = sum(r.num_steps for r in records)
    wall_ms = 1e3 * statistics.median(walls)
    row = {
        "engine": name,
        "overrides": over,
        "step_calls": cfg.steps,
        "engine_steps": engine_steps,
        "tokens": emitted,
        "tokens_per_call": emitted / cfg.steps,
        "wall_ms_per_call_median": wall_ms,
        "wall_ms_per_call_mean": 1e3 * statistics.fmean(walls),
        "ms_per_token": 1e3 * sum(walls) / max(emitted, 1),
        "host_blocked_ms_per_call": 1e3 * ph.wait_s / cfg.steps,
        "readbacks_per_call": ph.waits / cfg.steps,
        "phases": ph.summary(cfg.steps),
        "spec": {
            key: c1[key] - c0[key]
            for key in ("spec_proposed_tokens", "spec_accepted_tokens", "spec_verifications")
        },
        # timed calls that took the fused path, and of those the programs of spec_fused_rounds
        # rounds (the others ran one round: not every sequence could take R rounds)
        "fused_steps": None if eng.fused is None else eng.fused.runs - f0[0],
        "fused_round_programs": None if eng.fused is None else eng.fused.round_runs - f0[1],
    }
    if cfg.profile_steps:
        trace = out_dir / f"{Path(cfg.out).stem}.{name}.trace.json"
        row["profile"] = profile_steps(eng, cfg.profile_steps, trace)
        row["trace"] = trace.name
    del llm, eng
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return row


def summary_line(row: dict) -> str:
    p = row.get("profile", {})
    busy = p.get("device_busy_ms_per_step")
    phases = ", ".join(
        f"{k} {v['host_ms_per_step']:.3f}"
        + (f"/{v['device_span_ms_per_step']:.3f}" if "device_span_ms_per_step" in v else "")
        for k, v in row["phases"].items()
        if k != "step"
    )
    return (
        f"{row['engine']:>20}: {row['wall_ms_per_call_median']:.3f} ms/step, "
        f"{row['ms_per_token']:.3f} ms/token ({row['tokens_per_call']:.2f} tok/step), "
        f"blocked in {row['readbacks_per_call']:.1f} read-backs {row['host_blocked_ms_per_call']:.3f} ms, "
        f"device busy {'n/a' if busy is None else f'{busy:.3f}'} ms, "
        f"kernels {p.get('kernel_launches_per_step', 0):.0f} + graphs {p.get('graph_launches_per_step', 0):.1f}"
        f" | phases host/device ms: {phases}"
    )


def run(cfg: SpecProfileConfig) -> dict:
    out = Path(cfg.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        if cfg.models_dir is not None:
            target, draft = Path(cfg.models_dir) / "target", Path(cfg.models_dir) / "draft"
        else:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            t_fields, d_fields = PAIRS[cfg.shape]
            target = write_random_model(tmp / "target", t_fields, cfg.seed)
            draft = write_random_model(tmp / "draft", d_fields, cfg.seed + 1)
        rows = []
        for name, over in engine_plan(cfg):
            rows.append(measure(cfg, name, over, target, draft, out.parent))
            print(summary_line(rows[-1]), flush=True)
            for op in rows[-1].get("profile", {}).get("top_device_ops", []):
                print(
                    f"{'':>22}{op['ms_per_step']:.4f} ms/step in {op['calls_per_step']:.1f} "
                    f"calls: {op['name']}"
                )
    env = {"torch": torch.__version__, "cuda": torch.version.cuda}
    if torch.cuda.is_available() and cfg.device != "cpu":
        env["gpu"] = torch.cuda.get_device_name()
    record = {
        "config": {k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
        "env": env,
        "engines": rows,
    }
    out.write_text(json.dumps(record, indent=2, default=str) + "\n")
    print(f"wrote {out}")
    return record


def main(argv: list[str] | None = None) -> None:
    import tyro

    prog = "python -m project04_llm_inference.bench.spec_profile"
    run(tyro.cli(SpecProfileConfig, args=argv, prog=prog, description=__doc__.split("\n\n")[0]))


if __name__ == "__main__":
    main()
