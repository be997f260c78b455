"""`make gpu-smoke`: what it selects, how it reports skips, and that it fails on any failure.

The GPU tests themselves run in the GPU tier; here the smoke run is exercised with no GPU
visible (everything skips, with the reasons printed), on planted tests (a failure, a skip, a
pass), and with a build that fails.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from scripts import gpu_smoke
from scripts.fork_project import PROJECTS

ROOT = Path(__file__).resolve().parents[2]
NO_GPU = dict(os.environ, CUDA_VISIBLE_DEVICES="")


def _loaders() -> set[tuple[str, str]]:
    """(module, function) of every function in a project package that calls load_extension
    (a wrapper of shared's, itself named load_extension, aside)."""
    found = set()
    for pkg in PROJECTS:
        for py in sorted((ROOT / pkg).rglob("*.py")):
            tree = ast.parse(py.read_text())
            module = ".".join(py.relative_to(ROOT).with_suffix("").parts)
            for fn in ast.walk(tree):
                if (
                    isinstance(fn, ast.FunctionDef)
                    and fn.name != "load_extension"
                    and any(
                        isinstance(c, ast.Call)
                        and getattr(c.func, "id", getattr(c.func, "attr", "")) == "load_extension"
                        for c in ast.walk(fn)
                    )
                ):
                    found.add((module, fn.name))
    return found


def test_every_cuda_extension_of_the_projects_is_built_first():
    assert set(gpu_smoke.EXTENSIONS) == _loaders()
    for module, loader in gpu_smoke.EXTENSIONS:  # importing needs no GPU and no compiler
        assert callable(getattr(importlib.import_module(module), loader)), (module, loader)


def test_every_project_with_gpu_tests_has_smoke_tests():
    """So that each fork with a GPU tier gets a smoke tier and its workflow."""
    for project in PROJECTS:
        files = sorted((ROOT / "tests" / project).rglob("test_*.py"))
        if any(gpu_smoke.uses_mark(f, "gpu") for f in files):
            assert any(gpu_smoke.uses_mark(f, "smoke") for f in files), project
    planted = ROOT / "tests" / "repo" / "test_gpu_smoke.py"  # names the mark in strings only
    assert "pytest.mark.smoke" in planted.read_text() and not gpu_smoke.uses_mark(planted)
    assert gpu_smoke.smoke_test_dirs() == [
        "tests/project01_cuda_kernel",
        "tests/project02_fsdp_scaling",
        "tests/project03_capstone_infra",
        "tests/project04_llm_inference",
    ]


@pytest.fixture(scope="module")
def cpu_smoke_run(tmp_path_factory):
    """`python -m scripts.gpu_smoke` with no GPU visible: builds skipped, every test skipped."""
    out = tmp_path_factory.mktemp("smoke")
    r = subprocess.run(
        [sys.executable, "-m", "scripts.gpu_smoke", "--out-dir", str(out)],
        cwd=ROOT,
        env=NO_GPU,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return r, out


@pytest.mark.slow
def test_the_smoke_selection_covers_each_kernel_attention_fsdp_checkpoints_and_generation(
    cpu_smoke_run,
):
    r, out = cpu_smoke_run
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    tests = [o.test for o in gpu_smoke.read_junit(out / "junit.xml")]
    from project01_cuda_kernel.gemm import GEMM_KERNELS

    p01 = "tests/project01_cuda_kernel/"
    for kernel in GEMM_KERNELS:  # every ladder kernel exactly once, on an odd shape
        hits = [t for t in tests if t.startswith(p01 + "test_gemm_gpu.py") and f"[{kernel}]" in t]
        assert len(hits) == 1, (kernel, hits)
    assert any(t.startswith(p01 + "test_attention_gpu.py::test_softmax_scale") for t in tests)
    p04 = "tests/project04_llm_inference/"
    for needed in (
        "tests/project02_fsdp_scaling/test_train_gpu.py::test_compiled_bf16_run_on_one_gpu",
        "tests/project03_capstone_infra/test_trainer_gpu.py::test_gpu_preempt_and_resume",
        p04 + "test_engine_gpu.py::test_llama_3_2_1b_shape_smoke",  # a generation
        p04 + "test_engine_gpu.py::test_norm_and_activation_kernels",
        p04 + "test_kernels_gpu.py::test_decode_step_replays_in_a_cuda_graph_with_new_lengths",
        p04 + "test_prefill_gpu.py::test_q_view_of_fused_qkv",
    ):
        assert any(t.startswith(needed) for t in tests), needed
    assert len(tests) <= 48  # a small subset of the GPU tier: each kernel and path once


@pytest.mark.slow
def test_without_a_gpu_it_says_what_it_skipped_and_why(cpu_smoke_run):
    r, out = cpu_smoke_run
    assert "builds skipped: " in r.stdout
    assert "what was skipped, and why:" in r.stdout and "needs a CUDA GPU" in r.stdout
    assert "every test skipped" in r.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "all skipped" and summary["counts"]["passed"] == 0
    assert summary["counts"]["skipped"] == len(summary["tests"]) > 0
    assert all(b["ok"] is None and b["skipped"] for b in summary["builds"])
    assert summary["environment"]["gpu"] is None


def test_require_gpu_fails_where_no_gpu_is_usable(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "scripts.gpu_smoke", "--require-gpu", "--out-dir", str(tmp_path)],
        cwd=ROOT,
        env=NO_GPU,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "cannot run here" in r.stdout and not (tmp_path / "junit.xml").exists()
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "no GPU"


PLANTED = """
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.smoke]

def test_passes():
    pass

def test_skips():
    pytest.skip("a planted reason")
{extra}
"""


def _planted_run(tmp_path, monkeypatch, extra: str):
    tests = tmp_path / "planted"
    tests.mkdir()
    (tests / "test_planted.py").write_text(PLANTED.format(extra=textwrap.dedent(extra)))
    monkeypatch.setattr(gpu_smoke, "smoke_test_dirs", lambda root=ROOT: [str(tests)])
    monkeypatch.setattr(gpu_smoke, "present_extensions", lambda root=ROOT: [])
    monkeypatch.setattr(gpu_smoke, "gpu_unavailable_reason", lambda need_compiler: None)
    lines: list[str] = []
    rc = gpu_smoke.run(tmp_path / "out", log=lines.append)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    return rc, "\n".join(lines), summary


def test_a_failing_test_fails_the_run_and_skips_are_listed(tmp_path, monkeypatch):
    rc, text, summary = _planted_run(
        tmp_path,
        monkeypatch,
        """
        def test_fails():
            assert 1 + 1 == 3
        """,
    )
    assert rc == 1 and summary["status"] == "failed"
    assert summary["counts"] == {"passed": 1, "failed": 1, "error": 0, "skipped": 1}
    assert "1 skipped: a planted reason" in text and "FAILED" in text
    failed = [t for t in summary["tests"] if t["outcome"] == "failed"]
    assert [t["test"].split("::")[-1] for t in failed] == ["test_fails"]


def test_passes_and_skips_alone_pass(tmp_path, monkeypatch):
    rc, text, summary = _planted_run(tmp_path, monkeypatch, "")
    assert rc == 0 and summary["status"] == "passed", text
    assert "1 passed, 0 failed, 1 skipped" in text and "budget: met" in text


def test_an_error_in_a_fixture_fails_the_run(tmp_path, monkeypatch):
    rc, _, summary = _planted_run(
        tmp_path,
        monkeypatch,
        """
        @pytest.fixture
        def broken():
            raise RuntimeError("set-up failed")

        def test_uses_it(broken):
            pass
        """,
    )
    assert rc == 1 and summary["counts"]["error"] == 1


def test_a_failed_build_stops_the_run(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_smoke, "gpu_unavailable_reason", lambda need_compiler: None)
    monkeypatch.setattr(
        gpu_smoke, "present_extensions", lambda root=ROOT: [("json", "no_such_loader")]
    )
    lines: list[str] = []
    rc = gpu_smoke.run(tmp_path, log=lines.append)
    assert rc == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "build failed" and summary["builds"][0]["ok"] is False
    log = Path(summary["builds"][0]["log"])
    assert "no_such_loader" in log.read_text() and log.parent == tmp_path
    assert any(line.startswith("FAIL build json") for line in lines)
    assert not (tmp_path / "junit.xml").exists()  # the tests were not run


def test_read_junit_names_files_and_reasons(tmp_path):
    xml = tmp_path / "j.xml"
    xml.write_text(
        textwrap.dedent("""\
        <testsuites><testsuite>
          <testcase classname="tests.repo.test_gpu_smoke" name="test_a[x]" time="1.5"/>
          <testcase classname="tests.repo.test_gpu_smoke" name="test_b" time="0.1">
            <skipped type="pytest.skip" message="needs a CUDA GPU">tests/repo/test_gpu_smoke.py:3: needs a CUDA GPU</skipped>
          </testcase>
          <testcase classname="tests.repo.test_gpu_smoke" name="test_c" time="0.2">
            <failure message="assert 1 == 2">trace</failure>
          </testcase>
        </testsuite></testsuites>
        """)
    )
    got = gpu_smoke.read_junit(xml)
    assert [(o.test, o.outcome) for o in got] == [
        ("tests/repo/test_gpu_smoke.py::test_a[x]", "passed"),
        ("tests/repo/test_gpu_smoke.py::test_b", "skipped"),
        ("tests/repo/test_gpu_smoke.py::test_c", "failed"),
    ]
    assert got[0].seconds == 1.5 and got[2].message == "assert 1 == 2"
    report = gpu_smoke.skipped_report(got)
    assert report[0] == "  1 skipped: needs a CUDA GPU"
    assert gpu_smoke._reason("tests/x.py:12: needs a GPU") == "needs a GPU"


def test_bad_arguments_are_one_line(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "scripts.gpu_smoke", "--out-dir", ""],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and r.stderr.startswith("error: argument --out-dir")
    (tmp_path / "file").write_text("x")
    r = subprocess.run(
        [sys.executable, "-m", "scripts.gpu_smoke", "--out-dir", str(tmp_path / "file")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "is not a folder" in r.stderr
