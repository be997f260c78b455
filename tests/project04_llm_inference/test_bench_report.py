"""project04's benchmarks and report on the CPU: workloads, arithmetic, the vLLM plumbing, the
static baseline's model against transformers, and the report from hand-written records."""

from __future__ import annotations

import json
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from project04_llm_inference.bench import baselines, offline
from project04_llm_inference.bench.baselines import StaticCudaGraphDecoder, StaticLlama, Workload
from project04_llm_inference.config import DUMMY_SHAPES
from project04_llm_inference.report import render, targets

from .conftest import RECORD_ENV as ENV

LLAMA_1B = DUMMY_SHAPES["llama-3.2-1b"]
# A tiny Llama with GQA 4/2, Llama-3 RoPE scaling (positions past 32 are rescaled), untied head.
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=97,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    rope_theta=10_000.0,
    tie_word_embeddings=False,
    rope_scaling=dict(
        rope_type="llama3",
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=32,
    ),
)


# --- workloads -------------------------------------------------------------------------------


def test_random_workload_is_seeded_and_in_range():
    a = offline.random_workload(300, (128, 2048), (64, 1024), 128_256, seed=3)
    b = offline.random_workload(300, (128, 2048), (64, 1024), 128_256, seed=3)
    c = offline.random_workload(300, (128, 2048), (64, 1024), 128_256, seed=4)
    assert a == b and a != c
    assert all(128 <= len(p) <= 2048 for p in a.prompts)
    assert all(64 <= n <= 1024 for n in a.output_lens)
    # Ids stay clear of Llama-3's reserved tail (128,000+) and of ids 0-2.
    assert all(3 <= t < 128_000 for p in a.prompts for t in p)
    d = offline.describe(a)
    assert d["requests"] == 300 and d["prompt_tokens"] == a.prompt_tokens
    assert a.head(10).prompts == a.prompts[:10]
    with pytest.raises(ValueError):
        offline.random_workload(5, (10, 5), (1, 2), 1000, seed=0)


def test_shared_prefix_workload():
    wl = offline.shared_prefix_workload(20, 1024, 64, 64, 128_256, seed=0)
    assert len({tuple(p[:1024]) for p in wl.prompts}) == 1
    assert len({tuple(p[1024:]) for p in wl.prompts}) == 20
    assert all(len(p) == 1088 for p in wl.prompts) and wl.output_lens == [64] * 20


# --- arithmetic ------------------------------------------------------------------------------


def test_bandwidth_floor_of_llama_3_2_1b():
    assert offline.param_count(LLAMA_1B) == pytest.approx(1.236e9, rel=1e-3)
    assert offline.weight_bytes(LLAMA_1B) == pytest.approx(2.47e9, rel=2e-3)  # bf16
    assert offline.decode_floor_ms(LLAMA_1B, 1, 0, 4.3) == pytest.approx(0.575, abs=5e-4)
    # 16 layers x (K, V) x 8 KV heads x 64 x 2 bytes
    assert offline.kv_bytes_per_token(LLAMA_1B) == 32_768
    kv_ms = 256 * 1024 * 32_768 / 4.3e12 * 1e3
    assert offline.decode_floor_ms(LLAMA_1B, 256, 1024) == pytest.approx(0.5748 + kv_ms, abs=1e-3)


def test_decode_median_uses_pure_decode_steps_only():
    @dataclass
    class Step:
        prefill_tokens: int
        decode_seqs: int
        duration_s: float

    steps = [
        Step(4096, 3, 0.9),
        Step(0, 8, 0.002),
        Step(0, 8, 0.004),
        Step(0, 8, 0.003),
        Step(0, 7, 0.0001),
        Step(12, 8, 0.5),
    ]
    assert offline.decode_ms_from_step_log(steps, 8) == (pytest.approx(3.0), 3)
    assert offline.decode_ms_from_step_log(steps, 64) == (None, 0)


def test_decode_median_splits_multi_step_records():
    """A record of k decode steps run back to back is k steps of duration / k each."""
    step = types.SimpleNamespace
    steps = [
        step(prefill_tokens=0, decode_seqs=8, duration_s=0.008, num_steps=4),
        step(prefill_tokens=0, decode_seqs=8, duration_s=0.012, num_steps=4),
        step(prefill_tokens=0, decode_seqs=8, duration_s=0.0025, num_steps=1),
    ]
    # per step: 2, 3, 2.5 ms -> median 2.5 over 9 steps
    assert offline.decode_ms_from_step_log(steps, 8) == (pytest.approx(2.5), 9)


