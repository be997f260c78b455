"""The server under hostile and careless clients: one live server on 127.0.0.1 for the module
(in this process, on its own event-loop thread, so the tests can look at the engine), a tiny
dummy-weight model with a word-level tokenizer.

Every case is a request that once broke the server (a 500, a dead engine loop, a stalled event
loop, NaN sampling, a foreign web page driving it); each must now get a clear answer (an
OpenAI-shaped error naming the field, or the right result), `/health` must stay green, and at
the end no KV block may be held. A seeded fuzz of request bodies closes the module.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import random
import socket
import threading
import time

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("tokenizers")

from project04_llm_inference import EngineArgs, SamplingParams  # noqa: E402
from project04_llm_inference.config import DUMMY_SHAPES  # noqa: E402

NAME = "tiny"
MAX_MODEL_LEN = 256
READ_TIMEOUT_S = 0.5  # the test server's; the half-sent bodies wait out this long
SPECIAL = ["<unk>", "<s>", "</s>"]
WORDS = [a + v + b for a in "bdfgklmnprstvz" for v in "aeiou" for b in "bdfgklmnprstvz"][:253]


def _write_model(d) -> None:
    """config.json of the tiny shape, a WordLevel tokenizer over its 256 ids, a chat template
    (no weights: the engine makes dummy ones)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    (d / "config.json").write_text(json.dumps(DUMMY_SHAPES["tiny"]))
    vocab = {w: i for i, w in enumerate(SPECIAL + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(SPECIAL)
    tok.save(str(d / "tokenizer.json"))
    template = "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))


class LiveServer:
    """`start_server` on a background event loop; `url`, `port`, `app`, `engine`."""

    def __init__(self, model_dir) -> None:
        from project04_llm_inference.server.api import ServerOptions, start_server

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        args = EngineArgs(
            model=str(model_dir),
            load_format="dummy",
            device="cpu",
            num_gpu_blocks=64,
            max_model_len=MAX_MODEL_LEN,
        )
        options = ServerOptions(
            host="127.0.0.1",
            port=0,
            max_queued_requests=64,
            read_timeout_s=READ_TIMEOUT_S,
            write_timeout_s=2.0,
            allowed_origins=["http://allowed.example:3000"],
        )
        self.server = self.call(start_server(args, options, model_name=NAME))
        self.url = self.server.url
        self.port = int(self.url.rsplit(":", 1)[1])
        self.app = self.server.runner.app
        self.engine = self.server.engine

    def call(self, coro, timeout: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        try:
            self.call(self.server.stop(0.0))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)


@pytest.fixture(scope="module")
def live(tmp_path_factory, one_thread):
    d = tmp_path_factory.mktemp("tiny-dummy-served")
    _write_model(d)
    server = LiveServer(d)
    yield server
    server.stop()
    engine = server.engine.engine  # the thread is joined: the engine may be read here
    assert engine.requests == {}
    engine.block_manager.check_no_leaks([])  # every block free, every count zero


def request(live, method, path, body=None, headers=None, timeout=30.0):
    """(status, parsed JSON or text) of one request; `body` a dict (sent as JSON) or bytes."""
    conn = http.client.HTTPConnection("127.0.0.1", live.port, timeout=timeout)
    try:
        hdrs = {"Content-Type": "application/json"}
        hdrs.update(headers or {})
        hdrs = {k: v for k, v in hdrs.items() if v is not None}
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        conn.request(method, path, body=data, headers=hdrs)
        r = conn.getresponse()
        text = r.read().decode()
        try:
            return r.status, json.loads(text)
        except ValueError:
            return r.status, text
    finally:
        conn.close()


def post(live, body, route="completions", **kw):
    return request(live, "POST", f"/v1/{route}", body, **kw)


def assert_error(answer, status, got_status, param=None):
    assert got_status == status, answer
    err = answer["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], answer
    if param is not None:
        assert err["param"] == param, answer


def assert_healthy(live):
    assert request(live, "GET", "/health") == (200, {"status": "ok"})


def wait_idle(live, timeout: float = 10.0) -> dict:
    """The engine's stats once nothing runs or waits (read through /metrics)."""
    deadline = time.monotonic() + timeout
    while True:
        status, text = request(live, "GET", "/metrics")
        vals = {}
        for line in text.splitlines():
            if line.startswith(("llm_num_requests_", "llm_kv_cache_usage_ratio")):
                name, value = line.split("{")[0], float(line.rsplit(" ", 1)[1])
                vals[name] = value
        idle = vals.get("llm_num_requests_running") == vals.get("llm_num_requests_waiting") == 0
        if (idle and vals.get("llm_kv_cache_usage_ratio") == 0) or time.monotonic() > deadline:
            return vals
        time.sleep(0.02)


def greedy(prompt: str, n_tokens: int = 6, **extra) -> dict:
    body = dict(
        prompt=prompt, max_tokens=n_tokens, temperature=0, ignore_eos=True, return_token_ids=True
    )
    return {**body, **extra}


PROMPT = " ".join(WORDS[10:18])


# --- the cases, replayed ------------------------------------------------------------------------

HUGE = 18446744073709551616  # 2**64: once a 500 that killed the engine loop


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": "bab", "top_k": HUGE}, "top_k"),
        ({"prompt": "bab", "top_k": 10**30}, "top_k"),
        ({"prompt": "bab", "top_k": True}, "top_k"),
        ({"prompt": "bab", "seed": "x"}, "seed"),
        ({"prompt": "bab", "seed": HUGE}, "seed"),
        ({"prompt": "bab", "max_tokens": 2.5}, "max_tokens"),
        ({"prompt": "bab", "max_tokens": HUGE}, "max_tokens"),
        ({"prompt": "bab", "temperature": 1e30}, "temperature"),
        ({"prompt": "bab", "temperature": -1e-39}, "temperature"),
        ({"prompt": "bab", "top_p": 1.5}, "top_p"),
        ({"prompt": "bab", "stop": [1]}, "stop"),
        ({"prompt": "bab", "stop": ["x"] * 100_000}, "stop"),
        ({"prompt": "bab", "stop": "x" * 1000}, "stop"),
        ({"prompt": "bab", "n": 17}, "n"),
        ({"prompt": ["bab"] * 9, "n": 2}, "n"),
        ({"prompt": "bab", "n": 0}, "n"),
        ({"prompt": "bab", "logprobs": 21}, "logprobs"),
        ({"prompt": [1, 2, HUGE]}, "prompt"),
        ({"prompt": "bab " * 5000}, "prompt"),  # 20,000 characters > 32 x 256
        ({"messages": [{"role": "user", "content": "bab " * 5000}]}, "messages"),
        ({"messages": [{"role": "u" * 100}] * 100}, "messages"),  # the rendered text's length
        ({"messages": [{"role": "user", "content": "bab"}], "top_k": HUGE}, "top_k"),
    ],
)
def test_bad_fields_answer_400_naming_the_field(live, body, param):
    status, answer = post(
        live, body, route="chat/completions" if "messages" in body else "completions"
    )
    assert_error(answer, 400, status, param)


def test_unknown_model_is_404(live):
    status, answer = post(live, {"model": "gpt-4", "prompt": "bab"})
    assert_error(answer, 404, status, "model")
    assert answer["error"]["code"] == "model_not_found"


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 100_000 + b"]" * 100_000,  # 100k-deep JSON
        b'{"prompt": [' * 70 + b"1" + b"]" * 70 + b"}",  # past the depth limit, parseable
        b'{"prompt": "bab", "max_tokens": ' + b"9" * 5000 + b"}",  # a 5,000-digit integer
        b'{"prompt": "bab \\ud800"}',  # a lone surrogate
        b'{"messages": [{"role": "user", "content": "\\udfff"}]}',
        b'{"prompt": "bab", "temperature": NaN}',
        b'{"prompt": "bab", "top_p": Infinity}',
        b'{"prompt": "bab"',
        b"\xff\xfe",
    ],
)
def test_malformed_bodies_answer_400(live, raw):
    route = "chat/completions" if b"messages" in raw else "completions"
    status, answer = post(live, raw, route=route)
    assert_error(answer, 400, status)
    assert "malformed JSON" in answer["error"]["message"]


