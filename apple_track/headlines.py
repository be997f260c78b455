"""The front page's claims: each headline figure, the record it comes from, and its target.

`make readme` renders these into the README's results table (`shared.front_page`).
"""

from __future__ import annotations

from shared.front_page import Claim


def _outside_tolerance(rec: dict) -> float | None:
    """Exported variants whose error against PyTorch float32 exceeds their stated tolerance
    (stated for trained weights: None for an untrained export, where it does not apply)."""
    if not rec["results"].get("model", {}).get("train_steps"):
        return None
    variants = rec["results"].get("variants") or []
    return float(sum(1 for v in variants if not v.get("within_tolerance"))) if variants else None


def _variant(runtime: str, name: str, what: str):
    def measure(rec: dict) -> float | None:
        v = next(
            (
                v
                for v in rec["results"].get("variants", [])
                if v["runtime"] == runtime and v["variant"] == name
            ),
            None,
        )
        if v is None:
            return None
        if what == "rel_l2":
            return (v.get("parity") or {}).get("rel_l2")
        return (v.get("latency") or {}).get("median_ms")

    return measure


CLAIMS = [
    Claim(
        "Core ML, LiteRT and MLX variants of `tiny` outside their tolerance",
        "export.json",
        _outside_tolerance,
        "variants",
        0.0,
        higher_is_better=False,
        fmt=".0f",
        root=True,
    ),
    Claim(
        "LiteRT int8 error against PyTorch float32, `tiny`",
        "export.json",
        _variant("litert", "int8", "rel_l2"),
        "relative L2",
        fmt=".2g",
    ),
    Claim(
        "LiteRT int8 latency, `tiny`, one CPU thread",
        "export.json",
        _variant("litert", "int8", "latency"),
        "ms per forward",
        fmt=".3g",
    ),
]
