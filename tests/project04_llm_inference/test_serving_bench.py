"""The serving benchmark on the CPU: arrivals, the latency and goodput arithmetic, SSE parsing,
the loopback-only rule, and whole runs against a fake OpenAI-compatible server started here
(its own thread and event loop on 127.0.0.1, tokens at fixed times), including one that answers
503 and one that drops the connection mid-stream."""

from __future__ import annotations

import asyncio
import json
import math
import socket
import threading
import time

import numpy as np
import pytest

from project04_llm_inference.bench import serving
from project04_llm_inference.bench import serving_metrics as sm
from project04_llm_inference.bench.serving_client import (
    RequestResult,
    SSEParser,
    arrival_times,
    check_loopback,
    is_token_chunk,
    run_load,
)
from project04_llm_inference.bench.serving_launch import engine_flags
from project04_llm_inference.config import EngineArgs

aiohttp = pytest.importorskip("aiohttp")
from aiohttp import web  # noqa: E402

# Timing bounds of the fake server's streams. Lower bounds are exact (the server sleeps before it
# writes, and asyncio never wakes early), less 2 ms for clock granularity. Upper bounds add
# SLACK_S for scheduling: client and server share one process (and the GIL) on what may be a
# loaded 2-core CI runner.
EARLY_S = 0.002
SLACK_S = 1.0  # upper bounds only catch gross errors: a loaded 2-core CI machine can stall a read for long


# --- the fake server -------------------------------------------------------------------------


class FakeServer:
    """OpenAI-style streaming completions on 127.0.0.1: after `first_delay_s` one token per
    `gap_s`, `per_chunk` tokens per chunk, then a usage chunk and [DONE]. What a request gets
    is `behaviour(prompt)`: 'ok', '503', 'drop' (connection closed after 2 chunks), 'no_done'
    (a clean end without [DONE]) or 'hang'."""

    def __init__(
        self,
        *,
        first_delay_s=0.0,
        gap_s=0.0,
        per_chunk=1,
        usage=True,
        behaviour=lambda prompt: "ok",
    ):
        self.first_delay_s, self.gap_s, self.per_chunk, self.usage = (
            first_delay_s,
            gap_s,
            per_chunk,
            usage,
        )
        self.behaviour = behaviour
        self.bodies: list[dict] = []
        self.in_flight = self.peak_in_flight = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self):
        self._thread.start()
        assert self._ready.wait(10), "fake server did not start"
        return self

    def __exit__(self, *exc):
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self):
        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(self._main())

    async def _main(self):
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        runner = web.AppRunner(app, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = runner.addresses[0][1]
        self._stop = asyncio.Event()
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()

    async def _health(self, request):
        return web.Response(text="ok")

    async def _models(self, request):
        return web.json_response({"object": "list", "data": [{"id": "fake-model"}]})

    async def _completions(self, request):
        body = await request.json()
        self.bodies.append(body)
        what = self.behaviour(body["prompt"])
        if what == "503":
            return web.Response(status=503, text="server overloaded")
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            return await self._stream(request, body, what)
        finally:
            self.in_flight -= 1

    async def _stream(self, request, body, what):
        resp = web.StreamResponse()
        resp.content_type = "text/event-stream"
        await resp.prepare(request)
        n = body["max_tokens"]
        if what == "hang":  # until the server stops
            await self._stop.wait()
            return resp
        await asyncio.sleep(self.first_delay_s)
        for k in range(0, n, self.per_chunk):
            if k:
                await asyncio.sleep(self.gap_s * self.per_chunk)
            if what == "drop" and k >= 2 * self.per_chunk:
                request.transport.close()
                return resp
            last = k + self.per_chunk >= n
            chunk = {
                "id": "cmpl-1",
                "object": "text_completion",
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "text": " tok" * min(self.per_chunk, n - k),
                        "finish_reason": "length" if last else None,
                    }
                ],
            }
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        if self.usage:
            prompt = body["prompt"]
            usage = {
                "prompt_tokens": len(prompt),
                "completion_tokens": n,
                "total_tokens": len(prompt) + n,
            }
            await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        if what != "no_done":
            await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def _bodies(prompts_and_lens) -> list[tuple[dict, int]]:
    return [
        ({"model": "fake-model", "prompt": p, "max_tokens": m, "stream": True}, len(p))
        for p, m in prompts_and_lens
    ]


