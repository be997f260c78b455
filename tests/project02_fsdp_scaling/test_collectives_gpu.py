"""GPU tier (2 or more GPUs): the collective sweep over NCCL records what the CPU's cannot (NCCL
version, topology, the link peak), and its bus bandwidth follows nccl-tests' arithmetic."""

from __future__ import annotations

import pytest
import torch

from project02_fsdp_scaling import collectives as coll

pytestmark = pytest.mark.gpu


def test_a_short_nccl_sweep_on_two_gpus(tmp_path):
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    from shared.results import load_result

    cfg = coll.CollectivesConfig(reports_dir=str(tmp_path), max_bytes=2**20, iters=5)
    rec = load_result(coll.run(cfg))
    sysinfo = rec["results"]["system"]
    assert sysinfo["backend"] == "nccl" and sysinfo["world_size"] == 2
    assert sysinfo["nccl_version"] and sysinfo["topology"]
    for op, rows in rec["results"]["ops"].items():
        assert rows[-1]["bytes"] == 2**20 or op != "all_reduce"
        for r in rows:
            assert r["busbw_gbs"] == pytest.approx(r["algbw_gbs"] * coll.bus_factor(op, 2))
