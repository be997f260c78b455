"""The OpenAI-compatible HTTP server (aiohttp): completions, chat completions, models, health,
Prometheus metrics.

A route checks the body (`protocol.parse_request`, 400 naming the field), hands one engine
request per choice to the `AsyncEngine` (all acknowledged before any byte of the answer is sent,
so a refusal is still a clean 400 or 503), then reads their outputs from one shared queue:
collected into one JSON answer, or sent as server-sent events in OpenAI's chunk format as
tokens come (`responses.py`). Whatever ends the handler (done, client gone: aiohttp cancels the
handler, server stopping) aborts the requests that have not finished, which frees their KV blocks.
Every error is an OpenAI-style body (`{"error": {"message", "type", "param", "code"}}`), unknown
routes included. Request timings (TTFT, TPOT, end-to-end) are taken by the `AsyncEngine` and
observed in the Prometheus histograms served at /metrics.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
import uuid

from aiohttp import web

from ..config import EngineArgs
from .async_engine import AsyncEngine, EngineDead, ServerOverloaded
from .chat import ChatFormatter
from .metrics import ServerMetrics
from .protocol import APIError, GenerationRequest, ModelInfo, parse_request
from .responses import ChoiceState, collect, stream

log = logging.getLogger(__name__)

ENGINE = web.AppKey("engine", AsyncEngine)
INFO = web.AppKey("info", ModelInfo)
METRICS = web.AppKey("metrics", ServerMetrics)


async def _read_json(request: web.Request):
    raw = await request.read()
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(f"malformed JSON body: {e}") from None


async def _submit(request: web.Request, req: GenerationRequest, rid: str, queue, arrival):
    """One engine request per choice; all accepted, or none (then the error is raised)."""
    engine = request.app[ENGINE]
    ids = [f"{rid}-{c.index}" for c in req.choices]
    results = await asyncio.gather(
        *(
            engine.add_request(r, c.prompt_ids, c.params, queue=queue, arrival=arrival)
            for r, c in zip(ids, req.choices)
        ),
        return_exceptions=True,
    )
    errors = [e for e in results if isinstance(e, BaseException)]
    if errors:
        for h in results:
            if not isinstance(h, BaseException):
                engine.abort(h.request_id)
        e = errors[0]
        if isinstance(e, ServerOverloaded):
            raise APIError(str(e), None, 503, "server_overloaded") from None
        if isinstance(e, EngineDead):
            raise APIError(str(e), None, 503, "server_error") from None
        if isinstance(e, ValueError):
            field = str(e).split(":")[0].split(" ")[0]  # the engine names the field first
            field = "messages" if field == "prompt" and req.chat else field
            raise APIError(str(e), field if field in ("prompt", "messages", "stop") else None)
        raise e
    return results


async def _generate(request: web.Request, chat: bool) -> web.StreamResponse:
    arrival = time.monotonic()
    info = request.app[INFO]
    req = parse_request(info, await _read_json(request), chat=chat)
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    queue: asyncio.Queue = asyncio.Queue()
    handles = await _submit(request, req, rid, queue, arrival)
    states = {f"{rid}-{c.index}": ChoiceState(c, info.tokenizer) for c in req.choices}
    try:
        if req.stream:
            return await stream(request, req, rid, queue, states)
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
        return await handler(request)
    except APIError as e:
        return web.json_response(e.body(), status=e.status)
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


def build_app(engine: AsyncEngine, served_model_name: str, server_metrics: ServerMetrics):
    """The aiohttp application over a started `AsyncEngine`."""
    e = engine.engine
    app = web.Application(middlewares=[_errors], client_max_size=64 * 1024**2)
    app[ENGINE] = engine
    app[METRICS] = server_metrics
    app[INFO] = ModelInfo(
        names=[served_model_name],
        max_model_len=min(e.max_model_len, e.block_manager.num_blocks * e.args.block_size),
        vocab_size=e.vocab_size,
        tokenizer=e.tokenizer,
        chat=ChatFormatter(e.tokenizer) if e.tokenizer is not None else None,
    )
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    return app


def default_model_name(args: EngineArgs) -> str:
    return args.model if args.model is not None else f"dummy-{args.dummy_shape}"


async def serve(
    args: EngineArgs,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    served_model_name: str | None = None,
    max_queued_requests: int = 256,
    shutdown_grace_s: float = 10.0,
) -> None:
    """Serve until SIGINT or SIGTERM, then shut down gracefully: stop listening, let running
    requests finish for up to shutdown_grace_s, abort the rest, stop the engine thread."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    name = served_model_name or default_model_name(args)
    server_metrics = ServerMetrics(name)
    engine = AsyncEngine(args, max_queued_requests=max_queued_requests, metrics=server_metrics)
    await engine.start()  # a signal meanwhile is kept in `stop`
    runner = web.AppRunner(
        build_app(engine, name, server_metrics),
        handler_cancellation=True,  # a client gone cancels its handler: its requests abort
        access_log=None,
        shutdown_timeout=2.0,
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        try:
            await site.start()
        except OSError as e:
            raise ValueError(f"port: cannot listen on {host}:{port}: {e.strerror}") from None
        bound = runner.addresses[0][1] if runner.addresses else port
        print(f"serving {name} on http://{host}:{bound}", flush=True)
        await stop.wait()
        log.info("shutting down")
        await site.stop()  # no new connections
        await engine.shutdown(shutdown_grace_s)
    finally:
        await engine.shutdown(0.0)
        await runner.cleanup()
