"""project04's benchmarks repeat their headline figures and the report shows the range (CPU):
latency interleaves one-step and multi-step runs, throughput repeats on fresh token ids,
prefix caching's overhead is the median of paired runs; tables read "median (min–max)" and a
record of one run renders exactly as before."""

from __future__ import annotations

import types

import pytest
import torch

from project04_llm_inference.bench import baselines, offline
from project04_llm_inference.report import render, targets
from shared.repeat import Spread, flat
from shared.results import save_result

from .conftest import RECORD_ENV as ENV


class _Engine:
    def __init__(self, args, log):
        self.args, self.step_log, self.log = args, [], log
        self.counters = dict.fromkeys(offline.COUNTERS, 0)

    def stats(self):
        return {"num_kv_blocks": 100, "block_size": 16, "peak_running_seqs": 1, **self.counters}


def fake_llm_class(ms_of_call):
    """An LLM whose decode steps in its i-th generate call take ms_of_call(i, k) ms each, k the
    decode steps per round trip it runs with (negative: multi-step without the next run queued
    ahead); every call is logged as (k, prompts)."""
    calls: list = []

    class LLM:
        def __init__(self, args):
            self.engine = _Engine(args, calls)

        def generate(self, prompts, params, use_tqdm=True):
            k, i = self.engine.args.num_scheduler_steps, len(calls)
            queue_ahead = getattr(self.engine.args, "async_multi_step", True)
            signed = k if queue_ahead or k == 1 else -k
            calls.append((signed, [list(p) for p in prompts]))
            step = types.SimpleNamespace
            self.engine.step_log.append(
                step(prefill_tokens=sum(map(len, prompts)), decode_seqs=0, duration_s=1.0)
            )
            n, per_step = len(prompts), ms_of_call(i, signed) / 1e3
            for _ in range(max(p.max_tokens for p in params) // k):
                self.engine.step_log.append(
                    step(prefill_tokens=0, decode_seqs=n, duration_s=per_step * k, num_steps=k)
                )
            return [types.SimpleNamespace(token_ids=[1] * p.max_tokens) for p in params]

    return LLM, calls


@pytest.fixture
def engine(monkeypatch):
    from project04_llm_inference.config import EngineArgs, SamplingParams

    def install(ms_of_call):
        llm, calls = fake_llm_class(ms_of_call)
        monkeypatch.setattr(offline, "_engine", lambda: (llm, EngineArgs, SamplingParams))
        monkeypatch.setattr(offline, "_has_gpu", lambda what: True)
        return calls

    return install


def test_latency_interleaves_one_step_and_multi_step_and_keeps_every_repetition(
    engine, tmp_path, monkeypatch
):
    # call i: one step per round trip takes i + 1 ms per step, multi-step half of that, and
    # multi-step without the next run queued ahead three quarters
    calls = engine(lambda i, k: (i + 1) * (0.5 if k > 1 else 0.75 if k < 0 else 1.0))
    monkeypatch.setattr(offline, "warm_up", lambda llm, v: None)
    monkeypatch.setattr(
        baselines, "decode_step_times", lambda c, b, ctx, n: [2.0, 1.0, 3.0, 5.0, 4.0][:n]
    )
    res = offline.run_latency(
        offline.LatencyConfig(
            shape="tiny", batches=(1,), contexts=(1024,), decode_steps=8, reports_dir=str(tmp_path)
        )
    )
    # alternating, the order reversed every other repetition, 5 each
    assert [k for k, _ in calls] == [1, 8, -8, -8, 8, 1, 1, 8, -8, -8, 8, 1, 1, 8, -8]
    row = res["rows"][0]
    # calls 0, 5, 6, 11, 12
    assert row["engine_ms_reps"] == pytest.approx([1.0, 6.0, 7.0, 12.0, 13.0])
    assert (row["engine_ms"], row["engine_ms_min"], row["engine_ms_max"]) == pytest.approx(
        (7, 1, 13)
    )
    assert row["engine_multi_ms_reps"] == pytest.approx([1.0, 2.5, 4.0, 5.5, 7.0])
    assert row["engine_multi_ms"] == pytest.approx(4.0)
    assert row["engine_multi_sync_ms_reps"] == pytest.approx([2.25, 3.0, 6.75, 7.5, 11.25])
    # tok/s per repetition: its range comes from the fastest and slowest runs
    assert row["engine_multi_tok_s_min"] == pytest.approx(1e3 / 7.0)
    assert row["engine_multi_tok_s_max"] == pytest.approx(1e3 / 1.0)
    assert row["static_cuda_graph_ms"] == 3.0 and row["static_cuda_graph_ms_max"] == 5.0
    assert res["repeats"] == 5
    t = targets({"decode_latency": {"results": res}})[0]  # batch 1, context 1,024
    assert t["measured"] == pytest.approx(4.0) and t["range"] == pytest.approx((1.0, 7.0))
    assert "8 steps per round trip" in t["unit"]
    md = render(tmp_path)[0].read_text()
    assert "| 7 (1–13) |" in md and "| 4 (1–7) |" in md  # engine ms, multi-step ms
    assert "| 6.75 (2.25–11.2) |" in md and "not queued ahead" in md
    assert "Measured: the median of repeated runs" in md


def test_throughput_repeats_on_fresh_token_ids_of_the_same_lengths(engine, tmp_path, monkeypatch):
    calls = engine(lambda i, k: 1.0)
    monkeypatch.setitem(__import__("sys").modules, "vllm", None)
    cfg = offline.ThroughputConfig(
        shape="tiny",
        num_requests=6,
        prompt_len=(4, 9),
        output_len=(2, 4),
        transformers_requests=0,
        single_step=False,
        static_baseline=False,
        repeats=3,
        reports_dir=str(tmp_path),
    )
    res = offline.run_throughput(cfg)
    timed = [p for _, p in calls[1:]]  # calls[0] is the warm-up
    assert len(timed) == 3
    assert [list(map(len, p)) for p in timed] == [list(map(len, timed[0]))] * 3
    assert timed[0] != timed[1] != timed[2] != timed[0]  # no run repeats another's prompts
    eng = res["engine"]
    assert eng["repeats"] == 3 and len(eng["output_tok_s_reps"]) == 3
    assert eng["output_tok_s_min"] <= eng["output_tok_s"] <= eng["output_tok_s_max"]
    assert res["repeats"] == 3 and "median of 3 runs" in res["repeats_note"]
    assert res["static_cuda_graph"] == {
        "measured": False,
        "reason": "skipped: --no-static-baseline",
    }
    one = offline.ThroughputConfig(shape="tiny")
    assert one.repeats == 1 and "--repeats" in offline._throughput_repeats_note(one.repeats)


def test_prefix_overhead_is_the_median_of_paired_runs(engine, tmp_path, monkeypatch):
    engine(lambda i, k: 1.0)
    off = [4.0, 4.1, 3.9, 4.0, 4.2]
    extra = [0.01, 0.02, 0.03, -0.01, 0.015]  # caching on: run i slower by extra[i]
    seen = {"off": 0, "on": 0}
    order, prompts, built = [], [], {}

    def fake_generate(llm, wl, *, use_tqdm=True):
        key = "on" if llm.engine.args.enable_prefix_caching else "off"
        built[key] = llm.engine.args
        order.append(key)
        prompts.append(sorted(wl.prompts))
        i = seen[key]
        seen[key] += 1
        wall = off[i] * (1 + extra[i]) if key == "on" and i < 5 else off[min(i, 4)]
        return {
            "wall_s": wall,
            "output_tok_s": 1.0,
            "total_tok_s": 1.0,
            "stats": {
                "prefill_tokens_computed": 1,
                "prefix_cache_hits": 0,
                "prefix_cache_queries": 1,
            },
        }

    monkeypatch.setattr(offline, "generate", fake_generate)
    monkeypatch.setattr(offline, "warm_up", lambda llm, v: None)
    res = offline.run_prefix(
        offline.PrefixConfig(
            shape="tiny",
            num_requests=2,
            prefix_len=8,
            unique_len=2,
            output_len=2,
            reports_dir=str(tmp_path),
        )
    )
    un = res["unshared"]
    assert un["overhead_pct_reps"] == pytest.approx([1.0, 2.0, 3.0, -1.0, 1.5])
    # both engines resident, runs alternating, who goes first alternating by pair; then the
    # shared workload on each
    assert order == ["off", "on", "on", "off", "off", "on", "on", "off", "off", "on", "off", "on"]
    # pair i ran the same prompts on both engines, a fresh set per pair
    assert all(prompts[2 * i] == prompts[2 * i + 1] for i in range(5))
    assert len({tuple(map(tuple, prompts[2 * i])) for i in range(5)}) == 5
    off_args, on_args = (built[k] for k in ("off", "on"))
    assert off_args.gpu_memory_utilization == pytest.approx(0.45)  # half of the default 0.9
    assert on_args.num_gpu_blocks == 100  # the off engine's blocks (the fake engine's stats)
    assert res["num_kv_blocks"] == 100
    assert (un["overhead_pct"], un["overhead_pct_min"], un["overhead_pct_max"]) == pytest.approx(
        (1.5, -1.0, 3.0)
    )
    md = render(tmp_path)[0].read_text()
    assert "costs +1.50% wall time (median of 5 paired runs, -1.00% to +3.00%" in md
    assert "| 1.5 (-1–3) | % wall time | met |" in md


@pytest.mark.parametrize("repeats", [0, -2])
def test_repeat_counts_below_one_are_refused(repeats):
    for cfg, name in (
        (offline.LatencyConfig, "repeats"),
        (offline.ThroughputConfig, "repeats"),
        (offline.PrefixConfig, "overhead_repeats"),
    ):
        with pytest.raises(ValueError, match=name):
            cfg(**{name: repeats})


# --- the report from hand-written records -----------------------------------------------------


def _kernel_rows(spread_of):
    """decode_attention rows; spread_of(batch, context) -> the ms Spread of ours (SDPA: 1.1x)."""
    rows = []
    for b in (64, 256):
        for ctx in (8192, 32768):
            nbytes = 2 * b * ctx * 8 * 64 * 2
            ours = spread_of(b, ctx)
            sdpa = ours.map(lambda v: 1.1 * v)
            row = {"batch": b, "context": ctx, "bytes": nbytes, "num_splits": 4}
            for key, s in (("ours", ours), ("sdpa", sdpa)):
                row.update(flat(f"{key}_ms", s))
                row.update(flat(f"{key}_gbps", s.map(lambda t, n=nbytes: n / (t * 1e-3) / 1e9)))
            row.update(flat("speedup_vs_sdpa", Spread.of([1.1] * ours.n)))
            rows.append(row)
    return rows


def _save_kernel(folder, rows):
    save_result(
        offline.PROJECT,
        "decode_attention",
        {"rows": rows, "copy_ceiling_gbps": 4294},
        reports_dir=folder,
        env=ENV,
    )


def test_kernel_table_and_target_show_the_worst_shapes_range(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    # batch 64, context 8,192 is the slowest shape; its five runs spread by +-5%
    base = {(64, 8192): 0.3, (64, 32768): 1.05, (256, 8192): 1.05, (256, 32768): 4.1}
    rows = _kernel_rows(
        lambda b, c: Spread.of([base[b, c] * f for f in (1.0, 0.95, 1.05, 1.0, 1.02)])
    )
    _save_kernel(tmp_path, rows)
    tg = targets({"decode_attention": {"results": {"rows": rows}}})
    kernel = next(t for t in tg if "copy bandwidth" in t["target"])
    worst = min(rows, key=lambda r: r["ours_gbps"])
    assert (worst["batch"], worst["context"]) == (64, 8192)
    pct = worst["ours_gbps"] / 43
    assert kernel["measured"] == pytest.approx(pct)
    assert kernel["range"] == pytest.approx(
        (worst["ours_gbps_min"] / 43, worst["ours_gbps_max"] / 43)
    )
    paths = render(tmp_path)
    md, summary = paths[0].read_text(), paths[1].read_text()
    assert "| 64 | 8,192 | 300 (285–315) |" in md  # ours in us, median (min-max)
    assert f"| {float(f'{pct:.3g}'):g} (" in summary  # the target's measured cell has a range


def test_a_record_of_single_runs_renders_as_one_without_repetition_fields(tmp_path, monkeypatch):
    """flat() of one value adds _min/_max/_reps; with fewer than two repetitions there is no
    range to show, so the output is byte-for-byte that of a record without those fields."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    one = _kernel_rows(lambda b, c: Spread.of([0.001 * b * c / 8192]))
    plain = [{k: v for k, v in r.items() if not k.endswith(("_min", "_max", "_reps"))} for r in one]
    a, b = tmp_path / "a", tmp_path / "b"
    _save_kernel(a, one)
    _save_kernel(b, plain)
    for pa, pb in zip(render(a), render(b)):
        if pa.suffix == ".md":
            assert pa.read_text() == pb.read_text(), pa.name
    assert "–" not in (a / offline.PROJECT / "results.md").read_text()
    # the companion: the same rows with five repetitions do show ranges
    five = _kernel_rows(lambda b, c: Spread.of([0.001 * b * c / 8192 * f for f in (1, 2, 3, 4, 5)]))
    _save_kernel(tmp_path / "c", five)
    assert "–" in render(tmp_path / "c")[0].read_text()
