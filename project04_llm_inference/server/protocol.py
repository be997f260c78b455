"""OpenAI request bodies -> what the engine runs, checked field by field.

Every refusal is an `APIError` naming the field (the `param` of the OpenAI error body). Fields the
engine does not implement are refused when set to anything but their neutral value (a penalty of
0, `echo` false, ...), never silently ignored; fields that change nothing here (`user`,
`metadata`) are ignored.

Logprobs: the engine returns the log-probability of each chosen token only. Completions'
`logprobs: k` and chat's `top_logprobs: k` are accepted, and `top_logprobs` then lists the chosen
token alone.

Structured output (`response_format`, `structured_outputs`) and tool calls (`tools`,
`tool_choice`) are read and compiled by `structured.parse_constraints`.

Work per request is bounded before any is done: the body's JSON (`json_body.parse_json`), the
characters of
prompt text (`Limits.max_prompt_chars`, checked before tokenizing), the choices (n times the
prompts, `Limits.max_choices`), stop strings and logprobs (`SamplingParams`' bounds). The whole
of it runs off the event loop (`api.py` hands it to a thread), so a large prompt never stalls
other clients.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace

from ..config import MAX_INT32, SamplingParams
from ..model.tokenizer import Tokenizer
from .chat import ChatFormatter, ChatTemplateError

MAX_LOGPROBS = 20
# fields the engine does not implement, with the values that mean "off"
_UNSUPPORTED = {
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "logit_bias": (None, {}),
    "echo": (None, False),
    "suffix": (None, ""),
    "functions": (None, []),
    "stop_token_ids": (None, []),
}


class APIError(Exception):
    """An error answered with an OpenAI-style body."""

    def __init__(
        self,
        message: str,
        param: str | None = None,
        status: int = 400,
        type: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.type = message, param, status, type
        self.code = code

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


@dataclass
class Limits:
    """Per-request bounds of the server (`serve`'s flags of the same names)."""

    max_choices: int = 16
    """n times the number of prompts of one request."""
    max_prompt_chars: int | None = None
    """Characters of prompt text per prompt (a chat's messages together), checked before
    tokenizing; None: 32 per token of the model's context (a text that long is very unlikely to
    fit: English runs about 4 characters a token)."""

    def prompt_chars(self, max_model_len: int) -> int:
        return self.max_prompt_chars or 32 * max_model_len


@dataclass
class ModelInfo:
    """What request checking needs to know about the served model."""

    names: list[str]
    max_model_len: int
    vocab_size: int
    tokenizer: Tokenizer | None
    chat: ChatFormatter | None
    limits: Limits = field(default_factory=Limits)
    grammars: object | None = (
        None  # the engine's `structured.Grammars` (None: no structured output)
    )


@dataclass
class Choice:
    index: int
    prompt_index: int
    prompt_ids: list[int]
    params: SamplingParams


@dataclass
class GenerationRequest:
    chat: bool
    model: str
    choices: list[Choice]
    stream: bool
    include_usage: bool
    logprobs: int | None  # None: off; else how many top entries were asked for
    return_token_ids: bool
    tools: object | None = None  # `structured.ToolMode` of a chat request with tools


# --- field readers --------------------------------------------------------------------------


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _get_int(body: dict, name: str, default, lo: int | None = None, hi: int | None = None):
    x = body.get(name)
    if x is None:
        return default
    if not _is_int(x):
        raise APIError(f"{name} must be an integer, got {type(x).__name__}", name)
    if lo is not None and x < lo:
        raise APIError(f"{name} must be >= {lo}, got {x}", name)
    if hi is not None and x > hi:
        raise APIError(f"{name} must be <= {hi}, got {x}", name)
    return x


def _get_float(body: dict, name: str, default: float) -> float:
    x = body.get(name)
    if x is None:
        return default
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        raise APIError(f"{name} must be a finite number, got {x!r}", name)
    return float(x)


def _get_bool(body: dict, name: str, default: bool) -> bool:
    x = body.get(name)
    if x is None:
        return default
    if not isinstance(x, bool):
        raise APIError(f"{name} must be a boolean, got {type(x).__name__}", name)
    return x


def _get_stop(body: dict) -> list[str]:
    x = body.get("stop")
    if x is None:
        return []
    stops = [x] if isinstance(x, str) else x
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise APIError("stop must be a non-empty string or a list of non-empty strings", "stop")
    return stops  # their number and lengths: SamplingParams' bounds


def _is_token_list(x) -> bool:
    return isinstance(x, list) and bool(x) and all(_is_int(t) for t in x)


# --- the two routes' bodies -----------------------------------------------------------------


def _check_chars(info: ModelInfo, n_chars: int, field: str) -> None:
    limit = info.limits.prompt_chars(info.max_model_len)
    if n_chars > limit:
        raise APIError(
            f"{field}: {n_chars} characters of text, more than the {limit} this server "
            f"tokenizes for a context of {info.max_model_len} tokens",
            field,
        )


def _encode_text(info: ModelInfo, text: str, field: str) -> list[int]:
    if info.tokenizer is None:
        raise APIError(
            f"{field}: text needs the model folder's tokenizer.json; this model has none "
            "(send token ids)",
            field,
        )
    _check_chars(info, len(text), field)
    return info.tokenizer.encode(text)


def _completion_prompts(info: ModelInfo, body: dict, n: int) -> list[list[int]]:
    p = body.get("prompt")
    count = len(p) if isinstance(p, list) and p and not _is_int(p[0]) else 1
    if n * count > info.limits.max_choices:
        raise APIError(
            f"n times the number of prompts must be <= {info.limits.max_choices}, got "
            f"{n} x {count}",
            "n",
        )
    if isinstance(p, str):
        prompts = [_encode_text(info, p, "prompt")]
    elif _is_token_list(p):
        prompts = [list(p)]
    elif isinstance(p, list) and p and all(isinstance(x, str) for x in p):
        prompts = [_encode_text(info, x, "prompt") for x in p]
    elif isinstance(p, list) and p and all(_is_token_list(x) for x in p):
        prompts = [list(x) for x in p]
    else:
        raise APIError(
            "prompt must be a string, a list of token ids, or a non-empty list of either", "prompt"
        )
    for ids in prompts:
        if not ids:
            raise APIError("prompt: empty (it encodes to no tokens)", "prompt")
        bad = [t for t in ids if not 0 <= t < info.vocab_size]
        if bad:
            raise APIError(
                f"prompt: token ids must be in [0, {info.vocab_size}), got {bad[:3]}", "prompt"
            )
    return prompts


def _message_text(m, i: int) -> dict:
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise APIError(f"messages[{i}] must be an object with a string 'role'", "messages")
    content = m.get("content")
    if content is None:
        content = ""
    elif isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"):
                raise APIError(f"messages[{i}].content: only text parts are supported", "messages")
            if not isinstance(part.get("text"), str):
                raise APIError(f"messages[{i}].content: a text part needs 'text'", "messages")
            parts.append(part["text"])
        content = "".join(parts)
    elif not isinstance(content, str):
        raise APIError(f"messages[{i}].content must be a string or a list of parts", "messages")
    return {**{k: v for k, v in m.items() if k != "content"}, "content": content}


def _chat_prompt(info: ModelInfo, body: dict, tools: list | None = None) -> list[int]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise APIError("messages must be a non-empty list", "messages")
    if info.chat is None:
        raise APIError(
            "messages: chat needs the model folder's tokenizer.json; this model has none "
            "(use /v1/completions with token ids)",
            "messages",
        )
    messages = [_message_text(m, i) for i, m in enumerate(msgs)]
    _check_chars(info, sum(len(m["content"]) for m in messages), "messages")
    try:
        ids = info.chat.encode(
            messages, max_chars=info.limits.prompt_chars(info.max_model_len), tools=tools
        )
    except ChatTemplateError as e:
        raise APIError(str(e), "messages") from None
    if not ids:
        raise APIError("messages: the rendered prompt has no tokens", "messages")
    return ids


def parse_request(info: ModelInfo, body, *, chat: bool) -> GenerationRequest:
    if not isinstance(body, dict):
        raise APIError("the request body must be a JSON object", None)
    model = body.get("model")
    if model is None:
        model = info.names[0]
    elif not isinstance(model, str) or model not in info.names:
        raise APIError(
            f"The model {model!r} does not exist on this server; served: {info.names}",
            "model",
            404,
            code="model_not_found",
        )
    for name, neutral in _UNSUPPORTED.items():
        if name in body and body[name] not in neutral:
            raise APIError(f"{name} is not supported by this server", name)

    from .structured import parse_constraints

    spec, tool_mode = parse_constraints(body, info.grammars, chat=chat)
    n = _get_int(body, "n", 1, lo=1, hi=info.limits.max_choices)
    best_of = body.get("best_of")
    if best_of is not None and best_of != n:
        raise APIError("best_of is not supported by this server (give n alone)", "best_of")
    listed = tool_mode.listed if tool_mode is not None else None
    prompts = [_chat_prompt(info, body, listed)] if chat else _completion_prompts(info, body, n)
    prompt_field = "messages" if chat else "prompt"
    max_field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else None
    max_tokens = _get_int(body, "max_completion_tokens", None, lo=1)
    if max_tokens is None:
        max_tokens = _get_int(body, "max_tokens", None, lo=1)
        max_field = "max_tokens"

    stream = _get_bool(body, "stream", False)
    include_usage = False
    opts = body.get("stream_options")
    if opts is not None:
        if not stream:
            raise APIError("stream_options is only allowed with stream: true", "stream_options")
        if not isinstance(opts, dict):
            raise APIError("stream_options must be an object", "stream_options")
        include_usage = _get_bool(opts, "include_usage", False)

    if chat:
        wants = _get_bool(body, "logprobs", False)
        top = _get_int(body, "top_logprobs", None, lo=0, hi=MAX_LOGPROBS)
        if top is not None and not wants:
            raise APIError("top_logprobs needs logprobs: true", "top_logprobs")
        logprobs = (top or 0) if wants else None
    else:
        logprobs = _get_int(body, "logprobs", None, lo=0, hi=MAX_LOGPROBS)

    seed = _get_int(body, "seed", None, lo=0, hi=2**63 - 1 - info.limits.max_choices)
    top_k = _get_int(body, "top_k", 0, lo=-1, hi=MAX_INT32)
    stop = _get_stop(body)
    if stop and info.tokenizer is None:
        raise APIError("stop: stop strings need the model folder's tokenizer.json", "stop")
    try:
        base = SamplingParams(
            temperature=_get_float(body, "temperature", 1.0),
            top_p=_get_float(body, "top_p", 1.0),
            top_k=0 if top_k == -1 else top_k,
            min_p=_get_float(body, "min_p", 0.0),
            stop=stop,
            ignore_eos=_get_bool(body, "ignore_eos", False),
            logprobs=logprobs is not None,
            structured_outputs=spec,
        )
    except (ValueError, TypeError) as e:
        m = re.search(r"SamplingParams\.(\w+)", str(e))
        raise APIError(str(e).replace("SamplingParams.", ""), m.group(1) if m else None) from None

    choices = []
    for p, ids in enumerate(prompts):
        room = info.max_model_len - len(ids)
        if room < 1:
            raise APIError(
                f"{prompt_field}: {len(ids)} tokens leave no room to generate within the "
                f"model's context of {info.max_model_len} tokens",
                prompt_field,
            )
        if max_tokens is None:
            want = room if chat else min(16, room)
        elif max_tokens > room:
            raise APIError(
                f"{max_field}: {max_tokens} tokens after a prompt of {len(ids)} exceed the "
                f"model's context of {info.max_model_len} tokens (at most {room})",
                max_field,
            )
        else:
            want = max_tokens
        for i in range(n):
            index = p * n + i
            params = replace(
                base, max_tokens=want, seed=None if seed is None else seed + index, stop=list(stop)
            )
            choices.append(Choice(index, p, ids, params))
    return GenerationRequest(
        chat=chat,
        model=model,
        choices=choices,
        stream=stream,
        include_usage=include_usage,
        logprobs=logprobs,
        return_token_ids=_get_bool(body, "return_token_ids", False),
        tools=tool_mode,
    )
