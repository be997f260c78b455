"""The repository's own rules: layering, forking, the README refresh, the demo plan."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import demo, fork_project, refresh_readme
from scripts.fork_project import PROJECTS, cross_project_imports, imported_top_level_names

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("project", PROJECTS)
def test_no_project_imports_another(project):
    assert cross_project_imports(project) == []


def test_shared_imports_no_project():
    for py in (ROOT / "shared").rglob("*.py"):
        assert not imported_top_level_names(py) & set(PROJECTS), py


def test_the_import_check_catches_a_cross_import(tmp_path):
    pkg = tmp_path / "project02_fsdp_scaling"
    pkg.mkdir()
    (pkg / "bad.py").write_text("from project01_cuda_kernel import matmul\nimport shared\n")
    (tmp_path / "tests").mkdir()
    problems = cross_project_imports("project02_fsdp_scaling", root=tmp_path)
    assert problems == ["project02_fsdp_scaling/bad.py imports project01_cuda_kernel"]


def test_fork_refuses_bad_requests(tmp_path):
    with pytest.raises(fork_project.ForkError, match="unknown project"):
        fork_project.fork("project99", tmp_path / "x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    with pytest.raises(fork_project.ForkError, match="not empty"):
        fork_project.fork("apple_track", tmp_path / "full")
    with pytest.raises(fork_project.ForkError, match="outside this repository"):
        fork_project.fork("apple_track", ROOT / ".scratch" / "fork-inside")


@pytest.mark.parametrize("project", PROJECTS)
def test_every_fork_is_complete_and_its_tests_collect(project, tmp_path):
    dest = fork_project.fork(project, tmp_path / "fork", git=False)
    for rel in (project, "shared", "tests/conftest.py", "tests/shared", "Makefile",
                "pyproject.toml", "README.md", ".ci/run", ".gitignore", "LICENSE", "scripts/demo.py"):  # fmt: skip
        assert (dest / rel).exists(), rel
    others = set(PROJECTS) - {project}
    assert not any((dest / o).exists() for o in others)
    pyproject = (dest / "pyproject.toml").read_text()
    assert f'name = "{project.replace("_", "-")}"' in pyproject
    assert f'include = ["shared*", "{project}*"]' in pyproject
    makefile = (dest / "Makefile").read_text()
    assert "\ntest:" in makefile and "\ndemo:" in makefile and "\nfork:" not in makefile
    if project != "apple_track":
        assert "\napple" not in makefile  # no target of the on-device track in other forks
    # the fork's tests import only what the fork holds: collection succeeds in a clean env
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "tests"],
                       cwd=dest, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]


@pytest.mark.slow
def test_a_fork_runs_its_own_test_command(tmp_path):
    """make fork, then the fork's `make test` (set-up skipped: this interpreter has the
    packages) passes on its own."""
    dest = tmp_path / "fork"
    r = subprocess.run(["make", "fork", "PROJECT=apple_track", f"DEST={dest}",
                        f"PYTHON={sys.executable}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert (dest / ".git").exists()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # The fork's fast tests: its slow multi-process ones are the same files the main suite runs.
    r = subprocess.run(["make", "test", f"PYTHON={sys.executable}", "APPLE_TESTS=0",
                        'PYTEST_ARGS=-q -p no:cacheprovider -m "not gpu and not slow"'],
                       cwd=dest, env=env, capture_output=True, text=True,
                       timeout=900)  # fmt: skip
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " passed" in r.stdout


def test_readme_refresh(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("x\n<!-- results:p1 -->\nold\n<!-- /results:p1 -->\n"
                      "<!-- results:p2 -->\nold\n<!-- /results:p2 -->\n")  # fmt: skip
    (tmp_path / "reports" / "p1").mkdir(parents=True)
    (tmp_path / "reports" / "p1" / "summary.md").write_text("| a |\n| --- |\n| 1 |\n")
    assert refresh_readme.refresh(readme, tmp_path / "reports") == ["p1"]
    text = readme.read_text()
    assert "| a |\n| --- |\n| 1 |" in text and "old" not in text
    assert "No results recorded yet: `reports/p2/summary.md`" in text


def test_the_root_readme_gives_the_two_commands_first():
    text = (ROOT / "README.md").read_text()
    first_block = text.split("```bash", 1)[1].split("```", 1)[0]
    assert "make test" in first_block and "make demo" in first_block
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_demo_plan_follows_the_hardware():
    cpu = demo.plan(demo.Hardware(gpus=0, gpu_name=None, nvcc=False, cuda_torch=False))
    p01 = [s for s in cpu if s.project == "project01"]
    assert all(s.skip_reason for s in p01)
    assert any("nvcc not found" in s.skip_reason for s in p01)
    p02 = next(s for s in cpu if s.project == "project02")
    assert p02.argv[-1] == "project02_fsdp_scaling.scaling"  # sizes itself: tiny over gloo
    gpu = demo.plan(demo.Hardware(gpus=4, gpu_name="NVIDIA H200", nvcc=True, cuda_torch=True))
    assert all(s.skip_reason is None for s in gpu if "DeepSpeed" not in s.title)
    p02 = next(s for s in gpu if s.project == "project02")
    assert p02.argv[-2:] == ["--gpus", "1,2,4"]


def test_make_help_lists_the_targets():
    r = subprocess.run(["make", "help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    for target in ("setup", "test", "gpu-test", "demo", "project01", "project02", "project03",
                   "apple", "lint", "fork"):  # fmt: skip
        assert f"make {target} " in r.stdout, target
