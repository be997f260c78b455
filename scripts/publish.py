"""Publish a run as the reference results (`make publish RUN=runs/<time>`).

    python -m scripts.publish runs/20260101T120000Z

`make demo` (and every project's entry point pointed at a run folder) writes under
`<run>/<project>/`; nothing there touches `reports/` or a README. Publishing is the one step that
does, on purpose: it copies each project's records, charts and Markdown from the run into
`reports/<project>/` (files of `reports/` the run did not produce stay, so a CPU run does not
remove the GPU records), then regenerates what is rendered from `reports/`: each project's
`summary.md` and README results, and the repository README's results blocks
(`scripts/refresh_readme.py`). It refuses a folder that does not exist or holds no result
records, and says what it copied. Review with `git diff`, then commit.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import tyro

ROOT = Path(__file__).resolve().parent.parent

# What a run holds that reports/ publishes: result records, charts, Markdown, profiler traces.
PUBLISHED_SUFFIXES = (".json", ".png", ".md", ".json.gz", ".svg", ".csv")
NOT_PROJECTS = {"shared", "scripts", "tests"}
# In a fork, text after this line of the README is the fork's own (kept when a project's
# report regenerates the whole README).
FORK_SECTION_MARKER = "<!-- fork: this repository -->"


class PublishError(ValueError):
    pass


@dataclass
class PublishConfig:
    """Copy a run's results into reports/ and refresh every README results block from them."""

    run: Annotated[tyro.conf.Positional[str], tyro.conf.arg(metavar="RUN")]
    """the run folder, e.g. runs/20260101T120000Z (what `make demo` printed at the end)"""


def is_record(path: Path) -> bool:
    """A result record: a JSON object that carries the environment it was measured in."""
    try:
        obj = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(obj, dict) and isinstance(obj.get("environment"), dict)


def _published(path: Path) -> bool:
    return (
        path.is_file()
        and not path.name.startswith(".")  # temporary files of atomic writes
        and path.name.endswith(PUBLISHED_SUFFIXES)
    )


def run_contents(run: Path, root: Path = ROOT) -> dict[str, list[Path]]:
    """project -> the files of `<run>/<project>/` that publishing copies, for every project of
    this checkout the run holds records of."""
    out = {}
    for sub in sorted(p for p in run.iterdir() if p.is_dir()):
        if sub.name in NOT_PROJECTS or not (root / sub.name / "__init__.py").is_file():
            continue
        files = sorted(p for p in sub.rglob("*") if _published(p))
        if any(p.suffix == ".json" and is_record(p) for p in files):
            out[sub.name] = files
    return out


# --- what is rendered from reports/ ---------------------------------------------------------


def project_readme(root: Path, project: str) -> Path | None:
    """The project's README: <project>/README.md, or in a fork of that one project the
    repository's README (moved to the root there). None when there is neither."""
    own = root / project / "README.md"
    if own.is_file():
        return own
    projects = [p for p in root.iterdir() if (p / "__init__.py").is_file()]
    if [p.name for p in projects if p.name not in NOT_PROJECTS] == [project]:
        return root / "README.md" if (root / "README.md").is_file() else None
    return None


def _write(path: Path, text: str) -> None:
    from shared.results import atomic_write_text

    atomic_write_text(path, text)


def _report(module: str):
    """A project's report module, imported by name: each is imported only when a run holds
    that project (a fork holds one project, and its scripts import no other)."""
    return importlib.import_module(module)


def _project01(reports: Path, readme: Path | None) -> list[Path]:
    report = _report("project01_cuda_kernel.report")
    summary = reports / report.PROJECT / "summary.md"
    _write(summary, report.render_summary(reports))
    details = reports / report.PROJECT / "details.md"
    _write(details, report.render_details(reports))
    if readme is None:
        return [summary, details]
    sections = report.render_all(reports, report.image_prefix_for(readme, reports))
    _write(readme, report.update_readme(readme, sections))
    return [summary, details, readme]


def _project02(reports: Path, readme: Path | None) -> list[Path]:
    report = _report("project02_fsdp_scaling.report")
    folder = reports / report.PROJECT
    summary = folder / "summary.md"
    _write(summary, report.summary_markdown(folder))
    if readme is None:
        return [summary]
    report.refresh_readme(folder, readme)
    return [summary, readme]


