"""Every apple_track command answers a bad argument with one line naming it: `error: ...` on
stderr, exit code 2, no traceback, and before the model is trained or anything is written."""

import os
import subprocess
import sys

import pytest

from apple_track import __main__ as package_main
from shared.testing import assert_one_line_error, run_entry

# (argv of `python -m apple_track`, what the one line must name); {bad} is a folder that cannot
# be made (its parent is a file), {missing} a path that does not exist.
CASES = [
    (["bogus"], "bogus"),
    (["export", "--preset", "bogus"], "preset"),
    (["export", "--seq-len", "-1"], "seq_len"),
    (["export", "--seq-len", "100000"], "seq_len"),
    (["export", "--batch", "0"], "batch"),
    (["export", "--batch", "two"], "--batch"),
    (["export", "--train-steps", "-5"], "train_steps"),
    (["export", "--seed", "-1"], "seed"),
    (["export", "--set", "dim=nan"], "--set dim"),
    (["export", "--set", "dim=inf"], "--set dim"),
    (["export", "--set", "dim"], "--set"),
    (["export", "--set", "bogus=3"], "bogus"),
    (["export", "--coreml", "int4"], "coreml"),
    (["export", "--name", "../elsewhere"], "--name"),
    (["export", "--models-dir", ""], "--models-dir"),
    (["export", "--models-dir", "{bad}"], "--models-dir"),
    (["export", "--reports-dir", "{bad}"], "--reports-dir"),
    (["export", "--reports-dir", ""], "--reports-dir"),
    (["profile", "litert", "fp16"], "litert variant"),
    (["profile", "tensorrt", "fp16"], "tensorrt"),
    (["profile", "litert", "fp32", "--seconds", "inf"], "--seconds"),
    (["profile", "litert", "fp32", "--seconds", "0"], "--seconds"),
    (["profile", "litert", "int8", "--record", "{missing}.json"], "no result file"),
    (["profile", "litert", "int8", "--models-dir", ""], "--models-dir"),
    (["report", "--record", "{missing}.json", "--no-readme"], "no result file"),
    (["report", "--record", ""], "--record"),
]


@pytest.mark.parametrize(("argv", "names"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_a_bad_argument_is_one_line_naming_it(argv, names, tmp_path, capsys):
    (tmp_path / "a_file").write_text("x")
    subs = {"bad": tmp_path / "a_file" / "sub", "missing": tmp_path / "missing"}
    argv = [a.format(**subs) for a in argv]
    code, err = run_entry(package_main.main, argv, capsys)
    assert_one_line_error(code, err, names)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]  # nothing written


def test_the_real_entry_point_answers_in_one_line(repo_root):
    path = os.pathsep.join(p for p in (str(repo_root), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    r = subprocess.run(
        [sys.executable, "-m", "apple_track", "export", "--set", "dim=nan"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=repo_root,
    )
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error: ") and line.endswith("--set dim: 'nan' is not a finite number")
