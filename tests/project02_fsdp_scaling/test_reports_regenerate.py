"""CPU tier: every published report of project02 (each record's Markdown and charts,
summary.md, the README's generated sections) is rendered from the JSON records alone by
`report`, byte for byte what is committed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from project02_fsdp_scaling import PROJECT, report
from shared.results import REPORTS_DIR

COMMITTED = Path(REPORTS_DIR) / PROJECT


@pytest.mark.skipif(not (COMMITTED / "scaling_gpu.json").is_file(), reason="no committed records")
def test_committed_reports_regenerate_byte_for_byte(tmp_path):
    copy = tmp_path / "reports" / PROJECT
    # the records (and the profiler traces they link to): everything else comes back from them
    shutil.copytree(COMMITTED, copy, ignore=shutil.ignore_patterns("*.png", "*.md"))
    # the README where it lies against reports/ (its project's folder; a fork's root), so that
    # its links come out the same
    readme = tmp_path / report.README.parent.relative_to(Path(REPORTS_DIR).parent) / "README.md"
    readme.parent.mkdir(exist_ok=True)
    shutil.copy2(report.README, readme)
    report.run(report.ReportConfig(reports_dir=str(tmp_path / "reports"), readme_file=str(readme)))
    made = sorted(p.name for p in copy.iterdir() if p.suffix in (".png", ".md"))
    assert made == sorted(p.name for p in COMMITTED.iterdir() if p.suffix in (".png", ".md"))
    for name in made:
        assert (copy / name).read_bytes() == (COMMITTED / name).read_bytes(), name
    assert readme.read_text() == report.README.read_text()
