"""CPU tier: a bench-attention record with the Hopper backward (`ours_hbwd`, attention_hbwd.json)
renders its own table (ratios to ours, cuDNN and FLASH with their ranges, backward and
forward + backward only) and its gradient differences against the FA2 backward, and has a
README block of its own."""

from __future__ import annotations

from project01_cuda_kernel import report
from project01_cuda_kernel.report.attention import render_record


def _ratio(d, s, causal, mode, ours, reps):
    return {
        "head_dim": d,
        "seq_len": s,
        "causal": causal,
        "mode": mode,
        "ours": ours,
        "ratio": sorted(reps)[len(reps) // 2],
        "ratio_min": min(reps),
        "ratio_max": max(reps),
        "ratio_reps": reps,
    }


def hbwd_record() -> dict:
    shapes = [(128, 4096, False), (64, 8192, True)]
    modes = ("fwd", "bwd", "fwd_bwd")
    rows = [
        {
            "head_dim": d,
            "seq_len": s,
            "batch": 16384 // s,
            "heads": 2048 // d,
            "causal": c,
            "provider": p,
            "mode": m,
            "tflops": 100.0,
        }
        for d, s, c in shapes
        for p in ("ours", "ours_hbwd", "cudnn")
        for m in modes
    ]
    res = {
        "rows": rows,
        "checks": [
            {"head_dim": 128, "max_abs_diff_vs_flash": 0.004},
            {
                "head_dim": 128,
                "hbwd_dq_max_abs_diff_vs_ours": 0.001,
                "dq_max_abs": 0.5,
                "hbwd_dk_max_abs_diff_vs_ours": 0.0,
                "dk_max_abs": 0.25,
                "hbwd_dv_max_abs_diff_vs_ours": 0.002,
                "dv_max_abs": 0.25,
            },
        ],
        "memory": [],
        "skipped": [],
        "repeats": 3,
        "ours_forward_kernel": "hopper",
        "ratios_hbwd_vs_ours": [
            _ratio(d, s, c, m, 300.0, [1.2, 1.3, 1.25]) for d, s, c in shapes for m in modes
        ],
        "ratios_hbwd_vs_cudnn": [
            _ratio(d, s, c, m, 300.0, [0.7, 0.74, 0.72]) for d, s, c in shapes for m in modes
        ],
        # FLASH not measured at one shape: its cell says so
        "ratios_hbwd_vs_flash": [
            _ratio(128, 4096, False, m, 300.0, [1.1, 1.2, 1.15]) for m in modes
        ],
    }
    return {
        "name": "attention_hbwd",
        "environment": {"gpu": "Test GPU", "torch": "2.x", "date": "2026-01-02T00:00:00"},
        "config": {"dtype": "bfloat16", "total_tokens": 16384, "hidden": 2048},
        "results": res,
    }


def test_hbwd_table_has_backward_modes_with_ranges_and_gradient_line():
    md = render_record(hbwd_record())
    table = [ln for ln in md.splitlines() if ln.startswith("| 128 | 4096 |")]
    # backward and fwd+bwd of the one non-causal shape; the forward (the same kernel as ours) is
    # left out of this table
    assert [ln.split(" | ")[3] for ln in table] == ["bwd", "fwd_bwd"]
    assert (
        table[0]
        == "| 128 | 4096 | no | bwd | 300 | 1.25 (1.20-1.30) | 0.72 (0.70-0.74) | 1.15 (1.10-1.20) |"
    )
    causal = [ln for ln in md.splitlines() if ln.startswith("| 64 | 8192 | yes |")]
    assert len(causal) == 2 and all(ln.endswith("| n/a |") for ln in causal)
    # the largest difference over the largest magnitude: dq 0.001/0.5, dk 0, dv 0.002/0.25
    assert "dq 2.0e-03, dk 0.0e+00, dv 8.0e-03 (1 shapes)" in md
    # the FLASH output check still reads only the checks that carry it
    assert "over all 1 shapes is 4.00e-03" in md


def test_record_without_hbwd_renders_no_hbwd_table():
    rec = hbwd_record()
    for k in ("ratios_hbwd_vs_ours", "ratios_hbwd_vs_cudnn", "ratios_hbwd_vs_flash"):
        del rec["results"][k]
    assert "Hopper backward" not in render_record(rec)


def test_hbwd_record_has_its_readme_block(tmp_path):
    name, args = report.ATTENTION_RECORDS["attention:hbwd"]
    assert name == "attention_hbwd" and "ours_hbwd" in args
    sections = report.render_all(tmp_path)  # no record there: the block says how to make it
    assert "No `attention_hbwd.json` yet" in sections["attention:hbwd"]


def test_headline_names_the_hopper_backward_per_head_dim():
    from project01_cuda_kernel.report.attention import headline

    line = headline(hbwd_record())
    # per head dim, the ranges of the per-shape medians: backward over ours', fwd+bwd over cuDNN
    assert line.endswith(
        " The Hopper backward (`ours_hbwd`): head dim 128: backward 1.25–1.25x the FA2 "
        "one, fwd+bwd 0.72–0.72x cuDNN's; head dim 64: backward 1.25–1.25x the FA2 one, "
        "fwd+bwd 0.72–0.72x cuDNN's."
    )
    rec = hbwd_record()
    del rec["results"]["ratios_hbwd_vs_cudnn"]
    assert "Hopper backward" not in headline(rec)


def test_hbwd_target_verdict_reads_head_dim_128_from_seq_4k():
    from project01_cuda_kernel.report.attention import _hbwd_target_lines

    def rows(ratios: dict) -> dict:
        return {k: {"ratio": v} for k, v in ratios.items()}

    base = {
        (128, 4096, False, "fwd_bwd"): 0.86,
        (128, 8192, True, "fwd_bwd"): 0.90,
        (128, 2048, False, "fwd_bwd"): 0.50,  # shorter than the target's shapes: not counted
        (64, 4096, False, "fwd_bwd"): 0.70,  # another head dim: not counted
        (128, 4096, False, "bwd"): 0.80,  # the backward alone: not the target's figure
    }
    text = " ".join(_hbwd_target_lines(rows(base)))
    assert "**met**" in text and "the 2 shapes measured range 0.86-0.90x" in text
    partial = {**base, (128, 16384, True, "fwd_bwd"): 0.84}
    assert "**met at 2 of 3 shapes**" in " ".join(_hbwd_target_lines(rows(partial)))
    missed = {k: 0.7 for k in base}
    assert "**not met**" in " ".join(_hbwd_target_lines(rows(missed)))
    assert _hbwd_target_lines(rows({(64, 4096, False, "fwd_bwd"): 0.9})) == []


def test_hbwd_record_with_the_fa2_backward_named_renders_the_same():
    """Records made once ours_fa2bwd exists key the FA2 comparison `..._vs_fa2` (not
    `..._vs_ours`: "ours" may run the Hopper backward itself); the table, the gradient line and
    the headline read either."""
    from project01_cuda_kernel.report.attention import headline

    old = hbwd_record()
    new = hbwd_record()
    res = new["results"]
    res["ratios_hbwd_vs_fa2"] = res.pop("ratios_hbwd_vs_ours")
    for check in res["checks"]:
        for key in [k for k in check if k.endswith("_vs_ours")]:
            check[key.removesuffix("_ours") + "_fa2"] = check.pop(key)
    assert render_record(new) == render_record(old)
    assert headline(new) == headline(old)
    assert "1.25 (1.20-1.30)" in render_record(new)
