"""Prometheus metrics of one server, in a registry of its own (a process may run several).

Latency histograms are observed per request when it finishes (`observe_request`); gauges and
counters follow the engine's own numbers (`update_engine`, called with `LLMEngine.stats()` on
the engine thread after every loop turn). The engine's counts are cumulative, so the counters
advance by the difference since the last update.

Speculative decoding reports two cumulative numbers in `stats()`: `spec_proposed_tokens` (draft
tokens verified by the target model) and `spec_accepted_tokens` (of those, accepted); the two
counters below follow them, and the acceptance rate is the ratio of their rates.
"""

from __future__ import annotations

import threading

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 60, 120)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.5, 1, 2.5)

# engine stats key -> counter attribute (cumulative in the engine)
_COUNTED = {
    "num_preemptions": "preemptions",
    "prefix_cache_queries": "prefix_cache_queries",
    "prefix_cache_hits": "prefix_cache_hits",
    "prefill_tokens_computed": "prompt_tokens_computed",
    "spec_proposed_tokens": "spec_decode_draft_tokens",
    "spec_accepted_tokens": "spec_decode_accepted_tokens",
}


class ServerMetrics:
    """The metrics of one served model. `render()` gives the Prometheus text exposition."""

    def __init__(self, model_name: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r, name = self.registry, ["model_name"]
        self.model_name = model_name

        def hist(metric: str, doc: str, buckets) -> Histogram:
            return Histogram(metric, doc, name, buckets=buckets, registry=r).labels(model_name)

        def gauge(metric: str, doc: str) -> Gauge:
            return Gauge(metric, doc, name, registry=r).labels(model_name)

        def counter(metric: str, doc: str) -> Counter:
            return Counter(metric, doc, name, registry=r).labels(model_name)

        self.ttft = hist(
            "llm_time_to_first_token_seconds",
            "Arrival to first generated token.",
            _LATENCY_BUCKETS,
        )
        self.tpot = hist(
            "llm_time_per_output_token_seconds",
            "Mean time between output tokens after the first, per request.",
            _TPOT_BUCKETS,
        )
        self.e2e = hist(
            "llm_e2e_request_latency_seconds", "Arrival to last token.", _LATENCY_BUCKETS
        )
        self.running = gauge("llm_num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("llm_num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_cache_usage = gauge(
            "llm_kv_cache_usage_ratio", "Share of KV-cache blocks in use (0 to 1)."
        )
        self.preemptions = counter("llm_num_preemptions", "Sequences preempted (recomputed).")
        self.prefix_cache_queries = counter(
            "llm_prefix_cache_queries", "Prompt tokens looked up in the prefix cache."
        )
        self.prefix_cache_hits = counter(
            "llm_prefix_cache_hits", "Prompt tokens found in the prefix cache."
        )
        self.prompt_tokens_computed = counter(
            "llm_prompt_tokens_computed", "Prompt tokens run through the model (prefill)."
        )
        self.prompt_tokens = counter("llm_prompt_tokens", "Prompt tokens of finished requests.")
        self.generation_tokens = counter(
            "llm_generation_tokens", "Tokens generated for finished requests (aborted included)."
        )
        self.spec_decode_draft_tokens = counter(
            "llm_spec_decode_num_draft_tokens", "Draft tokens proposed by speculative decoding."
        )
        self.spec_decode_accepted_tokens = counter(
            "llm_spec_decode_num_accepted_tokens", "Draft tokens accepted by the target model."
        )
        self._finished = Counter(
            "llm_request_success",
            "Requests finished, by finish reason (stop, length, abort).",
            ["model_name", "finish_reason"],
            registry=r,
        )
        self.rejected = counter(
            "llm_request_rejected", "Requests refused because the waiting queue was full."
        )
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def observe_request(
        self,
        finish_reason: str,
        ttft_s: float | None,
        tpot_s: float | None,
        e2e_s: float,
        prompt_tokens: int = 0,
        output_tokens: int = 0,
    ) -> None:
        self._finished.labels(self.model_name, finish_reason).inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(output_tokens)
        if ttft_s is not None:
            self.ttft.observe(ttft_s)
        if tpot_s is not None:
            self.tpot.observe(tpot_s)
        self.e2e.observe(e2e_s)

    def update_engine(self, stats: dict) -> None:
        """Follow `LLMEngine.stats()`: gauges set, counters advanced by what is new."""
        self.running.set(stats.get("running", 0))
        self.waiting.set(stats.get("waiting", 0))
        self.kv_cache_usage.set(stats.get("kv_cache_usage", 0.0))
        with self._lock:
            for key, attr in _COUNTED.items():
                if key not in stats:
                    continue
                value = float(stats[key])
                delta = value - self._last.get(key, 0.0)
                if delta > 0:
                    getattr(self, attr).inc(delta)
                self._last[key] = value

    def render(self) -> tuple[bytes, str]:
        """(body, content type) of the text exposition format."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