def _project03(reports: Path, readme: Path | None) -> list[Path]:
    return [
        _report("project03_capstone_infra.report.summary").write_summary(reports)
    ]  # its README has no generated blocks


def _apple_track(reports: Path, readme: Path | None) -> list[Path]:
    report = _report("apple_track.report")
    folder = reports / "apple_track"
    main, others = report._records(folder)
    written = []
    if main is not None:
        _write(folder / "summary.md", report.root_summary_markdown(main))
        written.append(folder / "summary.md")
    if readme is not None:
        rel = os.path.relpath(folder.resolve(), readme.resolve().parent).replace(os.sep, "/")
        text = report.render_readme(main, rel + "/", others, folder)
        old = readme.read_text()
        if FORK_SECTION_MARKER in old:  # the README is regenerated whole: keep the fork's part
            text = text.rstrip() + "\n\n" + old[old.index(FORK_SECTION_MARKER) :]
        _write(readme, text)
        written.append(readme)
    _write(folder / "details.md", report.render_details(main, others))
    written.append(folder / "details.md")
    return written


# project -> refresh(reports root, its README or None) -> files written. project04 renders its
# tables in the run itself (`report`), which publishing copies; every README's results table is
# refreshed afterwards from the headline claims (scripts/refresh_readme.py).
REFRESHERS: dict[str, Callable[[Path, Path | None], list[Path]]] = {
    "project01_cuda_kernel": _project01,
    "project02_fsdp_scaling": _project02,
    "project03_capstone_infra": _project03,
    "apple_track": _apple_track,
}


# --- publish ---------------------------------------------------------------------------------


def publish(run: str | os.PathLike, root: Path = ROOT, log: Callable[[str], None] = print) -> int:
    """Copy `run` into `root`/reports and refresh the READMEs; returns the number of files
    copied. Raises PublishError (one line) for a run that cannot be published."""
    if not str(run).strip():
        raise PublishError("RUN: expected a run folder such as runs/20260101T120000Z, got ''")
    root = Path(root).resolve()
    run_dir = Path(run)
    if not run_dir.is_absolute() and not run_dir.exists():
        run_dir = root / run_dir
    run_dir = run_dir.resolve()
    reports = root / "reports"
    if not run_dir.is_dir():
        raise PublishError(f"RUN: {run} is not a folder (make demo prints the one it wrote)")
    if run_dir == reports or reports in run_dir.parents:
        raise PublishError(f"RUN: {run} is inside reports/ already; give a run folder")
    contents = run_contents(run_dir, root)
    if not contents:
        raise PublishError(
            f"RUN: {run} holds no result records (<run>/<project>/*.json with their "
            "environment): nothing to publish"
        )

    from shared.results import atomic_write_bytes

    copied = 0
    for project, files in contents.items():
        dest = reports / project
        for src in files:
            atomic_write_bytes(dest / src.relative_to(run_dir / project), src.read_bytes())
        copied += len(files)
        names = ", ".join(str(f.relative_to(run_dir / project)) for f in files)
        log(f"copied {len(files)} file(s) into {dest.relative_to(root)}/: {names}")

    for project in contents:
        refresh = REFRESHERS.get(project)
        if refresh is None:
            continue
        readme = project_readme(root, project)
        written = refresh(reports, readme)
        log(f"refreshed from reports/: {', '.join(str(p.relative_to(root)) for p in written)}")

    from scripts.refresh_readme import refresh as refresh_tables

    # every README's results table (the project's own and the repository's), from the records
    own = [project_readme(root, project) for project in contents]
    for readme in dict.fromkeys([*own, root / "README.md"]):
        if readme is not None and readme.is_file():
            filled = refresh_tables(readme, reports)
            rel = readme.relative_to(root)
            log(f"refreshed {rel} results tables: {', '.join(filled) or 'none'}")
    log(f"published {run}: review with `git diff -- reports '*.md'`, then commit")
    return copied


def main(argv: list[str] | None = None) -> int:
    cfg = tyro.cli(
        PublishConfig,
        args=argv,
        prog="python -m scripts.publish",
        description=__doc__.split("\n\n")[0],
    )
    try:
        publish(cfg.run)
    except PublishError as e:
        print(f"publish: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