def test_tiny_temperature_and_top_p_decode_the_argmax(live):
    """Once float32 underflow: NaN probabilities and token 0 at every step."""
    status, want = post(live, greedy(PROMPT, temperature=0))
    assert status == 200, want
    want_ids = want["choices"][0]["token_ids"]
    for extra in ({"temperature": 1e-39}, {"temperature": 1.0, "top_p": 1e-46, "seed": 3}):
        status, got = post(live, greedy(PROMPT, **extra))
        assert status == 200, got
        assert got["choices"][0]["token_ids"] == want_ids, extra


def test_guards_refuse_foreign_pages_and_non_json(live):
    body = greedy("bab", 1)
    own = f"http://127.0.0.1:{live.port}"
    status, answer = post(live, body, headers={"Content-Type": "text/plain"})
    assert_error(answer, 415, status)
    status, answer = post(live, body, headers={"Content-Type": None})
    assert_error(answer, 415, status)
    status, answer = post(live, body, headers={"Origin": "http://evil.example"})
    assert_error(answer, 403, status)
    status, answer = post(live, body, headers={"Origin": "null"})
    assert_error(answer, 403, status)
    status, answer = post(live, body, headers={"Host": "evil.example"})  # DNS rebinding
    assert_error(answer, 403, status)
    status, answer = request(
        live, "GET", "/v1/models", headers={"Host": f"evil.example:{live.port}"}
    )
    assert_error(answer, 403, status)
    # the same origin, a listed origin, the loopback names, and charset parameters pass
    for headers in (
        {"Origin": own},
        {"Origin": "http://allowed.example:3000"},
        {"Host": f"localhost:{live.port}"},
        {"Content-Type": "application/json; charset=utf-8"},
    ):
        status, answer = post(live, body, headers=headers)
        assert status == 200, (headers, answer)


