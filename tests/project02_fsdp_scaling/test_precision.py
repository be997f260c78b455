"""The precision recipes (`--precision`): float8 linears through torchao, fp16 with dynamic loss
scaling and its underflow probe, and the `precision` harness's plan, record and report.

torchao's float8 training runs on the CPU too (torch emulates the float8 GEMM there), so the fp8
path is exercised in this tier; on a GPU it is the same code with Hopper's float8 tensor cores.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from project02_fsdp_scaling import precision
from project02_fsdp_scaling.config import TrainConfig, record_precision
from project02_fsdp_scaling.precision_report import precision_charts, precision_markdown
from shared.model import build_model
from shared.parallelize import apply_float8, float8_filter
from shared.results import REPORTS_DIR

# ---- float8 linears -----------------------------------------------------------------------------
E4M3_MAX = 448.0
E4M3_U = 2.0**-4  # unit roundoff: 3 mantissa bits, round to nearest
E4M3_SUBNORMAL_HALF_STEP = 2.0**-10  # subnormal spacing 2^-9 (in scaled units), half of it


def _e4m3_error_bound(t: torch.Tensor, dim: int | None) -> torch.Tensor:
    """Elementwise bound on |q(t) - t| for dynamic e4m3 scaling (amax maps to 448): relative u
    for normal values, plus half a subnormal step (in t's units) for the smallest ones. dim: the
    axis a rowwise scale is taken over (None: one scale for the tensor)."""
    amax = t.abs().amax() if dim is None else t.abs().amax(dim=dim, keepdim=True)
    return E4M3_U * t.abs() + E4M3_SUBNORMAL_HALF_STEP * amax / E4M3_MAX


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_a_float8_linear_is_within_e4m3_rounding_of_the_exact_product(recipe):
    pytest.importorskip("torchao.float8")
    torch.manual_seed(0)
    exact = nn.Sequential(nn.Linear(64, 32, bias=False))
    x = torch.randn(16, 64)
    fp8 = nn.Sequential(nn.Linear(64, 32, bias=False))
    fp8.load_state_dict(exact.state_dict())
    wrapper = nn.Module()
    wrapper.layers = fp8  # float8_filter converts the blocks' linears ("layers." names)
    assert apply_float8(wrapper, recipe) == 1
    w = exact[0].weight.detach()
    with torch.no_grad():
        y, y8 = exact(x), fp8(x)
    # |q(x)q(w) - xw| <= |dx||w| + |x||dw| + |dx||dw| per product; summed over k, plus float32
    # accumulation of 64 terms (64 * 2^-24 relative: far below the float8 terms).
    dx = _e4m3_error_bound(x, None if recipe == "tensorwise" else 1)
    dw = _e4m3_error_bound(w, None if recipe == "tensorwise" else 1)
    bound = dx @ w.abs().T + x.abs() @ dw.T + dx @ dw.T
    bound += 64 * 2.0**-24 * (x.abs() @ w.abs().T)
    assert (y8 - y).abs().le(bound).all(), float(((y8 - y).abs() / bound).max())
    assert not torch.equal(y8, y)  # the float8 path ran: e4m3 rounding shows


def test_float8_converts_the_block_linears_and_leaves_the_output_head():
    pytest.importorskip("torchao.float8")
    from torchao.float8.float8_linear import Float8Linear

    model = build_model("tiny", seed=0)
    eligible = [n for n, m in model.named_modules() if float8_filter(m, n)]
    assert eligible and all(n.startswith("layers.") for n in eligible)
    assert apply_float8(model, "rowwise") == len(eligible)
    assert not isinstance(model.output, Float8Linear) and isinstance(model.output, nn.Linear)
    with pytest.raises(ValueError, match="float8 recipe must be one of"):
        apply_float8(build_model("tiny", seed=0), "blockwise")


# ---- fp16: the underflow probe ------------------------------------------------------------------
@pytest.fixture
def world_of_one(monkeypatch):
    from shared.distributed import _free_port, cleanup, init_distributed

    for k, v in {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
    }.items():
        monkeypatch.setenv(k, v)
    info = init_distributed(device="cpu")
    yield info
    cleanup()


def test_the_underflow_probe_counts_what_fp16_flushes_to_zero(world_of_one):
    from torch.distributed.device_mesh import init_device_mesh

    from project02_fsdp_scaling.train import cross_entropy, gradient_underflow
    from shared.data import SyntheticTokens
    from shared.parallelize import apply_fsdp

    model = build_model("tiny", seed=0)
    apply_fsdp(model, mesh=init_device_mesh("cpu", (1,)), param_dtype="float16")
    params = list(model.parameters())
    x, y = SyntheticTokens(256, 32, 4, seed=0).next_batch()
    n = sum(p.numel() for p in params)

    # A loss 1e-7 times smaller: d loss / d logit is at most 1e-7 / (4 x 32 tokens) < 1e-9, under
    # half of fp16's smallest subnormal (2^-24 = 6e-8), so the fp16 logits' gradient is zero and
    # every gradient behind it too; times 2^16 it is representable. Every element is lost.
    def tiny(logits, t):
        return cross_entropy(logits, t) * 1e-7

    lost = gradient_underflow(model, params, tiny, x, y, 2.0**16)
    assert lost["elements"] == n and lost["nonzero_with_scaling"] > 0.5 * n
    assert lost["zero_without_scaling"] == lost["nonzero_with_scaling"]
    assert lost["underflow_share"] == 1.0
    # The loss as it is: most of the gradient survives without scaling.
    kept = gradient_underflow(model, params, cross_entropy, x, y, 2.0**16)
    assert kept["underflow_share"] < 0.5
    assert all(p.grad is None for p in params)  # the probe leaves no gradient behind


# ---- the harness --------------------------------------------------------------------------------
def test_the_plan_runs_bf16_first_and_fp16_without_scaling_too(tmp_path):
    cfg = precision.PrecisionConfig(
        precisions=("fp16", "fp8-rowwise"), reports_dir=str(tmp_path), parity_steps=6
    )
    plan = precision.make_plan(cfg)
    labels = [(phase, precision._label(job)) for phase, job in plan.jobs]
    assert labels == [
        ("parity", "bf16"),
        ("parity", "fp16"),
        ("parity", "fp16 (no loss scaling)"),
        ("parity", "fp8-rowwise"),
        ("throughput", "bf16"),
        ("throughput", "fp16"),
        ("throughput", "fp8-rowwise"),
    ]
    parity_jobs = [job for phase, job in plan.jobs if phase == "parity"]
    # the same job but for the recipe: seed, data, batch and steps
    assert {(j.seed, j.data_seed, j.global_batch, j.total_steps()) for j in parity_jobs} == {
        (0, 0, 8, 6)
    }
    if not plan.on_gpu:
        assert {j.preset for _, j in plan.jobs} == {"tiny"}
        assert not any(j.compile for _, j in plan.jobs)
    # the parameters stay gathered for the step; GPUs take micro-batches of 16, CPUs none
    assert not any(j.reshard_after_forward for _, j in plan.jobs)
    micro = {precision.GPU_MICRO_BATCH} if plan.on_gpu else {0}
    assert {j.micro_batch for _, j in plan.jobs} == micro


def test_a_fused_loss_run_leaves_fp16_jobs_unfused(tmp_path):
    # --fused-loss would form fp16's gradients before loss scaling: its jobs run unfused
    cfg = precision.PrecisionConfig(
        precisions=("fp16", "fp8-rowwise"),
        reports_dir=str(tmp_path),
        parity_steps=6,
        train=precision.replace(precision.PRECISION_TRAIN, fused_loss=True),
    )
    fused = {(phase, job.precision, job.fused_loss) for phase, job in precision.make_plan(cfg).jobs}
    assert fused == {
        (phase, p, p != "fp16")
        for phase in ("parity", "throughput")
        for p in ("bf16", "fp16", "fp8-rowwise")
    }


def test_the_throughput_heading_names_the_micro_batch_and_gathering():
    from project02_fsdp_scaling.precision_report import _micro

    assert _micro({"micro_batch": 16, "reshard_after_forward": False}) == (
        ", micro-batch 16, parameters gathered for the whole step"
    )
    assert _micro({"micro_batch": 8, "reshard_after_forward": True}) == ", micro-batch 8"
    assert _micro({"micro_batch": 0}) == "" and _micro({}) == ""  # CPU, or an older record


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"precisions": ("fp64",)}, "precisions must name one or more of"),
        ({"precisions": ("bf16", "bf16")}, "names one twice"),
        ({"parity": False, "throughput": False}, "leave nothing to run"),
        ({"train": replace(precision.PRECISION_TRAIN, precision="fp16")}, "--precision: precision"),
        ({"parity_steps": 2}, "parity_steps must exceed the warm-up steps"),
        ({"parity_preset": "huge"}, "unknown preset"),
        ({"keep_other_phases": True}, "--keep-other-phases keeps a phase this run leaves out"),
        ({"repeats": -1}, "repeats must be an integer >= 0"),
    ],
)
def test_bad_harness_configs_are_named(kwargs, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        precision.make_plan(precision.PrecisionConfig(reports_dir=str(tmp_path), **kwargs))


def test_a_phase_measured_apart_is_kept_with_its_own_environment(tmp_path):
    """--keep-other-phases: a throughput-only run keeps the parity phase of the record already
    there, with the environment and training config it was measured with, and the report says
    so; a record of another world size is refused."""
    from shared.results import save_result

    cfg = precision.PrecisionConfig(reports_dir=str(tmp_path), parity=False, keep_other_phases=True)
    plan = precision.make_plan(cfg)
    with pytest.raises(FileNotFoundError, match="no record at"):
        precision._kept_phases(cfg, plan, {"throughput"})
    tier = "gpu" if plan.on_gpu else "cpu"
    parity = {"preset": "tiny", "steps_total": 8, "global_batch": 8, "seq_len": 64, "runs": []}
    old_env = {"date": "2026-01-02T03:04:05+00:00", "gpu": None, "git_commit": "abc"}
    save_result(
        precision.PROJECT,
        plan.name,
        {"tier": tier, "world_size": 1, "parity": parity, "throughput": {"runs": ["old"]}},
        config={"train": {"global_batch": 8}},
        reports_dir=tmp_path,
        env=old_env,
    )
    kept = precision._kept_phases(cfg, plan, {"throughput"})
    assert list(kept) == ["parity"]  # the phase this run measures is not kept
    assert kept["parity"]["runs"] == [] and kept["parity"]["global_batch"] == 8
    assert kept["parity"]["measured_with"]["environment"]["date"] == old_env["date"]
    assert kept["parity"]["measured_with"]["train"] == {"global_batch": 8}
    rec = {
        "environment": {"date": "2026-02-03", "gpu": None},
        "results": {"tier": tier, "world_size": 1, "final_fraction": 0.1, "parity": kept["parity"]},
    }
    assert "The parity phase was measured separately, on: " in precision_markdown(rec)
    cfg2 = replace(cfg, world_size=2)
    with pytest.raises(ValueError, match="world size 1, this run is tier"):
        precision._kept_phases(cfg2, plan, {"throughput"})


def test_older_records_name_the_precision_by_dtype():
    assert record_precision({"precision": "fp8-rowwise"}) == "fp8-rowwise"
    assert record_precision({"param_dtype": "bfloat16"}) == "bf16"
    assert TrainConfig(precision="fp8-tensorwise").param_dtype() == "bfloat16"
    assert TrainConfig(precision="fp8-tensorwise").float8_recipe() == "tensorwise"
    assert TrainConfig(precision="fp16").param_dtype() == "float16"
    assert TrainConfig(precision="fp64").param_dtype() is None


@pytest.mark.slow  # 7 torchrun jobs of the tiny model; float8 GEMMs are emulated on the CPU
def test_the_precision_harness_end_to_end_on_cpu(tmp_path):
    pytest.importorskip("torchao.float8")
    cfg = precision.PrecisionConfig(
        precisions=("bf16", "fp8-tensorwise", "fp16"),
        reports_dir=str(tmp_path),
        parity_steps=8,
        throughput_steps=1,
        train=replace(precision.PRECISION_TRAIN, lr_warmup_steps=0),
    )
    path = precision.run(cfg)
    rec = json.loads(path.read_text())
    res = rec["results"]
    par, thr = res["parity"], res["throughput"]
    assert [r["label"] for r in par["runs"]] == [
        "bf16",
        "fp8-tensorwise",
        "fp16",
        "fp16 (no loss scaling)",
    ]
    assert all(r["status"] == "ok" for r in par["runs"] + thr["runs"])
    by = {r["label"]: r for r in par["runs"]}
    assert by["bf16"]["compute_dtype"] == "bfloat16" and by["fp16"]["compute_dtype"] == "float16"
    n_eligible = sum(
        float8_filter(m, name) for name, m in build_model("tiny", seed=0).named_modules()
    )
    assert by["fp8-tensorwise"]["float8_linears"] == n_eligible > 0
    assert by["bf16"]["float8_linears"] == 0
    # every recipe learns the stream, and the recipes differ by far less than what was learnt
    learnt = by["bf16"]["losses"][0] - by["bf16"]["final_loss"]
    assert learnt > 0
    for r in par["runs"]:
        assert r["final_loss"] < r["losses"][0]
        assert abs(r["final_loss_diff_vs_bf16"]) < 0.5 * learnt, r["label"]
    for label in ("fp16", "fp16 (no loss scaling)"):
        u = by[label]["fp16_underflow"]
        assert u["elements"] == build_model("tiny", seed=0).num_params()
        assert 0 <= u["zero_without_scaling"] <= u["nonzero_with_scaling"] <= u["elements"]
        assert 0 <= u["underflow_share"] <= 1
    assert by["fp16"]["loss_scale"] > 0 and by["fp16 (no loss scaling)"]["loss_scale"] is None
    assert [r["speedup_vs_bf16"] for r in thr["runs"]][0] == 1.0
    assert all(math.isfinite(r["tokens_per_s"]) and r["tokens_per_s"] > 0 for r in thr["runs"])
    # the report renders from the record alone
    md = precision_markdown(rec, name="precision_cpu")
    assert "Loss parity: `tiny`, 8 steps" in md and "| fp16 (no loss scaling) | ok |" in md
    assert (tmp_path / "project02_fsdp_scaling" / "precision_cpu.md").read_text() == md
    names = [p.name for p in precision_charts(rec, tmp_path)]
    assert names == ["precision_cpu_loss.png", "precision_cpu_throughput.png"]


# ---- the harness's repetitions, with a fake launcher --------------------------------------------
# No torchrun: each "job" writes the record train.py would, with a throughput chosen per recipe
# and repetition. fp8-tensorwise at 1.3, 1.1, 1.2 of bf16's run of the same repetition (median
# 1.2; the ratio of the medians would be 130 / 100 = 1.3); fp16 at 0.9, 0.75, 1.2.
REP_TPS = {
    "bf16": [100.0, 200.0, 50.0],
    "fp8-tensorwise": [130.0, 220.0, 60.0],
    "fp16": [90.0, 150.0, 60.0],
}
REP_MEMORY = [1.0, 3.0, 2.0]


def _fake_train_record(precision_name: str, tps: float, memory: float) -> dict:
    return {
        "preset": "tiny",
        "compute_dtype": "float16" if precision_name == "fp16" else "bfloat16",
        "float8_linears": 4 if precision_name.startswith("fp8") else 0,
        "losses": [5.0, 4.0, 3.0],
        "skipped_steps": [],
        "loss_scale": 65536.0 if precision_name == "fp16" else None,
        "fp16_underflow": None,
        "tokens_per_s": tps,
        "step_time_s": {"median": 1000.0 / tps},
        "mfu": tps / 1000,
        "peak_kind": "fp8" if precision_name.startswith("fp8") else "bf16",
        "mfu_bf16_peak": tps / 2000,
        "achieved_tflops_per_device": tps / 10,
        "peak_memory_gib": memory,
        "memory_kind": "fake",
        "gpu": None,
    }


@pytest.fixture
def fake_jobs(monkeypatch, tmp_path):
    """precision.launch replaced: records each throughput job's recipe, the record on disk
    before it, and fails the calls named in `fail_at` (recipe -> its nth throughput call)."""
    from project02_fsdp_scaling import precision_report

    calls: list[tuple[str, str]] = []  # (phase by steps, recipe)
    before: list[dict | None] = []
    fail_at: dict[str, int] = {}
    record = tmp_path / "project02_fsdp_scaling" / "precision_cpu.json"

    def launch(ws, command, flags, *, on_gpu, timeout_s):
        assert command == "train" and ws == 1 and not on_gpu
        p = flags[flags.index("--precision") + 1]
        phase = "throughput" if flags[flags.index("--steps") + 1] == "1" else "parity"
        calls.append((phase, p))
        before.append(json.loads(record.read_text()) if record.is_file() else None)
        n = sum(1 for c in calls if c == (phase, p))
        if phase == "throughput" and fail_at.get(p) == n:
            return 1, "boom\n"
        tps = REP_TPS[p][n - 1] if phase == "throughput" else 1.0
        out = Path(flags[flags.index("--out") + 1])
        out.write_text(json.dumps(_fake_train_record(p, tps, REP_MEMORY[n - 1])))
        return 0, ""

    monkeypatch.setattr(precision, "launch", launch)
    # charts are tested end to end; here each job's rewrite of the record is what counts
    monkeypatch.setattr(precision_report, "precision_charts", lambda *a, **k: [])
    return calls, before, fail_at


def _rep_cfg(tmp_path, repeats: int, **kw) -> precision.PrecisionConfig:
    return precision.PrecisionConfig(
        precisions=("bf16", "fp8-tensorwise", "fp16"),
        reports_dir=str(tmp_path),
        parity=kw.pop("parity", False),
        parity_steps=4,
        throughput_steps=1,
        repeats=repeats,
        **kw,
    )


def test_repetitions_interleave_and_the_speedup_is_per_repetition(
    tmp_path, fake_jobs, monkeypatch, capsys
):
    from shared.cost import cost_line
    from shared.hardware import get_gpu

    spec = get_gpu("h200-sxm")
    monkeypatch.setattr("shared.hardware.detect_gpu", lambda *a: spec)
    calls, before, _ = fake_jobs
    path = precision.run(_rep_cfg(tmp_path, 3))
    order = ["bf16", "fp8-tensorwise", "fp16"]
    # every recipe once per repetition, each its own job, the order reversed on the second
    assert [p for _, p in calls] == order + order[::-1] + order
    out = capsys.readouterr().out
    assert "=== throughput, repetition 2 of 3: fp16 (job 4 of 9)" in out
    rec = json.loads(path.read_text())
    thr = rec["results"]["throughput"]
    assert thr["repeats"] == 3 and rec["config"]["precision"]["repeats"] == 3
    assert [r["label"] for r in thr["runs"]] == order
    by = {r["precision"]: r for r in thr["runs"]}
    fp8 = by["fp8-tensorwise"]
    assert fp8["repeats"] == 3 and fp8["tokens_per_s"] == 130.0
    assert fp8["tokens_per_s_reps"] == REP_TPS["fp8-tensorwise"]
    assert (fp8["tokens_per_s_min"], fp8["tokens_per_s_max"]) == (60.0, 220.0)
    assert fp8["step_time_s_reps"] == pytest.approx([1000 / t for t in REP_TPS["fp8-tensorwise"]])
    assert fp8["mfu"] == pytest.approx(0.13) and fp8["mfu_bf16_peak_max"] == pytest.approx(0.11)
    assert fp8["achieved_tflops_per_device"] == pytest.approx(13.0)
    assert fp8["peak_memory_gib"] == 3.0  # the largest of the runs
    # the speed-up per repetition, against that repetition's bf16 run
    assert fp8["speedup_vs_bf16_reps"] == pytest.approx([1.3, 1.1, 1.2])
    assert fp8["speedup_vs_bf16"] == pytest.approx(1.2)  # not 130 / 100
    assert by["fp16"]["speedup_vs_bf16_reps"] == pytest.approx([0.9, 0.75, 1.2])
    assert (by["fp16"]["speedup_vs_bf16_min"], by["fp16"]["speedup_vs_bf16_max"]) == (
        pytest.approx(0.75),
        pytest.approx(1.2),
    )
    assert by["bf16"]["speedup_vs_bf16_reps"] == [1.0, 1.0, 1.0]
    # cost from the median tokens/s
    for r in thr["runs"]:
        line = cost_line(spec, 1, r["tokens_per_s"], measured=True).to_dict()
        assert r["usd_per_m_tokens_on_demand"] == line["usd_per_m_tokens_on_demand"]
    # rewritten after each job: before the sixth job (fp16 and fp8-tensorwise ran twice, bf16
    # once), each pairs its repetitions with bf16's, so only the first counts for the speed-up
    mid = {r["precision"]: r for r in before[5]["results"]["throughput"]["runs"]}
    assert mid["fp16"]["repeats"] == 2 and mid["fp16"]["tokens_per_s_reps"] == [90.0, 150.0]
    assert mid["fp16"]["speedup_vs_bf16"] == pytest.approx(0.9)
    assert "speedup_vs_bf16_reps" not in mid["fp16"] and mid["bf16"]["repeats"] == 1
    # the report: median (min–max) and how many runs
    md = (path.parent / "precision_cpu.md").read_text()
    assert "| fp8-tensorwise | 3 | 130 (60–220) | 1.2 (1.1–1.3) | 13 (6–22) |" in md
    assert "| fp16 | 3 | 90 (60–150) | 0.9 (0.75–1.2) |" in md
    assert "median of up to 3 runs" in md and "Each recipe ran up to 3 times" in md
    assert md == precision_markdown(rec, name="precision_cpu")


def test_one_repetition_is_the_record_and_report_of_one_run(tmp_path, fake_jobs):
    calls, _, _ = fake_jobs
    rec = json.loads(precision.run(_rep_cfg(tmp_path, 0)).read_text())  # 0: 1 on CPU
    assert [p for _, p in calls] == ["bf16", "fp8-tensorwise", "fp16"]
    thr = rec["results"]["throughput"]
    assert thr["repeats"] == 1
    for r in thr["runs"]:
        assert not any(k.endswith(("_reps", "_min", "_max")) for k in r) and "repeats" not in r
    assert thr["runs"][1]["speedup_vs_bf16"] == pytest.approx(1.3)
    md = precision_markdown(rec)
    assert "| fp8-tensorwise | 130 | 1.3 | 13 |" in md and "(min" not in md and "runs" not in md
    assert "loss fused" not in md
    # a --fused-loss run says so in its heading, and that its fp16 jobs ran unfused
    rec["config"]["train"]["fused_loss"] = True
    assert ", output projection and loss fused (fp16's unfused)" in precision_markdown(rec)


def test_a_failed_repetition_stops_its_recipe_and_is_reported(tmp_path, fake_jobs):
    calls, _, fail_at = fake_jobs
    fail_at["fp8-tensorwise"] = 2
    with pytest.raises(RuntimeError, match=r"fp8-tensorwise \(repetition 2\)"):
        precision.run(_rep_cfg(tmp_path, 3))
    order = ["bf16", "fp8-tensorwise", "fp16"]
    assert [p for _, p in calls] == order + order[::-1] + ["bf16", "fp16"]
    rec = json.loads((tmp_path / "project02_fsdp_scaling" / "precision_cpu.json").read_text())
    by = {r["precision"]: r for r in rec["results"]["throughput"]["runs"]}
    fp8 = by["fp8-tensorwise"]
    assert fp8["status"] == "ok" and fp8["repeats"] == 1 and "tokens_per_s_reps" not in fp8
    assert fp8["failed_repetition"]["repetition"] == 2 and fp8["speedup_vs_bf16"] == 1.3
    assert by["bf16"]["repeats"] == 3 and by["fp16"]["repeats"] == 3
    md = precision_markdown(rec)
    assert "| fp8-tensorwise | 1 | 130 | 1.3 |" in md  # one run: plain numbers
    assert "- throughput fp8-tensorwise, repetition 2 (the runs before it stand): exit 1" in md


def test_a_single_run_phase_is_kept_beside_repeated_throughput(tmp_path, fake_jobs):
    """--keep-other-phases: a repeated throughput run keeps the single parity phase (and the
    old single-run throughput record rendered plain before it)."""
    calls, _, _ = fake_jobs
    first = json.loads(precision.run(_rep_cfg(tmp_path, 1, parity=True)).read_text())
    assert [c for c in calls if c[0] == "parity"] == [
        ("parity", "bf16"),
        ("parity", "fp8-tensorwise"),
        ("parity", "fp16"),
        ("parity", "fp16"),  # without loss scaling
    ]
    calls.clear()
    path = precision.run(_rep_cfg(tmp_path, 2, keep_other_phases=True))
    assert {c[0] for c in calls} == {"throughput"} and len(calls) == 6
    rec = json.loads(path.read_text())
    res = rec["results"]
    gs = rec["environment"]["gpu_state"]  # read before the first job, and at the last publish
    assert isinstance(gs["start"], dict) and gs["start"]["time"] <= gs["end"]["time"]
    assert res["parity"]["runs"] == first["results"]["parity"]["runs"]
    assert res["parity"]["measured_with"]["environment"] == first["environment"]
    md = path.with_suffix(".md").read_text()
    assert "The parity phase was measured separately, on: " in md
    assert "| fp16 (no loss scaling) | ok |" in md and "| bf16 | 2 | 150 (100–200) |" in md


@pytest.mark.skipif(
    not (Path(REPORTS_DIR) / precision.PROJECT / "precision_gpu.json").is_file(),
    reason="no committed record",
)
def test_a_committed_single_run_record_renders_as_committed():
    from shared.results import load_result

    committed = Path(REPORTS_DIR) / precision.PROJECT
    rec = load_result(committed / "precision_gpu.json")
    assert not any("tokens_per_s_reps" in r for r in rec["results"]["throughput"]["runs"])
    md = precision_markdown(rec, name="precision_gpu")
    assert md == (committed / "precision_gpu.md").read_text()
