"""The OpenAI-compatible HTTP server (aiohttp): completions, chat completions, models, health,
Prometheus metrics.

A request first passes the guards (`guard.py`: Host, Origin; 403), then, with an API key set,
the key check on /v1/* (`auth.py`: 401), then the Content-Type guard (415). A route
reads the body within `read_timeout_s` (408 for a client that stops half way), then checks it
in a worker thread (`json_body.parse_json` and `protocol.parse_request`: JSON limits, prompt length,
tokenizing, every field; a 400 naming the field), so no body, however large, holds up the
event loop. It hands one engine request per choice to the `AsyncEngine`, all admitted
together (so a refusal is still a clean 400 or 503), then reads their outputs from one shared
queue: collected into one JSON answer, or sent as server-sent events in OpenAI's chunk format
as tokens come (`responses.py`), each write within `write_timeout_s`. Whatever ends the handler
(done, client gone: aiohttp cancels the handler, server stopping) aborts the requests that have
not finished, which frees their KV blocks. Every error is an OpenAI-style body (`{"error":
{"message", "type", "param", "code"}}`), unknown routes included. Request timings (TTFT, TPOT,
end-to-end) are taken by the `AsyncEngine` and observed in the Prometheus histograms served at
/metrics.

`serve` runs until SIGINT/SIGTERM (exit code 0) or until the engine loop dies (`AsyncEngine`
gives up on a broken engine): then it stops and returns 1, so a supervisor restarts it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field

from aiohttp import web

from ..config import EngineArgs
from ..engine.llm_engine import LLMEngine
from .async_engine import AsyncEngine, EngineDead, ServerOverloaded
from .auth import ApiKeyCheck, exposure_warning
from .chat import ChatFormatter
from .guard import HostGuard, bind_warning, content_type_error, is_loopback
from .json_body import parse_json
from .metrics import ServerMetrics
from .protocol import APIError, GenerationRequest, Limits, ModelInfo, parse_request
from .responses import ChoiceState, collect, stream

log = logging.getLogger(__name__)


@dataclass
class ServerOptions:
    """What `serve`'s flags set beside the engine (see ServeConfig for each)."""

    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    max_queued_requests: int = 256
    shutdown_grace_s: float = 10.0
    limits: Limits = field(default_factory=Limits)
    max_body_mib: float = 8.0
    read_timeout_s: float = 30.0
    write_timeout_s: float = 30.0
    allowed_hosts: list[str] = field(default_factory=list)
    allowed_origins: list[str] = field(default_factory=list)
    tokenizer_threads: int = 2
    api_key: str | None = None


ENGINE = web.AppKey("engine", AsyncEngine)
INFO = web.AppKey("info", ModelInfo)
METRICS = web.AppKey("metrics", ServerMetrics)
OPTIONS = web.AppKey("options", ServerOptions)
GUARD = web.AppKey("guard", HostGuard)
KEY_CHECK = web.AppKey("key_check", ApiKeyCheck)
TOKENIZERS = web.AppKey("tokenizers", concurrent.futures.ThreadPoolExecutor)


async def _read_body(request: web.Request) -> bytes:
    timeout = request.app[OPTIONS].read_timeout_s
    try:
        return await asyncio.wait_for(request.read(), timeout)
    except asyncio.TimeoutError:
        raise APIError(
            f"the request body did not arrive within {timeout:g} s", None, 408, code="timeout"
        ) from None


def _parse(info: ModelInfo, raw: bytes, chat: bool) -> GenerationRequest:
    """Worker thread: the body's JSON, then every field (tokenizing the prompt)."""
    return parse_request(info, parse_json(raw), chat=chat)


async def _submit(request: web.Request, req: GenerationRequest, rid: str, queue, arrival):
    """One engine request per choice; all accepted, or none (then the error is raised)."""
    engine = request.app[ENGINE]
    items = [(f"{rid}-{c.index}", c.prompt_ids, c.params) for c in req.choices]
    try:
        return await engine.add_requests(items, queue=queue, arrival=arrival)
    except ServerOverloaded as e:
        raise APIError(str(e), None, 503, "server_overloaded") from None
    except EngineDead as e:
        raise APIError(str(e), None, 503, "server_error") from None
    except (ValueError, TypeError) as e:
        field = str(e).split(":")[0].split(" ")[0]  # the engine names the field first
        field = "messages" if field == "prompt" and req.chat else field
        known = ("prompt", "messages", "stop", "n")
        raise APIError(str(e), field if field in known else None) from None


