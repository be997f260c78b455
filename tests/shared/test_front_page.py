"""shared.front_page: a results table row from a record, its verdict and its marks."""

from __future__ import annotations

import json

import pytest

from shared import front_page
from shared.front_page import Claim
from shared.hardware import get_gpu


def _claim(**kw) -> Claim:
    base = dict(what="x", record="r.json", measure=lambda rec: rec["results"]["v"], unit="ms")
    return Claim(**(base | kw))


@pytest.mark.parametrize(
    ("kw", "value", "expected"),
    [
        (dict(target=90.0, unit="% of cuBLAS"), 81.8, "**missed** by 8.2 pts"),  # points
        (dict(target=90.0, unit="% of cuBLAS"), 91.1, "met by 1.1 pts"),
        (dict(target=0.80, higher_is_better=False), 0.947, "**missed** by 18%"),  # relative
        (dict(target=2.0, unit="x"), 2.38, "met by 19%"),
        (dict(target=0.0, higher_is_better=False, unit="tensors"), 0.0, "met"),
        (dict(target=None), 1.0, "reported"),
        (dict(target=1.0), None, "not measured"),
    ],
)
def test_verdict_says_met_or_missed_and_by_how_much(kw, value, expected):
    assert front_page.verdict(_claim(**kw), value) == expected


def _record(tmp_path, v, **env):
    rec = {"results": {"v": v}, "environment": {"date": "2026-12-01T00:00:00+00:00", **env}}
    (tmp_path / "r.json").write_text(json.dumps(rec))


def test_a_row_names_date_gpu_and_record_and_marks_a_dirty_tree(tmp_path):
    _record(tmp_path, 0.5, gpu="NVIDIA H200", git_commit="abc", git_dirty=True)
    (row,) = front_page.rows([_claim(target=1.0, higher_is_better=False)], tmp_path, "../r/")
    assert row["measured"] == "0.5 (dirty tree)" and row["verdict"] == "met by 50%"
    assert row["date"] == "2026-12-01" and row["GPU"] == "H200"
    assert row["record"] == "[r.json](../r/r.json)"
    _record(tmp_path, 0.5, gpu=None, cpu_count=2, git_dirty=False)
    (row,) = front_page.rows([_claim()], tmp_path, "")
    assert row["measured"] == "0.5" and row["GPU"] == "CPU (2 cores)"


def test_a_missing_record_is_not_measured_never_a_figure(tmp_path):
    (row,) = front_page.rows([_claim(record="absent.json", target=1.0)], tmp_path, "")
    assert row["measured"] == "n/a" and row["verdict"] == "not measured"


def test_the_copy_bandwidth_comes_from_the_table_with_its_source():
    h200 = get_gpu("h200-sxm")
    assert h200.copy_bandwidth() == h200.copy_bandwidth_gbs.value * 1e9
    assert h200.copy_bandwidth_gbs.source and h200.copy_bandwidth_gbs.date
    with pytest.raises(ValueError, match="no measured copy bandwidth"):
        get_gpu("a100-80gb-sxm").copy_bandwidth()


def test_a_range_across_the_target_is_said_beside_the_verdict(tmp_path):
    claim = _claim(target=2.0, unit="x", spread=lambda rec: front_page.spread_of(rec, "v"))
    assert front_page.verdict(claim, 2.38, (1.85, 2.88)) == "met by 19% (range spans it)"
    assert front_page.verdict(claim, 2.38, (2.1, 2.88)) == "met by 19%"
    rec = {"results": {"v": 2.38}, "environment": {}, "v_min": 1.85, "v_max": 2.88}
    (tmp_path / "r.json").write_text(json.dumps(rec))
    claim = _claim(target=2.0, unit="x", fmt=".2f", spread=lambda r: front_page.spread_of(r, "v"))
    (row,) = front_page.rows([claim], tmp_path, "")
    assert row["measured"] == "2.38 (1.85–2.88)"
