"""The engine-variants benchmark's command line: variant names parsed, bad settings refused,
and (slow tier) one run on the tiny shape through FP8, an FP8 KV cache and TP=2 over gloo
writing its record."""

from __future__ import annotations

import json

import pytest

from project04_llm_inference.bench.engine_variants import (
    EngineVariantsConfig,
    parse_variant,
    run,
)


def test_variant_names():
    assert parse_variant("bf16") == ("bf16", 1, "auto")
    assert parse_variant("fp8-tp4") == ("fp8", 4, "auto")
    assert parse_variant("bf16-kvfp8") == ("bf16", 1, "fp8")
    assert parse_variant("fp8-kvfp8-tp2") == ("fp8", 2, "fp8")
    assert parse_variant("fp8-scaledmm") == ("fp8-scaledmm", 1, "auto")  # without the FP8 GEMV
    assert parse_variant("fp8-scaledmm-kvfp8") == ("fp8-scaledmm", 1, "fp8")
    bad_names = ("int4", "fp8-tp", "fp8-tp0", "bf16-tpx", "bf16-tp2-kvfp8", "kvfp8")
    for bad in bad_names + ("fp8-scaledmm-tp2", "bf16-scaledmm"):
        with pytest.raises(ValueError, match="expected 'bf16' or 'fp8'"):
            parse_variant(bad)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        (dict(variants=[]), "at least one"),
        (dict(output=1), "output must be >= 2"),
        (dict(batch_sizes=[0]), "batch_sizes"),
        (dict(variants=["fp16"]), "variant 'fp16'"),
    ],
)
def test_bad_settings_are_refused(kwargs, words):
    with pytest.raises(ValueError, match=words):
        EngineVariantsConfig(**kwargs)


@pytest.mark.slow
def test_a_cpu_run_writes_every_variant_with_its_ratio(tmp_path):
    cfg = EngineVariantsConfig(
        variants=["bf16", "fp8", "bf16-tp2", "bf16-kvfp8"],
        shape="tiny",
        batch_sizes=[2],
        context=16,
        output=4,
        repeats=1,
        device="cpu",
        reports_dir=str(tmp_path),
    )
    out = run(cfg)
    record = json.loads((tmp_path / "project04_llm_inference" / "engine_variants.json").read_text())
    rows = record["results"]["rows"]
    assert [r["variant"] for r in rows] == cfg.variants
    assert rows[0]["tok_s_vs_baseline"] == 1.0 and all(r["decode_tok_s"] > 0 for r in rows)
    assert out["baseline_variant"] == "bf16"
    assert rows[2]["collective_ms_per_step"] > 0 and rows[0]["collective_ms_per_step"] is None
    # the CPU budget holds four times the blocks of one-byte K/V as of float32 (4 bytes)
    assert rows[3]["kv_cache_dtype"] == "fp8" and rows[3]["kv_blocks"] == 4 * rows[0]["kv_blocks"]
