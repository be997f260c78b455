"""GPU tier (2 or more GPUs): the strategy comparison runs every 1-D layout on NCCL in bf16 (the
tiny model: the code path, not the figures), reads a peak memory per strategy, and its measured
training state still equals each formula."""

from __future__ import annotations

import pytest
import torch

from project02_fsdp_scaling import strategies as st

pytestmark = pytest.mark.gpu


def test_every_one_dimensional_strategy_on_two_gpus(tmp_path):
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    from shared.results import load_result

    cfg = st.StrategiesConfig(world_sizes=(2,), reports_dir=str(tmp_path))
    cfg.train.preset, cfg.train.n_layers, cfg.train.steps = "tiny", 4, 2
    rec = load_result(st.run(cfg))
    runs = rec["results"]["runs"]
    assert [r["name"] for r in runs] == [n for n in st.STRATEGIES if n not in st.TWO_D]
    for r in runs:
        assert r["state_bytes_measured"] == r["state_bytes_formula"], r["name"]
        assert r["peak_memory_gib"] > 0 and r["compute_dtype"] == "bfloat16", r["name"]
