"""`train-code-model` writes a Hugging Face folder the engine serves as text (its own BPE
tokenizer.json, a tokenizer_config.json naming the end-of-text token), and `code-demo` completes
a snippet through the openai client against it. Two optimizer steps on a small corpus: what is
checked is the folder, not what the model learned."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")

from project04_llm_inference import LLM, SamplingParams  # noqa: E402
from project04_llm_inference.code_model import (  # noqa: E402
    CodeModelConfig,
    resolve_preset,
    run,
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """20 small standard-library files (one is held out: holdout_every is 20)."""
    src = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"), key=lambda p: p.stat().st_size)
    d = tmp_path_factory.mktemp("corpus")
    for p in [p for p in src if p.stat().st_size > 2000][:20]:
        (d / p.name).write_text(p.read_text(encoding="utf-8", errors="replace"))
    return d


@pytest.fixture(scope="module")
def folder(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("models") / "code-model"
    cfg = CodeModelConfig(
        out_dir=str(out), preset="tiny", max_steps=2, corpus_dir=str(corpus), device="cpu"
    )
    record = run(cfg)
    assert record["preset"] == "tiny" and record["settings"]["max_steps"] == 2
    return out


@pytest.mark.slow  # trains a tokenizer and a model (seconds); the served text is covered fast
# by test_server_real_text.py
def test_the_folder_is_served_as_text(folder):
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    tok_cfg = json.loads((folder / "tokenizer_config.json").read_text())
    assert tok_cfg["eos_token"] == "<|endoftext|>"
    cfg = json.loads((folder / "config.json").read_text())
    from tokenizers import Tokenizer

    assert cfg["eos_token_id"] == Tokenizer.from_file(str(folder / "tokenizer.json")).token_to_id(
        "<|endoftext|>"
    )
    out = LLM(str(folder), device="cpu", max_model_len=128, num_gpu_blocks=16).generate(
        ["def main():\n    "], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    )[0]
    assert len(out.token_ids) == 8 and out.text  # decoded by the folder's own tokenizer


def test_auto_takes_the_full_size_only_on_a_gpu():
    assert resolve_preset(CodeModelConfig(), cuda=False) == "tiny"
    assert resolve_preset(CodeModelConfig(), cuda=True) == "full"
    assert resolve_preset(CodeModelConfig(device="cpu"), cuda=True) == "tiny"
    with pytest.raises(ValueError, match="max_steps"):
        CodeModelConfig(max_steps=0)


@pytest.mark.slow
def test_the_demo_completes_through_the_openai_client(folder, tmp_path):
    pytest.importorskip("openai")
    from project04_llm_inference.code_demo import CodeDemoConfig
    from project04_llm_inference.code_demo import run as demo

    res = demo(CodeDemoConfig(model_dir=str(folder), max_tokens=4, reports_dir=str(tmp_path)))
    assert res["completion_tokens"] >= 1 and res["prompt_tokens"] > 0
    rec = json.loads((tmp_path / "project04_llm_inference" / "code_demo.json").read_text())
    assert rec["results"]["completion"] == res["completion"]