def _load(url, bodies, **kw):
    kw = {
        "request_rate": math.inf,
        "max_concurrency": 0,
        "seed": 0,
        "time_limit_s": 30.0,
        "request_timeout_s": 30.0,
        **kw,
    }
    return asyncio.run(run_load(url + "/v1/completions", bodies, **kw))


# --- arrivals --------------------------------------------------------------------------------


def test_poisson_arrivals_are_seeded_with_exponential_gaps():
    n, rate = 20_001, 10.0
    t = arrival_times(n, rate, seed=7)
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0)
    np.testing.assert_array_equal(t, arrival_times(n, rate, seed=7))
    assert not np.array_equal(t, arrival_times(n, rate, seed=8))
    gaps = np.diff(t)
    # Exponential gaps of mean 1/rate have standard deviation 1/rate, so the mean of 20,000 has
    # standard error (1/rate)/sqrt(20,000) = 0.71% of the mean: 5 standard errors is 3.5%.
    assert abs(gaps.mean() * rate - 1) < 5 / math.sqrt(n - 1)
    # Their variance is 1/rate^2; the sample variance's relative standard error is sqrt(8/n)
    # (fourth central moment 9/rate^4), 2.0% here: 5 of them is 10%. Evenly spaced gaps, with
    # the right mean and no variance, fail this check.
    tol = 5 * math.sqrt(8 / (n - 1))
    assert abs(gaps.var() * rate**2 - 1) < tol
    assert abs(np.full(n - 1, 1 / rate).var() * rate**2 - 1) > tol
    # The Poisson property: counts in 1-s windows have variance equal to their mean (rate).
    counts = np.bincount(t.astype(int))[:-1]
    assert abs(counts.var() / counts.mean() - 1) < 5 * math.sqrt(2 / len(counts))


def test_rate_inf_sends_all_at_once_and_bad_rates_are_refused():
    np.testing.assert_array_equal(arrival_times(5, math.inf, 0), np.zeros(5))
    for bad in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError):
            arrival_times(5, bad, 0)


# --- arithmetic ------------------------------------------------------------------------------


def _result(i, ttft, e2e, out, ok=True, itl=(), prompt=10):
    return RequestResult(
        index=i,
        ok=ok,
        ttft_s=ttft,
        e2e_s=e2e,
        output_tokens=out,
        itl_s=list(itl),
        prompt_tokens=prompt,
        output_tokens_from="usage",
    )


def test_percentiles_are_linear_interpolation_in_ms():
    d = sm.distribution([0.1 * k for k in range(1, 11)])  # 100 ... 1,000 ms
    # position p/100 * (n - 1) between order statistics: p90 -> 8.1 -> 900 + 0.1 * 100
    assert d["n"] == 10
    assert d["mean_ms"] == pytest.approx(550)
    assert d["p50_ms"] == pytest.approx(550)
    assert d["p90_ms"] == pytest.approx(910)
    assert d["p99_ms"] == pytest.approx(991)
    assert sm.distribution([])["p99_ms"] is None


