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
    rows = [
        {"batch": 1, "context": 1024, **flat("engine_multi_ms", Spread.of(ms_b1))},
        {"batch": 256, "context": 1024, **flat("engine_multi_tok_s", Spread.of(tok_s_b256))},
    ]
    return {"environment": env, "config": {"decode_steps": 64}, "results": {"rows": rows}}


def prefix_record(overhead: list[float], env=H200) -> dict:
    return {
        "environment": env,
        "config": {},
        "results": {"unshared": flat("overhead_pct", Spread.of(overhead))},
    }


def fig(key: str) -> vr.Figure:
    return next(f for f in vr.FIGURES if f.key == key)


# --- reading a figure ----------------------------------------------------------------------------


def test_lookup_follows_keys_indices_and_matchers():
    rec = {
        "results": {
            "rows": [{"batch": 1, "x": 2.0}, {"batch": 8, **flat("x", Spread.of([3, 1, 2]))}]
        }
    }
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
    rows = [
        {"batch": 64, "context": 8192, **flat("ours_gbps", Spread.of([3700.0, 3600.0, 3800.0]))},
        {"batch": 256, "context": 8192, **flat("ours_gbps", Spread.of([4100.0] * 3))},
        {"batch": 1, "context": 32768, "ours_gbps": 500.0},  # not one of the target's shapes
        {"batch": 64, "context": 1024, "ours_gbps": 900.0},
    ]
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
    for project in ("p04.", "p01.", "p02.", "p03."):
        wired = [f for f in vr.FIGURES if f.key.startswith(project)]
        assert wired and all(not vr.RERUNS[f.rerun].not_wired for f in wired), project
    for f in vr.FIGURES:
        assert f.kind in ("ratio", "absolute") and f.tol.reason and (f.tol.rel or f.tol.abs)


def test_committed_values_of_the_published_project04_records(repo_root):
    rec = json.loads((repo_root / "reports" / P04 / "decode_latency.json").read_text())
    row = next(r for r in rec["results"]["rows"] if (r["batch"], r["context"]) == (1, 1024))
    assert fig("p04.decode.b1").value(rec).median == row["engine_multi_ms"]
    assert 0.3 < row["engine_multi_ms"] < 5  # ms per batch-1 token on a GPU: the right field
    rec = json.loads((repo_root / "reports" / P04 / "decode_attention.json").read_text())
    # the worst shape of the target's range (batch 64/256, context >= 8k), % of 4.3 TB/s
    shares = [
        r["ours_gbps"] / 43
        for r in rec["results"]["rows"]
        if r["batch"] in (64, 256) and r["context"] >= 8192 and "ours_gbps" in r
    ]
    assert shares and 50 < min(shares) < 100
    assert fig("p04.decode_kernel.share").value(rec).median == pytest.approx(min(shares))


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
    f = fig("p04.prefix.overhead")  # a ratio, +-4 points absolute
    committed = prefix_record([1.7])
    assert vr.compare(f, committed, prefix_record([0.5, 1.0, 3.0], env=H100)).status == "agree"
    assert vr.compare(f, committed, prefix_record([-1.8, -2.0, 7.3], env=H100)).status == "agree"
    assert vr.compare(f, committed, prefix_record([6.0, 5.9, 6.2], env=H100)).status == "disagree"
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
    [
        (["agree", "agree"], 0),
        (["agree", "disagree"], 1),
        (["agree", "not_wired"], 4),
        (["not_comparable", "rerun_failed"], 1),
        (["no_record"], 4),
        (["no_value", "agree"], 1),
        (["not_run"], 4),
    ],
)
def test_exit_codes(statuses, code):
    f = fig("p04.decode.b1")
    assert vr.exit_code([vr.Check(f, s) for s in statuses]) == code


# --- the whole run with recorded JSON ------------------------------------------------------------


