"""Write one project out as a standalone repository (`make fork PROJECT=... DEST=...`).

    python -m scripts.fork_project project01_cuda_kernel ../my-kernels

The fork is built from the committed tree (`git archive HEAD`), never from the working tree, so
uncommitted edits and local results do not leak into it. It holds:

- the project and its tests; its README at the root, every relative link rewritten to resolve
  inside the fork (or made plain text where its target is not carried), and the published
  results of the project under `reports/<project>/`;
- only the modules of `shared` the project imports (the import graph of the project and its
  tests, followed through `shared`), with the tests of `shared` that need nothing else;
- a pyproject.toml with the project's own name, description, dependencies and extras (those
  its modules import), a Makefile with the targets that exist for it, the demo runner (which
  plans the projects present: this one), `make publish`, the CI entry point, LICENSE;
- its own GitHub Actions workflows: the CPU tier and lint on every push and pull request (with
  the compile-only CUDA job where it has CUDA sources, and the binding check where it has torch
  bindings), and the GPU smoke workflow for a self-hosted runner where it has tests marked
  `smoke` (`make gpu-smoke`);
- a git repository with one commit by your git identity (user.name / user.email); with none
  configured, the files are staged and the fork says how to set one and commit.

Projects import `shared` and third-party packages only, never each other (checked first).
"""

from __future__ import annotations

import argparse
import ast
import io
import posixpath
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from scripts.compile_cuda import is_binding
from scripts.gpu_smoke import uses_mark

ROOT = Path(__file__).resolve().parent.parent
PROJECTS = (
    "project01_cuda_kernel",
    "project02_fsdp_scaling",
    "project03_capstone_infra",
    "project04_llm_inference",
    "apple_track",
)
# Each project's own targets of the Makefile (the rest are common to every fork).
MAKE_TARGETS = {
    "project01_cuda_kernel": ("project01",),
    "project02_fsdp_scaling": ("project02",),
    "project03_capstone_infra": ("project03",),
    "project04_llm_inference": ("project04",),
    "apple_track": ("apple-tier", "apple", "apple-test"),
}
COMMON_TARGETS = (
    "help",
    "setup",
    "$(STAMP)",
    "test",
    "test-all",
    "gpu-test",
    "demo",
    "publish",
    "lint",
    "format",
    "readme",
    "clean",
)
SCRIPTS = ("__init__.py", "demo.py", "publish.py", "refresh_readme.py")
# Scripts a project's README tells its users to run, carried into that project's fork.
PROJECT_SCRIPTS = {"project02_fsdp_scaling": ("build_deepspeed_wheel.sh",)}
TOP_FILES = (".gitignore", "LICENSE", ".ci/run", ".github/actionlint.yaml")
# The workflows of the monorepo a fork's own are made from, and the jobs of ci.yml that only
# some projects keep (see _workflows_for).
CI_WORKFLOW = ".github/workflows/ci.yml"
GPU_SMOKE_WORKFLOW = ".github/workflows/gpu-smoke.yml"
# Distribution name -> import name, where they differ.
IMPORT_NAMES = {
    "nvidia-ml-py": "pynvml",
    "prometheus-client": "prometheus_client",
    "nvidia-dali-cuda130": "nvidia.dali",
    "scikit-learn": "sklearn",
}
TOOLS = {"pytest", "pytest-timeout", "ruff"}  # dev tools every fork keeps
BUILD_TOOLS = {"ninja", "pybind11"}  # kept where the fork builds CUDA extensions
FORK_SECTION_MARKER = "<!-- fork: this repository -->"  # scripts/publish.py keeps what follows


class ForkError(ValueError):
    pass


# --- imports -----------------------------------------------------------------------------------


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


