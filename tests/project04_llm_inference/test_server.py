"""The OpenAI server as a client sees it: real `serve` processes on 127.0.0.1, the official
`openai` client, a tiny Llama folder with a word-level tokenizer and a chat template.

Three servers start together (they load in parallel): `main` for the API's behaviour, `tight`
(one running sequence, one waiting request at most) for overload, `victim` for SIGTERM.
Prompts are shorter than one KV block (16 tokens), so no request reuses another's prefix cache
and greedy outputs are computed exactly as offline.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

openai = pytest.importorskip("openai")
pytest.importorskip("aiohttp")
tokenizers = pytest.importorskip("tokenizers")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from project04_llm_inference import LLM, SamplingParams  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
NAME = "tiny"
STARTUP_S = 90.0
CHAT_TEMPLATE = (
    "{{ bos_token }} {% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant{% endif %}"
)
SPECIAL = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2: the model's bos 1 and eos 2


def _words() -> list[str]:
    """253 words: 3 chat roles and 250 three-letter syllables (the model's vocab is 256)."""
    roles = ["system", "user", "assistant"]
    syll = [a + v + b for a in "bdfgklmnprstvz" for v in "aeiou" for b in "bdfgklmnprstvz"]
    return roles + syll[: 256 - len(SPECIAL) - len(roles)]


WORDS = _words()


def _prompt(start: int, n: int = 8) -> str:
    return " ".join(WORDS[3 + start : 3 + start + n])


@pytest.fixture(scope="module")
def model_dir(hf_model_dir, tmp_path_factory) -> Path:
    """conftest's tiny Llama plus a WordLevel tokenizer.json and a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    d = tmp_path_factory.mktemp("tiny-llama-served")
    for f in Path(hf_model_dir).iterdir():
        shutil.copy(f, d / f.name)
    vocab = {w: i for i, w in enumerate(SPECIAL + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.add_special_tokens(SPECIAL)
    tok.save(str(d / "tokenizer.json"))
    cfg = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": CHAT_TEMPLATE}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


# --- server processes ---------------------------------------------------------------------------


def _http(method: str, url: str, body: bytes | None = None, timeout: float = 10.0):
    """(status, body text) of one plain HTTP request."""
    req = urllib.request.Request(url, data=body, method=method)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _post(url: str, obj) -> tuple[int, dict]:
    status, text = _http("POST", url, json.dumps(obj).encode())
    return status, json.loads(text)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, model_dir: Path, log: Path, *extra: str) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        cmd = [
            sys.executable,
            "-m",
            "project04_llm_inference",
            "serve",
            "--engine.model",
            str(model_dir),
            "--engine.device",
            "cpu",
            "--engine.num-gpu-blocks",
            "128",
            "--served-model-name",
            NAME,
            "--port",
            str(self.port),
            *extra,
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def wait_healthy(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"server exited with {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                if _http("GET", self.url + "/health", timeout=1.0)[0] == 200:
                    return
            except OSError:  # not listening yet
                pass
            time.sleep(0.1)
        pytest.fail(f"server not healthy within {STARTUP_S} s:\n{self.log.read_text()}")

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.url + "/v1", api_key="none", max_retries=0, timeout=30.0, **kw
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


@pytest.fixture(scope="module")
def servers(model_dir, tmp_path_factory):
    logs = tmp_path_factory.mktemp("server-logs")
    started = {
        "main": Server(model_dir, logs / "main.log"),
        "tight": Server(
            model_dir,
            logs / "tight.log",
            "--max-queued-requests",
            "1",
            "--engine.max-num-seqs",
            "1",
        ),
        "victim": Server(model_dir, logs / "victim.log", "--shutdown-grace-s", "0.3"),
    }
    try:
        deadline = time.monotonic() + STARTUP_S
        for s in started.values():
            s.wait_healthy(deadline)
        yield started
    finally:
        for s in started.values():
            s.stop()


@pytest.fixture(scope="module")
def main(servers) -> Server:
    return servers["main"]


@pytest.fixture(scope="module")
def client(main) -> openai.OpenAI:
    return main.client()


@pytest.fixture(scope="module")
def offline(model_dir) -> LLM:
    return LLM(str(model_dir), device="cpu", num_gpu_blocks=128)


def _metric(server: Server, name: str, **labels) -> float:
    text = _http("GET", server.url + "/metrics")[1]
    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def _greedy(**kw) -> dict:
    return dict(temperature=0, extra_body={"ignore_eos": True, **kw.pop("extra_body", {})}, **kw)


# --- the API ------------------------------------------------------------------------------------


def test_models_and_health(main, client):
    assert _http("GET", main.url + "/health") == (200, '{"status": "ok"}')
    models = client.models.list()
    assert [m.id for m in models.data] == [NAME]


def test_greedy_completion_equals_offline_generate(client, offline):
    prompt = _prompt(0)
    r = client.completions.create(
        model=NAME, prompt=prompt, max_tokens=12, **_greedy(extra_body={"return_token_ids": True})
    )
    want = offline.generate(prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[
        0
    ]
    (choice,) = r.choices
    assert choice.token_ids == want.token_ids
    assert choice.text == want.text and choice.text
    assert choice.finish_reason == "length"
    n_prompt = len(offline.engine.tokenizer.encode(prompt))
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (n_prompt, 12)
    assert r.usage.total_tokens == n_prompt + 12


def test_token_id_prompt(client, offline):
    ids = [1, *range(40, 50)]
    r = client.completions.create(model=NAME, prompt=ids, max_tokens=6, **_greedy())
    want = offline.generate([ids], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0]
    assert r.choices[0].text == want.text
    assert r.usage.prompt_tokens == len(ids)


def test_streaming_completion_equals_non_streaming_with_usage_chunk(client):
    prompt = _prompt(20)
    full = client.completions.create(model=NAME, prompt=prompt, max_tokens=10, **_greedy())
    chunks = list(
        client.completions.create(
            model=NAME,
            prompt=prompt,
            max_tokens=10,
            stream=True,
            stream_options={"include_usage": True},
            **_greedy(),
        )
    )
    *body, last = chunks
    assert last.choices == [] and last.usage.completion_tokens == 10
    assert last.usage.prompt_tokens == full.usage.prompt_tokens
    assert all(c.usage is None for c in body)
    assert "".join(c.choices[0].text for c in body) == full.choices[0].text
    assert [c.choices[0].finish_reason for c in body if c.choices[0].finish_reason] == ["length"]
    assert body[-1].choices[0].finish_reason == "length"


def test_chat_uses_the_template_and_equals_offline(client, offline):
    messages = [
        {"role": "system", "content": _prompt(30, 3)},
        {"role": "user", "content": _prompt(40, 4)},
    ]
    r = client.chat.completions.create(model=NAME, messages=messages, max_tokens=8, **_greedy())
    rendered = "<s> " + "".join(f"{m['role']} {m['content']} " for m in messages) + "assistant"
    ids = offline.engine.tokenizer.encode(rendered, add_special_tokens=False)
    assert r.usage.prompt_tokens == len(ids) == 1 + 2 + 3 + 4 + 1
    want = offline.generate([ids], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0]
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == want.text
    assert r.object == "chat.completion" and r.usage.completion_tokens == 8

    chunks = list(
        client.chat.completions.create(
            model=NAME, messages=messages, max_tokens=8, stream=True, **_greedy()
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == want.text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_seed_reproducible_and_n_derives_seeds(client):
    def texts(seed: int, n: int = 1) -> list[str]:
        r = client.completions.create(
            model=NAME,
            prompt=_prompt(50),
            max_tokens=16,
            temperature=1.0,
            seed=seed,
            n=n,
            extra_body={"ignore_eos": True},
        )
        assert [c.index for c in r.choices] == list(range(n))
        assert r.usage.completion_tokens == 16 * n and r.usage.prompt_tokens == 9
        return [c.text for c in r.choices]

    a = texts(123)
    assert texts(123) == a  # same seed, same text
    # 16 draws at T=1 from ~250 tokens: two seeds agreeing everywhere has odds far below 1e-9
    assert texts(124) != a
    pair = texts(123, n=2)
    assert pair[0] == a[0] and pair[1] == texts(124)[0]  # choice i draws with seed + i
    assert pair[0] != pair[1]


def test_stop_strings_cut_the_text(client):
    prompt = _prompt(60)
    full = client.completions.create(model=NAME, prompt=prompt, max_tokens=16, **_greedy())
    text = full.choices[0].text
    words = text.split()
    stop = words[len(words) // 2]
    want = text[: text.find(stop)]
    r = client.completions.create(
        model=NAME, prompt=prompt, max_tokens=16, stop=[stop], **_greedy()
    )
    assert r.choices[0].text == want and r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens < 16
    streamed = client.completions.create(
        model=NAME, prompt=prompt, max_tokens=16, stop=stop, stream=True, **_greedy()
    )
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_logprobs_are_the_models(client, hf_model, offline):
    prompt = _prompt(70, 6)
    r = client.completions.create(
        model=NAME,
        prompt=prompt,
        max_tokens=6,
        logprobs=1,
        **_greedy(extra_body={"return_token_ids": True}),
    )
    lp, out = r.choices[0].logprobs, r.choices[0].token_ids
    ids = offline.engine.tokenizer.encode(prompt) + out
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    n = len(ids) - 6
    want = [float(ref[n - 1 + j, ids[n + j]]) for j in range(6)]
    # float32 logits of magnitude ~10 differ by op order at ~1e-5; 1e-3 leaves room, and a
    # wrong token or an off-by-one position differs by far more on this model
    assert lp.token_logprobs == pytest.approx(want, abs=1e-3)
    assert lp.tokens == [offline.engine.tokenizer.decode([t], False) for t in out]
    assert [list(d) for d in lp.top_logprobs] == [[t] for t in lp.tokens]

    chat = client.chat.completions.create(
        model=NAME,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=5,
        logprobs=True,
        **_greedy(),
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == 5 and all(c.logprob <= 0 and c.token for c in content)
    assert chat.usage.completion_tokens == 5


def test_client_disconnect_aborts_and_frees_blocks(main, client):
    aborted = _metric(main, "llm_request_success_total", finish_reason="abort")
    stream = client.completions.create(
        model=NAME, prompt=_prompt(80), max_tokens=490, stream=True, **_greedy()
    )
    for i, _ in enumerate(stream):
        if i == 2:
            break
    assert _metric(main, "llm_num_requests_running") == 1
    assert _metric(main, "llm_kv_cache_usage_ratio") > 0
    stream.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        done = _metric(main, "llm_request_success_total", finish_reason="abort") == aborted + 1
        if done and _metric(main, "llm_num_requests_running") == 0:
            break
        time.sleep(0.05)
    assert _metric(main, "llm_request_success_total", finish_reason="abort") == aborted + 1
    assert _metric(main, "llm_num_requests_running") == 0
    assert _metric(main, "llm_kv_cache_usage_ratio") == 0
    assert _metric(main, "llm_time_to_first_token_seconds_count") > 0


def test_overload_answers_503(servers):
    tight = servers["tight"]
    client = tight.client()

    def one(i: int):
        try:
            r = client.completions.create(
                model=NAME, prompt=_prompt(i), max_tokens=150, **_greedy()
            )
            return r.usage.completion_tokens
        except openai.APIStatusError as e:
            return e

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(8)))
    ok = [r for r in results if r == 150]
    refused = [r for r in results if isinstance(r, openai.APIStatusError)]
    assert len(ok) + len(refused) == 8, results
    assert ok and refused
    for e in refused:
        assert e.status_code == 503
        assert "overloaded" in e.message and "max_queued_requests=1" in e.message
    assert _metric(tight, "llm_request_rejected_total") == len(refused)


@pytest.mark.parametrize(
    "route, body, param",
    [
        ("completions", {"prompt": "bab", "max_tokens": -1}, "max_tokens"),
        ("completions", {"prompt": " ".join(WORDS[3:] * 3)}, "prompt"),
        ("completions", {"prompt": "bab", "max_tokens": 600}, "max_tokens"),
        ("completions", {"prompt": "bab", "temperature": "hot"}, "temperature"),
        ("completions", {"prompt": "bab", "n": "2"}, "n"),
        ("completions", {"prompt": "bab", "top_p": 0}, "top_p"),
        ("completions", {"prompt": "bab", "stop": 5}, "stop"),
        ("completions", {"prompt": "bab", "logprobs": True}, "logprobs"),
        ("completions", {"prompt": [1, 2, 999]}, "prompt"),
        ("completions", {"prompt": {"text": "bab"}}, "prompt"),
        ("completions", {"prompt": "bab", "frequency_penalty": 0.5}, "frequency_penalty"),
        ("chat/completions", {"messages": "hi"}, "messages"),
        ("chat/completions", {"messages": [{"content": "hi"}]}, "messages"),
        (
            "chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "logprobs": 1},
            "logprobs",
        ),
    ],
)
def test_bad_requests_answer_400_naming_the_field(main, route, body, param):
    status, answer = _post(f"{main.url}/v1/{route}", body)
    assert status == 400, answer
    err = answer["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]


def test_unknown_model_answers_404(main):
    status, answer = _post(f"{main.url}/v1/completions", {"model": "gpt-4", "prompt": "bab"})
    assert status == 404, answer
    assert answer["error"]["param"] == "model" and answer["error"]["code"] == "model_not_found"


def test_malformed_json_unknown_route_and_client_error(main, client):
    status, text = _http("POST", main.url + "/v1/completions", b"{not json")
    assert status == 400 and "malformed JSON" in json.loads(text)["error"]["message"]
    status, text = _http("GET", main.url + "/v1/nothing")
    assert status == 404 and json.loads(text)["error"]["type"] == "not_found_error"
    assert _http("GET", main.url + "/v1/completions")[0] == 405
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=NAME, prompt="bab", max_tokens=0)


def test_sigterm_exits_zero_with_requests_in_flight(servers):
    victim = servers["victim"]
    client = victim.client()
    first = concurrent.futures.Future()

    def stream(i: int) -> str | None:
        chunks = client.completions.create(
            model=NAME, prompt=_prompt(i), max_tokens=490, stream=True, **_greedy()
        )
        reason = None
        for c in chunks:
            if not first.done():
                first.set_result(True)
            reason = c.choices[0].finish_reason or reason
        return reason

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(stream, i) for i in (90, 100)]
        first.result(timeout=20)
        t0 = time.monotonic()
        victim.proc.send_signal(signal.SIGTERM)
        code = victim.proc.wait(timeout=10)
        elapsed = time.monotonic() - t0
        reasons = [f.result(timeout=10) for f in futures]
    assert code == 0, victim.log.read_text()
    assert elapsed < 5, f"took {elapsed:.1f} s to exit"
    # a grace period of 0.3 s: the streams end cleanly, aborted (or finished just in time)
    assert all(r in ("abort", "length") for r in reasons), reasons
    assert "abort" in reasons


# --- the engine loop alone, in this process ---------------------------------------------------


def test_async_engine_cancel_aborts_and_shutdown_grace(model_dir):
    import asyncio

    from project04_llm_inference import EngineArgs
    from project04_llm_inference.server.async_engine import AsyncEngine, ServerOverloaded

    long = SamplingParams(temperature=0, max_tokens=490, ignore_eos=True)
    short = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)

    async def scenario():
        args = EngineArgs(model=str(model_dir), device="cpu", num_gpu_blocks=128)
        engine = AsyncEngine(args, max_queued_requests=4)
        await engine.start()
        # a consumer that is cancelled mid-stream aborts its request
        seen = []

        async def consume():
            async for out in engine.generate([1, 5, 6], long, "cancelled"):
                seen.append(out)

        task = asyncio.create_task(consume())
        while len(seen) < 3:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 5)
        while engine.num_in_flight:  # the abort comes back as the last output
            await asyncio.sleep(0.005)
        # shutdown: the short request finishes within the grace period, the long one is aborted
        outs = {"short": [], "long": []}

        async def run(rid, params):
            async for out in engine.generate([1, 7, 8], params, rid):
                outs[rid].append(out)

        tasks = [asyncio.create_task(run(r, p)) for r, p in (("short", short), ("long", long))]
        while not outs["long"]:
            await asyncio.sleep(0.005)
        await asyncio.wait_for(engine.shutdown(grace_s=0.3), 10)
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        with pytest.raises(ServerOverloaded, match="shutting down"):
            await engine.add_request("late", [1, 2], short)
        return engine, len(seen), outs

    engine, n_seen, outs = asyncio.run(asyncio.wait_for(scenario(), 60))
    stats = engine.engine.stats()  # the thread is joined: the engine may be read here
    assert n_seen < 490 and stats["aborted"] >= 2
    assert outs["short"][-1].finish_reason == "length" and len(outs["short"]) == 3
    assert outs["long"][-1].finish_reason == "abort" and len(outs["long"]) < 490
    assert stats["running"] == stats["waiting"] == 0 and stats["kv_cache_usage"] == 0


def test_chat_fallback_format_without_a_template(model_dir, tmp_path):
    from project04_llm_inference.model.tokenizer import Tokenizer
    from project04_llm_inference.server.chat import ChatFormatter

    shutil.copy(model_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    chat = ChatFormatter(Tokenizer(tmp_path))  # no tokenizer_config.json: the plain format
    messages = [{"role": "system", "content": "bab bad"}, {"role": "user", "content": "baf"}]
    assert chat.render(messages) == "system: bab bad\nuser: baf\nassistant:"
    assert chat.encode(messages)[0] == 1  # the tokenizer's BOS, added when no template writes it