def _write(root: Path, rel: str, rec: dict) -> None:
    project, name = rel.split("/")
    save_result(
        project,
        name.removesuffix(".json"),
        rec["results"],
        config=rec.get("config"),
        reports_dir=root,
        env=rec["environment"],
    )


def test_verify_runs_each_rerun_once_and_reports_every_figure(tmp_path):
    committed, out = tmp_path / "reports", tmp_path / "run"
    _write(committed, f"{P04}/decode_latency.json", latency_record([1.41], [51_559.0]))
    _write(committed, f"{P04}/prefix_caching.json", prefix_record([1.7]))
    _write(
        committed,
        "project02_fsdp_scaling/scaling_gpu.json",
        {"environment": H200, "results": {"runs": [{"world_size": 1, "mfu": 0.41}]}},
    )
    ran = []

    def runner(rerun, committed_rec, out_dir):
        ran.append((rerun.key, rerun.argv(committed_rec)))
        if rerun.key == "p04-latency":
            env = {**H200, "cpu_model": "Example CPU 9000"}
            _write(out_dir, rerun.record, latency_record([1.45, 1.4, 1.5], [40_000.0] * 3, env))
            return ""
        return "exit status 1 (log: x): CUDA out of memory"

    figures = [
        fig(k)
        for k in (
            "p04.decode.b1",
            "p04.decode.b256",
            "p04.prefix.overhead",
            "p04.throughput",
            "p02.mfu.ws1",
        )
    ]
    v = vr.verify(figures, committed, out, runner)
    # latency once for both of its figures; prefix and project02's scaling ran and failed;
    # throughput has no committed record (not run)
    assert [k for k, _ in ran] == ["p04-latency", "p04-prefix", "p02-scaling"]
    latency_argv = dict(ran)["p04-latency"]
    assert latency_argv[:2] == [P04, "latency"] and "--decode-steps" in latency_argv
    assert latency_argv[latency_argv.index("--max-model-len") + 1] == "8352"  # the committed plan's
    got = {c.figure.key: c.status for c in v.checks}
    assert got == {
        "p04.decode.b1": "agree",
        "p04.decode.b256": "disagree",
        "p04.prefix.overhead": "rerun_failed",
        "p04.throughput": "no_record",
        "p02.mfu.ws1": "rerun_failed",
    }
    assert vr.exit_code(v.checks) == vr.EXIT_DISAGREE
    text = vr.report(v)
    assert "1.41 (1 run)" in text and "1.45 (1.4–1.5, n=3)" in text
    assert "FAILED: the re-run failed" in text and "CUDA out of memory" in text
    assert "Tolerances:" in text and vr.ABSOLUTE.reason in text
    # host-bound figures move with the host: both CPUs named (the committed one predates it)
    assert "host CPU: Example CPU 9000 (the committed record's: not recorded)" in text
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
    assert not ran and {c.status for c in v.checks} == {"not_run", "no_record"}


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
    code = vr.main(
        [
            "--only",
            "p04.prefix",
            "--committed-dir",
            str(committed),
            "--reports-dir",
            str(tmp_path / "run"),
        ]
    )
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


# --- project01: the GEMM ladder and attention ----------------------------------------------------

P01 = "project01_cuda_kernel"
# The README's published values, as it prints them (GEMM targets table, attention tables at head
# dim 128, seq 4,096, non-causal, the record of 2026-12-05 with the Hopper backward as "ours":
# 603 / 345, 603 / 674, 474 / 303, 474 / 585, 445 / 288; ratios are medians of the per-repetition
# ratios, so not exactly these quotients).
P01_PUBLISHED = {  # the committed records' medians of 5 repetitions, as the README prints them
    "p01.gemm.bf16_4096": 91.1,
    "p01.gemm.bf16_8192": 98.3,
    "p01.gemm.fp32_4096": 81.8,
    "p01.attention.fwd": 1.79,
    "p01.attention.fwd_cudnn": 0.895,
    "p01.attention.fwd_bwd": 1.57,
    "p01.attention.fwd_bwd_cudnn": 0.816,
    "p01.attention.bwd": 1.54,
    # attention_hbwd.json (the Hopper backward): its table's hbwd / cuDNN and hbwd / ours rows
    "p01.hbwd.fwd_bwd_cudnn": 0.865,
    "p01.hbwd.bwd_vs_fa2": 1.735,
}


