"""Every project03 entry point answers a bad argument (or environment variable) with one line
naming it: `error: ...` on stderr, exit code 2, no traceback, before any process group, run,
Ray cluster or output; nonsense (inf, nan, empty paths, negative counts) is refused."""

import os
import subprocess
import sys

import pytest

from project03_capstone_infra import __main__ as package_main
from shared.testing import assert_one_line_error, run_entry

# (argv of `python -m project03_capstone_infra`, what the one line must name); {bad} is a folder
# that cannot be made (its parent is a file), {missing} a path that does not exist, {tmp} an
# empty folder, {run} a run folder whose checkpoints/ is a file (an unwritable checkpoint root
# found at start, whoever runs the test: root included).
CASES = [
    (["bogus"], "bogus"),
    (["train", "--lr", "inf"], "lr"),
    (["train", "--grad-clip", "nan"], "grad_clip"),
    (["train", "--min-lr-ratio", "nan"], "min_lr_ratio"),
    (["train", "--pg-timeout-s", "inf"], "pg_timeout_s"),
    (["train", "--steps", "-1"], "steps"),
    (["train", "--global-batch", "x"], "--global-batch"),
    (["train", "--preset", "bogus"], "--preset"),
    (["train", "--metrics-port", "70000"], "metrics_port"),
    (["train", "--run-dir", ""], "run_dir"),
    (["train", "--metrics-port", "0", "--metrics-addr", "999.1.1.1"], "metrics_addr"),
    (["train", "--run-dir", "{bad}"], "--run-dir"),
    (["train", "--resume", ""], "resume"),
    (["train", "--run-dir", "{run}"], "--run-dir"),
    (["train", "--stop-after", "-1"], "stop_after"),
    (["chaos", "--steps", "5"], "steps"),
    (["chaos", "--report-name", "../chaos"], "report_name"),
    (["chaos", "--sigterm-deadline-s", "-1"], "sigterm_deadline_s"),
    (["reshard", "--directions", "2-2"], "directions"),
    (["reshard", "--directions", "3-1"], "global_batch"),
    (["reshard", "--switch-after", "30"], "switch_after"),
    (["reshard", "--pg-timeout-s", "nan"], "pg_timeout_s"),
    (["reshard", "--reports-dir", "{bad}"], "--reports-dir"),
    (["determinism-cost", "--warmup", "40"], "warmup"),
    (["determinism-cost", "--preset", "bogus"], "preset"),
    (["determinism-cost", "--timeout-s", "inf"], "timeout_s"),
    (["determinism-cost", "--reports-dir", "{bad}"], "--reports-dir"),
    (["chaos", "--pg-timeout-s", "nan"], "pg_timeout_s"),
    (["chaos", "--nproc", "-1"], "nproc"),
    (["chaos", "--preset", "bogus"], "preset"),
    (["chaos", "--reports-dir", "{bad}"], "--reports-dir"),
    (["cost", "--total-tokens", "inf"], "total_tokens"),
    (["cost", "--assumed-mfu", "nan"], "assumed_mfu"),
    (["cost", "--n-gpus", "-1"], "n_gpus"),
    (["cost", "--gpu", "bogus"], "GPU 'bogus'"),
    (["cost", "--preset", "x"], "preset"),
    (["cost", "--trace", "{missing}.txt"], "--trace"),
    (["cost", "--reports-dir", "{bad}"], "--reports-dir"),
    (["tune", "--lr-min", "nan"], "lr_min"),
    (["tune", "--cpus-per-trial", "inf"], "cpus_per_trial"),
    (["tune", "--num-samples", "0"], "num_samples"),
    (["tune", "--storage-path", ""], "storage_path"),
    (["tune", "--reports-dir", "{bad}"], "--reports-dir"),
    (["data", "--workers", "x"], "--workers"),
    (["data", "--batches", "-1"], "--batches"),
    (["data", "--warmup", "0"], "--warmup"),
    (["data", "--reports-dir", "{bad}"], "--reports-dir"),
    (["checkpoint", "list", "{missing}"], "root"),
    (["checkpoint", "verify", "{tmp}", "--step", "-2"], "--step"),
    (["checkpoint", "prune", "{tmp}", "--keep-last", "0"], "--keep-last"),
    (["checkpoint", "compare", "{missing}", "{tmp}"], "a:"),
    (["checkpoint", "bogus"], "bogus"),
    (["health", "--max-temperature-c", "nan"], "max_temperature_c"),
    (["health", "--serve-port", "-5"], "--serve-port"),
    (["health", "--require-gpus", "-1"], "--require-gpus"),
    (["health", "--serve-addr", " "], "--serve-addr"),
    (["health", "--serve-port", "0", "--serve-addr", "999.1.1.1"], "--serve-addr"),
    (["report", "--reports-dir", "{missing}"], "--reports-dir"),
    (["bench-checkpoint", "--timed-steps", "-1"], "--timed-steps"),
    (["bench-checkpoint", "--preset", "bogus"], "--preset"),
    (["bench-checkpoint", "--budget-s", "nan"], "--budget-s"),
    (["bench-checkpoint", "--repeats", "-2"], "--repeats"),
    (["bench-checkpoint", "--run-dir", ""], "--run-dir"),
    (["bench-checkpoint", "--from-json", "{missing}.json"], "--from-json"),
]


@pytest.mark.parametrize(("argv", "names"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_a_bad_argument_is_one_line_naming_it(argv, names, tmp_path, capsys):
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "empty").mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoints").write_text("a file where the checkpoints go")
    subs = {
        "bad": tmp_path / "a_file" / "sub",
        "missing": tmp_path / "missing",
        "tmp": tmp_path / "empty",
        "run": tmp_path / "run",
    }
    argv = [a.format(**subs) for a in argv]
    assert_one_line_error(*run_entry(package_main.main, argv, capsys), names)
    # nothing written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "empty", "run"]
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["checkpoints"]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("P03_FAULTS", "[{"),
        ("P03_FAULTS", '[{"kind": "explode", "step": 3}]'),
        ("P03_LAUNCH_T", "abc"),
        ("P03_LAUNCH_T", "inf"),
        ("TORCHELASTIC_RESTART_COUNT", "x"),
    ],
)
def test_a_bad_environment_variable_is_named(name, value, tmp_path, monkeypatch, capsys):
    for var in ("P03_FAULTS", "P03_LAUNCH_T", "TORCHELASTIC_RESTART_COUNT", "P03_ATTEMPT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(name, value)
    code, err = run_entry(package_main.main, ["train", "--run-dir", str(tmp_path / "r")], capsys)
    assert_one_line_error(code, err, name)
    assert not (tmp_path / "r").exists()


def test_the_real_entry_point_answers_in_one_line(repo_root, tmp_path):
    path = os.pathsep.join(p for p in (str(repo_root), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": path}
    r = subprocess.run(
        [sys.executable, "-m", "project03_capstone_infra.train", "--run-dir", ""],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "error: TrainConfig.run_dir: expected a folder, got an empty path"
    ]
    assert list(tmp_path.iterdir()) == []  # nothing written into the current folder