def imported_modules(path: Path, module: str) -> set[str]:
    """Dotted names a file imports, relative imports resolved against `module` (the file's own
    dotted name). `from a import b` yields both `a` and `a.b` (b may be a module)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            if base:
                names.add(base)
                names |= {f"{base}.{a.name}" for a in node.names if a.name != "*"}
    return names


def module_file(tree: Path, name: str) -> Path | None:
    """The file of dotted module `name` under `tree`, or None."""
    base = tree.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _module_name(tree: Path, path: Path) -> str:
    rel = path.relative_to(tree).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def internal_closure(tree: Path, seeds: list[Path], packages: set[str]) -> set[Path]:
    """Files of `packages` (top-level names) that `seeds` import, transitively, with the
    `__init__.py` of every package on the way."""
    found: set[Path] = set()
    queue = list(seeds)
    seen: set[Path] = set()
    while queue:
        path = queue.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in imported_modules(path, _module_name(tree, path)):
            if name.split(".")[0] not in packages:
                continue
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                f = module_file(tree, ".".join(parts[:i]))
                if f is not None and f not in found:
                    found.add(f)
                    queue.append(f)
    return found


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


def third_party_imports(files: list[Path], internal: set[str]) -> set[str]:
    """Dotted names of every absolute import of something outside `internal`."""
    out = set()
    for path in files:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                out |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                out.add(node.module)
            elif (  # a test's pytest.importorskip("x"): an optional dependency, in an extra
                isinstance(node, ast.Call)
                and isinstance(node.func, (ast.Attribute, ast.Name))
                and getattr(node.func, "attr", getattr(node.func, "id", "")) == "importorskip"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                out.add(node.args[0].value)
    return {n for n in out if n and n.split(".")[0] not in internal}


# --- what the fork holds -----------------------------------------------------------------------


@dataclass
class Selection:
    """Paths (posix, relative to the tree) the fork copies, and how the README moves."""

    project: str
    files: list[str] = field(default_factory=list)
    shared_modules: list[str] = field(default_factory=list)
    shared_tests: list[str] = field(default_factory=list)
    cuda_sources: bool = False  # CUDA sources under <project>/csrc/: the compile-only job
    cuda_bindings: bool = False  # torch bindings under <project>/csrc/: the binding check
    smoke_tests: bool = False  # tests marked smoke: `make gpu-smoke` and its workflow

    @property
    def readme(self) -> str:
        return f"{self.project}/README.md"


def _files_under(tree: Path, folder: str) -> list[str]:
    base = tree / folder
    if not base.is_dir():
        return []
    return sorted(p.relative_to(tree).as_posix() for p in base.rglob("*") if p.is_file())


def select(tree: Path, project: str) -> Selection:
    sel = Selection(project)
    own = _files_under(tree, project) + _files_under(tree, f"tests/{project}")
    csrc = tree / project / "csrc"
    sel.cuda_sources = csrc.is_dir() and any(csrc.rglob("*.cu"))
    sel.cuda_bindings = csrc.is_dir() and any(is_binding(p) for p in csrc.rglob("*") if p.is_file())
    sel.smoke_tests = any(
        uses_mark(tree / f, "smoke")
        for f in own
        if f.startswith("tests/")
        and posixpath.basename(f).startswith("test_")
        and f.endswith(".py")
    )
    # the scripts its workflows run: the compile-only CUDA job and the binding check, the GPU
    # smoke tier
    ci_scripts = [
        n
        for needed, n in (
            (sel.cuda_sources or sel.cuda_bindings, "compile_cuda.py"),
            (sel.smoke_tests, "gpu_smoke.py"),
        )
        if needed
    ]
    own_scripts = PROJECT_SCRIPTS.get(project, ())
    scripts = [
        f"scripts/{n}"
        for n in (*SCRIPTS, *ci_scripts, *own_scripts)
        if (tree / "scripts" / n).is_file()
    ]
    tests_top = [
        f"tests/{n}" for n in ("__init__.py", "conftest.py") if (tree / "tests" / n).is_file()
    ]
    seeds = [tree / f for f in own + scripts + tests_top if f.endswith(".py")]
    internal = internal_closure(tree, seeds, {"shared", "tests"})
    shared = {p for p in internal if p.relative_to(tree).parts[0] == "shared"}
    if shared or (tree / "shared" / "__init__.py").is_file():
        shared.add(tree / "shared" / "__init__.py")
    carried = {p.relative_to(tree).as_posix() for p in shared}
    carried |= {p.relative_to(tree).as_posix() for p in internal}

    # tests of shared: those whose imports (through shared and tests) the fork already holds
    shared_tests: set[str] = set()
    folder = tree / "tests" / "shared"
    candidates = sorted(folder.glob("test_*.py")) if folder.is_dir() else []
    others = set(PROJECTS) - {project}
    for test in candidates:
        if imported_top_level_names(test) & others:
            continue  # a test of shared that reaches into another project stays behind
        needs = internal_closure(tree, [test], {"shared", "tests"})
        rel_needs = {p.relative_to(tree).as_posix() for p in needs}
        helpers = [
            h
            for h in folder.glob("_*.py")
            if h.name != "__init__.py" and h.stem in test.read_text()
        ]
        for h in helpers:  # files a test starts by path (workers), with their imports
            rel_needs.add(h.relative_to(tree).as_posix())
            rel_needs |= {
                p.relative_to(tree).as_posix()
                for p in internal_closure(tree, [h], {"shared", "tests"})
            }
        rel_needs.discard("tests/shared/__init__.py")
        rel_needs.discard("tests/__init__.py")
        if all(n in carried or n.startswith("tests/shared/") for n in rel_needs) and not any(
            n.startswith("shared/") and n not in carried for n in rel_needs
        ):
            shared_tests.add(test.relative_to(tree).as_posix())
            shared_tests |= {n for n in rel_needs if n.startswith("tests/shared/")}
    if shared_tests and (folder / "__init__.py").is_file():
        shared_tests.add("tests/shared/__init__.py")

    reports = _files_under(tree, f"reports/{project}")
    top = [f for f in TOP_FILES if (tree / f).is_file()]
    sel.shared_modules = sorted(p.relative_to(tree).as_posix() for p in shared)
    sel.shared_tests = sorted(shared_tests)
    files = set(own) | set(scripts) | set(tests_top) | set(sel.shared_modules)
    files |= set(sel.shared_tests) | set(reports) | set(top)
    files |= {f for f in carried if f.startswith("tests/")}
    files.discard(sel.readme)
    sel.files = sorted(files)
    return sel


# --- README and Markdown links -----------------------------------------------------------------

_FENCE = re.compile(r"^(```|~~~)")
_LINK = re.compile(r"(!?)\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*([^)\s]+)(\s+\"[^\"]*\")?\s*\)")


def _is_external(target: str) -> bool:
    return bool(re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target)) or target.startswith(("#", "//"))


def rewrite_links(text: str, old_path: str, new_path: str, locate) -> str:
    """Links of a Markdown file that moves from `old_path` to `new_path` (both relative to the
    repository root), re-pointed: a target that `locate(path)` places in the fork (returning
    its path there) is linked relative to the new place; any other relative link becomes its
    text (an image its alt text), so no link is left broken."""
    old_dir, new_dir = posixpath.dirname(old_path), posixpath.dirname(new_path)

    def fix(m: re.Match) -> str:
        bang, label, target, title = m.group(1), m.group(2), m.group(3), m.group(4) or ""
        if _is_external(target):
            return m.group(0)
        path, sep, frag = target.partition("#")
        if not path:
            return m.group(0)
        resolved = posixpath.normpath(posixpath.join(old_dir, path))
        moved = None if resolved.startswith("..") else locate(resolved)
        if moved is None:
            return label if not bang else (f"_{label}_" if label else "")
        rel = posixpath.relpath(moved, new_dir or ".")
        if path.endswith("/") and not rel.endswith("/"):
            rel += "/"
        return f"{bang}[{label}]({rel}{sep}{frag}{title})"

    out, fenced = [], False
    for line in text.splitlines(keepends=True):
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
            out.append(line)
            continue
        out.append(line if fenced else _LINK.sub(fix, line))
    return "".join(out)


def _title(readme: str, project: str) -> str:
    for line in readme.splitlines():
        if line.startswith("# "):
            return line[2:].strip().replace("`", "").replace('"', "'")
    return project


_BULLET_LINK = re.compile(r"^- \[[^\]]*\]\(([^)\s]+)\)")


def _drop_uncarried_bullets(text: str, old_path: str, locate) -> str:
    """List items that start with a relative link the fork does not carry (a page of the
    monorepo, such as its CONTRIBUTING.md) are left out rather than kept as dead text."""
    old_dir = posixpath.dirname(old_path)
    out = []
    for line in text.splitlines(keepends=True):
        m = _BULLET_LINK.match(line)
        if m and not _is_external(m.group(1)):
            path = m.group(1).partition("#")[0]
            resolved = posixpath.normpath(posixpath.join(old_dir, path))
            if path and (resolved.startswith("..") or locate(resolved) is None):
                continue
        out.append(line)
    return "".join(out)


def _setup_block(sel: Selection) -> str:
    """The fork's first commands: set-up and the CPU tier, the demo, publishing a run."""
    return (
        "```bash\nmake test   # creates .venv, installs, runs the CPU test tier\n"
        "make demo   # runs this project at the size your hardware allows, into runs/<time>/\n"
        "make publish RUN=runs/<time>   # that run becomes reports/ and the results table\n```\n"
    )


