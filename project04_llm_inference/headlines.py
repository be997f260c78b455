"""The front page's claims: each headline figure, the record it comes from, and its target.

`make readme` renders these into the README's results table (`shared.front_page`). The decode
figures take the engine's faster configuration at each shape (one or several steps per host
round trip; the record holds both).
"""

from __future__ import annotations

from shared.front_page import Claim, spread_of


def _decode_key(row: dict | None, default: bool) -> str:
    """The latency row's field of the engine's default settings (one step per host round trip,
    `engine_ms`) or of its faster configuration (default or multi-step)."""
    from project04_llm_inference.report.render import _best

    if default:
        return "engine_ms" if row and row.get("engine_ms") is not None else ""
    return _best(row)[2]


def _decode_ms(batch: int, context: int, default: bool = False):
    def measure(rec: dict) -> float | None:
        from project04_llm_inference.report.render import _latency_row

        row = _latency_row({"decode_latency": rec}, batch, context)
        key = _decode_key(row, default)
        return row[key] if key else None

    return measure


def _decode_span(batch: int, context: int, per_second: bool = False, default: bool = False):
    """The repetitions' range of the configuration's step time (or its tokens/s)."""

    def spread(rec: dict) -> tuple[float, float] | None:
        from project04_llm_inference.report.render import _latency_row, _span

        row = _latency_row({"decode_latency": rec}, batch, context)
        key = _decode_key(row, default)
        if not key:
            return None
        return _span(row, key, (lambda v: batch / v * 1e3) if per_second else (lambda v: v))

    return spread


def _decode_tok_s(batch: int, context: int, default: bool = False):
    ms = _decode_ms(batch, context, default)

    def measure(rec: dict) -> float | None:
        v = ms(rec)
        return None if not v else batch / v * 1e3

    return measure


def _offline(rec: dict) -> float | None:
    return rec["results"].get("engine", {}).get("output_tok_s")


def _offline_span(rec: dict) -> tuple[float, float] | None:
    return spread_of(rec["results"].get("engine"), "output_tok_s")


def _decode_kernel_share(rec: dict) -> float | None:
    """The worst shape's bandwidth (batch 64/256, context >= 8k) as a % of the copy bandwidth."""
    from project04_llm_inference.report.render import COPY_TB_S

    rows = [
        r
        for r in rec["results"].get("rows", [])
        if r.get("batch") in (64, 256) and r.get("context", 0) >= 8192 and r.get("ours_gbps")
    ]
    worst = min((r["ours_gbps"] for r in rows), default=None)
    return None if worst is None else worst / 1e3 / COPY_TB_S * 100


def _prefix_overhead(rec: dict) -> float | None:
    return rec["results"].get("unshared", {}).get("overhead_pct")


def _prefix_span(rec: dict) -> tuple[float, float] | None:
    return spread_of(rec["results"].get("unshared"), "overhead_pct")


def _spec_speedup(rec: dict) -> float | None:
    return (rec["results"].get("best_batch1_draft") or {}).get("speedup")


def _spec_span(rec: dict) -> tuple[float, float] | None:
    """The best configuration's speed-up over its repetitions (its row of the record)."""
    best = rec["results"].get("best_batch1_draft") or {}
    row = next(
        (
            r
            for r in rec["results"].get("rows", [])
            if r.get("batch") == 1
            and r.get("k") == best.get("k")
            and r.get("method") == best.get("method")
            and r.get("speedup") == best.get("speedup")
        ),
        None,
    )
    return spread_of(row, "speedup")


def _serving_rate(rec: dict) -> float | None:
    rate = (rec["results"].get("max_rate_meeting_slo") or {}).get("request_rate")
    return None if rate in (None, "inf") else float(rate)


def _structured_overhead(batch: int):
    def measure(rec: dict) -> float | None:
        row = next((r for r in rec["results"].get("rows", []) if r.get("batch") == batch), None)
        return None if row is None else row["overhead"] * 100

    return measure


def _engine_variant_ms(variant: str, batch: int):
    def measure(rec: dict) -> float | None:
        row = next(
            (
                r
                for r in rec["results"].get("rows", [])
                if r.get("variant") == variant and r.get("batch") == batch
            ),
            None,
        )
        return None if row is None else row.get("decode_ms_per_step")

    return measure