def test_targets_take_the_faster_engine_configuration_and_name_it():
    def rec(rows):
        return {"decode_latency": {"results": {"rows": rows}}}

    row = {"batch": 1, "context": 1024, "engine_ms": 1.5, "engine_multi_ms": 0.7, "multi_step_k": 8}
    t = targets(rec([row]))[0]
    assert t["measured"] == 0.7 and t["met"] is True and "8 steps per round trip" in t["unit"]
    t = targets(rec([{**row, "engine_multi_ms": 2.0}]))[0]
    assert t["measured"] == 1.5 and t["met"] is False and "one step" in t["unit"]
    t = targets(rec([{"batch": 1, "context": 1024, "engine_ms": 1.5}]))[0]
    assert t["measured"] == 1.5 and t["unit"] == "ms/token"  # older records: nothing to name
    r64 = {
        "batch": 64,
        "context": 1024,
        "engine_ms": 3.2,
        "engine_multi_ms": 1.6,
        "multi_step_k": 8,
    }
    t = targets(rec([r64]))[2]
    assert t["measured"] == pytest.approx(40_000) and t["met"] is True


def test_static_allocation_arithmetic():
    budget = 1024 * 16 * 32_768  # 1,024 blocks of 16 tokens at 32 KiB per token
    assert offline.static_max_seqs(budget, 4096, 32_768) == 4
    plan = offline.latency_plan(offline.LatencyConfig(batches=(256,), contexts=(8192,)))
    # 256 x 8,192 prompt tokens at 32,768 per step: 64 prefill steps, +25%, + 64 + 16
    assert plan == [{"batch": 256, "context": 8192, "max_tokens": 160}]


# --- vLLM runner -----------------------------------------------------------------------------


def _fake_vllm(calls: dict) -> types.ModuleType:
    mod = types.ModuleType("vllm")
    mod.__version__ = "0.0-fake"

    class SamplingParams:
        def __init__(self, **kw):
            self.kw = kw

    class LLM:
        def __init__(self, **kw):
            calls["init"] = kw
            calls["config"] = json.loads((Path(kw["model"]) / "config.json").read_text())

        def generate(self, prompts, params, use_tqdm=True):
            calls.setdefault("generate", []).append((prompts, params))
            out = types.SimpleNamespace
            return [out(outputs=[out(token_ids=[7] * p.kw["max_tokens"])]) for p in params]

    mod.SamplingParams, mod.LLM = SamplingParams, LLM
    return mod


def test_vllm_runner_maps_the_workload(monkeypatch):
    calls: dict = {}
    monkeypatch.setitem(sys.modules, "vllm", _fake_vllm(calls))
    wl = Workload([[5, 6, 7], [8, 9]], [4, 2])
    r = baselines.run_vllm(wl, TINY, max_model_len=128, gpu_memory_utilization=0.5)
    assert r["measured"] and r["produced_tokens"] == 6 and r["output_tokens"] == 6
    assert r["output_tok_s"] > 0 and r["vllm"] == "0.0-fake"
    init = calls["init"]
    assert init["load_format"] == "dummy" and init["skip_tokenizer_init"]
    assert init["max_model_len"] == 128 and init["gpu_memory_utilization"] == 0.5
    assert calls["config"]["architectures"] == ["LlamaForCausalLM"]
    assert calls["config"]["num_key_value_heads"] == 2
    prompts, params = calls["generate"][-1]  # the timed call (the first is the warm-up)
    assert prompts == [{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [8, 9]}]
    assert [p.kw for p in params] == [
        dict(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True, detokenize=False)
        for n in (4, 2)
    ]


def test_vllm_runner_says_not_measured_without_vllm(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    r = baselines.run_vllm(Workload([[1]], [1]), TINY)
    assert r["measured"] is False and "output_tok_s" not in r
    assert r["reason"].startswith("not measured here") and "vllm" in r["reason"]


# --- static CUDA-graph baseline's model against transformers ---------------------------------


def _hf_to_static(sd: dict, n_layers: int) -> dict:
    own = {
        "embed.weight": sd["model.embed_tokens.weight"],
        "norm.weight": sd["model.norm.weight"],
        "lm_head.weight": sd["lm_head.weight"],
    }
    for i in range(n_layers):
        p, q = f"model.layers.{i}.", f"layers.{i}."
        own[q + "wqkv.weight"] = torch.cat([sd[p + f"self_attn.{n}_proj.weight"] for n in "qkv"])
        own[q + "wo.weight"] = sd[p + "self_attn.o_proj.weight"]
        own[q + "w13.weight"] = torch.cat(
            [sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]]
        )
        own[q + "w2.weight"] = sd[p + "mlp.down_proj.weight"]
        own[q + "attn_norm.weight"] = sd[p + "input_layernorm.weight"]
        own[q + "mlp_norm.weight"] = sd[p + "post_attention_layernorm.weight"]
    return own


