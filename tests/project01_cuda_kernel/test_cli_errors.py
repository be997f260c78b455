"""Every project01 entry point answers a bad argument with one line naming it: `error: ...` on
stderr, exit code 2, no traceback, and before any GPU work (so this holds on a CPU machine too)."""

import os
import subprocess
import sys

import pytest

from project01_cuda_kernel import __main__ as package_main
from shared.testing import assert_one_line_error, run_entry

# (argv of `python -m project01_cuda_kernel`, what the one line must name); {bad} is a folder that
# cannot be made (its parent is a file), {missing} a path that does not exist.
CASES = [
    (["bogus"], "bogus"),
    (["all", "--kernels", "matmul"], "--kernels"),
    (["all", "--reports-dir", ""], "--reports-dir"),
    (["all", "--reports-dir", "{bad}"], "--reports-dir"),
    (["bench-gemm", "--warmup-ms", "inf"], "--warmup-ms"),
    (["bench-gemm", "--rep-ms", "nan"], "--rep-ms"),
    (["bench-gemm", "--warmup-ms", "-1"], "--warmup-ms"),
    (["bench-gemm", "--sizes", "0"], "--sizes"),
    (["bench-gemm", "--sizes", "abc"], "--sizes"),
    (["bench-gemm", "--shapes", "1x2"], "--shapes"),
    (["bench-gemm", "--kernels", "bogus"], "--kernels"),
    (["bench-gemm", "--half-dtypes", "fp64"], "--half-dtypes"),
    (["bench-gemm", "--reports-dir", ""], "--reports-dir"),
    (["bench-gemm", "--repeats", "0"], "--repeats"),
    (["bench-gemm", "--reports-dir", "{bad}"], "--reports-dir"),
    (["bench-attention", "--warmup-ms", "inf"], "warmup_ms"),
    (["bench-attention", "--rep-ms", "nan"], "rep_ms"),
    (["bench-attention", "--providers", "bogus"], "--providers"),
    (["bench-attention", "--total-tokens", "-1"], "total_tokens"),
    (["bench-attention", "--seq-lens", "abc"], "--seq-lens"),
    (["bench-attention", "--dtype", "float64"], "--dtype"),
    (["bench-attention", "--name", ""], "name"),
    (["bench-attention", "--no-such-flag", "1"], "--no-such-flag"),
    (["bench-attention", "--reports-dir", "{bad}"], "--reports-dir"),
    (["bench-attention", "--repeats", "0"], "--repeats"),
    (["bench-attention", "--repeats", "1.5"], "--repeats"),
    (["profile-attention", "--seq-len", "0"], "--seq-len"),
    (["profile-attention", "--head-dim", "96"], "--head-dim"),
    (["profile-attention", "--reports-dir", "{bad}"], "--reports-dir"),
    (["profile-gemm", "--size", "-1"], "--size"),
    (["profile-gemm", "--kernels", "bogus"], "--kernels"),
    (["profile-gemm", "--reports-dir", "{bad}"], "--reports-dir"),
    (["compile-check", "--jobs", "0"], "--jobs"),
    (["compile-check", "--arch", ""], "--arch"),
    (["compile-check", "--arch", "sm_90a;rm"], "--arch"),
    (["compile-check", "{missing}.cu"], "files"),
    (["compile-check", "--reports-dir", "{bad}"], "--reports-dir"),
    (["sass-diff", "--jobs", "0"], "--jobs"),
    (["sass-diff", "--arch", "sm90"], "--arch"),
    (["sass-diff", "--base", ""], "--base"),
    (["sass-diff", "--base", "--output=x"], "--base"),
    (["sass-diff", "--base", "no-such-revision-anywhere"], "--base"),
    (["sass-diff", "/abs/k.cu"], "files"),
    (["sass-diff", "gemm/k.txt"], "files"),
    (["sass-diff", "--reports-dir", "{bad}"], "--reports-dir"),
    (["report", "--check", "--readme-file", "{missing}.md"], "--readme-file"),
    (["report", "--no-readme", "--reports-dir", "{bad}"], "--reports-dir"),
    (["report", "--reports-dir", ""], "--reports-dir"),
]


@pytest.mark.parametrize(("argv", "names"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_a_bad_argument_is_one_line_naming_it(argv, names, tmp_path, capsys):
    (tmp_path / "a_file").write_text("x")
    subs = {"bad": str(tmp_path / "a_file" / "sub"), "missing": str(tmp_path / "missing")}
    argv = [a.format(**subs) for a in argv]
    code, err = run_entry(package_main.main, argv, capsys)
    assert_one_line_error(code, err, names)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]  # nothing written


def test_the_real_entry_point_answers_in_one_line(repo_root):
    path = os.pathsep.join(p for p in (str(repo_root), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": path}
    r = subprocess.run(
        [sys.executable, "-m", "project01_cuda_kernel", "bench-gemm", "--warmup-ms", "inf"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=repo_root,
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "error: Error parsing GemmBenchConfig: --warmup-ms: expected a finite number > 0, got inf"
    ]
