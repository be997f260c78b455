"""What training costs: per token and per run, from measured throughput and a price per GPU-hour.

All prices are USD per GPU-hour; throughput is tokens/s of the whole job (all GPUs together).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .hardware import GPUSpec


def _check(tokens_per_s: float, price_per_gpu_hour: float, n_gpus: int) -> None:
    if tokens_per_s <= 0:
        raise ValueError(f"tokens_per_s must be positive, got {tokens_per_s}")
    if price_per_gpu_hour < 0:
        raise ValueError(f"price_per_gpu_hour must be >= 0, got {price_per_gpu_hour}")
    if n_gpus < 1 or int(n_gpus) != n_gpus:
        raise ValueError(f"n_gpus must be a positive integer, got {n_gpus}")


def cost_per_million_tokens(tokens_per_s: float, price_per_gpu_hour: float, n_gpus: int) -> float:
    """USD per 1e6 trained tokens: (n_gpus x price per hour) / tokens per hour x 1e6."""
    _check(tokens_per_s, price_per_gpu_hour, n_gpus)
    return n_gpus * price_per_gpu_hour / (tokens_per_s * 3600.0) * 1e6


def run_cost(
    total_tokens: float, tokens_per_s: float, price_per_gpu_hour: float, n_gpus: int
) -> dict:
    """Wall-clock hours, GPU-hours and USD to train `total_tokens`."""
    _check(tokens_per_s, price_per_gpu_hour, n_gpus)
    if total_tokens <= 0:
        raise ValueError(f"total_tokens must be positive, got {total_tokens}")
    hours = total_tokens / tokens_per_s / 3600.0
    return {
        "hours": hours,
        "gpu_hours": hours * n_gpus,
        "usd": hours * n_gpus * price_per_gpu_hour,
    }


@dataclass(frozen=True)
class CostLine:
    config: str  # e.g. "4x h200-sxm"
    gpu: str
    n_gpus: int
    tokens_per_s: float
    measured: bool  # False: projected from another measurement
    usd_per_m_tokens_on_demand: float
    usd_per_m_tokens_spot: float
    price_source: str

    def to_dict(self) -> dict:
        return asdict(self)


def cost_line(spec: GPUSpec, n_gpus: int, tokens_per_s: float, *, measured: bool) -> CostLine:
    """On-demand and spot cost per million tokens of one GPU configuration."""
    return CostLine(
        config=f"{n_gpus}x {spec.key}",
        gpu=spec.key,
        n_gpus=n_gpus,
        tokens_per_s=tokens_per_s,
        measured=measured,
        usd_per_m_tokens_on_demand=cost_per_million_tokens(
            tokens_per_s, spec.price_on_demand.value, n_gpus
        ),
        usd_per_m_tokens_spot=cost_per_million_tokens(tokens_per_s, spec.price_spot.value, n_gpus),
        price_source=f"{spec.price_on_demand.source} ({spec.price_on_demand.date})",
    )