def test_p01_figures_resolve_against_the_committed_records(repo_root):
    assert {f.key for f in vr.FIGURES if f.key.startswith("p01.")} == set(P01_PUBLISHED)
    for key, published in P01_PUBLISHED.items():
        f = fig(key)
        rec = json.loads((repo_root / "reports" / vr.RERUNS[f.rerun].record).read_text())
        s = f.value(rec)
        assert s is not None and s.n == 5 and isinstance(s.median, float), key
        # printed with one decimal (%) or two (x): within half of the last printed digit
        assert s.median == pytest.approx(published, abs=0.05 if published > 10 else 0.005), key


@pytest.mark.parametrize("key", ["p01-gemm", "p01-attention", "p01-hbwd"])
def test_p01_reruns_parse_with_the_benchmarks_own_command_line(key, repo_root, tmp_path):
    """The argv verify-results runs is one the benchmark accepts (parsed here, no GPU), and the
    reduced run measures every shape, kernel and provider its figures read."""
    from project01_cuda_kernel.__main__ import PROG, commands
    from project01_cuda_kernel.report.gemm import TARGETS, best_row
    from shared.cli import parse_subcommand

    rr = vr.RERUNS[key]
    committed = json.loads((repo_root / "reports" / rr.record).read_text())
    argv = rr.argv(committed) + ["--reports-dir", str(tmp_path)]
    assert argv[0] == P01
    name, cfg = parse_subcommand(commands(), prog=PROG, description="", argv=argv[1:])
    assert name == rr.command and cfg.repeats == 5 and not cfg.charts
    assert cfg.reports_dir == str(tmp_path)
    for k in ("warmup_ms", "rep_ms"):  # the committed run's timing budgets
        assert getattr(cfg, k) == committed["config"][k]
    if key == "p01-gemm":
        assert cfg.sizes == (4096, 8192) and cfg.shapes == ()
        assert list(cfg.half_dtypes) == committed["config"]["half_dtypes"]
        for dtype, size in TARGETS:  # the committed best kernel of every target is re-measured
            assert best_row(committed, dtype, size)["kernel"] in cfg.kernels
    else:
        assert (cfg.head_dims, cfg.seq_lens, cfg.causal) == ((128,), (4096,), (False,))
        hbwd = {"ours_hbwd", "ours_fa2bwd"} if key == "p01-hbwd" else set()
        assert set(cfg.providers) == {"ours", "flash", "cudnn"} | hbwd
        assert cfg.name == ("attention_hbwd" if hbwd else "attention")
        assert (cfg.total_tokens, cfg.hidden, cfg.dtype) == (16384, 2048, "bfloat16")
    with pytest.raises(SystemExit):  # the same parser refuses what the bench does not take
        parse_subcommand(commands(), prog=PROG, description="", argv=[*argv[1:], "--no-such"])


def gemm_record(
    bf16_4096: list[float], bf16_8192: list[float], fp32: list[float], env=H200
) -> dict:
    def row(kernel, dtype, size, pct, correct=True):
        return {
            "kernel": kernel,
            "dtype": dtype,
            "shape": f"{size}x{size}x{size}",
            "correct": correct,
            **flat("pct_of_cublas", Spread.of(pct)),
        }

    rows = [
        row("hgemm_08_mma_sync", "bfloat16", 4096, [48.0] * len(bf16_4096)),
        row("hgemm_09_wgmma_tma", "bfloat16", 4096, bf16_4096),
        row("hgemm_09_wgmma_tma", "bfloat16", 8192, bf16_8192),
        row("sgemm_07_warptiling", "float32", 4096, fp32),
        # neither is the best bfloat16 kernel: another dtype, a failed check
        row("hgemm_09_wgmma_tma", "float16", 4096, [120.0]),
        row("hgemm_08_mma_sync", "bfloat16", 8192, [130.0], correct=False),
    ]
    return {
        "environment": env,
        "config": {"warmup_ms": 25.0, "rep_ms": 100.0},
        "results": {"rows": rows, "baseline": []},
    }


