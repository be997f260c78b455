"""The front page's claims: each headline figure, the record it comes from, and its target.

`make readme` renders these into the README's results table (`shared.front_page`). The decode
figures take the engine's faster configuration at each shape (one or several steps per host
round trip; the record holds both).
"""

from __future__ import annotations

from shared.front_page import Claim, spread_of


def _decode_ms(batch: int, context: int):
    def measure(rec: dict) -> float | None:
        from project04_llm_inference.report.render import _best, _latency_row

        ms, _, _ = _best(_latency_row({"decode_latency": rec}, batch, context))
        return ms

    return measure


def _decode_span(batch: int, context: int, per_second: bool = False):
    """The repetitions' range of the faster configuration's step time (or its tokens/s)."""

    def spread(rec: dict) -> tuple[float, float] | None:
        from project04_llm_inference.report.render import _best, _latency_row, _span

        row = _latency_row({"decode_latency": rec}, batch, context)
        _, _, key = _best(row)
        if not key:
            return None
        return _span(row, key, (lambda v: batch / v * 1e3) if per_second else (lambda v: v))

    return spread


def _decode_tok_s(batch: int, context: int):
    ms = _decode_ms(batch, context)

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


CLAIMS = [
    Claim(
        "batch-1 decode, context 1,024",
        "decode_latency.json",
        _decode_ms(1, 1024),
        "ms/token",
        0.80,
        higher_is_better=False,
        fmt=".3g",
        root=True,
        spread=_decode_span(1, 1024),
    ),
    Claim(
        "batch-1 decode, context 8,192",
        "decode_latency.json",
        _decode_ms(1, 8192),
        "ms/token",
        0.80,
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
        65_000,
        fmt=",.0f",
        spread=_decode_span(256, 1024, per_second=True),
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
