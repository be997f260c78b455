"""Every project02 command answers a bad argument with one line naming it: `error: ...` on
stderr, exit code 2, no traceback, and before any process group, training or output (output
paths are checked before training, not after it)."""

import os
import subprocess
import sys

import pytest

from project02_fsdp_scaling import __main__ as package_main
from shared.testing import assert_one_line_error, run_entry

# (argv of `python -m project02_fsdp_scaling`, what the one line must name); {bad} is a folder
# that cannot be made (its parent is a file), {missing} a path that does not exist.
CASES = [
    (["bogus"], "bogus"),
    (["train", "--lr", "inf"], "lr"),
    (["train", "--lr", "nan"], "lr"),
    (["train", "--lr", "-1"], "lr"),
    (["train", "--grad-clip", "nan"], "grad_clip"),
    (["train", "--grad-clip", "-1"], "grad_clip"),
    (["train", "--weight-decay", "inf"], "weight_decay"),
    (["train", "--beta2", "nan"], "beta2"),
    (["train", "--steps", "-1"], "steps"),
    (["train", "--seq-len", "-1"], "seq_len"),
    (["train", "--micro-batch", "3"], "micro_batch"),
    (["train", "--preset", "bogus"], "preset"),
    (["train", "--attention", "bogus"], "--attention"),
    (["train", "--global-batch", "abc"], "--global-batch"),
    (["train", "--out", "{bad}/r.json"], "--out"),
    (["train", "--out", "{tmp}"], "--out"),
    (["train", "--save-params", "{bad}/p.pt"], "--save-params"),
    (["train", "--profile", "--trace-dir", "{bad}"], "--trace-dir"),
    (["train", "--parallel", "bogus"], "--parallel"),
    (["train", "--parallel", "fsdp-tp", "--tp", "2"], "--tp"),
    (["train", "--parallel", "pp", "--pp-microbatches", "3"], "--pp-microbatches"),
    (["train", "--parallel", "pp", "--stages-per-rank", "2"], "--stages-per-rank"),
    (["train", "--parallel", "pp", "--micro-batch", "2"], "--micro-batch"),
    (["train", "--parallel", "tp", "--precision", "fp16"], "--parallel tp"),
    (["train", "--parallel", "ddp", "--fused-loss"], "--fused-loss"),
    (["train", "--parallel", "tp", "--no-reshard-after-forward"], "--no-reshard-after-forward"),
    (["train", "--n-layers", "-1"], "n_layers"),
    (["train", "--save-checkpoint", "{bad}"], "--save-checkpoint"),
    (["train", "--resume", "{missing}"], "--resume"),
    (["collectives", "--factor", "1"], "factor"),
    (["collectives", "--ops", "bogus"], "--ops"),
    (["collectives", "--reports-dir", "{bad}"], "--reports-dir"),
    (["strategies", "--strategies", "bogus"], "strategies"),
    (["strategies", "--world-sizes", "1"], "world_sizes"),
    (["strategies", "--parallel", "tp"], "--parallel"),
    (["strategies", "--reports-dir", "{bad}"], "--reports-dir"),
    (["deepspeed", "--lr", "inf"], "lr"),
    (["scaling", "--gpus", "0"], "gpus"),
    (["scaling", "--gpus", "abc"], "gpus"),
    (["scaling", "--cost-configs", "bogus:1"], "cost_configs"),
    (["scaling", "--preset", "bogus"], "preset"),
    (["scaling", "--global-batch", "-8"], "global_batch"),
    (["scaling", "--name", "a/b"], "name"),
    (["scaling", "--sweep-variants", "eager+bogus"], "bogus"),
    (["scaling", "--timeout-s", "0"], "timeout_s"),
    (["scaling", "--repeats", "-1"], "repeats"),
    (["scaling", "--reports-dir", "{bad}"], "--reports-dir"),
    (["scaling", "--device", "cpu"], "--device"),
    (["scaling", "--out", "r.json"], "--out"),
    (["sweep", "--variants", "bogus"], "variant"),
    (["sweep", "--preset", "bogus"], "preset"),
    (["sweep", "--max-seconds", "-1"], "max_seconds"),
    (["sweep", "--repeats", "0"], "repeats"),
    (["sweep", "--variants", "eager+cdt"], "need --compile"),
    (["sweep", "--variants", "compile+mb0"], "mbN"),
    (["sweep", "--reports-dir", "{bad}"], "--reports-dir"),
    (["sweep", "--compile"], "--compile"),
    (["sweep", "--profile"], "--profile"),
    (["compare", "--world-size", "0"], "world_size"),
    (["compare", "--lr", "inf"], "lr"),
    (["compare", "--grad-clip", "nan"], "grad_clip"),
    (["compare", "--preset", "x"], "preset"),
    (["compare", "--compile"], "--no-compile"),
    (["compare", "--precision", "fp32"], "--precisions"),
    (["compare", "--bf16-rounded-init"], "--equal-start"),
    (["compare", "--reduce-dtype", "bfloat16"], "--reduce-dtype"),
    (["compare", "--precisions", "fp64"], "--precisions"),
    (["compare", "--precisions", "fp32", "fp32"], "precisions"),
    (["compare", "--precisions"], "precisions"),
    (["compare", "--reports-dir", "{bad}"], "--reports-dir"),
    (["deepspeed", "--precision", "fp64"], "--precision"),
    (["train", "--precision", "fp4"], "--precision"),
    (["train", "--precision", "bf16", "--no-loss-scaling"], "--no-loss-scaling"),
    (["deepspeed", "--compile"], "--compile"),
    (["report", "--reports-dir", "{missing}"], "--reports-dir"),
    (["report", "--reports-dir", ""], "--reports-dir"),
    (["comm-analysis", "{missing}.json.gz"], "trace"),
    (["comm-analysis"], "TRACE"),
]


@pytest.mark.parametrize(("argv", "names"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_a_bad_argument_is_one_line_naming_it(argv, names, tmp_path, capsys):
    (tmp_path / "a_file").write_text("x")
    subs = {"bad": tmp_path / "a_file" / "sub", "missing": tmp_path / "missing", "tmp": tmp_path}
    argv = [a.format(**subs) for a in argv]
    assert_one_line_error(*run_entry(package_main.main, argv, capsys), names)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]  # nothing written


def test_a_bad_environment_variable_is_named(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "abc")
    assert_one_line_error(*run_entry(package_main.main, ["train"], capsys), "WORLD_SIZE")
    monkeypatch.setenv("WORLD_SIZE", "0")
    assert_one_line_error(*run_entry(package_main.main, ["train"], capsys), "WORLD_SIZE")


def test_the_real_entry_point_answers_in_one_line(repo_root):
    path = os.pathsep.join(p for p in (str(repo_root), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": path}
    r = subprocess.run(
        [sys.executable, "-m", "project02_fsdp_scaling", "train", "--grad-clip", "nan"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=repo_root,
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["error: grad_clip must be a finite number, got nan"]
