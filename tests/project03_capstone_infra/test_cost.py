"""The spot/precision cost model: closed forms against hand values, the analytic expectation
against its Monte Carlo, inputs from reports and traces, and clear errors on bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from project03_capstone_infra.__main__ import main as package_main
from project03_capstone_infra.cost import inputs, plan
from project03_capstone_infra.cost.model import (
    MC_TOLERANCE,
    expected_hours,
    expected_segment_hours,
    exponential_sampler,
    optimal_interval,
    segment_lengths,
    simulate_hours,
    trace_sampler,
    young_daly_interval,
)
from project03_capstone_infra.cost.plan import CostConfig


def test_segments_cover_the_work_plus_one_save_each():
    segs = segment_lengths(10.0, 3.0, 0.1)
    assert segs.tolist() == pytest.approx([3.1, 3.1, 3.1, 1.1])
    assert segment_lengths(9.0, 3.0, 0.1).tolist() == pytest.approx([3.1, 3.1, 3.1])
    assert segment_lengths(2.0, 5.0, 0.5).tolist() == pytest.approx([2.5])


def test_expected_segment_hours_closed_form():
    # no failures: the segment itself
    assert expected_segment_hours(2.0, 0.0, 0.5) == pytest.approx(2.0)
    # hand value: M e^{R/M}(e^{s/M} - 1) with M = 4, R = 1, s = 2
    M, R, s = 4.0, 1.0, 2.0
    assert expected_segment_hours(s, 1 / M, R) == pytest.approx(
        M * math.exp(R / M) * (math.exp(s / M) - 1)
    )
    # rare failures: first order s + lambda (s^2/2 + s R)
    lam = 1e-6
    assert expected_segment_hours(s, lam, R) == pytest.approx(
        s + lam * (s * s / 2 + s * R), rel=1e-9
    )


def test_young_daly_interval_and_the_exact_optimum():
    assert young_daly_interval(1 / 60, 0.1) == pytest.approx(math.sqrt(2 * (1 / 60) * 10))
    assert young_daly_interval(0.1, 0.0) == math.inf
    # When C << M, Young's interval is within a few percent of the model's optimum and its
    # expected time within 0.1 %.
    work, C, lam, R = 200.0, 1 / 60, 0.05, 0.2
    yd = young_daly_interval(C, lam)
    best = optimal_interval(work, C, lam, R)
    assert abs(best / yd - 1) < 0.1
    t_yd = expected_hours(work, yd, C, lam, R)
    t_best = expected_hours(work, best, C, lam, R)
    assert t_best <= t_yd + 1e-9
    assert t_yd / t_best - 1 < 1e-3
    # checkpointing 10x too often or too rarely costs measurably more
    assert expected_hours(work, yd / 10, C, lam, R) > 1.01 * t_yd
    assert expected_hours(work, yd * 10, C, lam, R) > 1.01 * t_yd


@pytest.mark.parametrize(
    "work, interval, save, rate, restart",
    [
        (12.5, 0.58, 1 / 60, 0.1, 1 / 6),  # one 8-GPU node, Young/Daly interval
        (25.0, 1.0, 1 / 60, 0.4, 1 / 6),  # four nodes, fixed hourly checkpoints
        (5.0, 2.0, 0.1, 1.0, 0.5),  # interruptions more often than checkpoints: heavy rework
        (3.0, 3.0, 0.05, 0.02, 0.1),  # rare interruptions, a single segment
    ],
)
def test_monte_carlo_agrees_with_the_analytic_model(work, interval, save, rate, restart):
    sims = simulate_hours(
        work, interval, save, restart, exponential_sampler(rate), runs=20_000, seed=1
    )
    analytic = expected_hours(work, interval, save, rate, restart)
    se = sims.std(ddof=1) / math.sqrt(sims.size)
    assert abs(sims.mean() - analytic) < 4 * se + 1e-12
    assert abs(sims.mean() / analytic - 1) < MC_TOLERANCE
    # never faster than the failure-free time
    assert sims.min() >= segment_lengths(work, interval, save).sum() - 1e-9


def test_monte_carlo_without_failures_is_deterministic():
    sims = simulate_hours(4.0, 1.0, 0.1, 0.5, exponential_sampler(0.0), runs=50)
    assert np.allclose(sims, 4.4)


def test_trace_sampler_draws_only_observed_gaps():
    gaps = np.array([0.5, 2.0, 7.5])
    draws = trace_sampler(gaps)(np.random.default_rng(0), 1000)
    assert set(np.unique(draws)) <= set(gaps)
    with pytest.raises(ValueError, match="> 0"):
        trace_sampler(np.array([1.0, -2.0]))
    with pytest.raises(ValueError, match="at least 2"):
        trace_sampler(np.array([1.0]))


def _small(tmp_path, **kw) -> CostConfig:
    return CostConfig(mc_runs=4000, reports_dir=str(tmp_path), **kw)


def test_plans_rank_spot_bf16_cheapest_and_agree_with_monte_carlo(tmp_path):
    res = plan.run(_small(tmp_path))
    rows = {(r["plan"], r["precision"]): r for r in res["plans"]}
    assert len(rows) == 6
    assert res["cheapest"]["market"] == "spot" and res["cheapest"]["precision"] == "bf16"
    # bf16 halves the failure-free hours with the default (labelled, unmeasured) speed ratio 2.0
    assert res["bf16_speedup"] == {
        "value": 2.0,
        "source": res["bf16_speedup"]["source"],
        "measured": False,
    }
    assert "assumed" in res["bf16_speedup"]["source"]
    od32, od16 = rows[("on-demand", "fp32")], rows[("on-demand", "bf16")]
    assert od32["work_h"] == pytest.approx(2 * od16["work_h"])
    # the Young/Daly plan is no worse in expectation than the hourly one on spot
    assert (
        rows[("spot, Young/Daly", "bf16")]["expected_usd"]
        <= rows[("spot, fixed interval", "bf16")]["expected_usd"] + 1e-9
    )
    for r in res["plans"]:
        assert r["analytic_is_exact"]
        assert abs(r["mc_vs_analytic_pct"]) < 100 * MC_TOLERANCE
        assert r["p90_h"] >= r["p50_h"] >= r["work_h"]
        # cost = hours x GPUs x price
        assert r["expected_usd"] == pytest.approx(r["expected_h"] * 8 * r["usd_per_gpu_hour"])
    assert res["savings_vs_on_demand_bf16_pct"] > 0


def test_measured_throughput_and_ratio_are_taken_from_reports(tmp_path):
    rec = {
        "environment": {"gpu": "NVIDIA H200"},
        "config": {"preset": "1b"},
        "results": {
            "runs": [
                {
                    "world_size": 8,
                    "dtype": "bfloat16",
                    "tokens_per_s": 8 * 60_000.0,
                    "status": "ok",
                },
                {"world_size": 8, "dtype": "float32", "tokens_per_s": 8 * 24_000.0, "status": "ok"},
                {"world_size": 4, "dtype": "bfloat16", "tokens_per_s": 0.0, "status": "failed"},
            ]
        },
    }
    folder = tmp_path / "project02_fsdp_scaling"
    folder.mkdir()
    (folder / "scaling.json").write_text(json.dumps(rec))
    tput, ratio = inputs.resolve_throughput(_small(tmp_path), tmp_path)
    assert tput.measured and tput.value == pytest.approx(60_000.0)
    assert "project02_fsdp_scaling/scaling.json" in tput.source
    assert ratio.measured and ratio.value == pytest.approx(2.5)
    # another GPU's measurement is not used for an H100 job
    tput_h100, ratio_h100 = inputs.resolve_throughput(_small(tmp_path, gpu="h100-sxm"), tmp_path)
    assert not tput_h100.measured and not ratio_h100.measured


def test_project02_shaped_records_are_read(tmp_path):
    """project02 nests the preset in config.train and names the dtype compute_dtype."""
    folder = tmp_path / "project02_fsdp_scaling"
    folder.mkdir()
    for name, dtype, tps in (("bf16", "bfloat16", 70_000.0), ("fp32", "float32", 20_000.0)):
        rec = {
            "environment": {"gpu": "NVIDIA H200"},
            "config": {"scaling": {"gpus": "1,2"}, "train": {"preset": "1b", "param_dtype": dtype}},
            "results": {
                "runs": [
                    {
                        "world_size": 2,
                        "status": "ok",
                        "tokens_per_s": 2 * tps,
                        "compute_dtype": dtype,
                    },
                    {"world_size": 4, "status": "failed", "returncode": 1},
                ]
            },
        }
        (folder / f"scaling_{name}.json").write_text(json.dumps(rec))
    # measured on 2 GPUs, planned on 8: the assumed scaling efficiency is applied and named
    tput, ratio = inputs.resolve_throughput(_small(tmp_path), tmp_path)
    assert tput.measured and tput.value == pytest.approx(70_000.0 * 0.95)
    assert "95% assumed scaling efficiency" in tput.source
    assert ratio.measured and ratio.value == pytest.approx(3.5)
    tput2, _ = inputs.resolve_throughput(_small(tmp_path, n_gpus=2), tmp_path)
    assert tput2.value == pytest.approx(70_000.0)


def test_projected_rows_are_not_taken_for_measurements(tmp_path):
    folder = tmp_path / "project02_fsdp_scaling"
    folder.mkdir()
    rec = {
        "environment": {"gpu": "NVIDIA H200"},
        "config": {"train": {"preset": "1b", "param_dtype": "bfloat16"}},
        "results": {
            "cost": {
                "lines": [
                    {"n_gpus": 1, "tokens_per_s": 78_000.0, "measured": True},
                    {"n_gpus": 8, "tokens_per_s": 8 * 90_000.0, "measured": False},
                ]
            }
        },
    }
    (folder / "scaling_gpu.json").write_text(json.dumps(rec))
    tput, _ = inputs.resolve_throughput(_small(tmp_path, n_gpus=1), tmp_path)
    assert tput.value == pytest.approx(78_000.0)


def test_slower_checkpoint_saves_cost_more(tmp_path):
    rows = plan.run(_small(tmp_path))["save_cost_sensitivity_spot_bf16"]
    assert [r["save_s"] for r in rows] == sorted(r["save_s"] for r in rows)
    usd = [r["expected_usd"] for r in rows]
    assert all(a < b for a, b in zip(usd, usd[1:]))
    # Young/Daly: the interval grows as the square root of the save time
    assert rows[-1]["interval_h"] / rows[0]["interval_h"] == pytest.approx(
        math.sqrt(rows[-1]["save_s"] / rows[0]["save_s"]), rel=1e-6
    )


def test_checkpoint_costs_come_from_the_checkpoint_benchmark(tmp_path):
    folder = tmp_path / "project03_capstone_infra"
    folder.mkdir()
    rec = {
        "environment": {"gpu": "NVIDIA H200"},
        "config": {"preset": "1b"},
        "results": {
            "sync": {"blocking_s": 17.8},
            "derived": {"async_cold": {"held_s": 5.45}},
            "resume": {"to_first_new_step_s": 23.6},
        },
    }
    (folder / "checkpoint_bench.json").write_text(json.dumps(rec))
    save, restart = inputs.resolve_checkpoint_costs(_small(tmp_path), tmp_path)
    assert save.measured and save.value == pytest.approx(5.45) and "async" in save.source
    assert restart.value == pytest.approx(23.6 + 300.0) and "assumed" in restart.source
    save_sync, _ = inputs.resolve_checkpoint_costs(_small(tmp_path, save_mode="sync"), tmp_path)
    assert save_sync.value == pytest.approx(17.8)
    given, _ = inputs.resolve_checkpoint_costs(_small(tmp_path, save_s=9.0), tmp_path)
    assert given.value == 9.0
    # another preset's benchmark is not used
    other, _ = inputs.resolve_checkpoint_costs(_small(tmp_path, preset="125m"), tmp_path)
    assert not other.measured and other.value == inputs.DEFAULT_SAVE_S
    res = plan.run(_small(tmp_path))
    assert res["save_s"] == pytest.approx(5.45) and res["restart_s"] == pytest.approx(323.6)
    # a steady-state async measurement, when the benchmark has one, is preferred
    rec["results"]["derived"]["async_warm"] = {"held_s": 0.3}
    (folder / "checkpoint_bench.json").write_text(json.dumps(rec))
    warm, _ = inputs.resolve_checkpoint_costs(_small(tmp_path), tmp_path)
    assert warm.value == pytest.approx(0.3) and "steady-state" in warm.source


def test_trace_drives_the_spot_monte_carlo(tmp_path):
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps([2.0, 6.0, 12.0, 4.0]))
    res = plan.run(_small(tmp_path, trace=str(trace)))
    spot = [r for r in res["plans"] if r["market"] == "spot"]
    assert spot and all(not r["analytic_is_exact"] for r in spot)
    assert all(r["interruptions_per_h"] == pytest.approx(1 / 6.0) for r in spot)
    assert "trace" in res["interruptions"]["spot_source"]


def test_cli_writes_json_chart_and_markdown(tmp_path):
    rc = package_main(
        ["cost", "--mc-runs", "2000", "--reports-dir", str(tmp_path), "--deadline-h", "14"]
    )
    assert rc == 0
    out = tmp_path / "project03_capstone_infra"
    record = json.loads((out / "cost.json").read_text())
    assert record["environment"]["torch"] and record["results"]["cheapest"]
    assert all("p_miss_deadline" in r for r in record["results"]["plans"])
    assert (out / "cost.png").stat().st_size > 10_000
    assert (out / "cost_interval.png").stat().st_size > 10_000
    md = (out / "cost.md").read_text()
    assert "Cheapest plan" in md and "assumed" in md


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"gpu": "h999"}, "unknown GPU"),
        ({"spot_preemptions_per_node_hour": -0.1}, "spot_preemptions_per_node_hour"),
        ({"gpu_failures_per_gpu_hour": -1e-5}, "gpu_failures_per_gpu_hour"),
        ({"n_gpus": 0}, "n_gpus"),
        ({"save_s": -1.0}, "save_s"),
        ({"save_mode": "eventually"}, "save_mode"),
        ({"restart_s": -5.0}, "restart_s"),
        ({"total_tokens": -1.0}, "total_tokens"),
        ({"assumed_mfu": 1.5}, "assumed_mfu"),
    ],
)
def test_bad_config_gives_a_clear_error(kw, match):
    with pytest.raises(ValueError, match=match):
        CostConfig(**kw).validate()


def test_bad_arguments_to_the_model_functions():
    with pytest.raises(ValueError, match="rate_per_h"):
        expected_hours(10.0, 1.0, 0.1, -0.5, 0.1)
    with pytest.raises(ValueError, match="interval_h"):
        segment_lengths(10.0, 0.0, 0.1)
    with pytest.raises(TypeError, match="save_h"):
        segment_lengths(10.0, 1.0, "0.1")
    with pytest.raises(ValueError, match="runs"):
        simulate_hours(1.0, 1.0, 0.1, 0.1, exponential_sampler(0.1), runs=0)
    with pytest.raises(ValueError, match="choose a longer"):
        segment_lengths(1e6, 1e-6, 0.0)


def test_bf16_fp32_ratio_pairs_sweep_variants_that_differ_only_in_precision(tmp_path):
    """A project02 sweep record: world of one, variants named; the ratio must compare a variant
    with its own +fp32, not with a faster or slower configuration."""
    folder = tmp_path / "project02_fsdp_scaling"
    folder.mkdir()
    rec = {
        "environment": {"gpu": "NVIDIA H200"},
        "config": {"preset": "1b"},
        "results": {
            "preset": "1b",
            "world_size": 1,
            "variants": [
                {
                    "variant": "eager",
                    "status": "ok",
                    "tokens_per_s": 50_000.0,
                    "compute_dtype": "bfloat16",
                },
                {
                    "variant": "compile+cudnn",
                    "status": "ok",
                    "tokens_per_s": 80_000.0,
                    "compute_dtype": "bfloat16",
                },
                {
                    "variant": "compile+cudnn+fp32",
                    "status": "ok",
                    "tokens_per_s": 8_000.0,
                    "compute_dtype": "float32",
                },
                {"variant": "eager+fp32", "status": "failed", "error": "OOM"},
            ],
        },
    }
    (folder / "sweep_gpu_precision.json").write_text(json.dumps(rec))
    _, ratio = inputs.resolve_throughput(_small(tmp_path, n_gpus=1), tmp_path)
    assert ratio.measured and ratio.value == pytest.approx(10.0)
    assert "compile+cudnn vs compile+cudnn+fp32" in ratio.source
    rows = inputs.measured_throughput(tmp_path, "h200-sxm", "1b")
    pairs = inputs.bf16_fp32_pairs(rows)
    assert [(b["variant"], f["variant"]) for b, f in pairs] == [
        ("compile+cudnn", "compile+cudnn+fp32")
    ]


def _precision_record(tps: dict[str, float], world_size: int = 1) -> dict:
    """A record shaped as project02's `precision` harness writes it: every recipe's throughput
    measured in one run."""
    return {
        "environment": {"gpu": "NVIDIA H200"},
        "config": {"precision": {"world_size": world_size}, "train": {"precision": None}},
        "results": {
            "world_size": world_size,
            "throughput": {
                "preset": "1b",
                "runs": [
                    {
                        "precision": p,
                        "status": "ok",
                        "compute_dtype": "bfloat16" if p.startswith("fp8") else "x",
                        "tokens_per_s": v,
                    }
                    for p, v in tps.items()
                ],
            },
        },
    }


def test_measured_fp8_and_fp16_are_priced_beside_bf16(tmp_path):
    from project03_capstone_infra.report import cost as report

    folder = tmp_path / "project02_fsdp_scaling"
    folder.mkdir()
    tps = {"bf16": 80_000.0, "fp8-rowwise": 104_000.0, "fp16": 78_000.0}
    (folder / "precision_gpu.json").write_text(json.dumps(_precision_record(tps)))
    ratios = inputs.precision_speedups(_small(tmp_path), tmp_path)
    # fp8's compute dtype is bf16 (attention, norms): the recipe, not the dtype, names the row
    assert set(ratios) == {"fp8-rowwise", "fp16"}
    assert ratios["fp8-rowwise"].value == pytest.approx(1.3) and ratios["fp8-rowwise"].measured
    assert "precision_gpu.json" in ratios["fp16"].source
    res = plan.run(_small(tmp_path))
    by = {(r["plan"], r["precision"]): r for r in res["plans"]}
    assert {p for _, p in by} == {"fp32", "bf16", "fp8-rowwise", "fp16"}
    # the same job: fp8's failure-free hours are bf16's over the measured ratio
    assert by[("on-demand", "fp8-rowwise")]["work_h"] == pytest.approx(
        by[("on-demand", "bf16")]["work_h"] / 1.3
    )
    assert res["cheapest"]["precision"] == "fp8-rowwise" and res["cheapest"]["market"] == "spot"
    rec = {"config": {**vars(_small(tmp_path)), "out_name": "cost"}, "results": res}
    rec["environment"] = {"gpu": "NVIDIA H200", "date": "2026-12-01"}
    md = report.render_markdown(rec)
    assert "## Market x precision" in md and "| fp8-rowwise E[cost] USD |" in md
    assert "not priced, because no record here measured them: fp8-tensorwise" in md
    assert "- fp8-rowwise / bf16 speed ratio: 1.30" in md
    names = [p.name for p in report.write_charts(rec, tmp_path)]
    assert names == ["cost.png", "cost_interval.png"]


def test_without_measured_fp8_only_fp32_and_bf16_are_priced(tmp_path):
    assert inputs.precision_speedups(_small(tmp_path), tmp_path) == {}
    res = plan.run(_small(tmp_path))
    assert {r["precision"] for r in res["plans"]} == {"fp32", "bf16"}
    assert res["precision_speedups_vs_bf16"] == {}