def test_prompts_are_tokenized_off_the_event_loop(live):
    from project04_llm_inference.server.api import INFO

    tok = live.app[INFO].tokenizer
    threads = []
    encode = tok.encode

    def spy(text, *a, **kw):
        threads.append(threading.current_thread().name)
        return encode(text, *a, **kw)

    tok.encode = spy
    try:
        status, answer = post(live, greedy(PROMPT, 2))
        assert status == 200, answer
        status, answer = post(
            live,
            {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 2},
            route="chat/completions",
        )
        assert status == 200, answer
    finally:
        del tok.encode
    assert len(threads) == 2 and all(t.startswith("tokenize") for t in threads), threads


def test_logprob_offsets_are_the_decoded_prefix_lengths(live):
    from project04_llm_inference.server.api import INFO

    tok = live.app[INFO].tokenizer
    status, answer = post(live, greedy(PROMPT, 40, logprobs=1))
    assert status == 200, answer
    choice = answer["choices"][0]
    ids, lp = choice["token_ids"], choice["logprobs"]
    assert lp["text_offset"] == [len(tok.decode(ids[:i])) for i in range(len(ids))]
    assert choice["text"] == tok.decode(ids) and len(lp["token_logprobs"]) == 40


def test_streamed_text_equals_the_full_text(live):
    status, full = post(live, greedy(PROMPT, 30))
    assert status == 200
    conn = http.client.HTTPConnection("127.0.0.1", live.port, timeout=30)
    conn.request(
        "POST",
        "/v1/completions",
        json.dumps({**greedy(PROMPT, 30), "stream": True}).encode(),
        {"Content-Type": "application/json"},
    )
    events = conn.getresponse().read().decode().split("\n\n")
    conn.close()
    chunks = [json.loads(e[6:]) for e in events if e.startswith("data: {")]
    assert "".join(c["choices"][0]["text"] for c in chunks) == full["choices"][0]["text"]


