"""The collective benchmark: nccl-tests' bus-bandwidth factors and sizes, the buffers of each
collective, the system record (NVLink parsing), the Markdown and chart from a record alone, and
(slow) a real sweep on 2 gloo ranks."""

from __future__ import annotations

import pytest

from project02_fsdp_scaling import collectives as coll
from project02_fsdp_scaling.collectives_report import collectives_markdown, render


@pytest.mark.parametrize(
    "op, n, factor",
    [
        ("all_reduce", 2, 1.0),
        ("all_reduce", 8, 1.75),  # 2 (n - 1) / n
        ("all_gather", 8, 0.875),
        ("reduce_scatter", 4, 0.75),
        ("all_to_all", 8, 0.875),
        ("broadcast", 8, 1.0),
    ],
)
def test_bus_factors_are_nccl_tests(op, n, factor):
    assert coll.bus_factor(op, n) == factor


def test_sizes_run_from_8_bytes_to_1_gib_like_nccl_tests():
    sizes = coll.message_sizes(8, 2**30, 2)
    assert sizes[0] == 8 and sizes[-1] == 2**30 and len(sizes) == 28
    assert coll.CollectivesConfig().resolved_max_bytes(on_gpu=True) == 2**30
    assert coll.CollectivesConfig().resolved_max_bytes(on_gpu=False) == 4 * 2**20


def test_each_collective_gets_nccl_tests_buffers():
    import torch

    f32 = torch.float32
    inp, out = coll._buffers("all_gather", 2**20, 8, f32, "cpu")  # size = the gathered output
    assert out.numel() * 4 == 2**20 and inp.numel() * 8 == out.numel()
    inp, out = coll._buffers("reduce_scatter", 2**20, 8, f32, "cpu")  # size = the input
    assert inp.numel() * 4 == 2**20 and out.numel() * 8 == inp.numel()
    inp, out = coll._buffers("all_reduce", 8, 8, f32, "cpu")  # at least an element a rank
    assert inp.numel() == 8 and out is None


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"factor": 1}, "factor"),
        ({"ops": ("bogus",)}, "ops"),
        ({"min_bytes": 0}, "min_bytes"),
        ({"min_bytes": 64, "max_bytes": 8}, "max_bytes"),
        ({"name": "a/b"}, "name"),
    ],
)
def test_bad_settings_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        coll.CollectivesConfig(**kwargs).validate()


NVLINK_STATUS = """GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-x)
\t Link 0: 26.562 GB/s
\t Link 1: 26.562 GB/s
\t Link 2: 26.562 GB/s
GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-y)
\t Link 0: 26.562 GB/s
"""


def test_nvlink_status_is_read_for_gpu_0():
    assert coll.nvlink_links(NVLINK_STATUS) == {
        "links": 3,
        "gbs_per_link": 26.562,
        "gbs_total": pytest.approx(79.686),
    }
    assert coll.nvlink_links("NVML: not supported") is None
    assert coll.link_peak_gbs("NVIDIA H100 80GB HBM3") == 450.0
    assert coll.link_peak_gbs(None) is None


def _record(backend="nccl") -> dict:
    rows = [
        {"bytes": b, "count": b // 4, "time_us": 10.0, "algbw_gbs": b / 1e4, "busbw_gbs": b / 1e4}
        for b in (8, 1024, 2**20)
    ]
    return {
        "environment": {"gpu": "NVIDIA H100 80GB HBM3", "cpu_count": 16, "torch": "2.13"},
        "config": {"dtype": "float32", "iters": 20, "warmup": 5},
        "results": {
            "system": {
                "backend": backend,
                "world_size": 8,
                "nccl_version": "2.27.5",
                "nccl_env": {"NCCL_ALGO": "Tree"},
                "topology": "\tGPU0\tGPU1\nGPU0\t X \tNV18",
                "nvlink": {"links": 18, "gbs_per_link": 26.562, "gbs_total": 478.1},
                "link_peak_gbs": 450.0,
            },
            "ops": {"all_reduce": rows, "broadcast": rows},
        },
    }


def test_the_report_is_rendered_from_the_record_alone(tmp_path):
    md = collectives_markdown(_record())
    assert "| 1 MiB |" in md and "NCCL 2.27.5" in md and "NCCL_ALGO=Tree" in md
    assert "18 links" in md and "NV18" in md and "link peak 450" in md
    paths = render(_record(), tmp_path, "collectives_gpu")
    assert [p.name for p in paths] == ["collectives_gpu.md", "collectives_gpu_busbw.png"]
    assert all(p.stat().st_size > 0 for p in paths)


@pytest.mark.slow
def test_a_sweep_on_two_gloo_ranks(tmp_path):
    from shared.results import load_result

    cfg = coll.CollectivesConfig(
        reports_dir=str(tmp_path), max_bytes=4096, iters=3, warmup=1, timeout_s=300
    )
    rec = load_result(coll.run(cfg))
    res = rec["results"]
    assert res["system"]["backend"] == "gloo" and res["system"]["world_size"] == 2
    assert list(res["ops"]) == list(coll.OPS)
    for op, rows in res["ops"].items():
        assert [r["bytes"] for r in rows] == [8, 32, 128, 512, 2048]
        for r in rows:
            assert r["time_us"] > 0
            assert r["algbw_gbs"] == pytest.approx(r["bytes"] / (r["time_us"] * 1e-6) / 1e9)
            assert r["busbw_gbs"] == pytest.approx(r["algbw_gbs"] * coll.bus_factor(op, 2))
    assert (tmp_path / "project02_fsdp_scaling" / "collectives_cpu_busbw.png").is_file()
