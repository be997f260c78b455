"""LiteRT: litert-torch converts the model to float32 and int8 dynamic-range .tflite files, and
the ai-edge-litert interpreter (XNNPACK) reproduces PyTorch within the stated tolerances:
float32 to rounding, int8 looser. Needs litert-torch and ai-edge-litert: run in .venv-apple."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip(
    "litert_torch", reason="litert-torch is not installed: run the track's tests in .venv-apple"
)
pytest.importorskip("ai_edge_litert", reason="ai-edge-litert (the LiteRT interpreter) is missing")

from apple_track import litert_export as le  # noqa: E402
from apple_track.model import (  # noqa: E402
    LITERT_VARIANTS,
    TOLERANCES,
    ExportConfig,
    build_export_model,
    parity,
    within_tolerance,
)

pytestmark = pytest.mark.slow  # two conversions, ~10 s each


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    wrapper, _ = build_export_model(ExportConfig(train_steps=150, seq_len=32))
    tokens, targets = wrapper.example_input(0)
    with torch.no_grad():
        ref = wrapper(tokens)
    out = tmp_path_factory.mktemp("litert")
    paths = {v: le.convert(wrapper, tokens, v, out / f"{v}.tflite") for v in LITERT_VARIANTS}
    return wrapper, tokens, targets, ref, paths


@pytest.mark.parametrize("variant", list(LITERT_VARIANTS))
def test_output_matches_pytorch_within_tolerance(converted, variant):
    _, tokens, targets, ref, paths = converted
    out = le.run(le.interpreter(paths[variant], threads=1), tokens)
    assert out.dtype == np.float32 and out.shape == tuple(ref.shape)
    p = parity(torch.from_numpy(out), ref, targets)
    assert within_tolerance("litert", variant, p), (p, TOLERANCES[("litert", variant)])
    if variant == "fp32":
        np.testing.assert_allclose(out, ref.numpy(), rtol=0, atol=1e-4)


def test_int8_variant_stores_the_weights_in_int8(converted):
    wrapper, *_, paths = converted
    weight_elements = sum(p.numel() for p in wrapper.parameters() if p.dim() == 2)
    fp32, int8 = le.constant_tensors(paths["fp32"]), le.constant_tensors(paths["int8"])
    assert "int8" not in fp32
    assert fp32["float32"]["elements"] >= weight_elements
    assert int8["int8"] == {"tensors": 12, "elements": weight_elements}
    assert paths["int8"].stat().st_size < 0.45 * paths["fp32"].stat().st_size


def test_description_of_the_graph(converted):
    wrapper, *_, paths = converted
    d = le.describe(paths["fp32"])
    V = wrapper.model.args.vocab_size
    assert [(i["dtype"], i["shape"]) for i in d["inputs"]] == [("int32", [1, 32])]
    assert [(o["dtype"], o["shape"]) for o in d["outputs"]] == [("float32", [1, 32, V])]
    assert d["op_counts"]["FULLY_CONNECTED"] == 1 + 5 * wrapper.model.args.n_layers
    assert d["op_counts"]["EMBEDDING_LOOKUP"] == 1
    assert "DELEGATE" not in d["op_counts"]  # counted before XNNPACK takes the graph


def test_bad_inputs_are_clear_errors(converted, tmp_path):
    wrapper, tokens, *_, paths = converted
    with pytest.raises(ValueError, match="unsupported LiteRT variant 'fp16'"):
        le.convert(wrapper, tokens, "fp16", tmp_path / "x.tflite")
    with pytest.raises(ValueError, match="example must be int32"):
        le.convert(wrapper, tokens.float(), "fp32", tmp_path / "x.tflite")
    with pytest.raises(ValueError, match=r"tokens must have shape \(1, 32\)"):
        le.run(le.interpreter(paths["fp32"]), np.zeros((1, 31), dtype=np.int32))
    with pytest.raises(FileNotFoundError):
        le.interpreter(tmp_path / "missing.tflite")