def test_half_sent_requests_time_out(live):
    """Clients that send headers and part of a body, then nothing: each gets a 408 after the
    read timeout; clients that stop inside their headers are disconnected after it; the server
    answers everyone else meanwhile."""
    socks = []
    for _ in range(20):
        s = socket.create_connection(("127.0.0.1", live.port), timeout=10)
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"prompt":'
        )
        socks.append(s)
    slow = []  # and clients that never finish their headers
    for _ in range(20):
        s = socket.create_connection(("127.0.0.1", live.port), timeout=10)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0")
        slow.append(s)
    assert_healthy(live)
    t0 = time.monotonic()
    for s in socks:
        head = s.recv(4096)
        assert head.startswith(b"HTTP/1.1 408"), head[:100]
        s.close()
    for s in slow:
        assert s.recv(4096) == b""  # closed by the server
        s.close()
    # the read timeout, with room for a loaded 2-core machine
    assert time.monotonic() - t0 < READ_TIMEOUT_S + 5


def test_n_is_admitted_whole(live):
    status, answer = post(live, {**greedy(PROMPT, 2), "n": 16, "temperature": 1.0, "seed": 1})
    assert status == 200, answer
    assert [c["index"] for c in answer["choices"]] == list(range(16))


def test_an_oversized_body_is_413_and_the_server_goes_on(live):
    status, answer = post(live, b'{"prompt": "' + b"bab " * (9 * 2**18) + b'"}')  # 9 MiB
    assert_error(answer, 413, status)
    assert_healthy(live)


def test_a_request_choices_are_admitted_all_or_none(live):
    """The second choice is refused: the first, already in the engine, is taken back."""
    ok = SamplingParams(max_tokens=200, ignore_eos=True)
    items = [("whole-0", [1, 5, 6], ok), ("whole-1", [1, 999], ok)]
    with pytest.raises(ValueError, match="prompt"):
        live.call(live.engine.add_requests(items))
    too_many = [(f"many-{i}", [1, 5], ok) for i in range(65)]  # max_queued_requests is 64
    with pytest.raises(ValueError, match="could ever admit"):
        live.call(live.engine.add_requests(too_many))
    vals = wait_idle(live)
    assert vals["llm_num_requests_running"] == vals["llm_num_requests_waiting"] == 0, vals
    assert live.engine.num_in_flight == 0


def test_a_failing_step_fails_its_requests_and_the_loop_goes_on(live):
    """A step that raises (planted: any step running a request with max_tokens 13) fails that
    request with a 500; the engine loop survives, and the next requests are served."""
    engine = live.engine.engine
    step = engine.step

    def planted():
        if any(s.params.max_tokens == 13 for s in engine.scheduler.running):
            raise RuntimeError("planted step failure")
        return step()

    engine.step = planted
    try:
        status, answer = post(live, greedy(PROMPT, 13))
        assert_error(answer, 500, status)
        assert "planted step failure" in answer["error"]["message"]
    finally:
        del engine.step
    assert_healthy(live)
    status, answer = post(live, greedy(PROMPT, 5))
    assert status == 200 and len(answer["choices"][0]["token_ids"]) == 5


def test_health_green_and_no_block_held_after_the_replay(live):
    assert_healthy(live)
    vals = wait_idle(live)
    assert vals["llm_kv_cache_usage_ratio"] == 0, vals
    assert vals["llm_num_requests_running"] == vals["llm_num_requests_waiting"] == 0, vals


# --- a seeded fuzz of request bodies ------------------------------------------------------------

