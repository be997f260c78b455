"""`make fork`: a standalone repository of one project, from the committed tree.

The forks here are taken from a snapshot of this checkout (its tracked and untracked, not
ignored files, committed in a temporary repository), so that the code under test is what is in
the working tree while the fork still reads a committed tree through `git archive`.
"""

import os
import posixpath
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import compile_cuda, fork_project, publish
from scripts.fork_project import PROJECTS
from scripts.gpu_smoke import uses_mark

from .test_workflows import actionlint, runs
from .test_workflows import load as load_workflow

ROOT = Path(__file__).resolve().parents[2]
IDENT = ["-c", "user.name=snapshot", "-c", "user.email=snapshot@example.invalid"]

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(*args, cwd):
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True, timeout=120
    )


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    """This checkout's files committed in a temporary repository."""
    snap = tmp_path_factory.mktemp("snapshot")
    listed = _git("ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=ROOT).stdout
    for rel in filter(None, listed.split("\0")):
        src = ROOT / rel
        if src.is_file() and not src.is_symlink():
            (snap / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, snap / rel)
    _git("init", "-q", cwd=snap)
    _git("add", "-A", cwd=snap)
    _git(*IDENT, "commit", "-qm", "snapshot", cwd=snap)
    return snap


@pytest.fixture(scope="module")
def fork_of(snapshot, tmp_path_factory):
    made = {}

    def make(project: str) -> Path:
        if project not in made:
            dest = tmp_path_factory.mktemp("forks") / project
            made[project] = fork_project.fork(project, dest, root=snapshot, git=False).dest
        return made[project]

    return make


def test_fork_refuses_bad_requests(tmp_path):
    with pytest.raises(fork_project.ForkError, match="unknown project"):
        fork_project.fork("project99", tmp_path / "x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    with pytest.raises(fork_project.ForkError, match="not empty"):
        fork_project.fork("apple_track", tmp_path / "full")
    with pytest.raises(fork_project.ForkError, match="outside this repository"):
        fork_project.fork("apple_track", ROOT / ".scratch" / "fork-inside")
    with pytest.raises(fork_project.ForkError, match="committed tree"):
        fork_project.fork("apple_track", tmp_path / "y", root=tmp_path / "full")  # not git


def test_the_fork_comes_from_the_committed_tree_not_the_working_tree(snapshot, tmp_path):
    readme = snapshot / "project03_capstone_infra" / "DESIGN.md"
    committed = readme.read_text()
    readme.write_text("laptop numbers\n")  # a dirty tree
    (snapshot / "project03_capstone_infra" / "scratch_notes.py").write_text("x = 1\n")
    try:
        dest = fork_project.fork(
            "project03_capstone_infra", tmp_path / "f", root=snapshot, git=False
        ).dest
    finally:
        readme.write_text(committed)
        (snapshot / "project03_capstone_infra" / "scratch_notes.py").unlink()
    assert "laptop numbers" not in (dest / "project03_capstone_infra" / "DESIGN.md").read_text()
    assert not (dest / "project03_capstone_infra" / "scratch_notes.py").exists()


def test_the_fork_commits_as_the_user_or_says_how_to(snapshot, tmp_path, monkeypatch):
    monkeypatch.setattr(fork_project, "git_identity", lambda cwd=None: ("Ada L", "ada@example.org"))
    done = fork_project.fork("apple_track", tmp_path / "a", root=snapshot)
    assert done.committed
    log = _git("log", "--format=%an <%ae>|%s", cwd=done.dest).stdout.strip()
    assert log == "Ada L <ada@example.org>|apple_track: standalone fork"
    assert _git("status", "--porcelain", cwd=done.dest).stdout == ""

    monkeypatch.setattr(fork_project, "git_identity", lambda cwd=None: None)
    staged = fork_project.fork("apple_track", tmp_path / "b", root=snapshot)
    assert staged.committed is False
    assert "git config --global user.email" in staged.note and "git commit" in staged.note
    r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=staged.dest, capture_output=True)
    assert r.returncode != 0  # no commit under an invented name
    assert "fork@localhost" not in (ROOT / "scripts" / "fork_project.py").read_text()


def _links(md: Path) -> list[str]:
    out, fenced = [], False
    for line in md.read_text().splitlines():
        if fork_project._FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            out += [m.group(3) for m in fork_project._LINK.finditer(line)]
    return out


@pytest.mark.parametrize("project", PROJECTS)
def test_every_link_of_the_fork_readme_resolves_inside_the_fork(project, fork_of):
    dest = fork_of(project)
    assert not (dest / project / "README.md").exists()  # moved to the root
    links = [t for t in _links(dest / "README.md") if not fork_project._is_external(t)]
    local = [t.partition("#")[0] for t in links if t.partition("#")[0]]
    broken = [t for t in local if not (dest / t).exists() or ".." in Path(t).parts]
    assert broken == []
    if project in ("project01_cuda_kernel", "project02_fsdp_scaling"):
        assert any(t.startswith(f"reports/{project}/") and t.endswith(".png") for t in local)


@pytest.mark.parametrize("project", PROJECTS)
def test_the_fork_holds_only_the_shared_modules_it_imports(project, fork_of):
    dest = fork_of(project)
    own = [p for p in (dest / project).rglob("*.py")]
    own += [p for p in (dest / "tests" / project).rglob("*.py")]
    own += [p for p in (dest / "scripts").glob("*.py")] + [dest / "tests" / "conftest.py"]
    needed = fork_project.internal_closure(dest, own, {"shared"})
    held = set((dest / "shared").glob("*.py"))
    assert held == needed | {dest / "shared" / "__init__.py"}
    # ...and every import of shared or tests anywhere in the fork is a file of the fork
    for py in dest.rglob("*.py"):
        mod = fork_project._module_name(dest, py)
        for name in fork_project.imported_modules(py, mod):
            top = name.split(".")[0]
            assert top not in set(PROJECTS) - {project}, f"{py} imports {name}"
            parts = name.split(".")
            if (
                top == "shared"
                and len(parts) > 1
                and (ROOT / "shared" / f"{parts[1]}.py").is_file()
            ):
                assert (dest / "shared" / f"{parts[1]}.py").is_file(), f"{py} imports {name}"


def test_each_fork_declares_what_it_imports_and_no_more(fork_of):
    p01 = (fork_of("project01_cuda_kernel") / "pyproject.toml").read_text()
    assert 'name = "project01-cuda-kernel"' in p01
    assert 'include = ["shared*", "project01_cuda_kernel*"]' in p01
    for absent in (
        "ray",
        "dali",
        "deepspeed",
        "apple =",
        "serve",
        "coremltools",
        "prometheus",
        "project02",
        "apple_track =",
    ):
        assert absent not in p01, absent
    assert "ninja" in p01 and "csrc/**/*.cu" in p01  # builds its CUDA sources
    assert "ai-infra-capstones" not in p01 and "three AI-infrastructure" not in p01
    p03 = (fork_of("project03_capstone_infra") / "pyproject.toml").read_text()
    assert "ray = " in p03 and "prometheus-client" in p03 and "ninja" not in p03
    assert "deepspeed" not in p03 and "apple =" not in p03
    p02 = (fork_of("project02_fsdp_scaling") / "pyproject.toml").read_text()
    assert "deepspeed = " in p02 and "ray =" not in p02
    assert (
        "OPTIONAL_EXTRAS ?= deepspeed fp8\n"
        in (fork_of("project02_fsdp_scaling") / "Makefile").read_text()
    )
    assert "OPTIONAL_EXTRAS ?=\n" in (fork_of("project01_cuda_kernel") / "Makefile").read_text()


@pytest.mark.parametrize("project", PROJECTS)
def test_the_fork_has_its_own_makefile_and_demo_plan(project, fork_of):
    dest = fork_of(project)
    makefile = (dest / "Makefile").read_text()
    for target in (
        "test",
        "test-all",
        "gpu-test",
        "demo",
        "publish",
        "lint",
        "setup",
        "readme",  # its README's results table, regenerated from its reports/
        *fork_project.MAKE_TARGETS[project],
    ):
        assert f"\n{target}:" in makefile, target
    others = {t for p, ts in fork_project.MAKE_TARGETS.items() if p != project for t in ts}
    for target in others | {"fork", "verify-results"}:
        assert f"\n{target}:" not in makefile, target
    if project != "apple_track":
        assert "apple" not in makefile.lower()
    r = subprocess.run(["make", "help"], cwd=dest, capture_output=True, text=True, timeout=60)
    assert "make test " in r.stdout and "make publish " in r.stdout
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run(
        [sys.executable, "-c", "from scripts import demo; print(*demo.PROJECTS)"],
        cwd=dest,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    short = {
        v: k
        for k, v in {
            "project01": "project01_cuda_kernel",
            "project02": "project02_fsdp_scaling",
            "project03": "project03_capstone_infra",
            "project04": "project04_llm_inference",
            "apple": "apple_track",
        }.items()
    }[project]
    assert r.stdout.split() == [short]


def test_publish_in_a_fork_refreshes_the_readme_at_its_root(fork_of, tmp_path):
    dest = tmp_path / "fork"
    shutil.copytree(fork_of("project02_fsdp_scaling"), dest)
    run = dest / "runs" / "t" / "project02_fsdp_scaling"
    run.mkdir(parents=True)
    shutil.copy2(dest / "reports/project02_fsdp_scaling/scaling_cpu.json", run)
    from shared.results import replace_between_markers

    marker = "results:project02_fsdp_scaling"
    text = replace_between_markers((dest / "README.md").read_text(), marker, "stale")
    (dest / "README.md").write_text(text)
    publish.publish(run.parent, root=dest, log=lambda s: None)
    readme = dest / "README.md"
    assert publish.project_readme(dest, "project02_fsdp_scaling") == readme
    block = readme.read_text().split(f"<!-- {marker} -->")[1].split(f"<!-- /{marker} -->")[0]
    assert "stale" not in block
    assert "](reports/project02_fsdp_scaling/scaling_gpu.json)" in block
    assert "Running this repository" in readme.read_text()
    for t in _links(readme):
        path = t.partition("#")[0]
        if path and not fork_project._is_external(t):
            assert (dest / posixpath.normpath(path)).exists(), t


@pytest.mark.slow
@pytest.mark.parametrize("project", PROJECTS)
def test_the_fork_passes_its_own_tests(project, fork_of):
    """The fork's CPU tests (`-m "not gpu and not slow"`: its slow ones are the same files the
    main suite runs), run from inside the fork with this repository's interpreter: a new
    virtual environment per fork would take minutes, so the fork's dependencies are those of
    .venv. This checkout is installed there in editable mode, whose import hook would find a
    module the fork lacks in this checkout instead: the hook is removed first, and PYTHONPATH
    is cleared, so every import of shared or the project is served by the fork's files."""
    dest = fork_of(project)
    guard = (
        "import sys\n"
        "sys.meta_path[:] = [f for f in sys.meta_path\n"
        "                    if 'editable' not in getattr(f, '__module__', '').lower()]\n"
        "import pytest\n"
        "raise SystemExit(pytest.main(sys.argv[1:]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run(
        [sys.executable, "-c", guard, "-m", "not gpu and not slow", "-q", "-p", "no:cacheprovider"],
        cwd=dest,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " passed" in r.stdout


# --- the fork's own workflows -----------------------------------------------------------------

GPU_PROJECTS = {
    p for p in PROJECTS if any(uses_mark(f, "gpu") for f in (ROOT / "tests" / p).rglob("test_*.py"))
}
CUDA_PROJECTS = {p for p in PROJECTS if any((ROOT / p).glob("csrc/**/*.cu"))}


def test_the_projects_the_workflow_checks_expect():
    assert GPU_PROJECTS == set(PROJECTS) - {"apple_track"}
    assert CUDA_PROJECTS == {"project01_cuda_kernel", "project04_llm_inference"}


@pytest.mark.parametrize("project", PROJECTS)
def test_the_fork_has_workflows_of_its_own_that_pass_actionlint(project, fork_of):
    """CI for its own tests and lint on every push; the compile-only CUDA job where it has CUDA
    sources; the GPU smoke workflow where it has GPU tests; nothing of another project."""
    dest = fork_of(project)
    folder = dest / ".github" / "workflows"
    files = sorted(folder.glob("*.yml"))
    smoke = project in GPU_PROJECTS
    assert {f.name for f in files} == ({"ci.yml", "gpu-smoke.yml"} if smoke else {"ci.yml"})
    r = actionlint(files, dest)
    assert r.returncode == 0, r.stdout + r.stderr

    ci = load_workflow(folder / "ci.yml")
    assert ("cuda-compile" in ci["jobs"]) == (project in CUDA_PROJECTS)
    assert ("cuda-compile-bindings" in ci["jobs"]) == (project in CUDA_PROJECTS)
    assert ("apple-track" in ci["jobs"]) == (project == "apple_track")
    assert "make test" in runs(ci["jobs"]["cpu-tier"]) and "make lint" in runs(
        ci["jobs"]["cpu-tier"]
    )
    text = "".join(f.read_text() for f in files)
    for other in set(PROJECTS) - {project}:
        assert other not in text, other
    if project != "apple_track":
        assert "apple" not in text.lower()
    # every make target and script the workflows run is the fork's own
    makefile = (dest / "Makefile").read_text()
    for f in files:
        for job in load_workflow(f)["jobs"].values():
            for line in runs(job).splitlines():
                for target in line.split("make ")[1:]:
                    assert f"\n{target.split()[0]}:" in makefile, (f.name, line)
                for script in re.findall(r"scripts/\w+\.py", line):
                    assert (dest / script).is_file(), (f.name, script)
    assert ("\ngpu-smoke:" in makefile) == smoke == (dest / "scripts" / "gpu_smoke.py").is_file()
    cuda = project in CUDA_PROJECTS
    assert (
        ("\ncuda-compile:" in makefile) == cuda == (dest / "scripts" / "compile_cuda.py").is_file()
    )
    assert ("\ncuda-compile-bindings:" in makefile) == cuda
    assert (dest / ".github" / "actionlint.yaml").is_file()
    assert ".github/workflows/" in (dest / "README.md").read_text()


def test_drop_job_removes_one_job_and_keeps_the_rest():
    text = "on: push\njobs:\n  a:\n    steps: []\n\n  b:\n    # b's note\n    steps:\n      - run: x\n\n  c:\n    steps: []\n"
    assert (
        fork_project.drop_job(text, "b")
        == "on: push\njobs:\n  a:\n    steps: []\n\n  c:\n    steps: []\n"
    )
    assert (
        fork_project.drop_job(text, "c")
        == "on: push\njobs:\n  a:\n    steps: []\n\n  b:\n    # b's note\n    steps:\n      - run: x\n"
    )
    with pytest.raises(fork_project.ForkError, match="no job 'd'"):
        fork_project.drop_job(text, "d")


@pytest.mark.slow
def test_the_forks_gpu_smoke_runs_inside_it_and_selects_its_own_tests(fork_of, tmp_path):
    """With no GPU visible every test skips, but the run itself (its scripts, its shared
    modules, its smoke selection) is the fork's."""
    dest = fork_of("project03_capstone_infra")
    assert not (dest / "shared" / "cuda_build.py").exists()  # no kernels: no build tools either
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run(
        [sys.executable, "-m", "scripts.gpu_smoke", "--out-dir", str(tmp_path)],
        cwd=dest,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    junit = (tmp_path / "junit.xml").read_text()
    assert 'classname="tests.project03_capstone_infra.test_trainer_gpu"' in junit
    assert "project01" not in junit and "project04" not in junit
    assert "what was skipped, and why:" in r.stdout


@pytest.mark.slow
@pytest.mark.skipif(compile_cuda.find_nvcc() is None, reason="nvcc not found: CUDA toolkit absent")
def test_the_forks_cuda_compile_job_compiles_its_own_sources(fork_of):
    dest = fork_of("project04_llm_inference")
    r = subprocess.run(
        [sys.executable, "scripts/compile_cuda.py", "--strict"],
        cwd=dest,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    compiled = re.findall(r"^ok   (\S+)", r.stdout, re.M)
    assert compiled and all(c.startswith("project04_llm_inference/csrc/") for c in compiled)
    assert len(compiled) == len(list((dest / "project04_llm_inference" / "csrc").glob("*.cu")))
