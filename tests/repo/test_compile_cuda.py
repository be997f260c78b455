"""scripts/compile_cuda.py, the compile-only CI job: every CUDA source compiled by nvcc alone.

The reporting and exit status are checked with a stand-in nvcc (a script that fails on planted
errors), so they are tested on any machine; the real compiler is used where it is installed.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from scripts import compile_cuda

ROOT = Path(__file__).resolve().parents[2]
NEEDS_NVCC = pytest.mark.skipif(
    compile_cuda.find_nvcc() is None, reason="nvcc not found: CUDA toolkit absent"
)

# A stand-in for nvcc: fails the way nvcc does on a planted error or a torch header, else
# writes the object file named after -o.
FAKE_NVCC = f"""#!{sys.executable}
import sys
args = sys.argv[1:]
src = open(args[args.index("-c") + 1]).read()
if "planted_error" in src:
    print('bad.cu(1): error: identifier "planted_error" is undefined')
    sys.exit(1)
if "torch/extension.h" in src:
    print("torchy.cu:1:10: fatal error: torch/extension.h: No such file or directory")
    sys.exit(1)
open(args[args.index("-o") + 1], "w").write("object")
"""


@pytest.fixture
def fake_nvcc(tmp_path) -> str:
    path = tmp_path / "bin" / "nvcc"
    path.parent.mkdir()
    path.write_text(FAKE_NVCC)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _write(tmp_path, name, text):
    path = tmp_path / "csrc" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return str(path)


def test_the_sources_are_every_cu_file_under_a_project_csrc():
    found = compile_cuda.sources()
    expected = sorted(p for p in ROOT.glob("*/csrc/**/*.cu"))
    assert found == expected
    projects = {p.relative_to(ROOT).parts[0] for p in found}
    assert {"project01_cuda_kernel", "project04_llm_inference"} <= projects


def test_failures_are_reported_and_fail_the_run(tmp_path, fake_nvcc, capsys):
    good = _write(tmp_path, "good.cu", "__global__ void k() {}\n")
    bad = _write(tmp_path, "bad.cu", "__global__ void k() { planted_error; }\n")
    torchy = _write(tmp_path, "torchy.cu", "#include <torch/extension.h>\n")
    assert compile_cuda.main(["--nvcc", fake_nvcc, "--jobs", "2", good, bad, torchy]) == 1
    out = capsys.readouterr().out
    assert "ok   " in out and out.count("FAIL ") == 2
    assert 'identifier "planted_error" is undefined' in out
    assert compile_cuda.TORCH_NOTE in out and out.count(compile_cuda.TORCH_NOTE) == 1
    assert "3 CUDA source(s) compiled for sm_90a" in out and "2 failed" in out
    assert compile_cuda.main(["--nvcc", fake_nvcc, "--arch", "80", good]) == 0
    assert "for sm_80" in capsys.readouterr().out


def test_without_nvcc_it_skips_or_with_strict_fails(monkeypatch, capsys):
    monkeypatch.setattr(compile_cuda, "find_nvcc", lambda: None)
    assert compile_cuda.main([]) == 0
    assert "cuda compile skipped: nvcc was not found" in capsys.readouterr().out
    assert compile_cuda.main(["--strict"]) == 2


def test_nothing_to_compile_fails_only_with_strict(tmp_path, fake_nvcc, monkeypatch, capsys):
    monkeypatch.setattr(compile_cuda, "sources", lambda root=ROOT: [])
    assert compile_cuda.main(["--nvcc", fake_nvcc]) == 0
    assert "no CUDA sources here" in capsys.readouterr().out
    assert compile_cuda.main(["--nvcc", fake_nvcc, "--strict"]) == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--arch", "sm_90"], "argument --arch"),
        (["--jobs", "0"], "argument --jobs"),
        (["no/such/file.cu"], "no such file"),
    ],
)
def test_bad_arguments_are_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        compile_cuda.main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_the_script_needs_only_the_standard_library():
    """It runs in a bare CUDA container: no third-party or repository imports."""
    import ast

    tree = ast.parse(Path(compile_cuda.__file__).read_text())
    names = {
        a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    names |= {
        n.module.split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module
    }
    assert names <= set(sys.stdlib_module_names) | {"__future__"}, names


@NEEDS_NVCC
def test_real_nvcc_compiles_a_kernel_and_rejects_a_broken_one(tmp_path, capsys):
    good = _write(tmp_path, "good.cu", "__global__ void k(float* x) { x[threadIdx.x] = 1.f; }\n")
    bad = _write(tmp_path, "bad.cu", "__global__ void k(float* x) { x[0] = planted_error; }\n")
    assert compile_cuda.main(["--strict", good]) == 0
    assert compile_cuda.main(["--strict", bad]) == 1
    assert "planted_error" in capsys.readouterr().out


@NEEDS_NVCC
@pytest.mark.slow
def test_project04_sources_compile_with_nvcc_alone(capsys):
    """project01's sources have their own compile check (tests/project01_cuda_kernel)."""
    files = [str(p) for p in compile_cuda.sources() if p.parts[-3] == "project04_llm_inference"]
    assert files
    rc = compile_cuda.main(["--strict", "--jobs", str(min(4, os.cpu_count() or 2)), *files])
    assert rc == 0, capsys.readouterr().out