_VALUES = [
    None,
    True,
    False,
    0,
    1,
    -1,
    2,
    7,
    2**31,
    HUGE,
    -HUGE,
    0.0,
    1e-39,
    1e-46,
    0.5,
    1.0,
    2.0,
    1e300,
    -0.5,
    "",
    "bab",
    "x" * 300,
    "\u00e9\u4e2d",
    [],
    [1, 2, 3],
    ["bab", "bad"],
    [[1, 2], [3]],
    {},
    {"a": 1},
    [None],
    [""],
]
_FIELDS = [
    "model",
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "n",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "logprobs",
    "top_logprobs",
    "ignore_eos",
    "return_token_ids",
    "echo",
    "best_of",
    "presence_penalty",
    "user",
]


def _fuzz_body(rng: random.Random, chat: bool) -> dict:
    """A valid small body with a few fields replaced, added or removed at random."""
    if chat:
        body = {"messages": [{"role": "user", "content": "bab bad"}], "max_tokens": 2}
    else:
        body = {"prompt": rng.choice(["bab bad", [5, 6, 7]]), "max_tokens": 2}
    for _ in range(rng.randint(1, 3)):
        name = rng.choice(_FIELDS)
        if rng.random() < 0.15:
            body.pop(name, None)
        else:
            body[name] = rng.choice(_VALUES)
    if isinstance(body.get("max_tokens"), int) and not isinstance(body["max_tokens"], bool):
        body["max_tokens"] = min(body["max_tokens"], 3)  # keep accepted requests short
    body.pop("max_completion_tokens", None) if rng.random() < 0.5 else None
    return body


def test_fuzzed_bodies_get_an_answer_never_a_500(live):
    rng = random.Random(20261207)
    seen = {}
    for i in range(300):
        chat = rng.random() < 0.3
        body = _fuzz_body(rng, chat)
        status, answer = post(live, body, route="chat/completions" if chat else "completions")
        seen[status] = seen.get(status, 0) + 1
        assert status in (200, 400, 404), (i, body, answer)
        if status != 200:
            assert_error(answer, status, status)
        elif not body.get("stream"):
            assert answer["choices"] and answer["usage"]["completion_tokens"] >= 1, (body, answer)
    print("fuzz statuses:", seen)
    assert seen.get(200, 0) >= 20 and seen.get(400, 0) >= 20, seen  # both sides exercised
    assert_healthy(live)
    vals = wait_idle(live)
    assert vals["llm_kv_cache_usage_ratio"] == 0, vals


# --- the offline API ----------------------------------------------------------------------------


def test_sampling_params_types_are_strict():
    assert SamplingParams(stop="fub").stop == ["fub"]  # one string, never its characters
    assert SamplingParams(temperature=1e-39).greedy  # below 1e-5: greedy, never NaN
    for kw in (
        dict(stop=[1]),
        dict(max_tokens=2.5),
        dict(top_k=True),
        dict(seed="x"),
        dict(logprobs=1),
        dict(stop_token_ids=[True]),
        dict(temperature="1"),
    ):
        with pytest.raises(TypeError):
            SamplingParams(**kw)
    for kw in (
        dict(top_k=10**30),
        dict(stop=["x"] * 1000),
        dict(stop=["x" * 1000]),
        dict(temperature=float("inf")),
        dict(top_p=0.0),
        dict(seed=2**64),
    ):
        with pytest.raises(ValueError):
            SamplingParams(**kw)


def test_engine_args_refuse_bad_choices_and_memory():
    with pytest.raises(ValueError, match="dtype"):
        EngineArgs(load_format="dummy", dtype="int8")
    with pytest.raises(ValueError, match="cpu_kv_cache_gib"):
        EngineArgs(load_format="dummy", cpu_kv_cache_gib=1e9)
    with pytest.raises(TypeError, match="max_num_seqs"):
        EngineArgs(load_format="dummy", max_num_seqs=2.5)


# --- binding and the engine's death -------------------------------------------------------------