def _fork_section(sel: Selection, setup_shown: bool = False) -> str:
    """What a fork has that the project's own README does not say: its Makefile, its shared/,
    its CI. Kept after FORK_SECTION_MARKER, which a regenerated README keeps."""
    shared = ", ".join(
        f"`{Path(m).stem}`" for m in sel.shared_modules if not m.endswith("__init__.py")
    )
    ci = (
        "`.github/workflows/` runs the CPU tier and lint on every push and pull request"
        + (" and compiles the CUDA sources with nvcc" if sel.cuda_sources else "")
        + (
            " (the torch bindings too, against torch's headers, their launchers checked)"
            if sel.cuda_bindings
            else ""
        )
        + (
            "; `gpu-smoke.yml` runs `make gpu-smoke` (the tests of the GPU tier marked `smoke`) "
            "on a self-hosted runner labelled `gpu`, by hand, nightly, or on a pull request "
            "labelled `gpu-smoke`"
            if sel.smoke_tests
            else ""
        )
        + "."
    )
    setup = (
        "`make test` sets up `.venv` and runs the CPU tier; `make demo` runs the project at the "
        "size this machine allows; `make publish RUN=runs/<time>` makes a run the published "
        "results.\n"
        if setup_shown
        else _setup_block(sel)
    )
    return (
        f"{FORK_SECTION_MARKER}\n\n## Running this repository\n\n{setup}\n"
        f"`shared/` holds the parts of the library this project stands on ({shared or 'none'}). "
        "`make readme` regenerates the results table from `reports/`; `make help` lists the "
        f"other commands.\n\n{ci}\n"
    )