def attention_record(tflops: dict[tuple[str, str], list[float]], env=H200) -> dict:
    shape = {"head_dim": 128, "seq_len": 4096, "batch": 4, "heads": 16, "causal": False}
    rows = [
        {**shape, "provider": p, "mode": m, **flat("tflops", Spread.of(v))}
        for (p, m), v in tflops.items()
    ]
    return {
        "environment": env,
        "config": {"warmup_ms": 5.0, "rep_ms": 25.0},
        "results": {"rows": rows},
    }


COMMITTED_ATTENTION = {
    ("ours", "fwd"): [632.0],
    ("flash", "fwd"): [355.0],
    ("cudnn", "fwd"): [672.0],
    ("ours", "fwd_bwd"): [307.0],
    ("flash", "fwd_bwd"): [305.0],
    ("cudnn", "fwd_bwd"): [550.0],
    ("ours", "bwd"): [249.0],
    ("flash", "bwd"): [288.0],
}


# The Hopper backward's record at the re-run's shape (head dim 128, seq 4,096, non-causal).
COMMITTED_HBWD = {
    ("ours", "bwd"): [254.0],
    ("ours_hbwd", "bwd"): [441.0],
    ("ours_hbwd", "fwd_bwd"): [468.0],
    ("cudnn", "fwd_bwd"): [541.0],
    ("flash", "fwd_bwd"): [305.0],
}


def test_p01_hbwd_figures_read_the_hopper_backward_rows():
    """The Hopper backward's figures read provider ours_hbwd, against cuDNN and against ours (the
    FA2 backward): a re-run whose Hopper backward lost 20% disagrees on both; one whose only
    change is the FA2 backward's own speed moves only the second."""
    committed = attention_record(COMMITTED_HBWD)
    c = vr.compare(fig("p01.hbwd.fwd_bwd_cudnn"), committed, committed)
    assert c.status == "agree" and c.committed.median == pytest.approx(468 / 541)
    assert fig("p01.hbwd.bwd_vs_fa2").value(committed).median == pytest.approx(441 / 254)
    slow = dict(COMMITTED_HBWD)
    slow[("ours_hbwd", "bwd")] = [441.0 * 0.8]
    slow[("ours_hbwd", "fwd_bwd")] = [468.0 * 0.8]
    for key in ("p01.hbwd.fwd_bwd_cudnn", "p01.hbwd.bwd_vs_fa2"):
        assert vr.compare(fig(key), committed, attention_record(slow)).status == "disagree"
    fa2_faster = dict(COMMITTED_HBWD)
    fa2_faster[("ours", "bwd")] = [254.0 * 1.25]
    new = attention_record(fa2_faster)
    assert vr.compare(fig("p01.hbwd.fwd_bwd_cudnn"), committed, new).status == "agree"
    assert vr.compare(fig("p01.hbwd.bwd_vs_fa2"), committed, new).status == "disagree"