def test_bind_warning_and_host_guard():
    from project04_llm_inference.server.guard import HostGuard, bind_warning

    assert bind_warning("127.0.0.1") is None and bind_warning("::1") is None
    assert "every network interface" in bind_warning("0.0.0.0")
    assert "no authentication" in bind_warning("::")
    local = HostGuard("127.0.0.1")
    assert local.host_error("localhost:8000") is None and local.host_error("[::1]:80") is None
    assert local.host_error("attacker.example:8000") is not None
    assert local.host_error(None) is not None
    assert HostGuard("0.0.0.0").host_error("anything.example") is None
    assert HostGuard("127.0.0.1", allowed_hosts=["box.lan"]).host_error("box.lan:8000") is None
    assert local.origin_error(None, "http", "127.0.0.1:8000") is None  # not a browser
    assert local.origin_error("http://127.0.0.1:8000", "http", "127.0.0.1:8000") is None
    assert local.origin_error("http://127.0.0.1:9999", "http", "127.0.0.1:8000") is not None


def test_serve_exits_1_when_the_engine_cannot_go_on(monkeypatch, capsys, one_thread):
    """Every step raises (a device gone): each request fails with a 500, and after
    MAX_STEP_FAILURES in a row the loop gives up and `serve` returns 1 for a supervisor."""
    from project04_llm_inference.engine.llm_engine import LLMEngine
    from project04_llm_inference.server.api import ServerOptions, serve
    from project04_llm_inference.server.async_engine import MAX_STEP_FAILURES

    def broken(self):
        raise RuntimeError("device lost")

    monkeypatch.setattr(LLMEngine, "step", broken)
    args = EngineArgs(load_format="dummy", dummy_shape="tiny", device="cpu", num_gpu_blocks=16)

    async def scenario():
        task = asyncio.create_task(serve(args, ServerOptions(port=0)))
        out = ""
        while "serving" not in out:
            assert not task.done(), task
            await asyncio.sleep(0.02)
            out += capsys.readouterr().out
        port = int(out.split("http://127.0.0.1:")[1].split()[0])

        def one():
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            body = json.dumps({"prompt": [1, 5, 6], "max_tokens": 2}).encode()
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            conn.close()
            return r.status

        loop = asyncio.get_running_loop()
        statuses = [await loop.run_in_executor(None, one) for _ in range(MAX_STEP_FAILURES)]
        return statuses, await asyncio.wait_for(task, 30)

    statuses, code = asyncio.run(scenario())
    assert statuses == [500] * MAX_STEP_FAILURES
    assert code == 1
    assert "the engine loop stopped" in capsys.readouterr().err


def test_a_stream_write_the_client_never_takes_times_out():
    """A client that stops reading: the stream's next write waits on a full socket. After
    write_timeout_s the response gives up and closes the connection (the route then aborts
    the requests). The socket is a stand-in whose writes never complete: loopback buffers hold
    megabytes, more than a tiny model streams."""
    from unittest import mock

    from aiohttp import test_utils

    from project04_llm_inference.engine.llm_engine import RequestOutput
    from project04_llm_inference.server.protocol import Choice, GenerationRequest
    from project04_llm_inference.server.responses import ChoiceState, stream

    async def never(data) -> None:
        await asyncio.sleep(3600)

    async def scenario():
        writer = mock.Mock()
        writer.write_headers = mock.AsyncMock()
        writer.write = mock.AsyncMock(side_effect=never)
        transport = mock.Mock()
        request = test_utils.make_mocked_request(
            "POST", "/v1/completions", writer=writer, transport=transport
        )
        choice = Choice(0, 0, [1, 5], SamplingParams(max_tokens=4))
        req = GenerationRequest(False, NAME, [choice], True, False, None, True)
        states = {"r-0": ChoiceState(choice, None)}
        queue: asyncio.Queue = asyncio.Queue()
        queue.put_nowait(RequestOutput("r-0", [1, 5], [7], [7], False))
        t0 = time.monotonic()
        await asyncio.wait_for(stream(request, req, "r", queue, states, write_timeout_s=0.2), 10)
        return time.monotonic() - t0, transport

    elapsed, transport = asyncio.run(scenario())
    assert transport.close.called
    assert 0.2 <= elapsed < 5  # the timeout, not the hour the write would have taken