def fork_readme(sel: Selection, tree: Path, locate) -> str:
    """The fork's README: the project's front page written for a repository of its own. Its
    set-up commands open the quick start, links point inside the fork (or become plain text),
    list items that only pointed at monorepo pages are left out, and the fork's own section
    (Makefile, shared/, CI) closes it."""
    src = tree / sel.readme
    body = src.read_text() if src.is_file() else f"# {sel.project}\n"
    body = _drop_uncarried_bullets(body, sel.readme, locate)
    body = rewrite_links(body, sel.readme, "README.md", locate)
    if FORK_SECTION_MARKER in body:
        body = body[: body.index(FORK_SECTION_MARKER)]
    quick = re.search(r"(?m)^## Quick start\n\n", body)
    if quick:  # the fork's set-up first, then the project's own commands
        body = body[: quick.end()] + _setup_block(sel) + "\n" + body[quick.end() :]
    return f"{body.rstrip()}\n\n{_fork_section(sel, setup_shown=bool(quick))}"


def _readme_for(sel: Selection, tree: Path, locate) -> str:
    return fork_readme(sel, tree, locate)


def locator(sel: Selection):
    """locate(path) -> where a file or folder of the monorepo is in the fork of `sel` (None:
    not carried); the project's README moves to the root."""
    carried = set(sel.files) | {"README.md", "Makefile", "pyproject.toml"}
    dirs = {posixpath.dirname(f) for f in carried}
    dirs |= {d for f in list(dirs) for d in _parents(f)}

    def locate(path: str) -> str | None:
        path = "README.md" if path == sel.readme else path.rstrip("/")
        return path if path in carried or path in dirs or path == "." else None

    return locate


