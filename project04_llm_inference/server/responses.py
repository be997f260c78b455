"""OpenAI answers from engine outputs: one JSON body, or server-sent events in the chunk format.

`ChoiceState` follows one choice (one engine request): its tokens, logprobs and the text sent so
far. The text is decoded incrementally, a few tokens at a time (`IncrementalText`), so a long
output costs O(tokens), not a decode of everything per chunk; each token's text offset comes
with it. Streaming text: each chunk carries the text decoded so far minus what was sent. Text
that may still turn into a stop string (the last len(longest stop) - 1 characters) or that ends
in an incomplete UTF-8 sequence is held back; the last chunk sends the engine's final text (cut
at the stop string) minus what was sent. A stream write that the client does not take within
`write_timeout_s` ends the response. Chunks follow OpenAI's format: `data: {json}\n\n`, a chat
stream opens with a role-only delta per choice, `stream_options.include_usage` adds a last chunk
with empty `choices` and the usage (every other chunk then carries `"usage": null`), and
`data: [DONE]\n\n` closes the stream.

A chat request with tools (`structured.ToolMode`) is answered with `tool_calls` when its output is
a call, with the finish reason `tool_calls`. Streamed as OpenAI streams calls: per call a delta
with its id, type, name and empty arguments, then its arguments. A named tool_choice streams
the arguments as they are generated (the name is known from the start); "required" and "auto"
hold the output until it is complete (which tool is known only then); "auto" streams it as text
as soon as its start cannot begin a call (`structured.may_be_call`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from aiohttp import web

from ..engine.llm_engine import RequestOutput
from ..model.tokenizer import Tokenizer
from .protocol import APIError, Choice, GenerationRequest
from .structured import (
    call_args,
    call_head,
    may_be_call,
    message,
    new_call_id,
    stream_deltas,
)

log = logging.getLogger(__name__)


class IncrementalText:
    """The text of a growing token list, decoded a few tokens at a time.

    Decoding a window that starts a few tokens back (`prefix`..end) and dropping the text of
    its first part (`prefix`..`read`) gives the new tokens' text with the spacing and merged
    bytes a full decode would give them; text ending in U+FFFD (an incomplete UTF-8
    sequence) waits for the next token. The windows stay short, so each token costs O(1)."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok
        self.ids: list[int] = []
        self.text = ""
        self.offsets: list[int] = []  # per token: len(text) before it
        self._prefix = 0
        self._read = 0

    def push(self, token: int) -> None:
        self.offsets.append(len(self.text))
        self.ids.append(token)
        ids = self.ids
        before = self.tok.decode(ids[self._prefix : self._read]) if self._read else ""
        window = self.tok.decode(ids[self._prefix :])
        if len(window) > len(before) and not window.endswith("\ufffd"):
            self.text += window[len(before) :]
            self._prefix, self._read = self._read, len(ids)


class ChoiceState:
    """One choice's tokens, logprobs and the text sent so far."""

    def __init__(self, choice: Choice, tokenizer: Tokenizer | None) -> None:
        self.index = choice.index
        self.prompt_len = len(choice.prompt_ids)
        self.tok = tokenizer
        self.hold = max((len(s) for s in choice.params.stop), default=1) - 1
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.text = IncrementalText(tokenizer) if tokenizer is not None else None
        self.sent = ""
        self.finish_reason: str | None = None
        self.call_id: str | None = None  # a streamed named tool call's id, once sent
        self.text_only = False  # an "auto" tool output found to be text: streamed as text

    def push(self, out: RequestOutput, streaming: bool) -> str:
        """Take one output; returns the text to send now (streaming)."""
        new = out.new_token_ids
        self.ids.extend(new)
        if out.logprobs and new:
            self.logprobs.extend(out.logprobs[-len(new) :])
        if self.text is None:
            if out.finished:
                self.finish_reason = out.finish_reason
            return ""
        for t in new:
            self.text.push(t)
        if out.finished:
            self.finish_reason = out.finish_reason
            final = out.text if out.finish_reason != "abort" else self.text.text
        elif streaming:
            final = self.text.text
            final = final[: len(final) - self.hold]
        else:
            return ""
        if len(final) <= len(self.sent) or not final.startswith(self.sent):
            return ""
        delta = final[len(self.sent) :]
        self.sent = final
        return delta

    def token_str(self, t: int) -> str:
        return f"token_id:{t}" if self.tok is None else self.tok.decode([t], False)

    def completion_logprobs(self, start: int, top: int) -> dict:
        ids, lps = self.ids[start:], self.logprobs[start:]
        toks = [self.token_str(t) for t in ids]
        if self.text is not None:
            offsets = self.text.offsets[start : start + len(ids)]
        else:
            offsets = [0] * len(ids)
        return {
            "tokens": toks,
            "token_logprobs": lps,
            "top_logprobs": [{s: lp} for s, lp in zip(toks, lps)] if top else None,
            "text_offset": offsets,
        }

    def chat_logprobs(self, start: int, top: int) -> dict:
        content = []
        for t, lp in zip(self.ids[start:], self.logprobs[start:]):
            s = self.token_str(t)
            entry = {"token": s, "logprob": lp, "bytes": list(s.encode())}
            content.append({**entry, "top_logprobs": [entry] if top else []})
        return {"content": content}


def _usage(req: GenerationRequest, states: list[ChoiceState]) -> dict:
    lens = {c.prompt_index: len(c.prompt_ids) for c in req.choices}
    prompt = sum(lens.values())  # each prompt once, whatever n is
    completion = sum(len(s.ids) for s in states)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _sse(obj) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


