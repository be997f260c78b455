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


@pytest.fixture(scope="session")
def hf_model_dir(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY)).float().eval()
    d = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(d, safe_serialization=True)
    return d


@pytest.fixture(scope="session")
def hf_model(hf_model_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.LlamaForCausalLM.from_pretrained(hf_model_dir, dtype=torch.float32).eval()