async def _generate(request: web.Request, chat: bool) -> web.StreamResponse:
    arrival = time.monotonic()
    info = request.app[INFO]
    raw = await _read_body(request)
    pool = request.app[TOKENIZERS]
    req = await asyncio.get_running_loop().run_in_executor(pool, _parse, info, raw, chat)
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    queue: asyncio.Queue = asyncio.Queue()
    handles = await _submit(request, req, rid, queue, arrival)
    states = {f"{rid}-{c.index}": ChoiceState(c, info.tokenizer) for c in req.choices}
    try:
        if req.stream:
            timeout = request.app[OPTIONS].write_timeout_s
            return await stream(request, req, rid, queue, states, write_timeout_s=timeout)
        return await collect(req, rid, queue, states)
    finally:
        for h in handles:
            if not h.finished:
                request.app[ENGINE].abort(h.request_id)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)


async def models(request: web.Request) -> web.Response:
    info = request.app[INFO]
    data = [
        {
            "id": name,
            "object": "model",
            "created": 0,
            "owned_by": "project04_llm_inference",
            "max_model_len": info.max_model_len,
        }
        for name in info.names
    ]
    return web.json_response({"object": "list", "data": data})


async def health(request: web.Request) -> web.Response:
    engine = request.app[ENGINE]
    if engine.is_running:
        return web.json_response({"status": "ok"})
    return web.json_response({"status": "unavailable", "error": repr(engine.error)}, status=503)


async def metrics(request: web.Request) -> web.Response:
    body, content_type = request.app[METRICS].render()
    resp = web.Response(body=body)
    resp.headers["Content-Type"] = content_type
    return resp


@web.middleware
async def _errors(request: web.Request, handler):
    try:
        _check_guards(request)
        return await handler(request)
    except APIError as e:
        headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
        return web.json_response(e.body(), status=e.status, headers=headers)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        kind = "not_found_error" if e.status == 404 else "invalid_request_error"
        msg = f"{e.reason}: {request.method} {request.path}"
        return web.json_response(APIError(msg, None, e.status, kind).body(), status=e.status)
    except Exception as e:  # noqa: BLE001 - answered as a 500 with the cause, and logged
        log.exception("unhandled error in %s %s", request.method, request.path)
        return web.json_response(
            APIError(f"internal error: {e!r}", None, 500, "server_error").body(), status=500
        )


def _check_guards(request: web.Request) -> None:
    guard = request.app[GUARD]
    host = request.headers.get("Host")
    why = guard.host_error(host)
    if why is None:
        why = guard.origin_error(request.headers.get("Origin"), request.scheme, host)
    if why is not None:
        raise APIError(why, None, 403, "permission_error", code="forbidden")
    key_check = request.app.get(KEY_CHECK)
    if key_check is not None:
        why = key_check.error(request.path, request.headers.get("Authorization"))
        if why is not None:
            raise APIError(why, None, 401, "authentication_error", code="invalid_api_key")
    ct = request.content_type if "Content-Type" in request.headers else ""
    why = content_type_error(request.method, ct)
    if why is not None:
        raise APIError(why, None, 415, code="unsupported_media_type")


def build_app(
    engine: AsyncEngine,
    served_model_name: str,
    server_metrics: ServerMetrics,
    options: ServerOptions | None = None,
):
    """The aiohttp application over a started `AsyncEngine`."""
    options = options or ServerOptions()
    e = engine.engine
    app = web.Application(
        middlewares=[_errors], client_max_size=int(options.max_body_mib * 1024**2)
    )
    app[ENGINE] = engine
    app[METRICS] = server_metrics
    app[OPTIONS] = options
    app[GUARD] = HostGuard(options.host, options.allowed_hosts, options.allowed_origins)
    if options.api_key is not None:
        app[KEY_CHECK] = ApiKeyCheck(options.api_key)
    pool = concurrent.futures.ThreadPoolExecutor(
        options.tokenizer_threads, thread_name_prefix="tokenize"
    )
    app[TOKENIZERS] = pool

    async def _close_pool(_app) -> None:
        pool.shutdown(wait=False, cancel_futures=True)

    app.on_cleanup.append(_close_pool)
    app[INFO] = ModelInfo(
        names=[served_model_name],
        max_model_len=min(e.max_model_len, e.block_manager.num_blocks * e.args.block_size),
        vocab_size=e.vocab_size,
        tokenizer=e.tokenizer,
        chat=ChatFormatter(e.tokenizer) if e.tokenizer is not None else None,
        limits=options.limits,
        grammars=e.grammars,
    )
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    return app


