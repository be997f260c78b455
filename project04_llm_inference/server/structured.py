"""Structured output and tool calls in OpenAI request bodies.

Constraints a request may carry (one at a time):
- `response_format`: `{"type": "text"}` (none), `{"type": "json_object"}`, or
  `{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}`; chat and completions.
- `structured_outputs` (vLLM's name): `{"json": schema}`, `{"json_object": true}`,
  `{"regex": "..."}`, `{"grammar": "<EBNF>"}` or `{"choice": ["a", "b"]}`.

Tool calls (chat only): `tools` lists functions (`{"type": "function", "function": {"name",
"description", "parameters"}}`); they are given to the chat template as `tools`. `tool_choice`:
- "none": no tool is called (the default without tools), the output is text;
- "auto" (the default with tools): the model writes freely; an output that is one JSON object
  `{"name": <a listed tool>, "arguments": {...}}` (or a list of them, or `<tool_call>` blocks
  holding them), alone, is returned as tool calls, anything else as text;
- "required": the output is generated under the schema "one call object of a listed tool, its
  arguments under that tool's `parameters`";
- `{"type": "function", "function": {"name": N}}`: the output is generated under N's
  `parameters` schema: it is the call's arguments.

Every constraint is compiled here (in the server's tokenizer threads), so a bad one is answered
400 naming its field before the engine sees it.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from ..config import StructuredOutputsParams
from ..engine.structured import GrammarError
from .protocol import APIError

_SO_KEYS = ("json", "json_object", "regex", "grammar", "choice")
_LEGACY = ("guided_json", "guided_regex", "guided_grammar", "guided_choice", "guided_json_object")


@dataclass
class ToolMode:
    """What the chat request's tools ask for."""

    tools: dict[str, dict]  # name -> the function object
    choice: str  # "auto", "required", or the forced function's name
    listed: list[dict]  # the tools as given (for the chat template)

    @property
    def named(self) -> str | None:
        return None if self.choice in ("auto", "required") else self.choice


def _schema_of(fn: dict) -> dict:
    p = fn.get("parameters")
    return p if isinstance(p, dict) and p else {"type": "object"}


def _response_format(body: dict) -> StructuredOutputsParams | None:
    rf = body.get("response_format")
    if rf is None:
        return None
    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise APIError("response_format must be an object with a string 'type'", "response_format")
    kind = rf["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutputsParams(json_object=True)
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict) or not isinstance(js.get("schema"), dict):
            raise APIError(
                "response_format.json_schema must be an object with a 'schema' object",
                "response_format.json_schema",
            )
        return StructuredOutputsParams(json=js["schema"])
    raise APIError(
        f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}",
        "response_format.type",
    )


def _structured_outputs(body: dict) -> StructuredOutputsParams | None:
    so = body.get("structured_outputs")
    if so is None:
        return None
    f = "structured_outputs"
    if not isinstance(so, dict):
        raise APIError(f"{f} must be an object", f)
    unknown = sorted(set(so) - set(_SO_KEYS))
    if unknown:
        raise APIError(f"{f}: unknown field {unknown[0]!r} (known: {', '.join(_SO_KEYS)})", f)
    kw = {k: v for k, v in so.items() if v is not None and v is not False}
    if len(kw) != 1:
        raise APIError(f"{f}: give exactly one of {', '.join(_SO_KEYS)}", f)
    ((k, v),) = kw.items()
    ok = {
        "json": isinstance(v, (dict, str)),
        "json_object": v is True,
        "regex": isinstance(v, str) and v != "",
        "grammar": isinstance(v, str) and v != "",
        "choice": isinstance(v, list) and v and all(isinstance(x, str) and x for x in v),
    }[k]
    if not ok:
        want = {
            "json": "a JSON schema (object or string)",
            "json_object": "true",
            "regex": "a non-empty string",
            "grammar": "a non-empty EBNF string",
            "choice": "a non-empty list of non-empty strings",
        }[k]
        raise APIError(f"{f}.{k} must be {want}", f"{f}.{k}")
    return StructuredOutputsParams(**kw)


def _tools(body: dict) -> ToolMode | None:
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is None or tools == []:
        if choice not in (None, "none"):
            raise APIError("tool_choice needs tools", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise APIError("tools must be a list of function tools", "tools")
    by_name: dict[str, dict] = {}
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not (isinstance(t, dict) and t.get("type") == "function" and isinstance(fn, dict)):
            raise APIError(
                f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}", "tools"
            )
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise APIError(f"tools[{i}].function.name must be a non-empty string", "tools")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise APIError(f"tools[{i}].function.parameters must be a JSON schema object", "tools")
        by_name[name] = fn
    if choice is None:
        choice = "auto"
    if choice == "none":
        return None
    if isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            raise APIError(
                "tool_choice must be 'none', 'auto', 'required' or "
                "{'type': 'function', 'function': {'name': ...}}",
                "tool_choice",
            )
        if name not in by_name:
            raise APIError(
                f"tool_choice names the function {name!r}, which is not in tools "
                f"({', '.join(by_name)})",
                "tool_choice",
            )
        choice = name
    elif choice not in ("auto", "required"):
        raise APIError(
            f"tool_choice must be 'none', 'auto', 'required' or a named function, got {choice!r}",
            "tool_choice",
        )
    return ToolMode(by_name, choice, tools)


