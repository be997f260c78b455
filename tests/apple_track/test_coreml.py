"""Core ML: every variant converts, its spec has the expected inputs, outputs and compressed
weights, and its output stays within the stated tolerance of PyTorch (emulated where Core ML
cannot predict; predicted on macOS). Needs coremltools: run in .venv-apple
(make -f apple_track/Makefile test); elsewhere the module skips saying so."""

from __future__ import annotations

import platform

import numpy as np
import pytest
import torch

ct = pytest.importorskip(
    "coremltools", reason="coremltools is not installed: run the track's tests in .venv-apple"
)
pytest.importorskip("sklearn", reason="scikit-learn (k-means palettization) is not installed")

from apple_track import coreml_export as ce  # noqa: E402
from apple_track.model import (  # noqa: E402
    COREML_VARIANTS,
    TOLERANCES,
    ExportConfig,
    build_export_model,
    parity,
    within_tolerance,
)

pytestmark = pytest.mark.slow  # conversion and k-means take ~20 s on 2 cores


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    wrapper, _ = build_export_model(ExportConfig(train_steps=150, seq_len=32))
    tokens, targets = wrapper.example_input(0)
    with torch.no_grad():
        ref = wrapper(tokens)
    fp16 = ce.convert_fp16(wrapper, tokens)
    out = tmp_path_factory.mktemp("coreml")
    models, paths = {}, {}
    for v in COREML_VARIANTS:
        models[v] = ce.compress(fp16, v)
        paths[v] = out / f"{v}.mlpackage"
        models[v].save(str(paths[v]))
    return wrapper, tokens, targets, ref, models, paths


def test_spec_inputs_and_outputs(converted):
    wrapper, *_, models, _ = converted
    V = wrapper.model.args.vocab_size
    for v, m in models.items():
        io = ce.io_description(m)
        assert io["inputs"] == [{"name": "tokens", "dtype": "int32", "shape": [1, 32]}], v
        assert io["outputs"] == [{"name": "logits", "dtype": "float16", "shape": [1, 32, V]}], v
        assert m.get_spec().HasField("mlProgram")


def test_compressed_variants_hold_every_weight_matrix_compressed(converted):
    wrapper, *_, models, paths = converted
    n_matrices = sum(1 for p in wrapper.parameters() if p.dim() == 2)  # 2 + 5 per block = 12
    assert n_matrices == 2 + 5 * wrapper.model.args.n_layers
    fp16_ops = ce.op_counts(models["fp16"])
    assert not any(op.startswith("constexpr_") for op in fp16_ops)
    assert fp16_ops["linear"] == 1 + 5 * wrapper.model.args.n_layers  # wqkv wo w1 w2 w3, head
    assert fp16_ops["scaled_dot_product_attention"] == wrapper.model.args.n_layers
    for v, op in ce.COMPRESSED_WEIGHT_OPS.items():
        assert ce.op_counts(models[v]).get(op) == n_matrices, v
    sizes = [ce.package_bytes(paths[v]) for v in ("fp16", "int8", "palettize6", "palettize4")]
    assert sizes == sorted(sizes, reverse=True), sizes
    # weights dominate: 4 bits is under half of 16 bits plus the rest of the package
    assert sizes[3] < 0.45 * sizes[0]


def test_package_weights_are_the_models_weights_compressed(converted):
    wrapper, tokens, targets, ref, models, _ = converted
    errors = {}
    for v, m in models.items():
        twin, info = ce.load_package_weights(wrapper, m)
        assert info["replaced"] == 12
        errors[v] = info["weight_rel_err"]
    assert errors["fp16"] < 1e-3  # half-precision rounding only
    assert errors["fp16"] < errors["int8"] < errors["palettize6"] < errors["palettize4"] < 0.15


@pytest.mark.parametrize("variant", list(COREML_VARIANTS))
def test_emulated_output_within_tolerance(converted, variant):
    wrapper, tokens, targets, ref, models, _ = converted
    logits, _ = ce.emulate(wrapper, models[variant], tokens)
    p = parity(torch.from_numpy(logits), ref, targets)
    assert within_tolerance("coreml", variant, p), (p, TOLERANCES[("coreml", variant)])


def test_bad_inputs_are_clear_errors(converted):
    wrapper, tokens, *_, models, _ = converted
    with pytest.raises(ValueError, match="unsupported Core ML compression 'int4'"):
        ce.compress(models["fp16"], "int4")
    with pytest.raises(ValueError, match="example must be int32"):
        ce.convert_fp16(wrapper, tokens.long())
    with pytest.raises(TypeError, match="FixedShapeLM"):
        ce.convert_fp16(wrapper.model, tokens)
    with pytest.raises(FileNotFoundError):
        ce.package_bytes("no/such.mlpackage")


@pytest.mark.skipif(platform.system() == "Darwin", reason="on macOS Core ML does predict")
def test_prediction_off_macos_says_it_was_skipped(converted):
    _, tokens, *_, models, _ = converted
    with pytest.raises(ce.CoreMLUnavailableError, match="needs macOS.*prediction was skipped"):
        ce.predict(models["fp16"], tokens)


@pytest.mark.macos
@pytest.mark.parametrize("variant", list(COREML_VARIANTS))
def test_coreml_prediction_matches_pytorch(converted, variant):
    wrapper, tokens, targets, ref, _, paths = converted
    model = ce.load(paths[variant])  # a saved package, loaded as an app would
    out = ce.predict(model, tokens)
    assert out.shape == tuple(ref.shape) and np.isfinite(out).all()
    p = parity(torch.from_numpy(out), ref, targets)
    assert within_tolerance("coreml", variant, p), (p, TOLERANCES[("coreml", variant)])
