"""The one-GPU sweep's passes with a fake trainer (no model, no process group): the variant list
runs `repeats` times, its order reversed on alternate passes; each figure is the median over the
passes with its range, the speed-up the median of per-pass ratios; a variant that fails is not
run again, its earlier passes standing; the report shows median (min–max)."""

from __future__ import annotations

import statistics
from types import SimpleNamespace

import pytest

from project02_fsdp_scaling import sweep
from project02_fsdp_scaling.config import TrainConfig
from shared.results import load_result

# tokens/s of each pass, per variant; +syncmb fails in its second pass, +fusedloss in its first
TPS = {"eager": [100.0, 120.0, 90.0], "eager+syncmb": [150.0], "eager+mb1": [80.0, 60.0, 70.0]}
FAILS = {("eager+syncmb", 1), ("eager+fusedloss", 0)}


def _fake_training(calls: list):
    def run_training(cfg, info, template=None):
        def overrides(v):  # every field a variant sets, the micro-batch included
            return {"micro_batch": 2, **sweep.parse_variant(v)}

        name = next(
            v
            for v in (*TPS, "eager+fusedloss")
            if overrides(v) == {k: getattr(cfg, k) for k in overrides(v)}
        )
        n = sum(c == name for c in calls)
        calls.append(name)
        if (name, n) in FAILS:
            raise RuntimeError(f"{name} out of memory")
        tps = TPS[name][n]
        step = 1000.0 / tps
        return {
            "step_time_s": {"median": step, "p20": 0.9 * step, "p80": 1.1 * step, "all": [step]},
            "tokens_per_s": tps,
            "achieved_tflops_per_device": tps / 10,
            "mfu": tps / 1000,
            "peak_memory_gib": 1.0 + n,
            "compute_dtype": "bfloat16",
            "losses": [10.0, 9.0],
            "seq_len": 16,
            "flops_per_token": 1e6,
        }, None

    return run_training


@pytest.fixture
def fake(monkeypatch):
    import project02_fsdp_scaling.train as train
    import shared.distributed as distributed

    calls: list[str] = []
    monkeypatch.setattr(train, "run_training", _fake_training(calls))
    monkeypatch.setattr(train, "build_cpu_model", lambda args, seed: None)
    monkeypatch.setattr(distributed, "init_distributed", lambda **kw: SimpleNamespace(world_size=1))
    monkeypatch.setattr(distributed, "cleanup", lambda: None)
    monkeypatch.setattr(sweep.torch.cuda, "is_available", lambda: False)
    return calls


def test_passes_interleave_and_figures_are_medians(fake, tmp_path):
    names = ["eager", "eager+syncmb", "eager+fusedloss", "eager+mb1"]
    cfg = sweep.SweepConfig(
        variants=",".join(names),
        repeats=3,
        reports_dir=str(tmp_path),
        name="sweep_test",
        train=TrainConfig(preset="tiny", global_batch=4, micro_batch=2, steps=1, warmup_steps=0),
    )
    path = sweep.run(cfg)
    # pass 1 in order, pass 2 reversed, pass 3 in order; failed variants are not called again
    assert fake == [
        "eager", "eager+syncmb", "eager+fusedloss", "eager+mb1",
        "eager+mb1", "eager+syncmb", "eager",
        "eager", "eager+mb1",
    ]  # fmt: skip
    rec = load_result(path)["results"]
    assert rec["repeats"] == 3
    rows = {v["variant"]: v for v in rec["variants"]}
    assert list(rows) == names  # the order asked for, whatever order the passes ran in
    eager, mb1 = rows["eager"], rows["eager+mb1"]
    assert eager["runs"] == 3 and eager["tokens_per_s"] == 100.0
    assert (eager["tokens_per_s_min"], eager["tokens_per_s_max"]) == (90.0, 120.0)
    assert eager["tokens_per_s_reps"] == TPS["eager"]  # pass order
    assert eager["mfu"] == pytest.approx(0.1)
    assert eager["peak_memory_gib"] == 3.0  # the largest over the passes
    assert eager["step_time_s"] == 10.0 and eager["step_time_p80_s"] == 11.0  # the first pass's
    # the median of per-pass ratios (0.8, 0.5, 0.78): 0.78, not the ratio of medians 0.7
    assert mb1["speedup_vs_eager"] == pytest.approx(
        statistics.median(a / b for a, b in zip(TPS["eager+mb1"], TPS["eager"]))
    )
    assert mb1["speedup_vs_eager"] == pytest.approx(70 / 90)
    assert mb1["overrides"]["micro_batch"] == 1
    syncmb = rows["eager+syncmb"]  # one good pass, then a failure: the pass stands
    assert (
        syncmb["status"] == "ok"
        and syncmb["runs"] == 1
        and "out of memory" in syncmb["failed_pass"]
    )
    assert rows["eager+fusedloss"]["status"] == "failed"
    assert rec["best"]["variant"] == "eager+syncmb"  # best median MFU
    md = path.with_suffix(".md").read_text()
    assert "| 100 (90–120) |" in md
    assert "ok, then failed" in md and "3 passes over the list" in md