def test_p01_hbwd_against_the_fa2_backward_named():
    """A re-run made once "auto" runs the Hopper backward names the FA2 one (ours_fa2bwd): the
    figure divides by it, not by ours; a record whose ours ran the Hopper backward and that has
    no ours_fa2bwd gives no figure (not a ratio of the Hopper backward to itself)."""
    committed = attention_record(COMMITTED_HBWD)
    rerun = dict(COMMITTED_HBWD)
    rerun[("ours", "bwd")] = [441.0]  # "ours" is the Hopper backward now
    rerun[("ours_fa2bwd", "bwd")] = [254.0]
    new = attention_record(rerun)
    new["results"]["ours_backward_kernels"] = {"128": "hopper"}
    assert fig("p01.hbwd.bwd_vs_fa2").value(new).median == pytest.approx(441 / 254)
    assert vr.compare(fig("p01.hbwd.bwd_vs_fa2"), committed, new).status == "agree"
    del rerun[("ours_fa2bwd", "bwd")]
    alone = attention_record(rerun)
    alone["results"]["ours_backward_kernels"] = {"128": "hopper"}
    assert fig("p01.hbwd.bwd_vs_fa2").value(alone) is None


def test_p01_gemm_agrees_within_its_tolerance_and_disagrees_outside():
    committed = gemm_record([90.9], [98.3], [82.1])
    new = gemm_record([88.0, 91.5, 86.0, 92.0, 89.0], [97.0] * 5, [80.0, 83.0, 81.0, 82.0, 84.0])
    c = vr.compare(fig("p01.gemm.bf16_4096"), committed, new)
    assert c.status == "agree" and c.committed.median == 90.9 and c.new.median == 89.0
    assert (c.new.min, c.new.max, c.new.n) == (86.0, 92.0, 5)
    # step 9 down to 80% of cuBLAS: -12%, outside +-10%
    slow = gemm_record([80.0, 79.0, 81.0, 80.5, 78.0], [97.0] * 5, [82.0] * 5)
    c = vr.compare(fig("p01.gemm.bf16_4096"), committed, slow)
    assert c.status == "disagree" and "outside ±10%" in c.detail
    assert vr.compare(fig("p01.gemm.bf16_8192"), committed, slow).status == "agree"
    assert vr.compare(fig("p01.gemm.fp32_4096"), committed, slow).status == "agree"
    # another compute capability: a ratio figure is not compared
    c = vr.compare(fig("p01.gemm.bf16_8192"), committed, gemm_record([90.0], [97.0], [82.0], A100))
    assert c.status == "not_comparable"


def test_p01_attention_ratios_pair_the_repetitions():
    committed = attention_record(COMMITTED_ATTENTION)
    # ours and FLASH both slower in repetition 2 (the GPU's state fell on both): per-repetition
    # ratios 1.8, 1.8, 1.8, 1.75, 1.8 -> 1.8; the ratio of the medians would be 630 / 350 = 1.8 too,
    # but the range shows the pairing: 1.75-1.8, where unpaired values would span 1.62-2.0
    new = attention_record(
        {
            ("ours", "fwd"): [630.0, 576.0, 630.0, 612.5, 640.0],
            ("flash", "fwd"): [350.0, 320.0, 350.0, 350.0, 355.6],
        }
    )
    c = vr.compare(fig("p01.attention.fwd"), committed, new)
    assert c.status == "agree" and c.new.median == pytest.approx(1.8)
    assert (c.new.min, c.new.max) == (pytest.approx(1.75), pytest.approx(1.8, abs=1e-3))
    assert c.committed.median == pytest.approx(632 / 355)
    # the fwd+bwd figures were not in that re-run's record: it did not produce them
    assert vr.compare(fig("p01.attention.fwd_bwd"), committed, new).status == "no_value"
    half = attention_record({("ours", "fwd"): [316.0] * 5, ("flash", "fwd"): [355.0] * 5})
    assert vr.compare(fig("p01.attention.fwd"), committed, half).status == "disagree"


