"""GPU specifications: dense peak TFLOP/s per dtype, memory bandwidth and size, price per GPU-hour.

Every figure carries its source and date. Peaks are dense (no 2:4 sparsity) tensor-core rates
for tf32/bf16/fp16/fp8 and CUDA-core rates for fp32, from the vendor's datasheets. Prices move
weekly: the table holds indicative figures with where they came from; pass your own with
`load_price_overrides(path)` or the `SHARED_GPU_PRICES` environment variable (a JSON file
`{"h100-sxm": {"on_demand": 2.5, "spot": 1.2}, ...}`, USD per GPU-hour).

Measured ceilings (what cuBLAS reaches on a real card) belong in the reports, next to the
results they bound. The one exception is the device-to-device copy bandwidth: a memory-bound
kernel's target is stated as a share of it, so it is a reference figure like the datasheet's,
kept here once with how and when it was measured (None where no card of the kind was measured).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch


@dataclass(frozen=True)
class Figure:
    value: float
    unit: str
    source: str
    date: str

    def __float__(self) -> float:
        return float(self.value)


@dataclass(frozen=True)
class GPUSpec:
    key: str
    name: str
    arch: str
    compute_capability: tuple[int, int]
    peak_tflops: dict[str, Figure]  # dense TFLOP/s by dtype key
    mem_bandwidth_gbs: Figure  # GB/s (1e9 bytes/s)
    mem_gb: Figure  # GB (1e9 bytes)
    price_on_demand: Figure  # USD per GPU-hour
    price_spot: Figure  # USD per GPU-hour
    match: tuple[str, ...] = field(default=())  # substrings of the CUDA device name
    copy_bandwidth_gbs: Figure | None = None  # GB/s, read + write bytes of a device copy
    nvlink_gbs: Figure | None = None  # GB/s one direction per GPU, all NVLink links together

    def copy_bandwidth(self) -> float:
        """Device-to-device copy bandwidth in bytes/s (read + write): the ceiling a streaming
        kernel is judged against. Raises ValueError where the table has no measurement."""
        if self.copy_bandwidth_gbs is None:
            raise ValueError(f"{self.name} has no measured copy bandwidth in the table")
        return self.copy_bandwidth_gbs.value * 1e9

    def peak_flops(self, dtype: torch.dtype | str) -> float:
        """Dense peak in FLOP/s for `dtype` (a torch.dtype or 'fp32'/'tf32'/'bf16'/'fp16'/'fp8')."""
        key = dtype_key(dtype)
        if key not in self.peak_tflops:
            raise ValueError(f"{self.name} has no {key} peak in the table")
        return self.peak_tflops[key].value * 1e12

    def bandwidth(self) -> float:
        """Peak memory bandwidth in bytes/s."""
        return self.mem_bandwidth_gbs.value * 1e9

    def ridge_intensity(self, dtype: torch.dtype | str) -> float:
        """FLOP per byte above which a kernel is compute-bound on this GPU."""
        return self.peak_flops(dtype) / self.bandwidth()


_DTYPE_KEYS = {
    torch.float32: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float8_e4m3fn: "fp8",
    torch.float8_e5m2: "fp8",
}
_ALIASES = {
    "float32": "fp32",
    "fp32": "fp32",
    "tf32": "tf32",
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float16": "fp16",
    "fp16": "fp16",
    "half": "fp16",
    "fp8": "fp8",
    "float8": "fp8",
}


def dtype_key(dtype: torch.dtype | str) -> str:
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPE_KEYS:
            raise ValueError(f"no peak-FLOP/s key for dtype {dtype}")
        return _DTYPE_KEYS[dtype]
    key = _ALIASES.get(str(dtype).lower())
    if key is None:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(set(_ALIASES))}")
    return key


def _tf(values: dict[str, float], source: str, date: str) -> dict[str, Figure]:
    return {k: Figure(v, "TFLOP/s", source, date) for k, v in values.items()}


_PRICE_SRC = "Mercatus cloud GPU pricing guide, specialty-cloud on-demand range, midpoint"
_SPOT_SRC = "on-demand x 0.4: spot runs 50-70% below on-demand (packet.ai pricing-models guide)"


def _prices(on_demand: float, source: str = _PRICE_SRC, date: str = "2026-05"):
    return (
        Figure(on_demand, "USD/GPU-hour", source, date),
        Figure(round(on_demand * 0.4, 2), "USD/GPU-hour", _SPOT_SRC, "2026-06"),
    )


def _spec(key, name, arch, cc, peaks, src, date, bw, mem, price, match, copy=None) -> GPUSpec:
    on_demand, spot = price
    return GPUSpec(
        key=key,
        name=name,
        arch=arch,
        compute_capability=cc,
        peak_tflops=_tf(peaks, src, date),
        mem_bandwidth_gbs=Figure(bw, "GB/s", src, date),
        mem_gb=Figure(mem, "GB", src, date),
        price_on_demand=on_demand,
        price_spot=spot,
        match=match,
        copy_bandwidth_gbs=copy,
    )


GPUS: dict[str, GPUSpec] = {
    s.key: s
    for s in [
        _spec(
            "h100-sxm",
            "NVIDIA H100 SXM5 80GB",
            "Hopper",
            (9, 0),
            {"fp32": 67, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
            "NVIDIA H100 Tensor Core GPU datasheet (dense = half of the with-sparsity figure)",
            "2023",
            3350,
            80,
            _prices(3.00),
            ("H100 80GB HBM3", "H100 SXM"),
        ),
        _spec(
            "h200-sxm",
            "NVIDIA H200 SXM 141GB",
            "Hopper",
            (9, 0),
            {"fp32": 67, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
            "NVIDIA H200 Tensor Core GPU datasheet (dense = half of the with-sparsity figure)",
            "2024",
            4800,
            141,
            _prices(4.00),
            ("H200",),
            copy=Figure(
                4300,
                "GB/s",
                "device-to-device torch copy of a large bfloat16 tensor on one H200 SXM, "
                "(read + write bytes) / median time, rounded to two significant figures",
                "2026-11-30",
            ),
        ),
        _spec(
            "a100-80gb-sxm",
            "NVIDIA A100 SXM4 80GB",
            "Ampere",
            (8, 0),
            {"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312},
            "NVIDIA A100 Tensor Core GPU datasheet (dense)",
            "2021",
            2039,
            80,
            _prices(1.30),
            ("A100-SXM4-80GB", "A100 80GB"),
        ),
        _spec(
            "l40s",
            "NVIDIA L40S 48GB",
            "Ada Lovelace",
            (8, 9),
            {"fp32": 91.6, "tf32": 183, "bf16": 362.05, "fp16": 362.05, "fp8": 733},
            "NVIDIA L40S datasheet (dense = half of the with-sparsity figure)",
            "2023",
            864,
            48,
            _prices(1.00, "indicative specialty-cloud on-demand list price", "2026"),
            ("L40S",),
        ),
        _spec(
            "b200",
            "NVIDIA B200 180GB (HGX)",
            "Blackwell",
            (10, 0),
            {"fp32": 75, "tf32": 1125, "bf16": 2250, "fp16": 2250, "fp8": 4500},
            "NVIDIA HGX B200 datasheet: 8-GPU totals / 8, dense = half of the sparse figure",
            "2025",
            8000,
            180,
            _prices(5.60, "packet.ai B200 bare-metal on-demand list price", "2026-06"),
            ("B200",),
        ),
        _spec(
            "rtx-4090",
            "NVIDIA GeForce RTX 4090 24GB",
            "Ada Lovelace",
            (8, 9),
            # Tensor-core rates with fp32 accumulation, as training uses them.
            {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2, "fp8": 330.3},
            "NVIDIA Ada Lovelace architecture whitepaper v2.1, appendix A (dense, fp32 accumulate)",
            "2023",
            1008,
            24,
            _prices(0.40, "indicative community-cloud on-demand list price", "2026"),
            ("RTX 4090",),
        ),
    ]
}


# NVLink per GPU, one direction, all links together: the peak a collective's bus bandwidth is
# held against (nccl-tests' busbw). Hopper SXM: NVLink 4, 18 links; A100 SXM: NVLink 3, 12 links;
# B200: NVLink 5, 18 links. Half of each datasheet's bidirectional figure.
_NVLINK_SRC = "NVIDIA datasheets (bidirectional NVLink bandwidth / 2)"
_NVLINK = {"h100-sxm": 450.0, "h200-sxm": 450.0, "a100-80gb-sxm": 300.0, "b200": 900.0}
for _key, _gbs in _NVLINK.items():
    GPUS[_key] = replace(GPUS[_key], nvlink_gbs=Figure(_gbs, "GB/s", _NVLINK_SRC, "2024"))


def get_gpu(key: str) -> GPUSpec:
    """A spec by table key ('h200-sxm') or by a device name the table recognises."""
    if key in GPUS:
        return GPUS[key]
    spec = match_gpu_name(key)
    if spec is None:
        raise ValueError(f"unknown GPU {key!r}; the table has {sorted(GPUS)}")
    return spec


def match_gpu_name(device_name: str) -> GPUSpec | None:
    """The spec whose match strings occur in a CUDA device name such as 'NVIDIA H200'."""
    for spec in GPUS.values():
        if any(m.lower() in device_name.lower() for m in spec.match):
            return spec
    return None


def detect_gpu(device: int | None = None) -> GPUSpec | None:
    """The table entry of the current CUDA device, or None without a GPU or for an unknown one."""
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(device if device is not None else torch.cuda.current_device())
    return match_gpu_name(name)


def with_prices(spec: GPUSpec, on_demand: float, spot: float, source: str, date: str) -> GPUSpec:
    return replace(
        spec,
        price_on_demand=Figure(on_demand, "USD/GPU-hour", source, date),
        price_spot=Figure(spot, "USD/GPU-hour", source, date),
    )


def load_price_overrides(path: str | os.PathLike | None = None) -> dict[str, GPUSpec]:
    """The table with prices replaced from a JSON file (or $SHARED_GPU_PRICES)."""
    path = path or os.environ.get("SHARED_GPU_PRICES")
    if not path:
        return dict(GPUS)
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read GPU price overrides from {path}: {e}") from e
    table = dict(GPUS)
    for key, prices in data.items():
        if key not in table:
            raise ValueError(f"price override for unknown GPU {key!r}; known: {sorted(GPUS)}")
        if not {"on_demand", "spot"} <= set(prices):
            raise ValueError(f"price override for {key} needs 'on_demand' and 'spot' (USD/GPU-h)")
        table[key] = with_prices(
            table[key], float(prices["on_demand"]), float(prices["spot"]), f"override {path}", ""
        )
    return table
