"""Serve the code model and complete a Python snippet through the `openai` client, as a user
would: `serve MODEL` in its own process on 127.0.0.1 (a free port), one greedy completion, the
server stopped with SIGTERM. Prints the snippet and the completion and writes code_demo.json
(the prompt, the text, the token counts, the time to the answer) into the run folder.

    python -m project04_llm_inference train-code-model --out-dir models/code-model
    python -m project04_llm_inference code-demo --model-dir models/code-model
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

SNIPPET = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'


@dataclass
class CodeDemoConfig:
    """Serve a model folder and complete a Python snippet through the openai client."""

    model_dir: str = "models/code-model"
    """A Hugging Face model folder with its tokenizer.json (train-code-model writes one)."""
    prompt: str = SNIPPET
    """The text to complete."""
    max_tokens: int = 48
    startup_timeout_s: float = 300.0
    """How long the server may take to load the model."""
    reports_dir: str | None = None
    """Where code_demo.json goes (default: a new runs/<UTC time>/)."""

    def __post_init__(self) -> None:
        if not self.prompt:
            raise ValueError("CodeDemoConfig.prompt: empty")
        if self.max_tokens < 1:
            raise ValueError(f"CodeDemoConfig.max_tokens must be >= 1, got {self.max_tokens}")
        if not self.startup_timeout_s > 0:
            raise ValueError("CodeDemoConfig.startup_timeout_s must be > 0")


def _wait_for_url(proc: subprocess.Popen, timeout_s: float) -> str | None:
    """The URL in the server's 'serving NAME on URL' line; None when the server exits (or
    takes longer than timeout_s) before printing it."""
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    for line in proc.stdout:  # the line comes once the model is loaded and the port bound
        m = re.match(r"serving \S+ on (http://\S+)", line)
        if m:
            return m.group(1)
        if time.monotonic() > deadline:
            break
    return None


def run(cfg: CodeDemoConfig) -> dict:
    import openai

    from shared.cli import input_dir
    from shared.results import output_root, save_result

    folder = input_dir("model_dir", cfg.model_dir)
    if not (folder / "tokenizer.json").is_file():
        raise FileNotFoundError(f"model_dir: {folder} has no tokenizer.json")
    cmd = [
        sys.executable, "-m", "project04_llm_inference", "serve", str(folder),
        "--served-model-name", "code-model", "--port", "0",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("P04_API_KEY", "VLLM_API_KEY")}
    t0 = time.perf_counter()
    # the server's log goes to a file, shown if it does not start
    with tempfile.TemporaryFile(mode="w+") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
        try:
            url = _wait_for_url(proc, cfg.startup_timeout_s)
            if url is None:
                proc.wait(timeout=30)
                log.seek(0)
                tail = log.read().strip().splitlines()[-1:] or ["no output"]
                raise ValueError(f"model_dir: the server did not start: {tail[0]}")
            started = time.perf_counter()
            client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
            out = client.completions.create(
                model="code-model", prompt=cfg.prompt, max_tokens=cfg.max_tokens, temperature=0
            )
            answered = time.perf_counter()
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    text = out.choices[0].text
    print(f"--- prompt ---\n{cfg.prompt}--- completion ({out.usage.completion_tokens} tokens) ---")
    print(text)
    results = {
        "model_dir": str(folder),
        "prompt": cfg.prompt,
        "completion": text,
        "finish_reason": out.choices[0].finish_reason,
        "prompt_tokens": out.usage.prompt_tokens,
        "completion_tokens": out.usage.completion_tokens,
        "server_start_s": started - t0,
        "completion_s": answered - started,
    }
    path = save_result(
        "project04_llm_inference",
        "code_demo",
        results,
        config=asdict(cfg),
        reports_dir=output_root(cfg.reports_dir),
    )
    print(f"record: {path}")
    return results
