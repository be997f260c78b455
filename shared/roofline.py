"""Roofline position and model FLOP utilisation.

attainable = min(peak_flops, intensity x peak_bandwidth); a kernel is memory-bound when its
arithmetic intensity is below the ridge point peak_flops / peak_bandwidth (FLOP per byte).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class RooflinePoint:
    flops: float
    nbytes: float
    intensity: float  # FLOP/byte
    ridge_intensity: float  # FLOP/byte where the two roofs meet
    attainable_flops: float  # FLOP/s the roofline allows at this intensity
    bound: str  # "memory" or "compute"

    def fraction_of_roof(self, achieved_flops_per_s: float) -> float:
        """Achieved FLOP/s over what the roofline allows at this intensity."""
        return achieved_flops_per_s / self.attainable_flops

    def to_dict(self) -> dict:
        return asdict(self)


def roofline(
    flops: float, nbytes: float, peak_flops: float, peak_bandwidth: float
) -> RooflinePoint:
    """peak_flops in FLOP/s, peak_bandwidth in bytes/s."""
    for name, v in (("flops", flops), ("nbytes", nbytes), ("peak_flops", peak_flops)):
        if v <= 0:
            raise ValueError(f"{name} must be positive, got {v}")
    if peak_bandwidth <= 0:
        raise ValueError(f"peak_bandwidth must be positive, got {peak_bandwidth}")
    intensity = flops / nbytes
    ridge = peak_flops / peak_bandwidth
    attainable = min(peak_flops, intensity * peak_bandwidth)
    return RooflinePoint(
        flops=flops,
        nbytes=nbytes,
        intensity=intensity,
        ridge_intensity=ridge,
        attainable_flops=attainable,
        bound="memory" if intensity < ridge else "compute",
    )


def mfu(achieved_flops_per_s: float, peak_flops_per_s: float) -> float:
    """Model FLOP utilisation: achieved over dense peak, as a fraction (0.5 = 50%)."""
    if peak_flops_per_s <= 0:
        raise ValueError(f"peak_flops_per_s must be positive, got {peak_flops_per_s}")
    if achieved_flops_per_s < 0:
        raise ValueError(f"achieved_flops_per_s must be >= 0, got {achieved_flops_per_s}")
    return achieved_flops_per_s / peak_flops_per_s
