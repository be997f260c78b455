"""scripts/verify_results.py on the CPU: the comparison on recorded JSON (agree, disagree, not
comparable, missing record, a re-run that failed or left the figure out), the exit codes, the
registry against the committed reports, and `make verify-results` without a GPU."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from scripts import verify_results as vr
from shared.repeat import Spread, flat
from shared.results import save_result

ROOT = Path(__file__).resolve().parents[2]
H200 = {"gpu": "NVIDIA H200", "compute_capability": "9.0"}
H100 = {"gpu": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}
A100 = {"gpu": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0"}
P04 = "project04_llm_inference"


def latency_record(ms_b1: list[float], tok_s_b256: list[float], env=H200) -> dict:
    rows = [{"batch": 1, "context": 1024, **flat("engine_multi_ms", Spread.of(ms_b1))},
            {"batch": 256, "context": 1024, **flat("engine_multi_tok_s", Spread.of(tok_s_b256))}]  # fmt: skip
    return {"environment": env, "config": {"decode_steps": 64}, "results": {"rows": rows}}


def prefix_record(overhead: list[float], env=H200) -> dict:
    return {"environment": env, "config": {},
            "results": {"unshared": flat("overhead_pct", Spread.of(overhead))}}  # fmt: skip


def fig(key: str) -> vr.Figure:
    return next(f for f in vr.FIGURES if f.key == key)


# --- reading a figure ----------------------------------------------------------------------------


def test_lookup_follows_keys_indices_and_matchers():
    rec = {"results": {"rows": [{"batch": 1, "x": 2.0}, {"batch": 8, **flat("x", Spread.of([3, 1, 2]))}]}}  # fmt: skip
    assert vr.lookup(rec, ("results", "rows", {"batch": 1}, "x")) == Spread.of([2.0])
    s = vr.lookup(rec, ("results", "rows", {"batch": 8}, "x"))
    assert (s.median, s.min, s.max, s.n) == (2.0, 1.0, 3.0, 3)
    assert vr.lookup(rec, ("results", "rows", 1, "x")) == s
    assert vr.lookup(rec, ("results", "rows", {"batch": 64}, "x")) is None
    assert vr.lookup(rec, ("results", "nothing", "x")) is None
    assert vr.lookup(rec, ("results", "rows", 5, "x")) is None
    nested = {"a": {"f": {"median": 2.0, "values": [1.0, 2.0, 4.0]}}}
    assert vr.lookup(nested, ("a", "f")) == Spread.of([1.0, 2.0, 4.0])
    with pytest.raises(ValueError, match="matches 2"):
        vr.lookup({"r": [{"b": 1, "x": 1}, {"b": 1, "x": 2}]}, ("r", {"b": 1}, "x"))


def test_worst_decode_share_is_the_reports_definition_with_that_shapes_range():
    rows = [{"batch": 64, "context": 8192, **flat("ours_gbps", Spread.of([3700.0, 3600.0, 3800.0]))},
            {"batch": 256, "context": 8192, **flat("ours_gbps", Spread.of([4100.0] * 3))},
            {"batch": 1, "context": 32768, "ours_gbps": 500.0},  # not one of the target's shapes
            {"batch": 64, "context": 1024, "ours_gbps": 900.0}]  # fmt: skip
    s = vr.worst_decode_bandwidth_share({"results": {"rows": rows}})
    assert s.median == pytest.approx(3700 / 43) and s.min == pytest.approx(3600 / 43)
    assert vr.worst_decode_bandwidth_share({"results": {"rows": rows[2:]}}) is None


def test_the_registry_reads_every_committed_record_present():
    """Every figure whose committed record is in reports/ finds its value there (a typo in a
    key path would otherwise pass as 'no record' forever)."""
    found = 0
    for f in vr.FIGURES:
        path = ROOT / "reports" / vr.RERUNS[f.rerun].record
        if not path.is_file():
            continue
        value = f.value(json.loads(path.read_text()))
        assert value is not None, f.key
        found += 1
    assert found > 0
    assert {f.rerun for f in vr.FIGURES} <= set(vr.RERUNS)
    assert len({f.key for f in vr.FIGURES}) == len(vr.FIGURES)
    p04 = [f for f in vr.FIGURES if f.key.startswith("p04.")]
    assert p04 and all(not vr.RERUNS[f.rerun].not_wired for f in p04)
    for f in vr.FIGURES:
        assert f.kind in ("ratio", "absolute") and f.tol.reason and (f.tol.rel or f.tol.abs)


def test_committed_values_of_the_published_project04_records(repo_root):
    rec = json.loads((repo_root / "reports" / P04 / "decode_latency.json").read_text())
    assert fig("p04.decode.b1").value(rec).median == pytest.approx(1.413, abs=1e-3)
    rec = json.loads((repo_root / "reports" / P04 / "decode_attention.json").read_text())
    assert fig("p04.decode_kernel.share").value(rec).median == pytest.approx(87.8, abs=0.05)


# --- the verdicts --------------------------------------------------------------------------------


def test_agree_within_the_relative_tolerance_and_disagree_outside():
    f = fig("p04.decode.b1")  # absolute, +-15%
    committed = latency_record([1.41], [51_559.0])
    c = vr.compare(f, committed, latency_record([1.5, 1.45, 1.6, 1.52, 1.48], [50_000.0] * 5))
    assert c.status == "agree" and c.new.median == 1.5 and c.diff == pytest.approx(0.09 / 1.41)
    c = vr.compare(f, committed, latency_record([1.7, 1.65, 1.8, 1.72, 1.68], [50_000.0] * 5))
    assert c.status == "disagree" and "outside ±15%" in c.detail  # +20%
    # the range of the new run does not rescue a median outside the tolerance
    c = vr.compare(f, committed, latency_record([1.0, 1.7, 1.8, 1.9, 1.75], [50_000.0] * 5))
    assert c.status == "disagree"


def test_an_absolute_figure_compares_only_on_the_same_gpu_model():
    committed = latency_record([1.41], [51_559.0])
    c = vr.compare(fig("p04.decode.b256"), committed, latency_record([1.4], [51_000.0], env=H100))
    assert c.status == "not_comparable" and "measured on NVIDIA H200" in c.detail
    assert c.new.median == 51_000.0  # still printed


def test_a_ratio_figure_compares_across_gpus_of_one_compute_capability():
    f = fig("p04.prefix.overhead")  # a ratio, +-2 points absolute
    committed = prefix_record([1.7])
    assert vr.compare(f, committed, prefix_record([0.5, 1.0, 3.0], env=H100)).status == "agree"
    assert vr.compare(f, committed, prefix_record([4.0, 3.9, 4.2], env=H100)).status == "disagree"
    c = vr.compare(f, committed, prefix_record([1.7], env=A100))
    assert c.status == "not_comparable" and "compute capability 8.0 here, 9.0 committed" in c.detail
    c = vr.compare(f, committed, prefix_record([1.7], env={"gpu": "x"}))
    assert c.status == "not_comparable"


def test_missing_records_and_figures():
    f = fig("p04.decode.b1")
    assert vr.compare(f, None, latency_record([1.4], [1.0])).status == "no_record"
    empty = {"environment": H200, "results": {"rows": []}}
    assert vr.compare(f, empty, latency_record([1.4], [1.0])).status == "no_record"
    c = vr.compare(f, latency_record([1.4], [1.0]), empty)
    assert c.status == "no_value" and c.committed.median == 1.4
    assert vr.compare(f, latency_record([1.4], [1.0]), None).status == "not_run"


def test_tolerance_takes_the_larger_of_relative_and_absolute():
    t = vr.Tolerance(rel=0.1, abs=0.5)
    assert t.allows(2.0, 2.5) and not t.allows(2.0, 2.51)  # abs wins near zero
    assert t.allows(10.0, 11.0) and not t.allows(10.0, 11.01)  # rel wins further out
    assert t.text() == "±10% or ±0.5"


@pytest.mark.parametrize(
    ("statuses", "code"),
    [(["agree", "agree"], 0), (["agree", "disagree"], 1), (["agree", "not_wired"], 4),
     (["not_comparable", "rerun_failed"], 1), (["no_record"], 4), (["no_value", "agree"], 1),
     (["not_run"], 4)],
)  # fmt: skip
def test_exit_codes(statuses, code):
    f = fig("p04.decode.b1")
    assert vr.exit_code([vr.Check(f, s) for s in statuses]) == code


# --- the whole run with recorded JSON ------------------------------------------------------------


def _write(root: Path, rel: str, rec: dict) -> None:
    project, name = rel.split("/")
    save_result(project, name.removesuffix(".json"), rec["results"], config=rec.get("config"),
                reports_dir=root, env=rec["environment"])  # fmt: skip


def test_verify_runs_each_rerun_once_and_reports_every_figure(tmp_path):
    committed, out = tmp_path / "reports", tmp_path / "run"
    _write(committed, f"{P04}/decode_latency.json", latency_record([1.41], [51_559.0]))
    _write(committed, f"{P04}/prefix_caching.json", prefix_record([1.7]))
    _write(committed, "project01_cuda_kernel/gemm.json", {"environment": H200, "results": {
        "rows": [{"kernel": "hgemm_09_wgmma_tma", "shape": "4096x4096x4096", "pct_of_cublas": 90.9}]}})  # fmt: skip
    ran = []

    def runner(rerun, committed_rec, out_dir):
        ran.append((rerun.key, rerun.argv(committed_rec)))
        if rerun.key == "p04-latency":
            _write(out_dir, rerun.record, latency_record([1.45, 1.4, 1.5], [40_000.0] * 3))
            return ""
        return "exit status 1 (log: x): CUDA out of memory"

    figures = [fig(k) for k in ("p04.decode.b1", "p04.decode.b256", "p04.prefix.overhead",
                                "p04.throughput", "p01.gemm.bf16_4096")]  # fmt: skip
    v = vr.verify(figures, committed, out, runner)
    # latency once for both of its figures; prefix ran and failed; throughput has no committed
    # record (not run); gemm is not wired
    assert [k for k, _ in ran] == ["p04-latency", "p04-prefix"]
    latency_argv = dict(ran)["p04-latency"]
    assert latency_argv[:2] == [P04, "latency"] and "--decode-steps" in latency_argv
    assert latency_argv[latency_argv.index("--max-model-len") + 1] == "8352"  # the committed plan's
    got = {c.figure.key: c.status for c in v.checks}
    assert got == {"p04.decode.b1": "agree", "p04.decode.b256": "disagree",
                   "p04.prefix.overhead": "rerun_failed", "p04.throughput": "no_record",
                   "p01.gemm.bf16_4096": "not_wired"}  # fmt: skip
    assert vr.exit_code(v.checks) == vr.EXIT_DISAGREE
    text = vr.report(v)
    assert "1.41 (1 run)" in text and "1.45 (1.4–1.5, n=3)" in text
    assert "not checked: re-run not wired yet" in text and "CUDA out of memory" in text
    assert "Tolerances:" in text and vr.ABSOLUTE.reason in text
    # a record left by an earlier run in the same folder is not taken for the new one
    (out / f"{P04}/prefix_caching.json").parent.mkdir(parents=True, exist_ok=True)
    _write(out, f"{P04}/prefix_caching.json", prefix_record([1.7]))
    v = vr.verify([fig("p04.prefix.overhead")], committed, out, lambda rr, c, o: "")
    assert v.checks[0].status == "rerun_failed" and "wrote no" in v.reruns["p04-prefix"]["status"]
    with pytest.raises(ValueError, match="committed folder"):
        vr.verify(figures, committed, committed, runner)
    ran.clear()
    # no GPU: nothing runs, the committed values are still shown
    v = vr.verify(figures, committed, None, runner)
    assert not ran and {c.status for c in v.checks} == {"not_run", "no_record", "not_wired"}


def test_main_without_a_gpu_says_so_and_exits_3(monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert vr.main(["--only", "p04"]) == vr.EXIT_NO_GPU
    out = capsys.readouterr().out
    assert "no CUDA GPU here" in out and "p04.decode.b1" in out and "not re-measured" in out
    assert vr.main(["--list"]) == vr.EXIT_OK


def test_main_with_a_gpu_writes_the_verdicts(monkeypatch, tmp_path, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    committed = tmp_path / "reports"
    _write(committed, f"{P04}/prefix_caching.json", prefix_record([1.7]))

    def runner(rerun, committed_rec, out_dir):
        _write(out_dir, rerun.record, prefix_record([1.0, 1.5, 2.0]))
        return ""

    monkeypatch.setattr(vr, "run_rerun", runner)
    code = vr.main(["--only", "p04.prefix", "--committed-dir", str(committed),
                    "--reports-dir", str(tmp_path / "run")])  # fmt: skip
    assert code == vr.EXIT_OK
    saved = json.loads((tmp_path / "run" / "verify_results.json").read_text())
    assert saved["exit_code"] == 0 and saved["checks"][0]["status"] == "agree"
    assert saved["checks"][0]["new"]["median"] == 1.5


def test_bad_selection_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        vr.main(["--only", "p09"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --only: no figure matches")


def test_make_help_lists_verify_results():
    r = subprocess.run(["make", "help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "make verify-results" in r.stdout
