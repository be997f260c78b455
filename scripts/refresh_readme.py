"""Refresh the result tables of README.md from reports/ (`make readme`).

Every `<!-- results:NAME -->` ... `<!-- /results:NAME -->` block in the README is replaced by the
Markdown summary that project's last run wrote, `reports/NAME/summary.md`, or by a line saying
how to produce it. Run it after `make demo` (or a single project's target) and commit both.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shared.results import atomic_write_text, replace_between_markers  # noqa: E402

_MARKER = re.compile(r"<!-- results:([A-Za-z0-9_]+) -->")


def refresh(readme: Path, reports: Path) -> list[str]:
    """Rewrite `readme` in place; return the names of the blocks that were filled."""
    text = readme.read_text()
    filled = []
    for name in dict.fromkeys(_MARKER.findall(text)):
        summary = reports / name / "summary.md"
        if summary.exists():
            content = summary.read_text().strip()
            filled.append(name)
        else:
            content = (
                f"_No results recorded yet: `{summary.relative_to(reports.parent)}` is "
                "written by this project's run (see its README)._"
            )
        text = replace_between_markers(text, f"results:{name}", content)
    atomic_write_text(readme, text)
    return filled


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--readme", type=Path, default=ROOT / "README.md")
    p.add_argument("--reports", type=Path, default=ROOT / "reports")
    args = p.parse_args(argv)
    if not args.readme.exists():
        print(f"refresh_readme: no README at {args.readme}", file=sys.stderr)
        return 2
    filled = refresh(args.readme, args.reports)
    print(f"refreshed {args.readme.name}: {', '.join(filled) or 'no summaries found'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