# --- pyproject and Makefile --------------------------------------------------------------------


def _sections(toml: str) -> list[tuple[str, str]]:
    """(header, body) of each [section] in order; the text before the first has header ''."""
    parts = re.split(r"(?m)^(\[[^\]\n]+\])\s*$", toml)
    out = [("", parts[0])]
    out += [(parts[i], parts[i + 1]) for i in range(1, len(parts), 2)]
    return out


def _dist(spec: str) -> str:
    return re.match(r"[A-Za-z0-9_.-]+", spec.strip()).group(0).lower()


def _imported(dist: str, imports: set[str]) -> bool:
    name = IMPORT_NAMES.get(dist, dist.replace("-", "_"))
    return any(i == name or i.startswith(name + ".") for i in imports)


def _keep(spec: str, imports: set[str], builds_cuda: bool) -> bool:
    dist = _dist(spec)
    if dist in BUILD_TOOLS:
        return builds_cuda
    return dist in TOOLS or _imported(dist, imports)


def _pyproject_for(sel: Selection, tree: Path, imports: set[str], builds_cuda: bool) -> str:
    text = (tree / "pyproject.toml").read_text()
    readme = tree / sel.readme
    description = _title(readme.read_text(), sel.project) if readme.is_file() else sel.project
    out = []
    for header, body in _sections(text):
        if header == "[project]":
            body = re.sub(r'(?m)^name = ".*"$', f'name = "{sel.project.replace("_", "-")}"', body)
            body = re.sub(
                r'(?m)^description = ".*"$', lambda _: f'description = "{description}"', body
            )

            def deps(m: re.Match) -> str:
                lines = [
                    ln
                    for ln in m.group(2).splitlines(keepends=True)
                    if not re.search(r'"([^"]+)"', ln)
                    or _keep(re.search(r'"([^"]+)"', ln).group(1), imports, builds_cuda)
                ]
                return m.group(1) + "".join(lines) + m.group(3)

            body = re.sub(r"(?ms)^(dependencies = \[\n)(.*?)(^\])", deps, body)
        elif header == "[project.optional-dependencies]":
            kept, pending = [], ""
            for chunk in re.split(r"\n(?=(?:#[^\n]*\n)*\w+ = \[)", body.strip("\n")):
                chunk, pending = pending + chunk, ""
                m = re.search(r"(?m)^(\w+) = \[(.*?)\]\s*$", chunk, re.S)
                if m is None:  # comment lines: they belong to the entry below
                    pending = chunk + "\n"
                    continue
                specs = re.findall(r'"([^"]+)"', m.group(2))
                if m.group(1) == "dev":
                    specs = [s for s in specs if _keep(s, imports, builds_cuda)]
                    chunk = "dev = [" + ", ".join(f'"{s}"' for s in specs) + "]"
                elif not any(_imported(_dist(s), imports) for s in specs):
                    continue
                kept.append(chunk)
            body = "\n" + "\n".join(kept) + "\n\n"
        elif header == "[tool.setuptools.packages.find]":
            body = f'\ninclude = ["shared*", "{sel.project}*"]\n\n'
        elif header == "[tool.setuptools.package-data]":
            lines = [ln for ln in body.splitlines() if ln.startswith(f"{sel.project} =")]
            if not lines:
                continue
            body = "\n" + "\n".join(lines) + "\n\n"
        out.append(header + body)
    return "".join(out).rstrip() + "\n"