def test_p01_reruns_each_run_once_for_their_figures(tmp_path):
    committed, out = tmp_path / "reports", tmp_path / "run"
    _write(committed, f"{P01}/gemm.json", gemm_record([90.9], [98.3], [82.1]))
    _write(committed, f"{P01}/attention.json", attention_record(COMMITTED_ATTENTION))
    _write(committed, f"{P01}/attention_hbwd.json", attention_record(COMMITTED_HBWD))
    ran = []
    repeated = {
        k: [v[0] * f for f in (0.97, 1.0, 1.02, 0.99, 1.01)] for k, v in COMMITTED_ATTENTION.items()
    }
    repeated[("cudnn", "fwd_bwd")] = [700.0] * 5  # cuDNN much faster: ours / cuDNN 0.44 vs 0.56
    hbwd = {k: [v[0] * f for f in (0.98, 1.0, 1.01, 0.99, 1.0)] for k, v in COMMITTED_HBWD.items()}

    def runner(rerun, committed_rec, out_dir):
        ran.append(rerun.key)
        if rerun.key == "p01-gemm":
            rec = gemm_record([91.0, 92.0, 90.0, 89.5, 91.5], [97.0] * 5, [81.0] * 5)
        else:
            rec = attention_record(hbwd if rerun.key == "p01-hbwd" else repeated)
        _write(out_dir, rerun.record, rec)
        return ""

    v = vr.verify(vr.select(("p01",)), committed, out, runner)
    assert ran == ["p01-gemm", "p01-attention", "p01-hbwd"]
    got = {c.figure.key: c.status for c in v.checks}
    assert got.pop("p01.attention.fwd_bwd_cudnn") == "disagree"
    assert set(got.values()) == {"agree"} and len(got) == 9
    assert vr.exit_code(v.checks) == vr.EXIT_DISAGREE
    text = vr.report(v)
    assert "90.9 (1 run)" in text and "91 (89.5–92, n=5)" in text
    assert vr.GEMM_SHARE.reason in text and vr.ATTENTION_RATIO.reason in text


def test_p02_and_p03_reruns_parse_with_their_own_command_lines(repo_root, tmp_path):
    """The argv verify-results runs for project02's scaling and project03's checkpoint bench is
    one their command lines accept (parsed here, no GPU), with the committed record's settings."""
    import project02_fsdp_scaling.__main__ as p02
    import project03_capstone_infra.__main__ as p03
    from shared.cli import parse_subcommand

    rr = vr.RERUNS["p02-scaling"]
    committed = json.loads((repo_root / "reports" / rr.record).read_text())
    train = committed["config"]["train"]
    for gpus, sizes in ((1, "1"), (2, "1,2"), (8, "1,2")):
        flags = vr.p02_scaling_flags(committed, gpus)
        argv = [rr.module, rr.command, *rr.flags, *flags, "--reports-dir", str(tmp_path)]
        name, cfg = parse_subcommand(p02.commands(), prog="p", description="", argv=argv[1:])
        assert name == "scaling" and cfg.gpus == sizes and not cfg.sweep and not cfg.readme
        assert cfg.repeats == 3 and not cfg.train.profile  # medians of 3, no profiled steps
        for k in ("preset", "global_batch", "micro_batch", "steps", "warmup_steps", "compile"):
            assert getattr(cfg.train, k) == train[k], k
        assert cfg.train.attention == train["attention"] and cfg.reports_dir == str(tmp_path)

    rr = vr.RERUNS["p03-checkpoint"]
    committed = json.loads((repo_root / "reports" / rr.record).read_text())
    argv = rr.argv(committed) + ["--reports-dir", str(tmp_path)]
    name, cfg = parse_subcommand(p03.commands(), prog="p", description="", argv=argv[1:])
    assert name == "bench-checkpoint" and not cfg.prestage and not cfg.resume
    assert cfg.repeats == 3
    for k in rr.from_committed:
        assert getattr(cfg, k) == committed["config"][k], k
    assert cfg.reports_dir == str(tmp_path)