def test_summary_tpot_goodput_and_failures():
    # Times at a target are binary fractions (0.5 s, 0.0625 s), so "at the target" is exact.
    slo = sm.SLO(ttft_ms=500, tpot_ms=62.5)
    results = [
        _result(0, 0.2, 0.2 + 9 * 0.04, 10, itl=[0.04] * 9),  # TPOT 40 ms: good
        _result(1, 0.5, 0.5 + 4 * 0.0625, 5, itl=[0.0625] * 4),  # both at the target: good
        _result(2, 0.3, 0.3 + 9 * 0.07, 10, itl=[0.07] * 9),  # TPOT 70 ms: misses
        _result(3, 0.6, 0.6 + 9 * 0.01, 10, itl=[0.01] * 9),  # TTFT 600 ms: misses
        _result(4, 0.1, 0.1, 1),  # one token: no TPOT, judged on TTFT alone: good
        RequestResult(index=5, error="HTTP 503: overloaded", status=503),
        RequestResult(index=6, error="HTTP 503: overloaded", status=503),
        None,  # never sent (time limit)
    ]
    s = sm.summarize(results, duration_s=2.0, slo=slo)
    assert (s["requests"], s["sent"], s["completed"], s["failed"], s["not_sent"]) == (8, 7, 5, 2, 1)
    assert s["request_throughput"] == pytest.approx(2.5)
    assert s["output_tokens"] == 36 and s["output_tok_s"] == pytest.approx(18)
    assert s["prompt_tokens"] == 50 and s["total_tok_s"] == pytest.approx(43)
    assert s["good"] == 3 and s["goodput_req_s"] == pytest.approx(1.5)
    assert s["slo_attainment"] == pytest.approx(3 / 8)
    assert s["tpot"]["n"] == 4 and s["tpot"]["mean_ms"] == pytest.approx((40 + 62.5 + 70 + 10) / 4)
    assert s["ttft"]["p50_ms"] == pytest.approx(300)
    assert s["itl"]["n"] == 31
    assert s["errors"] == [{"error": "HTTP 503: overloaded", "count": 2}]
    # the same timings under tighter targets: the request at the targets drops out
    assert sm.summarize(results, 2.0, sm.SLO(500, 60))["good"] == 2
    assert sm.summarize(results, 2.0, sm.SLO(499, 62.5))["good"] == 2
    # an end-to-end target counts too (E2E 560, 750 and 100 ms)
    assert sm.summarize(results, 2.0, sm.SLO(500, 62.5, e2e_ms=500))["good"] == 1


def test_sweep_verdicts_and_offline_ratio():
    def run(rate, met, thr=1.0, **kw):
        return {
            "request_rate": sm.rate_label(rate),
            "slo_met": met,
            "request_throughput": thr,
            "goodput_req_s": thr,
            **kw,
        }

    runs = [run(8, True), run(1, True), run(4, False), run(2, True, 2.0)]  # 8: a lucky pass
    assert sm.max_rate_meeting_slo(runs) == {
        "request_rate": "2",
        "request_throughput": 2.0,
        "goodput_req_s": 2.0,
    }
    assert sm.max_rate_meeting_slo([run(1, False)])["request_rate"] is None
    assert sm.max_rate_meeting_slo([run(math.inf, True), run(1, True)])["request_rate"] == "inf"
    closed = run(math.inf, False, closed_loop=True)  # a client-count run offers no rate
    assert sm.max_rate_meeting_slo([run(1, True), closed])["request_rate"] == "1"
    base = {"failed": 0, "not_sent": 0, "slo_attainment": 0.95, "request_throughput": 3.0}
    assert sm.mark_run(base, 4.0, 0.9) | {} == {**base, "slo_met": True, "saturated": True}
    assert not sm.mark_run(base, 3.2, 0.9)["saturated"]
    assert not sm.mark_run({**base, "failed": 1}, 3.0, 0.9)["slo_met"]
    assert not sm.mark_run(base, 3.0, 0.99)["slo_met"]
    c = sm.offline_ceiling(9_000.0, 10_000.0)
    assert c["serving_vs_offline"] == pytest.approx(0.9) and c["overhead_pct"] == pytest.approx(10)
    assert sm.offline_ceiling(None, 10_000.0)["overhead_pct"] is None


# --- server-sent events ----------------------------------------------------------------------

STREAM = (
    b": keep-alive comment\r\n\r\n"
    b'data: {"choices":[{"index":0,"text":"h\xc3\xa9","finish_reason":null}]}\n\n'
    b"event: message\nid: 2\n"
    b'data: {"choices":[{"index":0,"text":" \xe2\x82\xac",\r\n'
    b'data: "finish_reason":"length"}]}\r\n\r\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}\n\n'
    b"data: [DONE]\n\n"
)
EVENTS = [
    '{"choices":[{"index":0,"text":"hé","finish_reason":null}]}',
    '{"choices":[{"index":0,"text":" €",\n"finish_reason":"length"}]}',
    '{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}',
    "[DONE]",
]


def _parse_in_pieces(data: bytes, cuts) -> list[str]:
    p, out, prev = SSEParser(), [], 0
    for c in [*cuts, len(data)]:
        out += p.feed(data[prev:c])
        prev = c
    return out + p.close()