async def collect(
    req: GenerationRequest, rid: str, queue: asyncio.Queue, states: dict[str, ChoiceState]
) -> web.Response:
    """Read every choice to its end; one JSON answer (503 if the server stopped them)."""
    pending = len(states)
    while pending:
        item = await queue.get()
        if isinstance(item, BaseException):
            raise APIError(f"the engine failed: {item}", None, 500, "server_error")
        states[item.request_id].push(item, streaming=False)
        pending -= item.finished
    ordered = list(states.values())
    if any(s.finish_reason == "abort" for s in ordered):
        raise APIError("the server shut down before the request finished", None, 503)
    choices = []
    for s in ordered:
        lp = None
        if req.logprobs is not None:
            lp = (
                s.chat_logprobs(0, req.logprobs)
                if req.chat
                else s.completion_logprobs(0, req.logprobs)
            )
        c = {"index": s.index, "logprobs": lp, "finish_reason": s.finish_reason}
        if req.chat:
            c["message"], c["finish_reason"] = message(req.tools, s.sent, s.finish_reason)
        else:
            c["text"] = s.sent
        if req.return_token_ids:
            c["token_ids"] = s.ids
        choices.append(c)
    return web.json_response(
        {
            "id": rid,
            "object": "chat.completion" if req.chat else "text_completion",
            "created": int(time.time()),
            "model": req.model,
            "choices": choices,
            "usage": _usage(req, ordered),
        }
    )


async def stream(
    request: web.Request,
    req: GenerationRequest,
    rid: str,
    queue: asyncio.Queue,
    states: dict[str, ChoiceState],
    *,
    write_timeout_s: float = 30.0,
) -> web.StreamResponse:
    """Send the choices' outputs as server-sent events as they come."""
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await resp.prepare(request)

    async def write(data: bytes) -> None:
        await asyncio.wait_for(resp.write(data), write_timeout_s)

    base = {
        "id": rid,
        "object": "chat.completion.chunk" if req.chat else "text_completion",
        "created": int(time.time()),
        "model": req.model,
    }
    if req.include_usage:
        base["usage"] = None

    def chunk(
        s: ChoiceState, delta: str, start: int, finish: str | None, role=False, extra=None
    ) -> dict:
        c = {"index": s.index}
        if req.chat:
            c["delta"] = {"role": "assistant", "content": ""} if role else {}
            if delta:
                c["delta"]["content"] = delta
            if extra:
                c["delta"].update(extra)
        else:
            c["text"] = delta
        lp = None
        if req.logprobs is not None and len(s.ids) > start:
            lp = (
                s.chat_logprobs(start, req.logprobs)
                if req.chat
                else s.completion_logprobs(start, req.logprobs)
            )
        c["logprobs"] = lp
        c["finish_reason"] = finish
        if req.return_token_ids:
            c["token_ids"] = s.ids[start:]
        return {**base, "choices": [c]}

    try:
        if req.chat:
            await write(b"".join(_sse(chunk(s, "", 0, None, True)) for s in states.values()))
        pending = len(states)
        while pending:
            items = [await queue.get()]
            while not queue.empty():
                items.append(queue.get_nowait())
            out = []
            for item in items:
                if isinstance(item, BaseException):
                    err = APIError(f"the engine failed: {item}", None, 500, "server_error")
                    await write(_sse(err.body()))
                    return resp
                s = states[item.request_id]
                start = len(s.ids)
                named = req.tools.named if req.tools is not None else None
                delta = s.push(item, streaming=True)
                pending -= item.finished
                finish = s.finish_reason if item.finished else None
                if named is not None:  # the arguments stream as they come
                    if s.call_id is None:
                        s.call_id = new_call_id()
                        out.append(
                            _sse(chunk(s, "", start, None, extra=call_head(0, s.call_id, named)))
                        )
                    if delta:
                        out.append(_sse(chunk(s, "", start, None, extra=call_args(0, delta))))
                    if finish:
                        finish = "tool_calls" if finish == "stop" else finish
                        out.append(_sse(chunk(s, "", start, finish)))
                    continue
                if req.tools is not None and not s.text_only:
                    if not item.finished:
                        if req.tools.choice != "auto" or may_be_call(s.sent):
                            continue  # held until complete (see the module's docstring)
                        s.text_only = True  # plain text: what was held goes out now
                        out.append(_sse(chunk(s, s.sent, 0, None)))
                        continue
                    deltas = stream_deltas(req.tools, s.sent)
                    if any("tool_calls" in d for d in deltas) and finish == "stop":
                        finish = "tool_calls"
                    out.extend(_sse(chunk(s, "", start, None, extra=d)) for d in deltas)
                    out.append(_sse(chunk(s, "", start, finish)))
                    continue
                if (
                    delta
                    or finish
                    or req.logprobs is not None
                    or req.return_token_ids
                    or s.tok is None
                ):
                    out.append(_sse(chunk(s, delta, start, finish)))
            if out:
                await write(b"".join(out))
        if req.include_usage:
            usage = _usage(req, list(states.values()))
            await write(_sse({**base, "choices": [], "usage": usage}))
        await write(b"data: [DONE]\n\n")
        await resp.write_eof()
    except ConnectionResetError:  # the client went away: the caller aborts what is left
        log.debug("%s: client disconnected", rid)
    except asyncio.TimeoutError:  # the client stopped reading: end it, the caller aborts
        log.info("%s: the client took no data for %.1f s; closing", rid, write_timeout_s)
        if request.transport is not None:
            request.transport.close()
    return resp
