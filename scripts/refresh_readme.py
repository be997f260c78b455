"""Refresh the results tables of the READMEs from reports/ (`make readme`).

Every `<!-- results:NAME -->` ... `<!-- /results:NAME -->` block is replaced by the table of
project NAME's headline claims (`NAME/headlines.py`, rendered by `shared.front_page` from the
records in `reports/NAME/`); `<!-- results:NAME:root -->` takes only the claims marked for the
repository README, and `<!-- results:all:root -->` those of every project in one table. A
project without a headlines module gets its `reports/NAME/summary.md`, or a line saying how to
produce it. With no arguments, the repository README and every project's own README are
refreshed (in a fork, its one README). Run it after `make publish` and commit both.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shared.results import atomic_write_text, replace_between_markers  # noqa: E402

_MARKER = re.compile(r"<!-- (results:([A-Za-z0-9_]+)(:root)?) -->")
ALL = "all"  # `<!-- results:all:root -->`: one table of every project's repository-README claims


def claims_of(project: str, root: Path = ROOT) -> list | None:
    """The project's headline claims, or None where it has no `headlines` module."""
    if not (root / project / "headlines.py").is_file():
        return None
    if str(root) not in sys.path:  # last: a package already importable keeps its place
        sys.path.append(str(root))
    return list(importlib.import_module(f"{project}.headlines").CLAIMS)


def projects_with_claims(root: Path) -> list[str]:
    """The projects with a headlines module: the numbered ones first, in order."""
    names = [p.parent.name for p in root.glob("*/headlines.py")]
    return sorted(names, key=lambda n: (not n.startswith("project"), n))


def render_block(project: str, readme: Path, reports: Path, *, root_only: bool = False) -> str:
    """The Markdown of one results block of `readme`, from the records in `reports/project/`
    (project "all": every project's claims for the repository README in one table)."""
    from shared import front_page

    root = reports.resolve().parent
    if project == ALL:
        groups = []
        for name in projects_with_claims(root):
            claims = [c for c in claims_of(name, root) if c.root or not root_only]
            folder = reports / name
            groups.append((name, claims, folder, front_page.link_prefix(readme, folder)))
        return front_page.render_projects(groups)
    claims = claims_of(project, root)
    folder = reports / project
    if claims is None:
        summary = folder / "summary.md"
        if summary.exists():
            return summary.read_text().strip()
        return (
            f"_No results recorded yet: `{summary.relative_to(reports.parent)}` is "
            "written by this project's run (see its README)._"
        )
    if root_only:  # the repository README: a few claims a project, its note said once above
        claims = [c for c in claims if c.root]
    prefix = front_page.link_prefix(readme, folder)
    return front_page.render(claims, folder, prefix, note=not root_only)


def refreshed(readme: Path, reports: Path, text: str | None = None) -> tuple[str, list[str]]:
    """The text of `readme` (or `text`, as if it lay at `readme`) with every results block
    regenerated, and the names of the blocks filled from records. Writes nothing."""
    text = readme.read_text() if text is None else text
    filled = []
    for marker, name, root_only in dict.fromkeys(_MARKER.findall(text)):
        content = render_block(name, readme, reports, root_only=bool(root_only))
        if not content.startswith("_No results recorded yet"):
            filled.append(name)
        text = replace_between_markers(text, marker, content)
    return text, filled


def refresh(readme: Path, reports: Path) -> list[str]:
    """Rewrite `readme` in place; return the names of the blocks filled from records."""
    text, filled = refreshed(readme, reports)
    atomic_write_text(readme, text)
    return filled


def readmes(root: Path = ROOT) -> list[Path]:
    """The README of the repository and every project README beside a headlines module."""
    out = [root / "README.md"] if (root / "README.md").is_file() else []
    for hl in sorted(root.glob("*/headlines.py")):
        if (hl.parent / "README.md").is_file():
            out.append(hl.parent / "README.md")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--readme", type=Path, action="append", help="default: every README")
    p.add_argument("--reports", type=Path, default=ROOT / "reports")
    args = p.parse_args(argv)
    for readme in args.readme or readmes():
        if not readme.exists():
            print(f"refresh_readme: no README at {readme}", file=sys.stderr)
            return 2
        filled = refresh(readme, args.reports)
        rel = readme.resolve().relative_to(ROOT) if ROOT in readme.resolve().parents else readme
        print(f"refreshed {rel}: {', '.join(filled) or 'no results blocks'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