def fork_extras(pyproject: str) -> list[str]:
    """The optional extras of a pyproject besides dev (what `make setup` tries)."""
    for header, body in _sections(pyproject):
        if header == "[project.optional-dependencies]":
            return [n for n in re.findall(r"(?m)^(\w+) = \[", body) if n != "dev"]
    return []


_COND = re.compile(r"^(ifeq|ifneq|ifdef|ifndef|else|endif)\b")
_ASSIGN = re.compile(r"^[A-Za-z0-9_]+\s*(\?|:|\+)?=")


def make_rule(text: str, target: str) -> str:
    """The rule of `target` in a Makefile with its recipe and the comments and variables just
    above it (and a paragraph of variables above those that the recipe uses)."""
    lines = text.splitlines()
    starts = [
        i
        for i, ln in enumerate(lines)
        if ln.startswith(f"{target}:") and not ln.startswith(f"{target}:=")
    ]
    if not starts:
        raise ForkError(f"the Makefile has no target {target!r}")
    i = starts[0]
    j = i + 1
    while j < len(lines) and (lines[j].startswith("\t") or _COND.match(lines[j])):
        j += 1
    k = i
    while k > 0 and (lines[k - 1].startswith("#") or _ASSIGN.match(lines[k - 1])):
        k -= 1
    if k >= 2 and lines[k - 1] == "":
        p = k - 1
        while p > 0 and lines[p - 1] != "":
            p -= 1
        para = lines[p : k - 1]
        names = [
            _ASSIGN.match(ln).group(0).split()[0].rstrip("?:+=") for ln in para if _ASSIGN.match(ln)
        ]
        body = "\n".join(lines[i:j])
        if (
            para
            and all(ln.startswith("#") or _ASSIGN.match(ln) for ln in para)
            and any(f"$({n})" in body for n in names)
        ):
            return "\n".join(lines[p : k - 1] + [""] + lines[k:j]) + "\n"
    return "\n".join(lines[k:j]) + "\n"


def _drop_conditional(block: str, opening: str) -> str:
    """`block` without the conditional that starts with the line `opening` (nested ones too)."""
    out, depth = [], 0
    for line in block.splitlines(keepends=True):
        if depth == 0 and line.startswith(opening):
            depth = 1
            continue
        if depth:
            if re.match(r"^(ifeq|ifneq|ifdef|ifndef)\b", line):
                depth += 1
            elif line.startswith("endif"):
                depth -= 1
            continue
        out.append(line)
    return "".join(out)


def _makefile_for(sel: Selection, tree: Path, extras: list[str]) -> str:
    text = (tree / "Makefile").read_text()
    head = text[: text.index(".PHONY:")]
    head = re.sub(r"\A(#.*\n)+", "", head).lstrip("\n")
    head = re.sub(
        r"(?m)^OPTIONAL_EXTRAS \?=.*$", f"OPTIONAL_EXTRAS ?= {' '.join(extras)}".rstrip(), head
    )
    apple = sel.project == "apple_track"
    if not apple:
        head = re.sub(r"(?m)^APPLE_TESTS \?=.*\n", "", head)
    ci = [
        t
        for needed, t in (
            (sel.smoke_tests, "gpu-smoke"),
            (sel.cuda_sources, "cuda-compile"),
            (sel.cuda_bindings, "cuda-compile-bindings"),
        )
        if needed
    ]
    targets = [
        *COMMON_TARGETS[:6],
        *ci,
        *COMMON_TARGETS[6:8],
        *MAKE_TARGETS[sel.project],
        *COMMON_TARGETS[8:],
    ]
    rules = []
    for t in list(targets):
        try:
            rule = make_rule(text, t)
        except ForkError:
            if t in MAKE_TARGETS[sel.project]:
                raise
            targets.remove(t)  # a common target this tree does not have yet
            continue
        if t == "test-all" and not apple:
            rule = _drop_conditional(rule, "ifneq ($(wildcard apple_track/Makefile),)")
        rules.append(rule.replace("## every capstone at the size", "## the project at the size"))
    phony = " ".join(t for t in targets if not t.startswith("$"))
    intro = (
        f"# {sel.project}: `make test` (the fast CPU tier; `make test-all` adds the slow tests) and\n"
        "# `make demo` (the project at the size this hardware allows, into runs/<time>/). Both\n"
        "# create .venv and install everything.\n"
        "# `make help` lists the targets.\n\n"
    )
    return intro + head + f".PHONY: {phony}\n\n" + "\n".join(rules)