# Targets by card: the H200's are the design targets; decode_latency_h100.json, the H100 80GB
# record, is judged against the same study's H100 figures.
CLAIMS = [
    Claim(
        "batch-1 decode, context 1,024, default settings",
        "decode_latency.json",
        _decode_ms(1, 1024, default=True),
        "ms/token",
        0.85,
        higher_is_better=False,
        fmt=".3g",
        spread=_decode_span(1, 1024, default=True),
    ),
    Claim(
        "batch-1 decode, context 1,024, best path",
        "decode_latency.json",
        _decode_ms(1, 1024),
        "ms/token",
        0.76,
        higher_is_better=False,
        fmt=".3g",
        root=True,
        spread=_decode_span(1, 1024),
    ),
    Claim(
        "batch-1 decode, context 8,192, best path",
        "decode_latency.json",
        _decode_ms(1, 8192),
        "ms/token",
        0.85,
        higher_is_better=False,
        fmt=".3g",
        spread=_decode_span(1, 8192),
    ),
    Claim(
        "decode throughput, batch 64, context 1,024",
        "decode_latency.json",
        _decode_tok_s(64, 1024),
        "tok/s",
        40_000,
        fmt=",.0f",
        spread=_decode_span(64, 1024, per_second=True),
    ),
    Claim(
        "decode throughput, batch 256, context 1,024",
        "decode_latency.json",
        _decode_tok_s(256, 1024),
        "tok/s",
        70_000,
        fmt=",.0f",
        spread=_decode_span(256, 1024, per_second=True),
    ),
    Claim(
        "H100: batch-1 decode, context 1,024, default settings",
        "decode_latency_h100.json",
        _decode_ms(1, 1024, default=True),
        "ms/token",
        1.05,
        higher_is_better=False,
        fmt=".3g",
        spread=_decode_span(1, 1024, default=True),
    ),
    Claim(
        "H100: batch-1 decode, context 1,024, best path",
        "decode_latency_h100.json",
        _decode_ms(1, 1024),
        "ms/token",
        0.97,
        higher_is_better=False,
        fmt=".3g",
        spread=_decode_span(1, 1024),
    ),
    Claim(
        "H100: decode throughput, batch 64, context 1,024",
        "decode_latency_h100.json",
        _decode_tok_s(64, 1024),
        "tok/s",
        30_000,
        fmt=",.0f",
        spread=_decode_span(64, 1024, per_second=True),
    ),
    Claim(
        "FP8 weights, batch-1 decode, context 1,024 (the H200's target: <= 0.50)",
        "engine_variants.json",
        _engine_variant_ms("fp8", 1),
        "ms/token",
        fmt=".3g",
    ),
    Claim(
        "bf16 weights, batch-1 decode, context 1,024, the same run",
        "engine_variants.json",
        _engine_variant_ms("bf16", 1),
        "ms/token",
        fmt=".3g",
    ),
    Claim(
        "structured output's cost per token, batch 64",
        "structured_cost.json",
        _structured_overhead(64),
        "% over free decoding",
        5.0,
        higher_is_better=False,
        fmt=".3g",
    ),
    Claim(
        "offline throughput (2,000 requests)",
        "offline_throughput.json",
        _offline,
        "output tok/s",
        30_000,
        fmt=",.0f",
        root=True,
        spread=_offline_span,
    ),
    Claim(
        "paged decode kernel, worst shape (batch 64/256, context >= 8k)",
        "decode_attention.json",
        _decode_kernel_share,
        "% of copy bandwidth",
        80.0,
        fmt=".1f",
        root=True,
    ),
    Claim(
        "prefix caching's cost when nothing is shared",
        "prefix_caching.json",
        _prefix_overhead,
        "% wall time",
        2.0,
        higher_is_better=False,
        fmt=".2f",
        spread=_prefix_span,
    ),
    Claim(
        "speculative decoding, batch 1, draft model, best k",
        "spec_decode.json",
        _spec_speedup,
        "x without speculation",
        2.0,
        fmt=".2f",
        root=True,
        spread=_spec_span,
    ),
    Claim(
        "serving: highest offered rate meeting the SLO",
        "serving.json",
        _serving_rate,
        "requests/s",
        fmt=".0f",
    ),
]