@pytest.fixture
def hf_tiny():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY)).eval()


def test_static_llama_matches_transformers_prefill_and_decode(hf_tiny):
    model = StaticLlama(TINY)
    model.load_state_dict(_hf_to_static(hf_tiny.state_dict(), 2))
    model.setup_cache(2, 64)
    ids = torch.randint(0, 97, (2, 50), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf_tiny(ids).logits  # (2, 50, V) float32
        model.cache_len = 40
        torch.testing.assert_close(model(ids[:, :40]), ref[:, 39], atol=1e-5, rtol=1e-4)
        model.cache_len, pos = 64, torch.tensor([40])
        for t in range(40, 50):  # decode reads the cache it wrote, past RoPE's rescaled range
            torch.testing.assert_close(
                model(ids[:, t : t + 1], pos), ref[:, t], atol=1e-5, rtol=1e-4
            )
            pos += 1


def test_static_decoder_greedy_tokens_match_transformers_generate(hf_tiny):
    dec = StaticCudaGraphDecoder(TINY, 2, 32, dtype=torch.float32, device="cpu")
    dec.model.load_state_dict(_hf_to_static(hf_tiny.state_dict(), 2))
    ids = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = hf_tiny.generate(
            ids, max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0
        )[:, 12:]
    dec.prefill(ids)
    dec.capture(20)  # on the CPU: eager steps, same code path as the graph's body
    got = [dec.tok[:, 0].clone()]
    for _ in range(7):
        dec.step()
        dec.pos.add_(1)
        got.append(dec.tok[:, 0].clone())
    assert torch.equal(torch.stack(got, 1), want)


def test_generate_static_counts_the_padding_waste():
    wl = Workload([[5] * 6, [6] * 3, [7] * 4], [4, 2, 3])
    tiny = {**TINY, "num_hidden_layers": 1}
    r = baselines.generate_static(tiny, wl, batch_size=2, dtype=torch.float32, device="cpu")
    assert r["measured"] and r["batches"] == 2 and r["output_tokens"] == 9
    # batch 1: 2 rows x max(4, 2); batch 2: 2 rows (one a pad row) x 3
    assert r["computed_output_tokens"] == 2 * 4 + 2 * 3
    assert r["padded_prompt_tokens"] == 2 * 6 + 2 * 4
    assert r["output_waste_fraction"] == pytest.approx(1 - 9 / 14)


# --- benchmark plumbing with a fake engine ---------------------------------------------------


class _FakeEngine:
    def __init__(self, args):
        self.args, self.step_log = args, []
        self.counters = dict.fromkeys(offline.COUNTERS, 0)
        self.peak = 0

    def stats(self):
        return {
            "num_kv_blocks": self.args.num_gpu_blocks or 100,
            "block_size": 16,
            "peak_running_seqs": self.peak,
            **self.counters,
        }


class _FakeLLM:
    """Steps like a continuous-batching engine: one prefill step, then pure decode steps."""

    def __init__(self, args):
        self.engine = _FakeEngine(args)

    def generate(self, prompts, params, use_tqdm=True):
        step = types.SimpleNamespace
        n = len(prompts)
        self.engine.peak = max(self.engine.peak, min(n, self.engine.args.max_num_seqs))
        hit = sum(len(p) // 2 for p in prompts) if self.engine.args.enable_prefix_caching else 0
        self.engine.counters["prefill_tokens_computed"] += sum(map(len, prompts)) - hit
        self.engine.counters["prefix_cache_hits"] += hit
        self.engine.step_log.append(
            step(prefill_tokens=sum(map(len, prompts)), decode_seqs=0, duration_s=1.0)
        )
        for _ in range(max(p.max_tokens for p in params)):
            self.engine.step_log.append(step(prefill_tokens=0, decode_seqs=n, duration_s=1e-3 * n))
        return [types.SimpleNamespace(token_ids=[1] * p.max_tokens) for p in params]


@pytest.fixture
def fake_engine(monkeypatch):
    from project04_llm_inference.config import EngineArgs, SamplingParams

    monkeypatch.setattr(offline, "_engine", lambda: (_FakeLLM, EngineArgs, SamplingParams))
    monkeypatch.setattr(offline, "_has_gpu", lambda what: True)
    monkeypatch.setattr(baselines, "decode_step_ms", lambda c, b, ctx: 0.5 * b)
    monkeypatch.setattr(baselines, "decode_step_times", lambda c, b, ctx, n: [0.5 * b] * n)


def test_latency_memory_prefix_records_with_a_fake_engine(fake_engine, tmp_path):
    common = dict(shape="tiny", reports_dir=str(tmp_path))
    lat = offline.run_latency(
        offline.LatencyConfig(
            batches=(1, 4), contexts=(32,), decode_steps=4, max_num_batched_tokens=64, **common
        )
    )
    assert [r["engine_ms"] for r in lat["rows"]] == [pytest.approx(1.0), pytest.approx(4.0)]
    assert lat["rows"][1]["engine_tok_s"] == pytest.approx(1000.0)
    assert lat["rows"][1]["static_cuda_graph_ms"] == 2.0
    mem = offline.run_memory(
        offline.MemoryConfig(
            num_gpu_blocks=64,
            max_model_len=256,
            num_requests=20,
            prompt_len=(8, 16),
            output_len=(4, 8),
            **common,
        )
    )
    assert mem["paged_peak_running_seqs"] == 20 and mem["static_max_seqs"] == 4  # 1,024 / 256
    pre = offline.run_prefix(
        offline.PrefixConfig(
            num_requests=6, prefix_len=32, unique_len=4, output_len=3, overhead_repeats=2, **common
        )
    )
    assert (
        pre["shared"]["on"]["prefill_tokens_computed"]
        < pre["shared"]["off"]["prefill_tokens_computed"]
    )
    assert pre["ttft"] is None and "serving" in pre["ttft_note"]
    folder = tmp_path / "project04_llm_inference"
    assert {p.stem for p in folder.glob("*.json")} == {
        "decode_latency",
        "kv_memory",
        "prefix_caching",
    }
    paths = render(tmp_path)
    assert "not measured: no record" in paths[0].read_text()  # the throughput record is absent


def test_latency_frees_the_engine_before_its_baselines(fake_engine, tmp_path, monkeypatch):
    """The static-graph baseline sizes itself from free memory: when it runs, no engine may be
    alive (the timed closures once kept it, and its KV pool, allocated)."""
    import gc
    import weakref

    made, alive = [], []

    class Tracked(_FakeLLM):
        def __init__(self, args):
            super().__init__(args)
            made.append(weakref.ref(self))

    def static_times(c, b, ctx, n):
        gc.collect()
        alive.append(sum(r() is not None for r in made))
        return [0.5 * b] * n

    from project04_llm_inference.config import EngineArgs, SamplingParams

    monkeypatch.setattr(offline, "_engine", lambda: (Tracked, EngineArgs, SamplingParams))
    monkeypatch.setattr(baselines, "decode_step_times", static_times)
    offline.run_latency(
        offline.LatencyConfig(
            shape="tiny",
            reports_dir=str(tmp_path),
            batches=(1, 4),
            contexts=(32,),
            decode_steps=4,
            max_num_batched_tokens=64,
            sync_single_step=True,
        )
    )
    assert made and alive == [0, 0]


def test_throughput_record_with_fakes(fake_engine, tmp_path, monkeypatch):
    monkeypatch.setattr(
        baselines,
        "generate_static",
        lambda c, wl, batch_size: baselines._rates(
            wl, 2.0, computed_output_tokens=2 * wl.output_tokens, output_waste_fraction=0.5
        ),
    )
    monkeypatch.setattr(
        baselines, "run_transformers", lambda c, wl, batch_size: baselines._rates(wl, 10.0)
    )
    monkeypatch.setitem(sys.modules, "vllm", None)
    cfg = offline.ThroughputConfig(
        shape="tiny",
        num_requests=10,
        prompt_len=(4, 8),
        output_len=(2, 4),
        transformers_requests=4,
        reports_dir=str(tmp_path),
    )
    res = offline.run_throughput(cfg)
    assert res["engine"]["produced_output_tokens"] == res["workload"]["output_tokens"]
    assert (
        res["transformers"]["requests"] == 4 and "first 4 of 10" in res["transformers"]["subsample"]
    )
    assert res["static_cuda_graph"]["subsample"] is None
    assert res["vllm"]["measured"] is False and res["ratios"]["engine_vs_vllm"] is None
    assert res["ratios"]["engine_vs_static_cuda_graph"] > 0


def test_no_gpu_is_one_line_and_no_record(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert offline.run_memory(offline.MemoryConfig(reports_dir=str(tmp_path))) is None
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "needs a CUDA GPU" in out[0]
    assert not any(tmp_path.iterdir())


# --- report ----------------------------------------------------------------------------------


def _records(tmp_path: Path, *, fast: bool) -> Path:
    from shared.results import save_result

    def lat_row(b, ctx, ms):
        return {
            "batch": b,
            "context": ctx,
            "context_max": ctx + 100,
            "engine_ms": ms,
            "engine_tok_s": b / ms * 1e3,
            "engine_pure_steps": 64,
            "static_cuda_graph_ms": 1.4 * ms,
            "static_cuda_graph_tok_s": b / (1.4 * ms) * 1e3,
            "floor_ms": 0.58,
            "engine_vs_floor": ms / 0.58,
        }

    scale = 1.0 if fast else 2.0  # slow: every time doubled, so every target is missed
    rows = [
        lat_row(1, 1024, 0.7 * scale),
        lat_row(1, 8192, 0.78 * scale),
        lat_row(64, 1024, 1.5 * scale),
        lat_row(256, 1024, 3.8 * scale),
    ]
    save_result(
        offline.PROJECT,
        "decode_latency",
        {
            "rows": rows,
            "bandwidth_tb_s": 4.3,
            "weight_bytes": 2.47e9,
            "params": 1.236e9,
            "kv_bytes_per_token": 32768,
            "note": "n",
        },
        reports_dir=tmp_path,
        env=ENV,
    )
    wl = {
        "requests": 2000,
        "prompt_len_min": 128,
        "prompt_len_max": 2048,
        "output_len_min": 64,
        "output_len_max": 1024,
    }
    thr = {
        "workload": wl,
        "engine": {
            "measured": True,
            "requests": 2000,
            "output_tok_s": 32_000 / scale,
            "total_tok_s": 90_000 / scale,
            "wall_s": 34.0 * scale,
        },
        "static_cuda_graph": {
            "measured": True,
            "requests": 2000,
            "output_tok_s": 12_000.0,
            "total_tok_s": 40_000.0,
            "wall_s": 90.0,
            "subsample": None,
            "computed_output_tokens": 2_000_000,
            "output_tokens": 1_090_000,
            "output_waste_fraction": 0.455,
        },
        "transformers": {
            "measured": True,
            "requests": 64,
            "output_tok_s": 700.0,
            "subsample": "ran the first 64 of 2000 requests",
        },
        "vllm": {"measured": False, "reason": "not measured here: No module named 'vllm'"},
        "ratios": {
            "engine_vs_static_cuda_graph": 2.7,
            "engine_vs_transformers": 45.0,
            "engine_vs_vllm": None,
        },
    }
    save_result(offline.PROJECT, "offline_throughput", thr, reports_dir=tmp_path, env=ENV)
    pre = {
        "shared": {
            "off": {
                "prefill_tokens_computed": 544_000,
                "prefix_cache_hit_tokens": 0,
                "output_tok_s": 5000.0,
                "wall_s": 6.4,
            },
            "on": {
                "prefill_tokens_computed": 33_000,
                "prefix_cache_hit_tokens": 511_000,
                "output_tok_s": 20_000.0,
                "wall_s": 1.6,
            },
            "speedup": 4.0,
            "prompt_tokens": 544_000,
        },
        "unshared": {
            "off": {"wall_s": [5.0, 5.1, 5.0]},
            "on": {"wall_s": [5.0, 5.1, 5.05]},
            "overhead_pct": 1.0 if fast else 3.5,
            "target_pct": 2.0,
        },
        "ttft": None,
        "ttft_note": "left to the serving benchmark",
    }
    save_result(offline.PROJECT, "prefix_caching", pre, reports_dir=tmp_path, env=ENV)
    return tmp_path


@pytest.mark.parametrize("fast", [True, False])
def test_report_renders_from_records_alone(tmp_path, fast, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the report needs no GPU
    root = _records(tmp_path, fast=fast)
    paths = render(root)
    assert [p.name for p in paths] == [
        "results.md",
        "summary.md",
        "decode_latency.png",
        "throughput.png",
    ]
    assert all(p.exists() and p.stat().st_size > 0 for p in paths)
    md = paths[0].read_text()
    assert "NVIDIA H200" in md and "commit abcdef1234" in md  # the environment line
    assert "not measured here: No module named 'vllm'" in md  # vLLM absent: said, not invented
    assert "ms/token" in md and "output tok/s" in md  # units
    assert "## kv_memory\n\nnot measured: no record." in md
    tg = targets(
        {
            n: json.loads((root / offline.PROJECT / f"{n}.json").read_text())
            for n in ("decode_latency", "offline_throughput", "prefix_caching")
        }
    )
    assert [t["met"] for t in tg if t["met"] is not None] == [fast] * 6
    assert [t["target"] for t in tg if t["met"] is None] == [
        "paged decode kernel >= 80% of the copy bandwidth (batch 64/256, context >= 8k)"
    ]  # no decode_attention record here: "not measured", never a number
    assert md.count("| missed |") == (0 if fast else 6) and md.count("| met |") == (
        6 if fast else 0
    )


def test_targets_without_records_are_not_measured(tmp_path):
    assert all(t["met"] is None and t["measured"] is None for t in targets({}))
    with pytest.raises(FileNotFoundError):
        render(tmp_path)


def test_published_report_regenerates_byte_for_byte(tmp_path, repo_root):
    """The committed results.md and summary.md are exactly what the committed JSON renders to."""
    import shutil

    published = repo_root / "reports" / offline.PROJECT
    if not published.is_dir():
        pytest.skip("no published project04 results in this checkout")
    copy = tmp_path / offline.PROJECT
    copy.mkdir()
    for f in published.glob("*.json"):
        shutil.copy(f, copy / f.name)
    render(tmp_path)
    for name in ("results.md", "summary.md"):
        assert (copy / name).read_text() == (published / name).read_text(), name


def test_serving_section_states_the_slo_rate_and_refusals(tmp_path, monkeypatch):
    """The serving record renders its runs, the highest rate meeting the SLO (or 'none'), the
    offline ratio when known, and every refused request with its reason."""
    from shared.results import save_result

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def run(rate, ok, failed=0):
        pct = {"n": 10, "mean_ms": 5.0, "p50_ms": 4.0, "p90_ms": 6.0, "p99_ms": 9.0}
        errs = [{"error": "HTTP 503: server overloaded", "count": failed}] if failed else []
        return {
            "request_rate": rate,
            "max_concurrency": 0,
            "completed": 10 - failed,
            "failed": failed,
            "request_throughput": 3.0,
            "output_tok_s": 900.0,
            "ttft": pct,
            "tpot": pct,
            "itl": pct,
            "e2e": pct,
            "slo_met": ok,
            "errors": errs,
        }

    slo = {"ttft_ms": 500.0, "tpot_ms": 50.0, "e2e_ms": 0.0, "attainment": 0.9}
    res = {
        "workload": {"num_requests": 10},
        "slo": slo,
        "runs": [run("4", True), run("inf", False, 3)],
        "max_rate_meeting_slo": {"request_rate": "4"},
        "offline": {
            "serving_vs_offline": 0.9,
            "serving_output_tok_s": 900.0,
            "offline_output_tok_s": 1000.0,
            "overhead_pct": 10.0,
            "workload_differences": {"num_requests": {"serving": 10, "offline": 2000}},
        },
    }
    save_result(offline.PROJECT, "serving", res, reports_dir=tmp_path, env=ENV)
    paths = render(tmp_path)
    md = paths[0].read_text()
    assert "## Serving" in md and "**4 req/s**" in md and "3 x HTTP 503" in md
    assert "0.900x the offline engine" in md and "num_requests 10 vs 2000" in md
    assert "serving.png" in [p.name for p in paths]
    assert (
        "highest offered rate meeting the SLO (TTFT <= 500 ms, TPOT <= 50 ms for 90% of requests): 4 req/s"
        in paths[1].read_text()
    )
    res["max_rate_meeting_slo"], res["offline"] = None, None
    save_result(offline.PROJECT, "serving", res, reports_dir=tmp_path, env=ENV)
    assert "Highest offered rate meeting it: **none**." in render(tmp_path)[0].read_text()
