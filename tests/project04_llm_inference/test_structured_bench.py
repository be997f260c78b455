"""The structured-output cost bench end to end at a toy size: it runs, every mode decodes, and
the record holds one row per batch size with the constrained requests still under their
grammar (the timing is the GPU's: `-m gpu` below)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("xgrammar", reason="structured output needs the 'structured' extra (xgrammar)")


def test_structured_bench_record(tmp_path, one_thread):
    from project04_llm_inference.bench.structured import StructuredBenchConfig, run

    cfg = StructuredBenchConfig(
        batches=[1, 3],
        steps=3,
        context=8,
        shape="tiny",
        device="cpu",
        repeats=1,
        reports_dir=str(tmp_path),
    )
    run(cfg)
    rec = json.loads((tmp_path / "project04_llm_inference" / "structured_cost.json").read_text())
    rows = rec["results"]["rows"] if "results" in rec else rec["rows"]
    assert [r["batch"] for r in rows] == [1, 3]
    for r in rows:
        assert r["constrained_ms_per_step"] > 0 and r["free_ms_per_step"] > 0
        assert r["constrained_active_at_end"] == r["batch"]  # the mask was on for every step


@pytest.mark.gpu
def test_structured_cost_on_gpu(tmp_path):
    """The mask's cost at batch 1 and 64 on the GPU (dummy llama-3.2-1b weights, a synthetic
    vocabulary of its size): the record is the measurement; the test checks it was made on CUDA
    and that the constrained requests stayed constrained."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from project04_llm_inference.bench.structured import StructuredBenchConfig, run

    res = run(StructuredBenchConfig(batches=[1, 64], steps=32, reports_dir=str(tmp_path)))
    assert res["device"].startswith("cuda")
    for r in res["rows"]:
        assert r["constrained_active_at_end"] == r["batch"]


def test_structured_validity_record_on_random_weights(tmp_path, one_thread):
    """The validity bench at one seed: every constrained output of random weights parses and
    validates (the mask holds whatever the weights prefer), and the record adds up."""
    pytest.importorskip("jsonschema")
    from project04_llm_inference.bench.structured_validity import ValidityConfig, run

    res = run(ValidityConfig(seeds=1, max_tokens=120, device="cpu", reports_dir=str(tmp_path)))
    assert res["weights"] == "random"
    assert res["outputs"] == sum(r["outputs"] for r in res["by_kind"].values()) == 5 * 2
    assert res["failures"] == [] and res["valid"] == res["outputs"]
    assert (tmp_path / "project04_llm_inference" / "structured_validity.json").exists()
