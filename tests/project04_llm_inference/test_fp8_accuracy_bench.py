"""The FP8 accuracy benchmark's pieces on the CPU: its one-window prefill scores every position
as transformers does, the comparison reads zero for a model against itself and a real error
for FP8 weights, an FP8 KV cache and both, and bad settings are refused. (The full run trains the code model: the
`fp8-accuracy` command.)"""

from __future__ import annotations

import pytest
import torch

from project04_llm_inference.bench.fp8_accuracy import (
    Fp8AccuracyConfig,
    compare,
    window_logits,
)
from project04_llm_inference.model.loader import build_model, read_config

# float32 against transformers' float32, another op order (test_engine_vs_transformers)
LOGIT_ATOL = 1e-4  # op-order noise is ~1e-6 at these magnitudes (|logit| < 10)


@pytest.fixture(scope="module")
def models(hf_model_dir):
    common = dict(
        model_dir=hf_model_dir, dtype=torch.float32, device=torch.device("cpu"), max_positions=64
    )
    hf = read_config(hf_model_dir)
    return build_model(hf, **common), build_model(hf, quantization="fp8", **common)


def test_a_window_is_scored_at_every_position_like_transformers(models, hf_model):
    ids = torch.tensor([3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32, 79, 50, 28])
    ours = window_logits(models[0], ids)
    with torch.inference_mode():
        ref = hf_model(ids[None]).logits[0]
    torch.testing.assert_close(ours, ref, rtol=0, atol=LOGIT_ATOL)


def test_compare_reads_zero_against_itself_and_an_error_for_fp8(models):
    g = torch.Generator().manual_seed(0)
    windows = [torch.randint(0, 256, (24,), generator=g) for _ in range(2)]
    same = compare(models[0], models[0], windows)
    assert same["logits_max_abs_err"] == 0.0 and same["greedy_agreement"] == 1.0
    assert same["perplexity_change_pct"] == 0.0 and same["positions"] == 48
    fp8 = compare(models[0], models[1], windows)
    assert 0.0 < fp8["logits_mean_abs_err"] <= fp8["logits_max_abs_err"]
    assert 0.0 <= fp8["greedy_agreement"] <= 1.0
    # the FP8 KV cache variants: the same model over an e4m3 cache, and both together
    kv = compare(models[0], models[0], windows, kv_dtype=torch.float8_e4m3fn)
    assert 0.0 < kv["logits_mean_abs_err"] <= kv["logits_max_abs_err"]
    both = compare(models[0], models[1], windows, kv_dtype=torch.float8_e4m3fn)
    assert both["logits_max_abs_err"] != fp8["logits_max_abs_err"]  # the cache's error adds


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        (dict(window=1), "window must be >= 2"),
        (dict(eval_tokens=0), "eval_tokens must be an integer >= 1"),
        (dict(train_steps=True), "train_steps must be an integer"),
        (dict(model=" "), "model: empty path"),
    ],
)
def test_bad_settings_are_refused(kwargs, words):
    with pytest.raises(ValueError, match=words):
        Fp8AccuracyConfig(**kwargs)
