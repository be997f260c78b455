"""The MLX port of the shared transformer: loads the PyTorch weights by name and matches PyTorch
(float32 to rounding; float16 and MLX's own quantization within their tolerances). Runs on
MLX's CPU backend (Linux) or Metal (macOS). Needs mlx: run in .venv-apple."""

from __future__ import annotations

import numpy as np
import pytest
import torch

mx = pytest.importorskip("mlx.core", reason="mlx is not installed: run in .venv-apple")

import mlx.nn as nn  # noqa: E402

from apple_track.mlx_model import MLXTransformer, from_torch, to_numpy  # noqa: E402
from apple_track.model import ExportConfig, build_export_model, parity, within_tolerance  # noqa: E402
from shared.model import ModelArgs, build_model  # noqa: E402


@pytest.fixture(scope="module")
def trained():
    wrapper, _ = build_export_model(ExportConfig(train_steps=100, seq_len=48))
    tokens, targets = wrapper.example_input(0)
    with torch.no_grad():
        ref = wrapper(tokens)
    return wrapper, tokens, targets, ref


def _logits(model, tokens):
    return torch.from_numpy(to_numpy(model(mx.array(tokens.numpy()))))


def test_float32_port_matches_pytorch(trained):
    wrapper, tokens, targets, ref = trained
    out = _logits(from_torch(wrapper.model), tokens)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=2e-5)
    assert within_tolerance("mlx", "fp32", parity(out, ref, targets))


@pytest.mark.parametrize("variant", ["fp16", "q8", "q4"])
def test_reduced_precision_within_tolerance(trained, variant):
    wrapper, tokens, targets, ref = trained
    model = from_torch(wrapper.model, dtype=mx.float16 if variant == "fp16" else mx.float32)
    if variant != "fp16":
        nn.quantize(model, group_size=32, bits=int(variant[1:]))
    p = parity(_logits(model, tokens), ref, targets)
    assert within_tolerance("mlx", variant, p), p
    assert p["rel_l2"] > 1e-5  # the reduced precision is really in use


def test_other_shapes_and_batch():
    # a non-preset shape, batch 3, the causal mask at a length that is no power of two
    model = build_model(ModelArgs.from_preset("tiny", dim=96, n_heads=6, n_layers=3), seed=1).eval()
    tokens = torch.randint(0, 256, (3, 37))
    with torch.no_grad():
        ref = model(tokens)
    out = _logits(from_torch(model), tokens)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=2e-5)


def test_weight_loading_is_strict():
    small = build_model(ModelArgs.from_preset("tiny"), seed=0)
    mlx_big = MLXTransformer(ModelArgs.from_preset("tiny", n_layers=3))
    state = [(k, mx.array(v.numpy())) for k, v in small.state_dict().items()]
    with pytest.raises(ValueError):
        mlx_big.load_weights(state, strict=True)  # layer 2's weights are missing


def test_bad_tokens_are_clear_errors(trained):
    model = from_torch(trained[0].model)
    with pytest.raises(ValueError, match="tokens must be"):
        model(mx.zeros((4,), dtype=mx.int32))
    with pytest.raises(ValueError, match="exceeds max_seq_len"):
        model(mx.zeros((1, 65), dtype=mx.int32))


def test_to_numpy_is_float32():
    assert to_numpy(mx.ones((2,), dtype=mx.float16)).dtype == np.float32
