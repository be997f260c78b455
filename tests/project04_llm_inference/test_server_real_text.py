"""Real text through a keyed server, as a vLLM user starts it: `serve MODEL --api-key KEY`.

The model folder is built here without the network: a byte-level BPE `tokenizer.json` trained by
`tokenizers` on a few lines of Python, a `tokenizer_config.json` with a ChatML-style chat
template, and random weights of a `shared.model` transformer exported by `shared.hf_export`
(the route a trained model takes). One server per module, on 127.0.0.1, the `openai` client.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
tokenizers = pytest.importorskip("tokenizers")

from project04_llm_inference import LLM, SamplingParams  # noqa: E402
from project04_llm_inference.server.auth import ApiKeyCheck, resolve_api_key  # noqa: E402
from shared.hf_export import export_hf  # noqa: E402
from shared.model import ModelArgs, build_model  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
KEY = "sk-test-0123456789"
NAME = "tiny-code"
STARTUP_S = 90.0
EOS = "<|endoftext|>"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "import os\nimport sys\n\nprint(os.getcwd(), sys.argv)\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "for i in range(10):\n    if i % 2 == 0:\n        print(i)\n",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    work = tmp_path_factory.mktemp("real-text")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384,
        special_tokens=[EOS, "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    tok_path = work / "tokenizer.json"
    tok.save(str(tok_path))
    args = ModelArgs(
        dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=128,
        vocab_size=tok.get_vocab_size(), max_seq_len=256,
    )  # fmt: skip
    folder = export_hf(
        build_model(args, seed=0).eval(),
        work / "model",
        tokenizer_json=tok_path,
        eos_token_id=tok.token_to_id(EOS),
    )
    cfg = {"eos_token": EOS, "chat_template": CHAT_TEMPLATE}
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return folder


def _http(url: str, headers: dict | None = None, body: bytes | None = None):
    """(status, headers, body text) of one request."""
    req = urllib.request.Request(url, data=body, headers=headers or {})
    if body is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path_factory.mktemp("log") / "serve.log"
    cmd = [
        sys.executable, "-m", "project04_llm_inference", "serve", str(model_dir),
        "--served-model-name", NAME, "--api-key", KEY, "--port", str(port),
        "--max-model-len", "256", "--device", "cpu", "--num-gpu-blocks", "64", "--seed", "1",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("P04_API_KEY", "VLLM_API_KEY"):
        env.pop(name, None)
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"server exited with {proc.returncode}:\n{log.read_text()}")
            try:
                if _http(url + "/health")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"server not healthy within {STARTUP_S} s:\n{log.read_text()}")
            time.sleep(0.1)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def _client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=30.0)


@pytest.fixture(scope="module")
def offline(model_dir) -> LLM:
    return LLM(str(model_dir), device="cpu", num_gpu_blocks=64, max_model_len=256)


def test_health_and_metrics_need_no_key(server):
    assert _http(server + "/health")[0] == 200
    status, _, text = _http(server + "/metrics")
    assert status == 200 and "llm_time_to_first_token_seconds" in text


@pytest.mark.parametrize("key", ["wrong-key", KEY + "x", KEY[:-1]])
def test_a_wrong_key_is_401_on_every_route(server, key):
    c = _client(server, key)
    with pytest.raises(openai.AuthenticationError, match="incorrect API key"):
        c.models.list()
    with pytest.raises(openai.AuthenticationError):
        c.completions.create(model=NAME, prompt="def f(", max_tokens=2)
    with pytest.raises(openai.AuthenticationError):
        c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}])


@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": f"Basic {KEY}"}, {"Authorization": "Bearer "}]
)
def test_a_missing_or_malformed_key_is_401_even_on_unknown_routes(server, headers):
    for path in ("/v1/models", "/v1/no-such-route"):
        status, h, text = _http(server + path, headers)
        assert status == 401 and h.get("WWW-Authenticate") == "Bearer", (path, text)
        err = json.loads(text)["error"]
        assert err["code"] == "invalid_api_key" and KEY not in text


def test_completion_is_real_text_equal_to_offline(server, offline):
    c = _client(server, KEY)
    prompt = "def add(a, b):\n    return"
    got = c.completions.create(model=NAME, prompt=prompt, max_tokens=12, temperature=0)
    want = offline.generate([prompt], SamplingParams(max_tokens=12, temperature=0))[0]
    assert want.text.strip() and got.choices[0].text == want.text  # decoded text, not ""
    assert got.usage.completion_tokens == len(want.token_ids)


def test_chat_uses_the_folders_template_and_streams(server, model_dir):
    c = _client(server, KEY)
    messages = [{"role": "user", "content": "print the numbers"}]
    whole = c.chat.completions.create(model=NAME, messages=messages, max_tokens=8, temperature=0)
    rendered = "<|im_start|>user\nprint the numbers<|im_end|>\n<|im_start|>assistant\n"
    tok = tokenizers.Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert whole.usage.prompt_tokens == len(tok.encode(rendered, add_special_tokens=False).ids)
    chunks = c.chat.completions.create(
        model=NAME, messages=messages, max_tokens=8, temperature=0, stream=True
    )
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert streamed == whole.choices[0].message.content


def test_the_key_comes_from_the_flag_then_the_environment():
    assert resolve_api_key("a", {"P04_API_KEY": "b"}) == "a"
    assert resolve_api_key(None, {"P04_API_KEY": "b", "VLLM_API_KEY": "c"}) == "b"
    assert resolve_api_key(None, {"P04_API_KEY": " ", "VLLM_API_KEY": "c"}) == "c"
    assert resolve_api_key(None, {}) is None
    with pytest.raises(ValueError, match="api_key"):
        resolve_api_key("", {})


def test_the_key_check_guards_only_v1():
    check = ApiKeyCheck("k")
    assert check.error("/health", None) is None and check.error("/metrics", None) is None
    assert check.error("/v1/models", "Bearer k") is None
    assert check.error("/v1/models", "bearer k") is None  # the scheme is case-insensitive
    assert check.error("/v1", None) and check.error("/v1/x", "Bearer kk")
    assert check.error("/v1x", None) is None  # not under /v1/: the router's 404