def test_sse_events_survive_any_split_across_reads():
    assert _parse_in_pieces(STREAM, []) == EVENTS
    assert _parse_in_pieces(STREAM, range(1, len(STREAM))) == EVENTS  # one byte per read
    rng = np.random.default_rng(0)
    for _ in range(50):
        cuts = sorted(rng.choice(np.arange(1, len(STREAM)), size=6, replace=False).tolist())
        assert _parse_in_pieces(STREAM, cuts) == EVENTS
    # a cut inside the two bytes of "é" still decodes it whole
    i = STREAM.index(b"\xc3")
    assert _parse_in_pieces(STREAM, [i + 1]) == EVENTS


def test_sse_end_of_stream():
    p = SSEParser()
    assert p.feed(b"data: [DONE]\n") == []  # no blank line yet
    assert p.close() == ["[DONE]"]  # complete data line at the end: kept
    p = SSEParser()
    assert p.feed(b'data: {"choi') == [] and p.close() == []  # truncated line: dropped


def test_token_chunks():
    text = lambda t, fr=None: {"choices": [{"index": 0, "text": t, "finish_reason": fr}]}  # noqa: E731
    assert is_token_chunk(text("a")) and is_token_chunk(text("a", "stop"))
    assert is_token_chunk(text(""))  # a server without a tokenizer: empty text per token
    assert not is_token_chunk(text("", "length"))  # closing chunk, finish reason only
    assert not is_token_chunk({"choices": [], "usage": {"completion_tokens": 3}})
    delta = lambda d, fr=None: {"choices": [{"index": 0, "delta": d, "finish_reason": fr}]}  # noqa: E731
    assert not is_token_chunk(delta({"role": "assistant", "content": ""}))
    assert is_token_chunk(delta({"content": "hi"}))
    assert not is_token_chunk(delta({}, "stop"))


# --- targets ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000",
        "http://127.9.8.7:1/",
        "http://[::1]:9",
        "http://LocalHost:8000",
        "https://localhost",
    ],
)
def test_loopback_targets_are_accepted(url):
    assert check_loopback(url) == url.rstrip("/")


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.1:8000",
        "http://example.com",
        "http://128.0.0.1",
        "http://0.0.0.0:8000",
        "http://[::2]:80",
        "http://[::ffff:7f00:1]",
        "http://127.0.0.1@example.com",
        "http://localhost.example.com",
        "http://127.1",
        "ftp://127.0.0.1",
        "127.0.0.1:8000",
    ],
)
def test_other_targets_are_refused(url):
    with pytest.raises(ValueError, match="base_url"):
        check_loopback(url)
    with pytest.raises(ValueError, match="base_url"):
        serving.ServingBenchConfig(base_url=url)


