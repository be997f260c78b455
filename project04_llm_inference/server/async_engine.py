"""The engine loop apart from HTTP: one thread owns the engine, the event loop owns the streams.

`LLMEngine` is synchronous and not thread-safe, so every call into it (building it, `add_request`,
`abort`, `step`, `stats`) happens on one background thread. The event loop talks to that thread
through a command queue (add, abort, stop); the thread answers through
`loop.call_soon_threadsafe`: an add is acknowledged (or refused with the engine's `ValueError`,
or `ServerOverloaded` when too many requests wait), and each step's outputs are delivered in one
batch to the requests' `asyncio.Queue`s.

The thread blocks on the command queue while no request is pending and steps while some are;
between two steps it takes every command that arrived, so adds and aborts wait at most one step.
An abort (a client gone, a shutdown) frees the request's KV blocks at once and ends its stream
with a `RequestOutput` whose finish_reason is "abort". The requests of one HTTP call (its n
choices) are admitted together or not at all, each counting once against max_queued_requests.

One request cannot stop the loop. A request the engine refuses fails alone. A step that raises
fails the requests that were running in it (their streams end with a `StepFailed`; waiting
requests go on), after which the engine's blocks are checked against its live requests; if
they disagree, or MAX_STEP_FAILURES steps fail in a row (a broken device, not a request), the
loop stops: `is_running` turns false, `dead` is set, and `serve` exits non-zero so that a
supervisor restarts the process.

Outputs: `RequestOutput.new_token_ids` is the stream (`token_ids` is the engine's live list
while a request runs, so a consumer accumulates `new_token_ids` rather than reading it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from queue import Empty, SimpleQueue

from ..config import EngineArgs, SamplingParams
from ..engine.llm_engine import LLMEngine, RequestOutput
from .metrics import ServerMetrics

log = logging.getLogger(__name__)


class ServerOverloaded(RuntimeError):
    """Too many requests wait already, or the server is shutting down (HTTP 503)."""


class EngineDead(RuntimeError):
    """The engine loop stopped on an error; no request can be served (HTTP 500/503)."""


class StepFailed(RuntimeError):
    """An engine step this request was part of raised; the request was aborted (HTTP 500)."""


MAX_STEP_FAILURES = 3  # consecutive failed steps after which the engine is declared dead


@dataclass
class RequestTiming:
    arrival: float
    first_token: float | None = None
    finished: float | None = None
    num_prompt_tokens: int = 0  # known from the first output
    num_output_tokens: int = 0

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def tpot_s(self) -> float | None:
        if self.finished is None or self.first_token is None or self.num_output_tokens < 2:
            return None
        return (self.finished - self.first_token) / (self.num_output_tokens - 1)

    @property
    def e2e_s(self) -> float | None:
        return None if self.finished is None else self.finished - self.arrival


@dataclass
class RequestHandle:
    """One request seen from the event loop: where its outputs go, whether it has ended."""

    request_id: str
    queue: asyncio.Queue
    timing: RequestTiming
    finished: bool = False


@dataclass
class _Add:
    """Requests admitted together (one HTTP call's choices): all, or none."""

    items: list[tuple[str, str | list[int], SamplingParams]]
    ack: asyncio.Future


@dataclass
class _Abort:
    request_id: str


@dataclass
class _Stop:
    pass


@dataclass
class _ThreadState:
    known: set[str] = field(default_factory=set)  # request ids the engine holds
    failures: int = 0  # consecutive steps that raised


class AsyncEngine:
    """`LLMEngine` driven by a background thread, for asyncio callers.

    `AsyncEngine(EngineArgs(...))` builds the engine on its thread at `await start()`; an
    already-built `LLMEngine` is accepted too (from then on only the thread may touch it)."""

    def __init__(
        self,
        engine: EngineArgs | LLMEngine,
        *,
        max_queued_requests: int = 256,
        metrics: ServerMetrics | None = None,
    ) -> None:
        if max_queued_requests < 1:
            raise ValueError(f"max_queued_requests must be >= 1, got {max_queued_requests}")
        self._source = engine
        self.engine: LLMEngine | None = None  # read-only attributes may be read from the loop
        self.max_queued_requests = max_queued_requests
        self.metrics = metrics
        self._commands: SimpleQueue = SimpleQueue()
        self._live: dict[str, RequestHandle] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self._accepting = False
        self._closed = False  # the thread has exited (set on the loop)
        self._shut = False
        self.error: BaseException | None = None
        self.dead = asyncio.Event()  # set when the loop stopped on an error
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- life cycle (event loop) ----------------------------------------------------------------

    async def start(self) -> None:
        """Start the thread and wait until the engine is built (its errors are raised here)."""
        self._loop = asyncio.get_running_loop()
        built: asyncio.Future = self._loop.create_future()
        self._thread = threading.Thread(
            target=self._run, args=(built,), name="llm-engine", daemon=True
        )
        self._thread.start()
        await built
        self._accepting = True

    @property
    def is_running(self) -> bool:
        return self._accepting and not self._closed and self.error is None

    @property
    def num_in_flight(self) -> int:
        return len(self._live)

    async def shutdown(self, grace_s: float = 10.0) -> None:
        """Stop accepting; let running requests finish for up to grace_s, abort the rest; join."""
        self._accepting = False
        if self._thread is None or self._shut:
            return
        self._shut = True
        if self._live and not self._closed:
            log.info("shutdown: waiting up to %.1f s for %d requests", grace_s, len(self._live))
            try:
                await asyncio.wait_for(self._idle.wait(), timeout=grace_s)
            except asyncio.TimeoutError:
                log.info("shutdown: aborting %d requests", len(self._live))
                for rid in list(self._live):
                    self.abort(rid)
        self._commands.put(_Stop())
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 30.0)
        if self._thread.is_alive():  # a step that never returns: nothing more can be done
            log.error("shutdown: the engine thread did not stop within 30 s")
        await asyncio.sleep(0)  # let the last deliveries (the aborts) run
        self._closed = True

    # --- requests (event loop) ------------------------------------------------------------------

    async def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        *,
        queue: asyncio.Queue | None = None,
        arrival: float | None = None,
    ) -> RequestHandle:
        """Hand a request to the engine; returns once the engine holds it.

        Raises `ValueError`/`TypeError` (the engine refused the request: bad prompt, too
        long, ...), `ServerOverloaded` (max_queued_requests wait already, or shutting down) or
        `EngineDead`. Outputs (`RequestOutput`, or an exception if the engine dies or a step
        it ran in fails) go to `queue`: several requests may share one, their outputs told
        apart by request_id."""
        (handle,) = await self.add_requests(
            [(request_id, prompt, params)], queue=queue, arrival=arrival
        )
        return handle

    async def add_requests(
        self,
        items: list[tuple[str, str | list[int], SamplingParams]],
        *,
        queue: asyncio.Queue | None = None,
        arrival: float | None = None,
    ) -> list[RequestHandle]:
        """`add_request` for several (request_id, prompt, params) at once: the engine takes
        all of them or none (the first refusal is raised), and they count one each against
        max_queued_requests, as separate requests would."""
        if self.error is not None:
            raise EngineDead(f"the engine loop has stopped: {self.error!r}")
        if not self._accepting:  # shutting down (or not started)
            raise ServerOverloaded("the server is shutting down and accepts no new requests")
        if len(items) > self.max_queued_requests:
            raise ValueError(
                f"n: {len(items)} choices in one request, more than max_queued_requests "
                f"({self.max_queued_requests}) could ever admit"
            )
        ids = [rid for rid, _, _ in items]
        if len(set(ids)) != len(ids) or any(rid in self._live for rid in ids):
            raise ValueError(f"request_id: already in use among {ids[:3]}")
        loop = asyncio.get_running_loop()
        queue = queue if queue is not None else asyncio.Queue()
        t0 = arrival if arrival is not None else time.monotonic()
        handles = [RequestHandle(rid, queue, RequestTiming(t0)) for rid in ids]
        for h in handles:
            self._live[h.request_id] = h
        self._idle.clear()
        ack = loop.create_future()
        self._commands.put(_Add(list(items), ack))
        try:
            await ack
        except asyncio.CancelledError:
            for rid in ids:
                self.abort(rid)  # they may have reached the engine meanwhile
                self._forget(rid)
            raise
        except BaseException:
            for rid in ids:
                self._forget(rid)
            raise
        return handles

    def abort(self, request_id: str) -> None:
        """Stop a request and free its blocks; its stream ends with finish_reason 'abort'."""
        if request_id in self._live and not self._closed:
            self._commands.put(_Abort(request_id))

    async def generate(
        self, prompt: str | list[int], params: SamplingParams, request_id: str
    ) -> AsyncIterator[RequestOutput]:
        """The request's outputs as they come; leaving the loop early (or being cancelled,
        a client gone) aborts the request."""
        handle = await self.add_request(request_id, prompt, params)
        try:
            while True:
                item = await handle.queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finished:
                    return
        finally:
            if not handle.finished:
                self.abort(request_id)

    def _forget(self, request_id: str) -> None:
        self._live.pop(request_id, None)
        if not self._live:
            self._idle.set()

    # --- delivery (event loop, called from the thread) ------------------------------------------

    def _deliver(self, batch: list[tuple[str, RequestOutput | BaseException]]) -> None:
        now = time.monotonic()
        for rid, item in batch:
            handle = self._live.get(rid)
            if handle is None:
                continue
            if isinstance(item, BaseException):
                handle.finished = True
                self._forget(rid)
                handle.queue.put_nowait(item)
                continue
            t = handle.timing
            if item.prompt_token_ids:
                t.num_prompt_tokens = len(item.prompt_token_ids)
            if item.new_token_ids:
                t.num_output_tokens += len(item.new_token_ids)
                if t.first_token is None:
                    t.first_token = now
            if item.finished:
                handle.finished = True
                t.finished = now
                self._forget(rid)
                log.debug(
                    "%s %s: %d+%d tokens, ttft %s s, tpot %s s, e2e %.3f s",
                    rid,
                    item.finish_reason,
                    t.num_prompt_tokens,
                    t.num_output_tokens,
                    t.ttft_s,
                    t.tpot_s,
                    t.e2e_s,
                )
                if self.metrics is not None:
                    self.metrics.observe_request(
                        item.finish_reason or "abort",
                        t.ttft_s,
                        t.tpot_s,
                        t.e2e_s or 0.0,
                        prompt_tokens=t.num_prompt_tokens,
                        output_tokens=t.num_output_tokens,
                    )
            handle.queue.put_nowait(item)

    def _on_thread_exit(self) -> None:
        self._closed = True
        self._accepting = False
        if self.error is not None:
            self.dead.set()
        err = self.error or EngineDead("the engine loop has stopped")
        while True:  # commands nobody will read: refuse the adds
            try:
                cmd = self._commands.get_nowait()
            except Empty:
                break
            if isinstance(cmd, _Add):
                _resolve(cmd.ack, EngineDead(f"the engine loop has stopped: {err!r}"))
        self._deliver(
            [(rid, EngineDead(f"the engine loop stopped: {err!r}")) for rid in self._live]
        )

    # --- the engine thread ----------------------------------------------------------------------

    def _call(self, fn, *args) -> None:
        # a closed event loop raises RuntimeError: nobody is listening any more
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(fn, *args)

    def _run(self, built: asyncio.Future) -> None:
        try:
            src = self._source
            self.engine = src if isinstance(src, LLMEngine) else LLMEngine(src)
        except BaseException as e:  # noqa: BLE001 - handed to the caller of start()
            self.error = e
            self._call(_resolve, built, e)
            self._call(self._on_thread_exit)
            return
        self._call(_resolve, built, None)
        state = _ThreadState()
        try:
            self._loop_body(self.engine, state)
        except BaseException as e:  # noqa: BLE001 - the loop dies; every request hears why
            log.exception("the engine loop stopped on an error")
            self.error = e
        finally:
            self._call(self._on_thread_exit)

    def _loop_body(self, engine: LLMEngine, state: _ThreadState) -> None:
        while True:
            commands = [self._commands.get()] if not engine.has_unfinished() else []
            while True:
                try:
                    commands.append(self._commands.get_nowait())
                except Empty:
                    break
            batch: list[tuple[str, RequestOutput | BaseException]] = []
            for cmd in commands:
                if isinstance(cmd, _Stop):
                    for rid in list(state.known):
                        engine.abort(rid)
                        batch.append((rid, _aborted(rid)))
                    self._call(self._deliver, batch)
                    self._update_metrics(engine)
                    return
                if isinstance(cmd, _Add):
                    self._add(engine, state, cmd)
                elif isinstance(cmd, _Abort) and cmd.request_id in state.known:
                    state.known.discard(cmd.request_id)
                    engine.abort(cmd.request_id)
                    batch.append((cmd.request_id, _aborted(cmd.request_id)))
            if engine.has_unfinished():
                try:
                    outs = engine.step()
                except Exception as e:  # noqa: BLE001 - fails the step's requests, not the loop
                    self._step_failed(engine, state, e, batch)
                else:
                    state.failures = 0
                    for out in outs:
                        if out.finished:
                            state.known.discard(out.request_id)
                        batch.append((out.request_id, out))
            if batch:
                self._call(self._deliver, batch)
            self._update_metrics(engine)

    def _step_failed(self, engine: LLMEngine, state: _ThreadState, error: Exception, batch) -> None:
        """A step raised: abort the requests it ran (all of them if the last step failed too),
        check the blocks, and give up after MAX_STEP_FAILURES in a row."""
        state.failures += 1
        log.exception("an engine step failed (%d in a row)", state.failures)
        if state.failures >= MAX_STEP_FAILURES:
            raise EngineDead(f"{state.failures} engine steps failed in a row: {error!r}")
        running = getattr(engine.scheduler, "running", None)
        victims = [s.request_id for s in running] if running and state.failures == 1 else []
        victims = victims or list(state.known)
        err = StepFailed(f"the engine failed on a step this request was part of: {error!r}")
        for rid in victims:
            engine.abort(rid)
            state.known.discard(rid)
            batch.append((rid, err))
        try:
            engine.block_manager.check_no_leaks(list(engine.requests.values()))
        except AssertionError as e:
            raise EngineDead(f"the KV cache is inconsistent after a failed step: {e}") from error

    def _add(self, engine: LLMEngine, state: _ThreadState, cmd: _Add) -> None:
        if cmd.ack.cancelled():  # the caller is gone already
            return
        waiting = engine.stats()["waiting"]
        if waiting + len(cmd.items) > self.max_queued_requests:
            if self.metrics is not None:
                self.metrics.rejected.inc()
            err = ServerOverloaded(
                f"server overloaded: {waiting} requests are waiting already "
                f"(max_queued_requests={self.max_queued_requests}); retry later"
            )
            self._call(_resolve, cmd.ack, err)
            return
        added = []
        for rid, prompt, params in cmd.items:
            try:
                engine.add_request(rid, prompt, params)
            except Exception as e:  # noqa: BLE001 - refuses this call's requests alone
                for r in added:
                    engine.abort(r)
                self._call(_resolve, cmd.ack, e)
                return
            added.append(rid)
        state.known.update(added)
        self._call(_resolve, cmd.ack, None)

    def _update_metrics(self, engine: LLMEngine) -> None:
        if self.metrics is not None:
            try:
                self.metrics.update_engine(engine.stats())
            except Exception:  # noqa: BLE001 - metrics never stop the engine
                log.exception("updating the engine metrics failed")


def _aborted(request_id: str) -> RequestOutput:
    return RequestOutput(
        request_id=request_id,
        prompt_token_ids=[],
        token_ids=[],
        new_token_ids=[],
        finished=True,
        finish_reason="abort",
    )


def _resolve(fut: asyncio.Future, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is None:
        fut.set_result(None)
    else:
        fut.set_exception(error)