def test_a_figure_needing_more_gpus_than_the_rerun_had_is_not_comparable_here():
    f = fig("p02.efficiency.ws2")
    committed = {
        "environment": H200,
        "results": {"runs": [{"world_size": 1, "mfu": 0.5}, {"world_size": 2, "efficiency": 0.95}]},
    }
    one_gpu = {
        "environment": {**H200, "gpu_count": 1},
        "results": {"runs": [{"world_size": 1, "mfu": 0.5}]},
    }
    c = vr.compare(f, committed, one_gpu)
    assert c.status == "not_comparable" and c.detail == "needs 2 GPUs, 1 here"
    two_gpus = {**one_gpu, "environment": {**H200, "gpu_count": 2}}
    assert (
        vr.compare(f, committed, two_gpus).status == "no_value"
    )  # two GPUs and no figure: a fault
    assert vr.compare(fig("p02.mfu.ws1"), committed, one_gpu).status == "agree"


def scaling_record(mfu: list[float], eff: list[float] | None = None, env=H200) -> dict:
    """A scaling record as the harness writes it: one run (plain fields) or repetitions
    (`shared.repeat.flat`: the median under the old name, `_min`, `_max`, `_reps`)."""

    def field(name, values):
        return {name: values[0]} if len(values) == 1 else flat(name, Spread.of(values))

    runs = [{"world_size": 1, "status": "ok", **field("mfu", mfu)}]
    if eff:
        runs.append({"world_size": 2, "status": "ok", **field("efficiency", eff)})
    return {"environment": {**env, "gpu_count": 2}, "results": {"runs": runs}}


def checkpoint_record(sync: list[float], steady: list[float], env=H200) -> dict:
    def field(name, values):
        return {name: values[0]} if len(values) == 1 else flat(name, Spread.of(values))

    derived = {"sync": field("held_s", sync), "steady_state": field("median_held_s", steady)}
    return {"environment": env, "results": {"derived": derived}}


def test_p02_and_p03_figures_compare_medians_of_repeated_records_with_single_run_ones():
    """Committed single-run records against re-runs of 3 repetitions (and back): the figure is
    the median, its range comes along, and the paths resolve in both layouts."""
    old_p02 = scaling_record([0.532], [0.950])
    new_p02 = scaling_record([0.50, 0.53, 0.40], [0.94, 0.96, 0.70])
    c = vr.compare(fig("p02.mfu.ws1"), old_p02, new_p02)
    assert c.status == "agree" and c.new.n == 3 and c.new.median == pytest.approx(50.0)
    assert c.committed.values == (pytest.approx(53.2),)  # x100: MFU in %
    c = vr.compare(fig("p02.efficiency.ws2"), old_p02, new_p02)
    assert c.status == "agree" and c.new.median == pytest.approx(94.0)
    assert (c.new.min, c.new.max) == (pytest.approx(70.0), pytest.approx(96.0))
    # the median decides, not an outlying repetition; a slow median disagrees
    slow = scaling_record([0.44, 0.45, 0.60])
    assert vr.compare(fig("p02.mfu.ws1"), old_p02, slow).status == "disagree"
    # a repeated committed record against a single-run re-run
    assert vr.compare(fig("p02.mfu.ws1"), new_p02, old_p02).status == "agree"

    old_p03 = checkpoint_record([20.48], [0.30])
    new_p03 = checkpoint_record([21.0, 19.5, 30.0], [0.28, 0.33, 0.90])
    for key, median in (("p03.ckpt.sync_held", 21.0), ("p03.ckpt.async_held", 0.33)):
        c = vr.compare(fig(key), old_p03, new_p03)
        assert c.status == "agree" and c.new.n == 3 and c.new.median == median, key
        assert c.committed.n == 1
    text = vr.table([vr.compare(fig("p03.ckpt.sync_held"), old_p03, new_p03)])
    assert "20.5 (1 run)" in text and "21 (19.5–30, n=3)" in text
    late = checkpoint_record([26.0, 27.0, 25.9], [0.3])
    assert vr.compare(fig("p03.ckpt.sync_held"), old_p03, late).status == "disagree"
