"""The serving benchmark's arithmetic: per-request timings in, one summary per run out.

Definitions (the ones vLLM's serving benchmark uses, so figures compare):
- TTFT: from sending the request to the first token event of its stream.
- TPOT: (end to end - TTFT) / (output tokens - 1), one value per request with 2+ output tokens.
- ITL: every gap between two token events of a stream, pooled over requests (a chunk that
  carries several tokens makes one gap, so ITL and TPOT differ when the server batches text).
- E2E: from sending the request to the end of its stream.
- Percentiles interpolate linearly between order statistics (numpy's default), in ms.
- Rates are over the run's wall time, first send to last finish: request throughput (completed
  requests/s), output tok/s, total tok/s (prompt + output), and goodput: requests/s that completed
  *and* met every SLO target.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from .serving_client import RequestResult

PERCENTILES = (50, 90, 99)
SATURATION_SHARE = 0.9  # a finite rate is saturated when under 90% of it completes per second


@dataclass(frozen=True)
class SLO:
    """Per-request targets, ms; e2e_ms 0 means no end-to-end target."""

    ttft_ms: float = 500.0
    tpot_ms: float = 50.0
    e2e_ms: float = 0.0


def distribution(values_s: list[float]) -> dict:
    """Mean and percentiles of durations given in seconds, reported in ms (None when empty)."""
    if not values_s:
        return {"n": 0, "mean_ms": None, **{f"p{p}_ms": None for p in PERCENTILES}}
    ms = np.asarray(values_s, dtype=float) * 1e3
    return {
        "n": len(ms),
        "mean_ms": float(ms.mean()),
        **{f"p{p}_ms": float(np.percentile(ms, p)) for p in PERCENTILES},
    }


def tpot_s(r: RequestResult) -> float | None:
    """Time per output token after the first, s; None below 2 output tokens."""
    if r.e2e_s is None or r.ttft_s is None or r.output_tokens < 2:
        return None
    return (r.e2e_s - r.ttft_s) / (r.output_tokens - 1)


def meets_slo(r: RequestResult, slo: SLO) -> bool:
    """A completed request within every target (no TPOT target applies to a 1-token output)."""
    if not r.ok or r.ttft_s is None or r.ttft_s * 1e3 > slo.ttft_ms:
        return False
    t = tpot_s(r)
    if t is not None and t * 1e3 > slo.tpot_ms:
        return False
    return not (slo.e2e_ms > 0 and (r.e2e_s is None or r.e2e_s * 1e3 > slo.e2e_ms))


def summarize(results: list[RequestResult | None], duration_s: float, slo: SLO) -> dict:
    """One run's summary: counts, rates, latency distributions, goodput, the commonest errors.
    `results` has None for requests never sent (a run ended by its time limit)."""
    if not duration_s > 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    sent = [r for r in results if r is not None]
    ok = [r for r in sent if r.ok]
    good = [r for r in ok if meets_slo(r, slo)]
    out_tokens = sum(r.output_tokens for r in ok)
    prompt_known = all(r.prompt_tokens is not None for r in ok)
    prompt_tokens = sum(r.prompt_tokens for r in ok) if prompt_known else None
    errors = Counter(r.error for r in sent if not r.ok)
    return {
        "requests": len(results),
        "sent": len(sent),
        "completed": len(ok),
        "failed": len(sent) - len(ok),
        "not_sent": len(results) - len(sent),
        "duration_s": duration_s,
        "request_throughput": len(ok) / duration_s,  # completed requests/s
        "output_tokens": out_tokens,
        "prompt_tokens": prompt_tokens,
        "output_tok_s": out_tokens / duration_s,
        "total_tok_s": (prompt_tokens + out_tokens) / duration_s if prompt_known else None,
        "ttft": distribution([r.ttft_s for r in ok]),
        "tpot": distribution([t for r in ok if (t := tpot_s(r)) is not None]),
        "itl": distribution([g for r in ok for g in r.itl_s]),
        "e2e": distribution([r.e2e_s for r in ok]),
        "good": len(good),
        "goodput_req_s": len(good) / duration_s,
        "slo_attainment": len(good) / len(results) if results else None,  # of all requests
        "output_tokens_from_usage": sum(r.output_tokens_from == "usage" for r in ok),
        "errors": [{"error": e, "count": n} for e, n in errors.most_common(5)],
    }


# --- a sweep ---------------------------------------------------------------------------------


def rate_label(rate: float) -> str:
    return "inf" if math.isinf(rate) else f"{rate:g}"


def mark_run(summary: dict, rate: float, attainment: float) -> dict:
    """Add to a run's summary whether it met the SLO (no failure, nothing left unsent, and at
    least `attainment` of its requests within every target) and whether it saturated (a finite
    offered rate of which under 90% completed per second)."""
    met = (
        summary["failed"] == 0
        and summary["not_sent"] == 0
        and (summary["slo_attainment"] or 0.0) >= attainment
    )
    saturated = (not math.isinf(rate)) and summary["request_throughput"] < SATURATION_SHARE * rate
    return {**summary, "slo_met": met, "saturated": saturated}


def max_rate_meeting_slo(runs: list[dict]) -> dict:
    """The highest offered rate below which every rate of the sweep met the SLO: rates are taken
    in increasing order and the first miss ends the climb (a lucky pass above a miss does not
    count). Runs are dicts with `request_rate` (a number or 'inf'), `slo_met` and the rates;
    closed-loop runs (`closed_loop`) offer no rate and are left out."""
    best = None
    rated = [r for r in runs if not r.get("closed_loop")]
    for r in sorted(rated, key=lambda r: float(r["request_rate"])):
        if not r["slo_met"]:
            break
        best = r
    if best is None:
        return {"request_rate": None, "request_throughput": None, "goodput_req_s": None}
    return {
        "request_rate": best["request_rate"],
        "request_throughput": best["request_throughput"],
        "goodput_req_s": best["goodput_req_s"],
    }


def offline_ceiling(serving_tok_s: float | None, offline_tok_s: float | None) -> dict:
    """Serving output tok/s over the offline engine's on the same kind of workload, and the
    difference as the cost of HTTP, streaming and arrivals, % of the offline rate."""
    if not serving_tok_s or not offline_tok_s:
        return {"serving_vs_offline": None, "overhead_pct": None}
    ratio = serving_tok_s / offline_tok_s
    return {"serving_vs_offline": ratio, "overhead_pct": (1.0 - ratio) * 100.0}