# --- workflows ---------------------------------------------------------------------------------


def drop_job(workflow: str, job: str) -> str:
    """`workflow` (the text of a GitHub Actions file whose jobs sit two spaces in under `jobs:`)
    without the job `job`: its lines up to the next job or top-level key, and the blank line
    before it."""
    lines = workflow.splitlines(keepends=True)
    try:
        start = lines.index(f"  {job}:\n")
    except ValueError:
        raise ForkError(f"the workflow has no job {job!r}") from None
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or lines[end].startswith("   ")):
        end += 1
    while end > start + 1 and not lines[end - 1].strip():
        end -= 1  # trailing blank lines separate it from the next job: keep one of them
    if start > 0 and not lines[start - 1].strip():
        start -= 1
    return "".join(lines[:start] + lines[end:])


def _workflows_for(sel: Selection, tree: Path) -> dict[str, str]:
    """The fork's own workflows, made from the monorepo's: ci.yml with the jobs of this project
    only (the compile-only CUDA job where it has CUDA sources, the on-device track's job in its
    fork), and gpu-smoke.yml where its tests have a `smoke` mark."""
    out = {}
    if (tree / CI_WORKFLOW).is_file():
        ci = (tree / CI_WORKFLOW).read_text()
        if not sel.cuda_sources:
            ci = drop_job(ci, "cuda-compile")
        if not sel.cuda_bindings:
            ci = drop_job(ci, "cuda-compile-bindings")
        if sel.project != "apple_track":
            ci = drop_job(ci, "apple-track")
            ci = ci.replace("make test-all APPLE_TESTS=0", "make test-all")
        out[CI_WORKFLOW] = ci
    if sel.smoke_tests and (tree / GPU_SMOKE_WORKFLOW).is_file():
        out[GPU_SMOKE_WORKFLOW] = (tree / GPU_SMOKE_WORKFLOW).read_text()
    return out


# --- the fork ----------------------------------------------------------------------------------


def _git(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, check=check)


def committed_tree(root: Path, into: Path, rev: str = "HEAD") -> None:
    """Extract the tree of `rev` (default HEAD) of the git checkout at `root` into `into`."""
    if shutil.which("git") is None:
        raise ForkError("git is not installed: the fork is taken from the committed tree")
    r = subprocess.run(["git", "archive", "--format=tar", rev], cwd=root, capture_output=True)
    if r.returncode != 0:
        raise ForkError(
            f"cannot read the committed tree of {root} ({rev}): "
            f"{r.stderr.decode(errors='replace').strip()}"
        )
    with tarfile.open(fileobj=io.BytesIO(r.stdout)) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(into, filter="data")
        else:  # Python < 3.11.4: git archive writes plain files and folders only
            tar.extractall(into)  # noqa: S202


def git_identity(cwd: Path = ROOT) -> tuple[str, str] | None:
    """(user.name, user.email) as git resolves them here, or None where either is unset."""
    vals = []
    for key in ("user.name", "user.email"):
        r = subprocess.run(["git", "config", key], cwd=cwd, capture_output=True, text=True)
        if r.returncode != 0 or not r.stdout.strip():
            return None
        vals.append(r.stdout.strip())
    return vals[0], vals[1]


@dataclass
class Fork:
    dest: Path
    selection: Selection
    committed: bool | None  # None: no git repository made
    note: str = ""