def _call_schema(mode: ToolMode) -> dict:
    """One call of any listed tool: {"name": <const>, "arguments": <its parameters>}."""
    alts = [
        {
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": _schema_of(fn)},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for name, fn in mode.tools.items()
    ]
    return alts[0] if len(alts) == 1 else {"anyOf": alts}


def parse_constraints(body: dict, grammars, *, chat: bool):
    """(the request's StructuredOutputsParams compiled, or None; its ToolMode, or None)."""
    for k in _LEGACY:
        if k in body:
            raise APIError(f"{k} is not supported: use structured_outputs (vLLM's current name)", k)
    rf = _response_format(body)
    so = _structured_outputs(body)
    if rf is not None and so is not None:
        raise APIError("give response_format or structured_outputs, not both", "structured_outputs")
    spec, field = (rf, "response_format") if rf is not None else (so, "structured_outputs")
    mode = None
    if chat:
        mode = _tools(body)
    else:
        for k in ("tools", "tool_choice"):
            if body.get(k) not in (None, [], "none"):
                raise APIError(f"{k} is only supported by /v1/chat/completions", k)
    if mode is not None and mode.choice != "auto":
        if spec is not None:
            raise APIError(
                f"{field} cannot be combined with tool_choice {mode.choice!r} (the call has "
                "its own schema)",
                field,
            )
        schema = _schema_of(mode.tools[mode.named]) if mode.named else _call_schema(mode)
        spec, field = StructuredOutputsParams(json=schema), "tools"
    if spec is not None:
        if grammars is None:
            raise APIError(f"{field}: structured output is not available on this server", field)
        try:
            grammars.compile(spec, field)
        except GrammarError as e:
            msg = str(e)
            if not msg.startswith(field):
                msg = f"{field}: {msg.split(': ', 1)[-1]}"
            raise APIError(msg, field) from None
    return spec, mode


# --- the answer -----------------------------------------------------------------------------


def _call(name: str, arguments) -> dict:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {
        "id": new_call_id(),
        "type": "function",
        "function": {"name": name, "arguments": args},
    }


_TAG = re.compile(r"\s*<tool_call>(.*?)</tool_call>\s*", re.S)


def may_be_call(text: str) -> bool:
    """Whether an "auto" output that begins with text may still turn out to be a call."""
    s = text.lstrip()
    return s[:1] in ("", "{", "[") or "<tool_call>".startswith(s[:11]) or s.startswith("<tool")


def _parse_calls(s: str, mode: ToolMode) -> list[dict] | None:
    try:
        obj = json.loads(s)
    except ValueError:
        return None
    items = obj if isinstance(obj, list) else [obj]
    if items and all(
        isinstance(o, dict)
        and o.get("name") in mode.tools
        and isinstance(o.get("arguments", o.get("parameters")), (dict, str))
        for o in items
    ):
        return [_call(o["name"], o.get("arguments", o.get("parameters"))) for o in items]
    return None


def tool_calls(mode: ToolMode, text: str) -> tuple[str | None, list[dict]]:
    """(content, tool calls) of a finished output under mode. "auto" takes the whole output as
    calls when it is one call object (`{"name", "arguments"}`, or Llama's `"parameters"`), a
    list of them, or a run of `<tool_call>{...}</tool_call>` blocks (Hermes/Qwen templates)."""
    if mode.named:
        return None, [_call(mode.named, text)]
    s = text.strip()
    calls = None
    if s[:1] in ("{", "["):
        calls = _parse_calls(s, mode)
    elif s.startswith("<tool_call>") and not _TAG.sub("", s):
        found = [_parse_calls(b.strip(), mode) for b in _TAG.findall(s)]
        if all(found):
            calls = [c for f in found for c in f]
    return (None, calls) if calls else (text, [])


def message(mode: ToolMode | None, text: str, finish: str | None):
    """The chat answer's message and finish reason."""
    if mode is None:
        return {"role": "assistant", "content": text}, finish
    content, calls = tool_calls(mode, text)
    msg = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = calls
        if finish == "stop":
            finish = "tool_calls"
    return msg, finish


def call_head(index: int, call_id: str, name: str) -> dict:
    """A streamed call's first delta: its id, type and name, empty arguments."""
    fn = {"name": name, "arguments": ""}
    return {"tool_calls": [{"index": index, "id": call_id, "type": "function", "function": fn}]}


def call_args(index: int, text: str) -> dict:
    """A streamed call's next piece of arguments."""
    return {"tool_calls": [{"index": index, "function": {"arguments": text}}]}


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def stream_deltas(mode: ToolMode, text: str) -> list[dict]:
    """The deltas that stream a finished output under mode, as OpenAI sends them: text as one
    content delta; each tool call as its id, type and name with empty arguments, then its
    arguments."""
    content, calls = tool_calls(mode, text)
    if not calls:
        return [{"content": content}] if content else []
    out = []
    for i, c in enumerate(calls):
        fn = c["function"]
        out += [call_head(i, c["id"], fn["name"]), call_args(i, fn["arguments"])]
    return out
