"""CPU tier: every published report of project01 (summary.md, every chart, the README's blocks)
is rendered from its JSON alone, byte for byte what is committed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from project01_cuda_kernel import report
from shared.results import REPORTS_DIR

COMMITTED = Path(REPORTS_DIR) / report.PROJECT


@pytest.mark.skipif(not (COMMITTED / "gemm.json").is_file(), reason="no committed records")
def test_committed_reports_regenerate_byte_for_byte(tmp_path):
    copy = tmp_path / "reports" / report.PROJECT
    shutil.copytree(COMMITTED, copy, ignore=shutil.ignore_patterns("*.png", "summary.md"))
    # the README where it lies against reports/ (its project's folder; a fork's root)
    readme = tmp_path / report.README.parent.relative_to(Path(REPORTS_DIR).parent) / "README.md"
    readme.parent.mkdir(exist_ok=True)
    shutil.copy2(report.README, readme)
    rendered = report.ReportConfig(reports_dir=str(tmp_path / "reports"), readme_file=str(readme))
    assert report.main(rendered) == 0
    made = sorted(p.name for p in copy.iterdir() if p.suffix in (".png", ".md"))
    assert made == sorted(p.name for p in COMMITTED.iterdir() if p.suffix in (".png", ".md"))
    for name in made:
        assert (copy / name).read_bytes() == (COMMITTED / name).read_bytes(), name
    assert readme.read_text() == report.README.read_text()
