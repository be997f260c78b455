"""Write one project out as a standalone repository (`make fork PROJECT=... DEST=...`).

    python -m scripts.fork_project project01_cuda_kernel ../my-kernels

The fork holds the project, the `shared` library, their tests, the project's reports, a
pyproject.toml, a Makefile with the same commands (`make test`, `make demo`, ...), a README and
the CI entry point; it is a git repository with one commit. Its own `make test` passes on its own:
projects import `shared` and third-party packages only, never each other (checked here first).
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROJECTS = ("project01_cuda_kernel", "project02_fsdp_scaling", "project03_capstone_infra",
            "apple_track")  # fmt: skip
MAKE_TARGETS = {"project01_cuda_kernel": "project01", "project02_fsdp_scaling": "project02",
                "project03_capstone_infra": "project03", "apple_track": "apple"}  # fmt: skip
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".build", ".pytest_cache", "*.egg-info")


class ForkError(ValueError):
    pass


def imported_top_level_names(path: Path) -> set[str]:
    """Top-level package names a Python file imports (absolute imports only)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def cross_project_imports(project: str, root: Path = ROOT) -> list[str]:
    """'file: imports other' lines for every import of another project (or of a project by
    shared), in the package and its tests."""
    others = set(PROJECTS) - {project}
    problems = []
    folders = [root / project, root / "tests" / project]
    for folder in folders:
        for py in sorted(folder.rglob("*.py")) if folder.exists() else []:
            bad = imported_top_level_names(py) & others
            if bad:
                problems.append(f"{py.relative_to(root)} imports {', '.join(sorted(bad))}")
    return problems


def _makefile_for(project: str) -> str:
    text = (ROOT / "Makefile").read_text()
    for other, target in MAKE_TARGETS.items():
        if other != project:
            text = re.sub(rf"(?m)^{target}(-[a-z]+)?:.*\n(\t.*\n)*", "", text)
    text = re.sub(r"(?m)^fork:.*\n(\t.*\n)*", "", text)
    phony = "test gpu-test demo setup lint format clean readme help " + MAKE_TARGETS[project]
    return re.sub(r"(?m)^\.PHONY:.*$", f".PHONY: {phony}", text)


def _pyproject_for(project: str) -> str:
    text = (ROOT / "pyproject.toml").read_text()
    text = re.sub(r'(?m)^name = ".*"$', f'name = "{project.replace("_", "-")}"', text)
    text = re.sub(r"(?m)^include = \[.*\]$", f'include = ["shared*", "{project}*"]', text)
    if project != "project01_cuda_kernel":
        text = re.sub(r"(?m)^\[tool\.setuptools\.package-data\]\n.*\n\n", "", text)
    return text


def _readme_for(project: str) -> str:
    own = ROOT / project / "README.md"
    body = own.read_text() if own.exists() else f"# {project}\n"
    return (
        f"{body.rstrip()}\n\n---\n\n## Running this repository\n\n"
        "```bash\nmake test   # creates .venv, installs, runs the CPU test tier\n"
        "make demo   # runs this project at the size your hardware allows, writes reports/\n```\n\n"
        "`shared/` is the library this project stands on: hardware specs, timing, FLOP counts, "
        "roofline, cost, result files, charts, the reference transformer and the distributed "
        "set-up. `make help` lists the other commands.\n"
    )


def fork(project: str, dest: Path, *, git: bool = True) -> Path:
    if project not in PROJECTS:
        raise ForkError(f"unknown project {project!r}; expected one of {', '.join(PROJECTS)}")
    dest = dest.expanduser().resolve()
    if dest.exists() and any(dest.iterdir()):
        raise ForkError(f"destination {dest} exists and is not empty")
    if dest == ROOT or ROOT in dest.parents:
        raise ForkError("the destination must be outside this repository")
    problems = cross_project_imports(project)
    if problems:
        raise ForkError("the project imports another project, so it cannot stand alone:\n  "
                        + "\n  ".join(problems))  # fmt: skip

    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(ROOT / project, dest / project, ignore=_IGNORE)
    shutil.copytree(ROOT / "shared", dest / "shared", ignore=_IGNORE)
    (dest / "tests").mkdir()
    for name in ("__init__.py", "conftest.py"):
        shutil.copy2(ROOT / "tests" / name, dest / "tests" / name)
    for sub in ("shared", project):
        if (ROOT / "tests" / sub).exists():
            shutil.copytree(ROOT / "tests" / sub, dest / "tests" / sub, ignore=_IGNORE)
    (dest / "scripts").mkdir()
    for name in ("__init__.py", "demo.py", "refresh_readme.py"):
        if (ROOT / "scripts" / name).exists():
            shutil.copy2(ROOT / "scripts" / name, dest / "scripts" / name)
    if (ROOT / "reports" / project).exists():
        shutil.copytree(ROOT / "reports" / project, dest / "reports" / project, ignore=_IGNORE)
    else:
        (dest / "reports").mkdir()
    (dest / ".ci").mkdir()
    shutil.copy2(ROOT / ".ci" / "run", dest / ".ci" / "run")
    shutil.copy2(ROOT / ".gitignore", dest / ".gitignore")
    shutil.copy2(ROOT / "LICENSE", dest / "LICENSE")
    (dest / "Makefile").write_text(_makefile_for(project))
    (dest / "pyproject.toml").write_text(_pyproject_for(project))
    (dest / "README.md").write_text(_readme_for(project))

    if git and shutil.which("git"):
        ident = ["-c", "user.name=fork", "-c", "user.email=fork@localhost"]
        for cmd in (["init", "-q"], ["add", "-A"],
                    [*ident, "commit", "-qm", f"{project}: standalone fork"]):  # fmt: skip
            subprocess.run(["git", *cmd], cwd=dest, check=True, capture_output=True)
    return dest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("project", help=f"one of: {', '.join(PROJECTS)}")
    p.add_argument("dest", type=Path, help="a new (or empty) directory outside this repository")
    p.add_argument("--no-git", action="store_true", help="do not make the fork a git repository")
    args = p.parse_args(argv)
    try:
        dest = fork(args.project, args.dest, git=not args.no_git)
    except ForkError as e:
        print(f"fork: {e}", file=sys.stderr)
        return 2
    print(f"wrote {dest}\nnext: cd {dest} && make test")
    return 0


if __name__ == "__main__":
    sys.exit(main())
