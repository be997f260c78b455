"""A tiny Llama-family model folder (GQA 4/2, random weights) written by `transformers`, the
reference every engine test compares against."""

from __future__ import annotations

import pytest
import torch

TINY = dict(
    hidden_size=64,
    intermediate_size=192,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=256,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    rope_theta=10_000.0,
    # a scale that keeps the top-2 logit gaps well above float32 op-order noise
    initializer_range=0.1,
    bos_token_id=1,
    eos_token_id=2,
    tie_word_embeddings=False,
)


# `spec.train_corpus` at a size that trains in seconds on a CPU: a 2-layer target and a 1-layer
# draft on a dozen standard-library files (every 4th held out), a 300-token BPE
TINY_CORPUS_PAIR = dict(
    max_files=12,
    holdout_every=4,
    vocab_size=300,
    seq_len=32,
    max_seq_len=128,
    batch_size=4,
    warmup_steps=1,
    eval_batches=1,
    target_dim=64,
    target_layers=2,
    target_heads=4,
    target_kv_heads=2,
    target_ffn=128,
    draft_dim=32,
    draft_layers=1,
    draft_heads=2,
    draft_kv_heads=1,
    draft_ffn=64,
    device="cpu",
)


# head dim 64 (the kernels take 64 and 128), GQA 4/2: the GPU tier's engine model
D64 = dict(TINY, hidden_size=256, intermediate_size=768, head_dim=64, vocab_size=512)
D64["max_position_embeddings"] = 2048


def _llama_folder(tmp_path_factory, shape: dict, name: str):
    """A `transformers` Llama folder of `shape`, random float32 weights (seed 0)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape)).float().eval()
    d = tmp_path_factory.mktemp(name)
    model.save_pretrained(d, safe_serialization=True)
    return d


@pytest.fixture(scope="session")
def d64_dir(tmp_path_factory):
    return _llama_folder(tmp_path_factory, D64, "d64")


@pytest.fixture(scope="session")
def hf_model_dir(tmp_path_factory):
    return _llama_folder(tmp_path_factory, TINY, "tiny-llama")


@pytest.fixture(scope="session")
def hf_model(hf_model_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.LlamaForCausalLM.from_pretrained(hf_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module of tiny-model tests: their ops take microseconds, and
    several threads only add OpenMP overhead (badly so on a shared 2-core runner). Restored
    afterwards."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# The environment of the fabricated benchmark records the report and repetition tests write.
RECORD_ENV = {
    "gpu": "NVIDIA H200",
    "driver": "570.0",
    "torch": "2.9.0",
    "cuda": "12.8",
    "python": "3.11.9",
    "date": "2026-12-01T10:00:00+00:00",
    "git_commit": "abcdef1234567",
    "git_dirty": False,
}


# A byte-level BPE vocabulary trained on a little JSON and prose: any text, JSON included, has a
# tokenization, which structured output needs (a word-level vocabulary cannot spell `{`).
BPE_CORPUS = [
    '{"name": "Ada", "age": 36, "ok": true, "tags": ["a", "b"]}',
    '{"city": "Paris", "temp": -3.5, "rain": false, "items": [1, 2, 3], "x": null}',
    "The quick brown fox jumps over the lazy dog. 0123456789 abc-def_ghi",
    '[{"id": 1}, {"id": 2}] get_weather location unit celsius fahrenheit',
]


def write_bpe_model_dir(path, vocab_size: int = 384) -> None:
    """config.json of the tiny shape (random weights: load_format dummy), a byte-level BPE
    tokenizer.json trained here with `tokenizers` (special tokens <unk> <s> </s> = 0 1 2) and a
    tokenizer_config.json with a chat template that lists the tools it is given."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from project04_llm_inference.config import DUMMY_SHAPES

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 8,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(BPE_CORPUS * 4, trainer)
    tok.save(str(path / "tokenizer.json"))
    cfg = dict(DUMMY_SHAPES["tiny"], vocab_size=vocab_size, model_type="llama")
    (path / "config.json").write_text(json.dumps(cfg))
    template = (
        "{% if tools %}tools: {{ tools | tojson }}\n{% endif %}"
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    tc = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": template}
    (path / "tokenizer_config.json").write_text(json.dumps(tc))
