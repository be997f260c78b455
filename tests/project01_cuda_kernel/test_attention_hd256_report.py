"""CPU tier: a bench-attention record other than attention.json (attention_hd256.json: head dim
256, providers ours, FLASH and cuDNN, repeated) renders as its own README block and summary line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from project01_cuda_kernel import report
from project01_cuda_kernel.report.attention import headline, render_markdown, render_record
from shared.repeat import Spread, flat
from shared.results import REPORTS_DIR

NAME = "attention_hd256"
# per provider: TFLOP/s of the three repetitions, forward; backward and fwd+bwd are scaled
REPS = {
    "ours": [250.0, 240.0, 260.0],
    "flash": [300.0, 310.0, 290.0],
    "cudnn": [600.0, 620.0, 580.0],
}
SCALE = {"fwd": 1.0, "bwd": 0.8, "fwd_bwd": 0.85}


def hd256_record(forward_kernel: str = "hopper") -> dict:
    rows = []
    for s in (1024, 16384):
        for causal in (False, True):
            for provider, reps in REPS.items():
                for mode, scale in SCALE.items():
                    row = {
                        "head_dim": 256,
                        "seq_len": s,
                        "batch": 16384 // s,
                        "heads": 8,
                        "causal": causal,
                        "provider": provider,
                        "mode": mode,
                    }
                    row.update(flat("tflops", Spread.of(v * scale for v in reps)))
                    rows.append(row)
    return {
        "name": NAME,
        "environment": {"gpu": "Test GPU", "torch": "2.x", "date": "2026-01-02T00:00:00"},
        "config": {"dtype": "bfloat16", "total_tokens": 16384, "hidden": 2048, "name": NAME},
        "results": {
            "rows": rows,
            "checks": [{"max_abs_diff_vs_flash": 0.004}],
            "memory": [],
            "skipped": [],
            "repeats": 3,
            "ours_forward_kernel": forward_kernel,
        },
    }


def test_record_renders_its_providers_and_both_ratios():
    md = render_record(hd256_record())
    assert md.startswith("### Head dim 256 vs SDPA (`attention_hd256.json`)")
    assert "Test GPU" in md and "2026-01-02" in md and "hidden 2048 (8 heads of 256)" in md
    assert "timed 3 times" in md
    for title in ("forward", "backward", "fwd+bwd"):
        assert f"Head dim 256, {title}, TFLOP/s:" in md
    # only the backends the record measured, and ours / cuDNN beside ours / FLASH
    header = "| causal | seq | batch x heads | ours | FLASH | cuDNN | ours / FLASH | ours / cuDNN |"
    assert md.count(header) == 3
    assert "EFFICIENT" not in md and "MATH" not in md
    # per repetition 250/300, 240/310, 260/290: 0.833, 0.774, 0.897 -> 0.83 (0.77–0.90);
    # vs cuDNN 250/600, 240/620, 260/580: 0.417, 0.387, 0.448 -> 0.42 (0.39–0.45)
    assert (
        "| no | 1,024 | 16 x 8 | 250 (240–260) | 300 (290–310) | 600 (580–620) "
        "| 0.83 (0.77–0.90) | 0.42 (0.39–0.45) |" in md
    )
    assert "ours / FLASH 0.83–0.83x" in md and "ours / cuDNN 0.42–0.42x" in md
    assert "4.00e-03" in md


def test_hopper_gpu_record_says_the_forward_is_fa2_at_head_dim_256():
    md = render_record(hd256_record("hopper"))
    assert "the Hopper forward has no head-dim-256 instance" in md
    assert "'ours' runs the Hopper forward" not in md
    assert "no head-dim-256 instance" not in render_record(hd256_record("fa2"))


def test_headline_names_the_record_and_the_ranges():
    line = headline(hd256_record())
    assert line.startswith("**FlashAttention at head dim 256 vs SDPA** (bfloat16; Test GPU")
    assert "ours / FLASH 0.83–0.83x (forward 0.83–0.83" in line
    assert "ours / cuDNN 0.42–0.42x" in line


def test_report_fills_the_block_and_the_summary(tmp_path):
    folder = tmp_path / report.PROJECT
    folder.mkdir()
    sections = report.render_all(tmp_path)
    assert "No `attention_hd256.json` yet" in sections["attention:hd256"]
    assert "--head-dims 256" in sections["attention:hd256"]
    (folder / f"{NAME}.json").write_text(json.dumps(hd256_record()))
    sections = report.render_all(tmp_path)
    assert sections["attention:hd256"] == render_record(hd256_record())
    assert "**FlashAttention at head dim 256 vs SDPA**" in report.render_summary(tmp_path)
    # attention.json's section does not pick the other record up
    assert "No attention measurements yet" in render_markdown(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text(
        "a\n<!-- attention -->\nold\n<!-- /attention -->\n"
        "<!-- attention:hd256 -->\nold\n<!-- /attention:hd256 -->\nb\n"
    )
    text = report.update_readme(readme, sections)
    assert "old" not in text and text.count("### Head dim 256 vs SDPA") == 1
    assert text.index("No attention measurements yet") < text.index("### Head dim 256 vs SDPA")


COMMITTED = Path(REPORTS_DIR) / report.PROJECT / f"{NAME}.json"


@pytest.mark.skipif(not COMMITTED.is_file(), reason="no committed attention_hd256.json")
def test_committed_record_gives_the_readme_ranges():
    """The ranges the README's head-dim-256 paragraph quotes, from the H200 record."""
    record = json.loads(COMMITTED.read_text())
    md = render_record(record)
    assert (
        "ours / FLASH 0.77–0.96x (forward 0.80–0.95, backward 0.77–0.96, fwd+bwd 0.79–0.92)" in md
    )
    assert (
        "ours / cuDNN 0.39–0.60x (forward 0.39–0.43, backward 0.51–0.60, fwd+bwd 0.49–0.55)" in md
    )
    assert "hidden 2048 (8 heads of 256)" in md and "2026-12-02" in md
    assert "| yes | 16,384 | 1 x 8 | 278 (277–278) | 294 (286–294) | 643 (607–645) |" in md
