"""Structured output and tool calls through the OpenAI server, as the `openai` client sees them:
one `serve` process over a tiny random-weight model with a byte-level BPE tokenizer trained in
the test. JSON schema answers validate, regexes fullmatch, tool calls parse (streamed and not),
and bad constraints are answered 400 naming the field."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("aiohttp")
pytest.importorskip("tokenizers")
pytest.importorskip("xgrammar", reason="structured output needs the 'structured' extra (xgrammar)")
jsonschema = pytest.importorskip("jsonschema")

from project04_llm_inference.server.structured import ToolMode, may_be_call, tool_calls  # noqa: E402

from .conftest import write_bpe_model_dir  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
STARTUP_S = 90.0
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Oslo", "Lima"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"enum": ["Paris", "Oslo"]},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location", "unit"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"utc": {"type": "boolean"}},
            "required": ["utc"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, CLOCK]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MSG = [{"role": "user", "content": "What is the weather in Paris?"}]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("bpe-served")
    write_bpe_model_dir(d)
    port = _free_port()
    log = d / "server.log"
    cmd = [
        sys.executable,
        "-m",
        "project04_llm_inference",
        "serve",
        "--engine.model",
        str(d),
        "--engine.load-format",
        "dummy",
        "--engine.device",
        "cpu",
        "--engine.max-model-len",
        "512",
        "--served-model-name",
        "tiny",
        "--port",
        str(port),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_S
    while True:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1.0) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"server not healthy within {STARTUP_S} s:\n{log.read_text()}")
        time.sleep(0.1)
    yield openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60.0)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def test_json_schema_chat_and_completions(server):
    rf = {"type": "json_schema", "json_schema": {"name": "trip", "schema": SCHEMA}}
    chat = server.chat.completions.create(
        model="tiny", messages=MSG, response_format=rf, max_tokens=100, n=3, seed=1
    )
    for c in chat.choices:
        assert c.finish_reason == "stop"
        jsonschema.validate(json.loads(c.message.content), SCHEMA)
    comp = server.completions.create(
        model="tiny",
        prompt="trip:",
        max_tokens=100,
        temperature=0,
        extra_body={"response_format": rf},
    )
    jsonschema.validate(json.loads(comp.choices[0].text), SCHEMA)


def test_regex_and_choice(server):
    out = server.completions.create(
        model="tiny",
        prompt="code:",
        max_tokens=30,
        n=4,
        seed=3,
        extra_body={"structured_outputs": {"regex": r"[A-Z]{2}\d{3}"}},
    )
    for c in out.choices:
        assert re.fullmatch(r"[A-Z]{2}\d{3}", c.text), c.text
    out = server.chat.completions.create(
        model="tiny",
        messages=MSG,
        max_tokens=10,
        extra_body={"structured_outputs": {"choice": ["yes", "no"]}},
    )
    assert out.choices[0].message.content in ("yes", "no")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("choice", ["required", "named"])
def test_tool_calls(server, choice, stream):
    tc = {"type": "function", "function": {"name": "get_weather"}} if choice == "named" else choice
    kw = dict(model="tiny", messages=MSG, tools=TOOLS, tool_choice=tc, max_tokens=120, seed=5)
    if not stream:
        out = server.chat.completions.create(**kw)
        c = out.choices[0]
        assert c.finish_reason == "tool_calls"
        assert c.message.content is None
        calls = [(t.id, t.function.name, t.function.arguments) for t in c.message.tool_calls]
    else:
        parts: dict[int, dict] = {}
        finish, arg_deltas = None, 0
        for chunk in server.chat.completions.create(stream=True, **kw):
            for ch in chunk.choices:
                finish = ch.finish_reason or finish
                for d in ch.delta.tool_calls or []:
                    p = parts.setdefault(d.index, {"id": None, "name": "", "args": ""})
                    p["id"] = d.id or p["id"]
                    if d.function is not None:
                        p["name"] += d.function.name or ""
                        p["args"] += d.function.arguments or ""
                        arg_deltas += bool(d.function.arguments)
        assert finish == "tool_calls"
        calls = [(p["id"], p["name"], p["args"]) for _, p in sorted(parts.items())]
        if choice == "named":  # its arguments stream as they are generated
            assert arg_deltas > 1
    assert len(calls) == 1
    cid, name, args = calls[0]
    assert cid.startswith("call_")
    assert name == "get_weather" if choice == "named" else name in PARAMS
    jsonschema.validate(json.loads(args), PARAMS[name])


def test_auto_and_none_answer_text_or_calls(server):
    """tool_choice auto on random weights writes text (no call object): content, no calls."""
    for tc in ("auto", "none"):
        out = server.chat.completions.create(
            model="tiny", messages=MSG, tools=TOOLS, tool_choice=tc, max_tokens=8, seed=2
        )
        c = out.choices[0]
        assert not c.message.tool_calls and c.finish_reason in ("stop", "length")


def test_auto_streams_text_as_text(server):
    """An "auto" answer that cannot be a call streams as content, as soon as that is known;
    the streamed text equals the whole answer."""
    kw = dict(model="tiny", messages=MSG, tools=TOOLS, max_tokens=24, seed=2, temperature=1.0)
    whole = server.chat.completions.create(**kw).choices[0].message.content
    pieces = [
        ch.delta.content
        for chunk in server.chat.completions.create(stream=True, **kw)
        for ch in chunk.choices
        if ch.delta.content
    ]
    assert "".join(pieces) == whole
    if not may_be_call(whole[:1]):
        assert len(pieces) > 1  # streamed, not held to the end


def test_auto_detects_a_call_object():
    mode = ToolMode({"get_time": CLOCK["function"]}, "auto", [CLOCK])
    content, calls = tool_calls(mode, ' {"name": "get_time", "arguments": {"utc": true}}')
    assert content is None and calls[0]["function"]["name"] == "get_time"
    assert json.loads(calls[0]["function"]["arguments"]) == {"utc": True}
    assert tool_calls(mode, '{"name": "nope", "arguments": {}}')[1] == []
    assert tool_calls(mode, "plain text")[0] == "plain text"
    tagged = '<tool_call>{"name": "get_time", "arguments": {"utc": false}}</tool_call>\n'
    content, calls = tool_calls(mode, tagged * 2)
    assert content is None and [c["function"]["name"] for c in calls] == ["get_time"] * 2
    assert tool_calls(mode, tagged + "and some text")[1] == []


@pytest.mark.parametrize(
    "body, param",
    [
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "x"}}}},
            "response_format",
        ),
        ({"structured_outputs": {"regex": "[a-"}}, "structured_outputs"),
        ({"structured_outputs": {"grammar": "root ::= nope"}}, "structured_outputs"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
        ),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
    ],
)
def test_bad_constraints_are_400_naming_the_field(server, body, param):
    with pytest.raises(openai.BadRequestError) as e:
        server.chat.completions.create(model="tiny", messages=MSG, max_tokens=4, extra_body=body)
    assert e.value.status_code == 400
    assert e.value.body["param"] == param, e.value.body
