"""The load generator's client side: streaming requests to an OpenAI-compatible server.

- `check_loopback`: the only targets allowed are on this machine (see its docstring for why).
- `SSEParser`: an incremental `text/event-stream` parser fed with raw network reads, so an event
  split across reads, or several events in one read, come out whole and in order.
- `send_request`: one streamed request, timed as its bytes arrive: time to first token, the gap
  before each later token event, end to end, output tokens (from the final usage chunk, else
  counted), and success or failure with the reason. Never raises for what the server does.
- `arrival_times` and `run_load`: Poisson arrivals at a rate (seeded exponential gaps), all at once
  (rate inf), optionally capped at N requests in flight (rate inf with a cap is N clients in a
  closed loop), under a time limit.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import numpy as np

ERROR_BODY_CHARS = 300  # how much of a failed response's body a result keeps


# --- targets ---------------------------------------------------------------------------------


def is_loopback_host(host: str) -> bool:
    """True for `localhost`, 127.0.0.0/8 and ::1 (literal addresses; no name is resolved)."""
    if host.lower() == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    if ip.version == 4:
        return ip in ipaddress.ip_network("127.0.0.0/8")
    return ip == ipaddress.ip_address("::1")


def check_loopback(base_url: str) -> str:
    """`base_url` without its trailing slash when its host is a loopback address; else ValueError.

    This is a load tool: it sends as many requests as it is told, as fast as it is told, and
    pointed at a server on another machine it would be a way to flood that machine. A serving
    benchmark only needs a server on this one (started here, or by `--launch`), so any host other
    than 127.0.0.0/8, ::1 or `localhost` is refused, before a single byte is sent.
    """
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"base_url: expected http://<host>:<port>, got {base_url!r}")
    if not is_loopback_host(parts.hostname):
        raise ValueError(
            f"base_url: host {parts.hostname!r} is not a loopback address; this load generator "
            "only targets servers on this machine (127.0.0.0/8, ::1, localhost)"
        )
    try:
        parts.port  # noqa: B018  (raises ValueError on a port out of range)
    except ValueError:
        raise ValueError(f"base_url: bad port in {base_url!r}") from None
    if parts.query or parts.fragment:
        raise ValueError(f"base_url: expected no query or fragment, got {base_url!r}")
    return base_url.rstrip("/")


# --- server-sent events ----------------------------------------------------------------------


class SSEParser:
    """Incremental parser of `text/event-stream`: `feed(bytes)` returns the data of every event
    completed by those bytes. Lines end in LF or CRLF; an event ends at a blank line; its `data:`
    lines are joined by newlines; comments (`:`) and other fields (`event`, `id`, `retry`) are
    skipped. Bytes are split into lines before decoding, so a UTF-8 character split across two
    reads is decoded whole (the LF byte never occurs inside a multi-byte character)."""

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        *lines, self._buf = (self._buf + chunk).split(b"\n")
        events: list[str] = []
        for raw in lines:
            line = raw[:-1] if raw.endswith(b"\r") else raw
            if not line:
                if self._data:
                    events.append("\n".join(self._data))
                    self._data = []
                continue
            if line.startswith(b":"):
                continue
            name, _, value = line.decode("utf-8", errors="replace").partition(":")
            if name == "data":
                self._data.append(value[1:] if value.startswith(" ") else value)
        return events

    def close(self) -> list[str]:
        """At the end of the stream: an event whose data lines were complete but whose blank line
        never came (a lenient reading); a partial last line is dropped as truncated."""
        events = ["\n".join(self._data)] if self._data else []
        self._buf, self._data = b"", []
        return events


def is_token_chunk(chunk: dict) -> bool:
    """Whether a streamed chunk carries generated output (a token event).

    Completions: a choice with non-empty `text` or `token_ids`, or with empty text and no finish
    reason (a server without a tokenizer streams tokens as empty text). Chat: a delta with
    non-empty `content`, or empty content that is not the opening role-only delta. The final
    usage chunk (empty `choices`) and a closing chunk with only a finish reason are not tokens.
    """
    for c in chunk.get("choices") or ():
        if not isinstance(c, dict):
            continue
        if c.get("token_ids"):
            return True
        if "delta" in c:
            d = c.get("delta") or {}
            content = d.get("content")
            if content or (content == "" and "role" not in d and c.get("finish_reason") is None):
                return True
        else:
            text = c.get("text")
            if text or (text == "" and c.get("finish_reason") is None):
                return True
    return False


# --- one request -----------------------------------------------------------------------------


@dataclass
class RequestResult:
    """What one request measured. Times in seconds; `start_s` from the start of its run."""

    index: int
    ok: bool = False
    status: int | None = None
    error: str | None = None
    prompt_tokens: int | None = None
    output_tokens: int = 0
    output_tokens_from: str = "chunks"  # 'usage' when the server's usage chunk said it
    token_events: int = 0
    start_s: float = 0.0
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    e2e_s: float | None = None


async def send_request(
    session, url: str, body: dict, *, index: int, prompt_tokens: int | None, origin: float
) -> RequestResult:
    """POST `body` (with `stream: true`) and time its stream. Failures (HTTP status, a dropped
    connection, a malformed chunk, an error event, no `[DONE]`) are returned, not raised."""
    import aiohttp

    r = RequestResult(index=index, prompt_tokens=prompt_tokens)
    start = time.perf_counter()
    r.start_s = start - origin
    parser, last, done, usage = SSEParser(), None, False, None

    def handle(events: list[str], now: float) -> str | None:
        nonlocal last, done, usage
        for ev in events:
            if ev.strip() == "[DONE]":
                done = True
                continue
            try:
                chunk = json.loads(ev)
            except json.JSONDecodeError:
                return f"malformed chunk: {ev[:80]!r}"
            if not isinstance(chunk, dict):
                return f"malformed chunk: {ev[:80]!r}"
            if chunk.get("error"):
                return f"error event: {json.dumps(chunk['error'])[:ERROR_BODY_CHARS]}"
            if chunk.get("usage"):
                usage = chunk["usage"]
            if is_token_chunk(chunk):
                if last is None:
                    r.ttft_s = now - start
                else:
                    r.itl_s.append(now - last)
                last = now
                r.token_events += 1
        return None

    try:
        async with session.post(url, json=body) as resp:
            r.status = resp.status
            if resp.status != 200:
                text = await resp.text(errors="replace")
                r.error = f"HTTP {resp.status}: {text[:ERROR_BODY_CHARS]}"
                return r
            if resp.content_type != "text/event-stream":
                r.error = f"expected text/event-stream, got {resp.content_type}"
                return r
            async for data in resp.content.iter_any():
                r.error = handle(parser.feed(data), time.perf_counter())
                if r.error:
                    return r
            r.error = handle(parser.close(), time.perf_counter())
            r.e2e_s = time.perf_counter() - start
    except asyncio.TimeoutError:
        r.error = "timed out (request_timeout_s)"
        return r
    except aiohttp.ClientError as e:  # refused, reset, dropped mid-stream, payload incomplete
        r.error = f"{type(e).__name__}: {e}"[:ERROR_BODY_CHARS]
        return r
    if r.error:
        return r
    if not done:
        r.error = "stream ended without [DONE]"
    elif r.ttft_s is None:
        r.error = "stream carried no output token"
    else:
        r.ok = True
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        r.output_tokens, r.output_tokens_from = usage["completion_tokens"], "usage"
    else:
        r.output_tokens = r.token_events
    if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
        r.prompt_tokens = usage["prompt_tokens"]
    return r


# --- arrivals and a run ----------------------------------------------------------------------


def arrival_times(n: int, rate: float, seed: int) -> np.ndarray:
    """Send times (s) of n requests: the first at 0, then n-1 exponential gaps of mean 1/rate
    (a Poisson process), seeded; all zeros for rate inf."""
    if n < 1 or not rate > 0 or math.isnan(rate):
        raise ValueError(f"need n >= 1 and a rate > 0, got n={n}, rate={rate}")
    if math.isinf(rate):
        return np.zeros(n)
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=n - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


def raise_open_file_limit(needed: int) -> int:
    """Lift the soft limit on open files towards the hard one when `needed` sockets (plus a
    margin) would pass it: all-at-once runs hold one socket per request. Returns the limit."""
    try:
        import resource
    except ImportError:  # not POSIX
        return needed
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed + 256
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
        except (ValueError, OSError):
            pass
    return soft


@dataclass
class LoadResult:
    """A run: one entry per request (None: never sent), its wall time, and whether the time
    limit ended it."""

    results: list[RequestResult | None]
    duration_s: float
    time_limited: bool


async def run_load(
    url: str,
    bodies: list[tuple[dict, int | None]],
    *,
    request_rate: float,
    max_concurrency: int,
    seed: int,
    time_limit_s: float,
    request_timeout_s: float,
    on_done: Callable[[RequestResult], None] | None = None,
) -> LoadResult:
    """Send every (body, prompt tokens) at its arrival time, at most `max_concurrency` in flight
    (0: no cap), until all finish or `time_limit_s` passes: then requests in flight are cancelled
    and count as failures, and those not yet sent are left out (None)."""
    import aiohttp

    times = arrival_times(len(bodies), request_rate, seed)
    results: list[RequestResult | None] = [None] * len(bodies)
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency > 0 else None
    # One connection per request in flight (aiohttp caps at 100 by default, which would queue
    # requests inside the client and count that wait as server latency).
    connector = aiohttp.TCPConnector(limit=max_concurrency, limit_per_host=0)
    timeout = aiohttp.ClientTimeout(total=request_timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        origin = time.perf_counter()

        async def one(i: int) -> None:
            body, prompt_tokens = bodies[i]
            sent = False

            async def send() -> RequestResult:
                nonlocal sent
                sent = True
                return await send_request(
                    session, url, body, index=i, prompt_tokens=prompt_tokens, origin=origin
                )

            try:
                if sem is None:
                    res = await send()
                else:
                    async with sem:
                        res = await send()
            except asyncio.CancelledError:
                if sent:  # in flight at the time limit: a failure; never sent: left out
                    results[i] = RequestResult(
                        index=i,
                        prompt_tokens=prompt_tokens,
                        error="cancelled: the run's time limit was reached",
                    )
                raise
            results[i] = res
            if on_done is not None:
                on_done(res)

        async def dispatch() -> None:
            tasks = []
            for i, t in enumerate(times):
                delay = origin + t - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one(i)))
            await asyncio.gather(*tasks)

        limited = False
        try:
            await asyncio.wait_for(dispatch(), timeout=time_limit_s)
        except asyncio.TimeoutError:
            limited = True
        duration = time.perf_counter() - origin
    return LoadResult(results, duration, limited)