def test_config_refuses_bad_input(tmp_path):
    for kw in (
        {"request_rates": (1.0, math.nan)},
        {"request_rates": ()},
        {"num_prompts": 0},
        {"num_prompts": 10**6},
        {"time_limit_s": math.inf},
        {"prompt_len": (5, 2)},
        {"slo_attainment": 0.0},
        {"endpoint": "/v1/chat/completions"},
        {"launch": True, "base_url": "http://127.0.0.1"},
    ):
        with pytest.raises(ValueError):
            serving.ServingBenchConfig(**kw)
    with pytest.raises(FileNotFoundError):
        serving.ServingBenchConfig(dataset_path=str(tmp_path / "missing.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": [1, 2], "max_tokens": 4}\n{"prompt": "x"}\n')
    with pytest.raises(ValueError, match="line 2"):
        serving.load_jsonl(str(bad), 10)


def test_engine_flags_pass_what_differs_from_the_defaults():
    flags = engine_flags(
        EngineArgs(
            load_format="dummy",
            dummy_shape="tiny",
            enforce_eager=True,
            enable_prefix_caching=False,
            num_gpu_blocks=64,
        )
    )
    assert flags == [
        "--engine.load-format",
        "dummy",
        "--engine.dummy-shape",
        "tiny",
        "--engine.num-gpu-blocks",
        "64",
        "--engine.no-enable-prefix-caching",
        "--engine.enforce-eager",
    ]


# --- against the fake server -----------------------------------------------------------------


def test_stream_timing_against_a_server_with_fixed_token_times():
    first, gap, n = 0.10, 0.03, 6
    with FakeServer(first_delay_s=first, gap_s=gap) as srv:
        load = _load(srv.base_url, _bodies([([1, 2, 3], n)] * 8))
    s = sm.summarize(load.results, load.duration_s, sm.SLO())
    assert s["completed"] == 8 and s["failed"] == 0 and not load.time_limited
    for r in load.results:
        assert r.ok and r.output_tokens == n and r.output_tokens_from == "usage"
        assert r.token_events == n and len(r.itl_s) == n - 1 and r.prompt_tokens == 3
        assert first - EARLY_S <= r.ttft_s <= first + SLACK_S
        assert first + (n - 1) * gap - EARLY_S <= r.e2e_s <= first + (n - 1) * gap + SLACK_S
    # A gap reads short only after a late read of the token before it; most are on time.
    assert gap / 2 <= s["itl"]["p50_ms"] / 1e3 <= gap + SLACK_S / 5
    assert gap / 2 <= s["tpot"]["p50_ms"] / 1e3 <= gap + SLACK_S / 5
    assert s["output_tokens"] == 8 * n


def test_usage_counts_tokens_when_chunks_carry_several():
    with FakeServer(per_chunk=3) as srv:
        r = _load(srv.base_url, _bodies([([5], 9)])).results[0]
    assert r.ok and r.token_events == 3 and r.output_tokens == 9 and r.output_tokens_from == "usage"
    with FakeServer(usage=False) as srv:
        r = _load(srv.base_url, _bodies([([5], 4)])).results[0]
    assert r.ok and r.output_tokens == 4 and r.output_tokens_from == "chunks"
    assert r.prompt_tokens == 1  # the length of the token-id prompt when no usage came


def test_503_dropped_and_unfinished_streams_are_failures_not_crashes():
    kinds = {0: "ok", 1: "503", 2: "drop", 3: "no_done"}
    with FakeServer(gap_s=0.005, behaviour=lambda p: kinds[p[0] % 4]) as srv:
        load = _load(srv.base_url, _bodies([([i], 6) for i in range(8)]))
    by_kind = {k: [r for r in load.results if kinds[r.index % 4] == k] for k in kinds.values()}
    assert all(r.ok for r in by_kind["ok"])
    assert all(
        not r.ok and r.status == 503 and "server overloaded" in r.error for r in by_kind["503"]
    )
    assert all(
        not r.ok and r.token_events == 2 and ("Payload" in r.error or "Disconnect" in r.error)
        for r in by_kind["drop"]
    )  # died after 2 tokens
    assert all(not r.ok and "[DONE]" in r.error for r in by_kind["no_done"])
    s = sm.summarize(load.results, load.duration_s, sm.SLO())
    assert s["completed"] == 2 and s["failed"] == 6 and s["output_tokens"] == 12


def test_connection_refused_is_a_failure():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    load = _load(f"http://127.0.0.1:{port}", _bodies([([1], 2)] * 3))
    assert all(not r.ok and "Connect" in r.error for r in load.results)


def test_arrivals_follow_the_schedule_and_concurrency_caps_flight():
    with FakeServer() as srv:
        load = _load(
            srv.base_url, _bodies([([i], 2) for i in range(20)]), request_rate=40.0, seed=3
        )
    want = arrival_times(20, 40.0, seed=3)
    got = np.array([r.start_s for r in load.results])
    assert np.all(got >= want - EARLY_S) and np.all(got <= want + SLACK_S)
    with FakeServer(first_delay_s=0.05) as srv:  # closed loop: 2 clients, 8 requests
        load = _load(srv.base_url, _bodies([([i], 2) for i in range(8)]), max_concurrency=2)
    assert all(r.ok for r in load.results) and srv.peak_in_flight == 2
    assert load.duration_s >= 4 * 0.05 - EARLY_S  # 4 rounds of 2


def test_time_limit_ends_a_run_with_failures_and_unsent_requests():
    with FakeServer(behaviour=lambda p: "hang") as srv:
        t0 = time.perf_counter()
        load = _load(
            srv.base_url, _bodies([([i], 2) for i in range(10)]), request_rate=4.0, time_limit_s=0.6
        )
        wall = time.perf_counter() - t0
    s = sm.summarize(load.results, load.duration_s, sm.SLO())
    assert load.time_limited and wall < 0.6 + 2.0
    assert s["completed"] == 0 and s["failed"] >= 1 and s["not_sent"] >= 1
    assert s["failed"] + s["not_sent"] == 10
    assert all("time limit" in r.error for r in load.results if r is not None)


def _offline_record(path, tok_s):
    path.write_text(
        json.dumps(
            {
                "environment": {},
                "results": {"engine": {"output_tok_s": tok_s}},
                "config": {
                    "num_requests": 12,
                    "prompt_len": [4, 8],
                    "output_len": [3, 5],
                    "seed": 1,
                },
            }
        )
    )
    return str(path)


def test_run_writes_a_record_chart_and_offline_ratio(tmp_path):
    with FakeServer(gap_s=0.002) as srv:
        cfg = serving.ServingBenchConfig(
            base_url=srv.base_url,
            num_prompts=12,
            prompt_len=(4, 8),
            output_len=(3, 5),
            vocab_size=256,
            seed=0,
            request_rates=(math.inf, 50.0),
            progress=False,
            offline_record=_offline_record(tmp_path / "offline_throughput.json", 1e9),
            reports_dir=str(tmp_path / "out"),
            time_limit_s=60,
        )
        res = serving.run(cfg)
    folder = tmp_path / "out" / "project04_llm_inference"
    rec = json.loads((folder / "serving.json").read_text())
    assert rec["results"]["runs"][1]["request_rate"] == "inf" and rec["environment"]["python"]
    assert all(isinstance(rec["environment"]["gpu_state"][k], dict) for k in ("start", "end"))
    assert (folder / "serving.png").stat().st_size > 0
    assert rec["config"]["request_rates"] == ["inf", "50"]
    assert srv.bodies[0]["model"] == "fake-model"  # from /v1/models
    assert all(
        b["ignore_eos"] and b["stream"] and b["stream_options"]["include_usage"] for b in srv.bodies
    )
    assert len(srv.bodies) == 2 + 2 * 12  # warm-up, then each run
    max_tokens = res["workload"]["max_tokens_total"]
    for r in res["runs"]:
        assert r["completed"] == 12 and r["output_tokens"] == max_tokens
        assert r["prompt_tokens"] == res["workload"]["prompt_tokens"]
        assert len(r["per_request"]) == 12
    off = res["offline"]
    assert off["serving_run"] == "inf" and off["overhead_pct"] > 99  # the ceiling is 1e9 tok/s
    assert off["workload_differences"] == {"seed": {"serving": 0, "offline": 1}}
    assert res["max_rate_meeting_slo"]["request_rate"] == "inf"


def test_closed_loop_sweep_and_the_chart_from_the_record_alone(tmp_path):
    from project04_llm_inference.bench.serving_chart import serving_chart

    with FakeServer(first_delay_s=0.02) as srv:
        res = serving.run(
            serving.ServingBenchConfig(
                base_url=srv.base_url,
                num_prompts=6,
                prompt_len=(2, 3),
                output_len=(2, 3),
                vocab_size=256,
                concurrencies=(3, 1),
                warmup_requests=0,
                progress=False,
                reports_dir=str(tmp_path / "out"),
                name="closed",
            )
        )
    assert [(r["max_concurrency"], r["closed_loop"], r["completed"]) for r in res["runs"]] == [
        (1, True, 6),
        (3, True, 6),
    ]
    assert res["max_rate_meeting_slo"]["request_rate"] is None  # no offered rate in a closed loop
    rec = json.loads((tmp_path / "out" / "project04_llm_inference" / "closed.json").read_text())
    png = serving_chart(rec["results"], tmp_path / "again.png")
    assert png.stat().st_size > 0


def test_command_line_refuses_a_remote_target_without_a_traceback(capsys):
    with pytest.raises(SystemExit) as e:
        serving.main(["--base-url", "http://192.0.2.1:8000"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    words = " ".join(err.replace("\u2502", " ").split())  # tyro's box, unwrapped
    assert "base_url: host '192.0.2.1' is not a loopback address" in words
    assert "Traceback" not in err


def test_run_with_failing_requests_misses_the_slo(tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": [i, 7], "max_tokens": 3}) + "\n" for i in range(8))
    )
    with FakeServer(behaviour=lambda p: "503" if p[0] % 2 else "ok") as srv:
        res = serving.run(
            serving.ServingBenchConfig(
                base_url=srv.base_url,
                dataset_path=str(data),
                num_prompts=100,
                request_rates=(100.0,),
                progress=False,
                reports_dir=str(tmp_path / "out"),
                model="m",
                save_requests=False,
            )
        )
    (r,) = res["runs"]
    assert r["requests"] == 8 and r["completed"] == 4 and r["failed"] == 4
    assert r["errors"][0]["error"].startswith("HTTP 503") and not r["slo_met"]
    assert res["max_rate_meeting_slo"]["request_rate"] is None
    assert "per_request" not in r and srv.bodies[0]["model"] == "m"


def test_a_server_failing_every_warm_up_stops_the_run(tmp_path):
    with (
        FakeServer(behaviour=lambda p: "503") as srv,
        pytest.raises(serving.ServerError, match="503"),
    ):
        serving.run(
            serving.ServingBenchConfig(
                base_url=srv.base_url,
                num_prompts=4,
                prompt_len=(2, 2),
                output_len=(2, 2),
                vocab_size=256,
                progress=False,
                reports_dir=str(tmp_path / "out"),
            )
        )
    assert not (tmp_path / "out" / "project04_llm_inference" / "serving.json").exists()


# --- against the project's own server --------------------------------------------------------


def test_launch_refuses_a_taken_port(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        cfg = serving.ServingBenchConfig(
            base_url=f"http://127.0.0.1:{s.getsockname()[1]}",
            launch=True,
            num_prompts=2,
            prompt_len=(2, 2),
            output_len=(2, 2),
            vocab_size=256,
            progress=False,
            reports_dir=str(tmp_path / "out"),
        )
        with pytest.raises(ValueError, match="taken"):
            serving.run(cfg)


@pytest.mark.slow
def test_launched_project_server_with_the_tiny_dummy_model(tmp_path, monkeypatch):
    pytest.importorskip("project04_llm_inference.server.api")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # inherited by the server: a 2-core runner
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = serving.ServingBenchConfig(
        base_url=f"http://127.0.0.1:{port}",
        launch=True,
        launch_timeout_s=120,
        engine=EngineArgs(load_format="dummy", dummy_shape="tiny", device="cpu"),
        num_prompts=6,
        prompt_len=(4, 12),
        output_len=(3, 6),
        vocab_size=256,
        request_rates=(math.inf,),
        return_token_ids=True,
        progress=False,
        time_limit_s=120,
        reports_dir=str(tmp_path / "out"),
    )
    res = serving.run(cfg)
    assert res["target"]["server_exit_code"] == 0  # stopped by SIGTERM, cleanly
    assert res["target"]["launched"][:4] == ["python", "-m", "project04_llm_inference", "serve"]
    (run,) = res["runs"]
    assert run["completed"] == 6 and run["failed"] == 0, run["errors"]
    assert run["output_tokens"] == res["workload"]["max_tokens_total"]  # ignore_eos honoured
    assert run["prompt_tokens"] == res["workload"]["prompt_tokens"]
    for r in run["per_request"]:  # token ids in every chunk: one token event per token
        assert r["token_events"] == r["output_tokens"] and 0 < r["ttft_s"] <= r["e2e_s"]


def test_offline_ceiling_is_the_same_engine_configuration(tmp_path):
    """A launched server is compared with the offline run of its own num_scheduler_steps when
    the record holds the engine with and without multi-step decoding."""
    path = tmp_path / "offline_throughput.json"
    path.write_text(
        json.dumps(
            {
                "environment": {},
                "config": {},
                "results": {
                    "engine": {"output_tok_s": 26_000.0, "num_scheduler_steps": 8},
                    "engine_single_step": {"output_tok_s": 20_000.0, "num_scheduler_steps": 1},
                },
            }
        )
    )
    runs = [{"request_rate": "inf", "max_concurrency": None, "output_tok_s": 18_000.0}]
    for k, key, tok_s in ((1, "engine_single_step", 20_000.0), (8, "engine", 26_000.0)):
        cfg = serving.ServingBenchConfig(
            launch=True,
            offline_record=str(path),
            progress=False,
            engine=EngineArgs(load_format="dummy", num_scheduler_steps=k),
        )
        out = serving.compare_offline(cfg, runs)
        assert out["offline_system"] == key and out["offline_output_tok_s"] == tok_s
    cfg = serving.ServingBenchConfig(base_url="http://127.0.0.1:1", offline_record=str(path))
    assert serving.compare_offline(cfg, runs)["offline_system"] == "engine"  # not launched here