def default_model_name(args: EngineArgs) -> str:
    return args.model if args.model is not None else f"dummy-{args.dummy_shape}"


class RunningServer:
    """A started server: the engine, the aiohttp runner, the address it listens on."""

    def __init__(self, engine: AsyncEngine, runner: web.AppRunner, site, url: str, name: str):
        self.engine, self.runner, self.site, self.url, self.name = engine, runner, site, url, name

    async def stop(self, grace_s: float) -> None:
        """Stop listening; let running requests finish for up to grace_s, abort the rest."""
        try:
            await self.site.stop()  # no new connections
            await self.engine.shutdown(grace_s)
        finally:
            await self.engine.shutdown(0.0)
            await self.runner.cleanup()


async def start_server(
    engine_source: EngineArgs | LLMEngine, options: ServerOptions, *, model_name: str
) -> RunningServer:
    """Build the engine (on its thread), the app, and listen on options.host:options.port."""
    server_metrics = ServerMetrics(model_name)
    engine = AsyncEngine(
        engine_source, max_queued_requests=options.max_queued_requests, metrics=server_metrics
    )
    await engine.start()
    runner = web.AppRunner(
        build_app(engine, model_name, server_metrics, options),
        handler_cancellation=True,  # a client gone cancels its handler: its requests abort
        # a connection that has not sent a whole request line and headers (a slow or stalled
        # client) or sits idle between requests is closed after this long
        keepalive_timeout=options.read_timeout_s,
        access_log=None,
        shutdown_timeout=2.0,
    )
    await runner.setup()
    site = web.TCPSite(runner, options.host, options.port)
    try:
        await site.start()
    except OSError as e:
        await engine.shutdown(0.0)
        await runner.cleanup()
        raise ValueError(
            f"port: cannot listen on {options.host}:{options.port}: {e.strerror or e}"
        ) from None
    bound = runner.addresses[0][1] if runner.addresses else options.port
    host = options.host if ":" not in options.host else f"[{options.host}]"
    return RunningServer(engine, runner, site, f"http://{host}:{bound}", model_name)


async def serve(args: EngineArgs, options: ServerOptions | None = None) -> int:
    """Serve until SIGINT or SIGTERM, then shut down gracefully (exit code 0): stop listening,
    let running requests finish for up to shutdown_grace_s, abort the rest, stop the engine
    thread. If the engine loop dies first, stop and return 1 (a supervisor restarts it)."""
    options = options or ServerOptions()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    keyed = options.api_key is not None
    warning = exposure_warning(options.host, keyed, is_loopback(options.host)) or (
        None if keyed else bind_warning(options.host)
    )
    if warning is not None:
        log.warning("%s", warning)
        print(f"WARNING: {warning}", file=sys.stderr, flush=True)
    name = options.served_model_name or default_model_name(args)
    server = await start_server(args, options, model_name=name)  # a signal meanwhile: `stop`
    code = 0
    try:
        print(f"serving {name} on {server.url}", flush=True)
        waits = [
            asyncio.ensure_future(stop.wait()),
            asyncio.ensure_future(server.engine.dead.wait()),
        ]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
        if server.engine.dead.is_set():
            log.error("the engine loop stopped: %r; exiting", server.engine.error)
            print(f"error: the engine loop stopped: {server.engine.error!r}", file=sys.stderr)
            code = 1
        else:
            log.info("shutting down")
    finally:
        await server.stop(options.shutdown_grace_s if code == 0 else 0.0)
    return code
