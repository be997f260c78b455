"""CPU tier: every published report of project03 (each experiment's Markdown and charts, and
summary.md) is rendered from its JSON alone by `report`, byte for byte what is committed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from project03_capstone_infra import PROJECT
from project03_capstone_infra.report import render
from shared.results import REPORTS_DIR

COMMITTED = Path(REPORTS_DIR) / PROJECT


@pytest.mark.skipif(not (COMMITTED / "cost.json").is_file(), reason="no committed records")
def test_committed_reports_regenerate_byte_for_byte(tmp_path):
    copy = tmp_path / PROJECT
    # only the records: every Markdown file and chart must come back from them
    shutil.copytree(COMMITTED, copy, ignore=shutil.ignore_patterns("*.png", "*.md"))
    render.render_all(tmp_path)
    made = sorted(p.name for p in copy.iterdir() if p.suffix in (".png", ".md"))
    assert made == sorted(p.name for p in COMMITTED.iterdir() if p.suffix in (".png", ".md"))
    for name in made:
        assert (copy / name).read_bytes() == (COMMITTED / name).read_bytes(), name
