import json

import pytest
import torch

from shared import hardware
from shared.hardware import GPUS, detect_gpu, dtype_key, get_gpu, load_price_overrides

REQUIRED = {"h100-sxm", "h200-sxm", "a100-80gb-sxm", "l40s", "b200", "rtx-4090"}


def test_table_has_the_required_gpus():
    assert REQUIRED <= set(GPUS)


@pytest.mark.parametrize("key", sorted(REQUIRED))
def test_every_figure_has_unit_source_and_date(key):
    spec = GPUS[key]
    figures = [*spec.peak_tflops.values(), spec.mem_bandwidth_gbs, spec.mem_gb]
    figures += [spec.price_on_demand, spec.price_spot]
    for fig in figures:
        assert fig.value > 0
        assert fig.unit and fig.source and fig.date
    for dtype in ("fp32", "tf32", "bf16", "fp16"):
        assert dtype in spec.peak_tflops
    # spot is cheaper than on-demand
    assert spec.price_spot.value < spec.price_on_demand.value


def test_h200_figures_and_conversions():
    h200 = get_gpu("h200-sxm")
    assert h200.peak_flops(torch.bfloat16) == pytest.approx(989.4e12)
    assert h200.peak_flops("fp32") == pytest.approx(67e12)
    assert h200.bandwidth() == pytest.approx(4.8e12)
    # ridge point in dense bf16: 989.4e12 / 4.8e12 = 206.1 FLOP/byte
    assert h200.ridge_intensity("bf16") == pytest.approx(206.125)
    assert h200.mem_gb.value == 141


def test_dense_rates_are_consistent_across_dtypes():
    for spec in GPUS.values():
        p = spec.peak_tflops
        assert p["bf16"].value == p["fp16"].value
        assert p["tf32"].value <= p["bf16"].value
        if "fp8" in p:
            assert p["fp8"].value >= p["bf16"].value


def test_name_matching_and_detection():
    assert get_gpu("NVIDIA H200").key == "h200-sxm"
    assert get_gpu("NVIDIA H100 80GB HBM3").key == "h100-sxm"
    assert get_gpu("NVIDIA A100-SXM4-80GB").key == "a100-80gb-sxm"
    with pytest.raises(ValueError, match="unknown GPU"):
        get_gpu("Voodoo 3")
    if not torch.cuda.is_available():
        assert detect_gpu() is None


def test_dtype_keys():
    assert dtype_key(torch.float16) == "fp16"
    assert dtype_key("bfloat16") == "bf16"
    assert dtype_key("TF32") == "tf32"
    with pytest.raises(ValueError):
        dtype_key("int4")
    with pytest.raises(ValueError, match="no fp8 peak"):
        get_gpu("a100-80gb-sxm").peak_flops("fp8")


def test_price_overrides(tmp_path, monkeypatch):
    f = tmp_path / "prices.json"
    f.write_text(json.dumps({"h100-sxm": {"on_demand": 2.5, "spot": 1.1}}))
    table = load_price_overrides(f)
    assert table["h100-sxm"].price_on_demand.value == 2.5
    assert table["h100-sxm"].price_spot.value == 1.1
    assert table["h200-sxm"] == hardware.GPUS["h200-sxm"]
    monkeypatch.setenv("SHARED_GPU_PRICES", str(f))
    assert load_price_overrides()["h100-sxm"].price_spot.value == 1.1
    f.write_text(json.dumps({"tpu": {"on_demand": 1, "spot": 1}}))
    with pytest.raises(ValueError, match="unknown GPU"):
        load_price_overrides(f)
    f.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read"):
        load_price_overrides(f)