def fork(
    project: str, dest: Path, *, git: bool = True, root: Path = ROOT, rev: str = "HEAD"
) -> Fork:
    if project not in PROJECTS:
        raise ForkError(f"unknown project {project!r}; expected one of {', '.join(PROJECTS)}")
    dest = Path(dest).expanduser().resolve()
    root = Path(root).resolve()
    if dest.exists() and any(dest.iterdir()):
        raise ForkError(f"destination {dest} exists and is not empty")
    if dest == root or root in dest.parents:
        raise ForkError("the destination must be outside this repository")
    with tempfile.TemporaryDirectory(prefix="fork-tree-") as tmp:
        tree = Path(tmp)
        committed_tree(root, tree, rev)
        if not (tree / project).is_dir():
            raise ForkError(f"{project} is not in the committed tree ({rev}) of {root}")
        problems = cross_project_imports(project, tree)
        if problems:
            raise ForkError(
                "the project imports another project, so it cannot stand alone:\n  "
                + "\n  ".join(problems)
            )
        sel = select(tree, project)
        locate = locator(sel)

        dest.mkdir(parents=True, exist_ok=True)
        for rel in sel.files:
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(tree / rel, target)
            if rel.endswith(".md") and rel.startswith(f"{project}/"):
                # the project's own notes; reports/ Markdown is generated, byte for byte
                target.write_text(rewrite_links(target.read_text(), rel, rel, locate))
        py_files = [dest / f for f in sel.files if f.endswith(".py")]
        imports = third_party_imports(py_files, {"shared", "tests", "scripts", project})
        builds_cuda = any(i.startswith("torch.utils.cpp_extension") for i in imports)
        pyproject = _pyproject_for(sel, tree, imports, builds_cuda)
        (dest / "pyproject.toml").write_text(pyproject)
        (dest / "Makefile").write_text(_makefile_for(sel, tree, fork_extras(pyproject)))
        (dest / "README.md").write_text(_readme_for(sel, tree, locate))
        for rel, text in _workflows_for(sel, tree).items():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_text(text)

    result = Fork(dest, sel, None)
    if git and shutil.which("git"):
        _git("init", "-q", cwd=dest)
        _git("add", "-A", cwd=dest)
        ident = git_identity()
        if ident is None:
            result.committed = False
            result.note = (
                "not committed: git has no user.name / user.email here. Set yours, then commit:\n"
                '  git config --global user.name "Your Name"\n'
                '  git config --global user.email "you@example.com"\n'
                f'  cd {dest} && git commit -m "{project}: standalone fork"'
            )
        else:
            name, email = ident
            _git(
                "-c",
                f"user.name={name}",
                "-c",
                f"user.email={email}",
                "commit",
                "-qm",
                f"{project}: standalone fork",
                cwd=dest,
            )
            result.committed = True
            result.note = f"committed as {name} <{email}>"
    return result


def _parents(path: str) -> list[str]:
    out = []
    while path:
        path = posixpath.dirname(path)
        if path:
            out.append(path)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("project", help=f"one of: {', '.join(PROJECTS)}")
    p.add_argument("dest", type=Path, help="a new (or empty) directory outside this repository")
    p.add_argument("--no-git", action="store_true", help="do not make the fork a git repository")
    args = p.parse_args(argv)
    try:
        result = fork(args.project, args.dest, git=not args.no_git)
    except ForkError as e:
        print(f"fork: {e}", file=sys.stderr)
        return 2
    sel = result.selection
    shared = [Path(m).stem for m in sel.shared_modules if not m.endswith("__init__.py")]
    print(
        f"wrote {result.dest} from the committed tree: {sel.project}, its tests, shared "
        f"({', '.join(shared) or 'none'}), {len(sel.shared_tests)} shared test file(s)"
    )
    workflows = sorted(p.name for p in (result.dest / ".github" / "workflows").glob("*.yml"))
    if workflows:
        print(f"its CI: .github/workflows/ ({', '.join(workflows)}); push it to GitHub to run them")
    if result.note:
        print(result.note, file=sys.stderr if result.committed is False else sys.stdout)
    print(f"next: cd {result.dest} && make test")
    return 0


if __name__ == "__main__":
    sys.exit(main())
