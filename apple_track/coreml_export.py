"""Core ML: the shared transformer as an ML program in float16, and compressed variants of it.

    fp16        ct.convert of the traced fixed-shape model, compute_precision FLOAT16
    int8        coremltools.optimize.coreml.linear_quantize_weights, int8 symmetric, per channel
    palettize6  palettize_weights, 6-bit k-means lookup table, per tensor
    palettize4  palettize_weights, 4-bit k-means lookup table, per tensor

Conversion and compression run anywhere coremltools installs; prediction needs the Core ML
framework, so macOS only. On other systems `predict` raises `CoreMLUnavailableError`, and the
report gives in its place an emulation: the package's own weights, decompressed from the
.mlpackage, loaded into the PyTorch model and run in float16 on the CPU. That measures what the
compression did to the weights; it is not a Core ML run, and the report says which one it shows.
"""

from __future__ import annotations

import copy
import platform
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from apple_track.model import COREML_VARIANTS, FixedShapeLM

# The oldest OS whose ML program opset has what we use: the fused scaled_dot_product_attention
# op and constexpr_blockwise_shift_scale (iOS 18 / macOS 15).
DEPLOYMENT_TARGET = "iOS18"
# Ops that hold compressed weights and expand them at load time, per compression.
COMPRESSED_WEIGHT_OPS = {
    "int8": "constexpr_blockwise_shift_scale",
    "palettize6": "constexpr_lut_to_dense",
    "palettize4": "constexpr_lut_to_dense",
}


class CoreMLUnavailableError(RuntimeError):
    """Raised where Core ML cannot run a model (any system but macOS)."""


def can_predict() -> bool:
    return platform.system() == "Darwin"


def convert_fp16(wrapper: FixedShapeLM, example: torch.Tensor):
    """Trace the fixed-shape model and convert it to a float16 ML program (an MLModel)."""
    if not isinstance(wrapper, FixedShapeLM):
        raise TypeError(f"wrapper must be a FixedShapeLM, got {type(wrapper).__name__}")
    if example.dtype != torch.int32 or tuple(example.shape) != (wrapper.batch, wrapper.seq_len):
        raise ValueError(
            f"example must be int32 of shape {(wrapper.batch, wrapper.seq_len)}, "
            f"got {example.dtype} {tuple(example.shape)}"
        )
    import coremltools as ct

    # torch.jit.trace: coremltools' most exercised PyTorch path, and it keeps the torch
    # parameter names in the weight constants (load_package_weights relies on them). Its
    # deprecation notice and the warnings about the shape checks (constants in a fixed-shape
    # graph, as intended) are silenced here only.
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.trace.* is deprecated")
        traced = torch.jit.trace(wrapper.eval(), (example,), check_trace=False)
    return ct.convert(
        traced,
        inputs=[ct.TensorType(name="tokens", shape=tuple(example.shape), dtype=np.int32)],
        outputs=[ct.TensorType(name="logits")],
        convert_to="mlprogram",
        compute_precision=ct.precision.FLOAT16,
        minimum_deployment_target=getattr(ct.target, DEPLOYMENT_TARGET),
        skip_model_load=not can_predict(),
    )


def compress(fp16_model, variant: str):
    """One compressed variant of the float16 ML program (`fp16` returns it unchanged)."""
    if variant not in COREML_VARIANTS:
        raise ValueError(
            f"unsupported Core ML compression {variant!r}; expected one of "
            f"{', '.join(COREML_VARIANTS)}"
        )
    if variant == "fp16":
        return fp16_model
    import coremltools.optimize.coreml as cto

    if variant == "int8":
        op_config = cto.OpLinearQuantizerConfig(
            mode="linear_symmetric", dtype="int8", granularity="per_channel"
        )
        return cto.linear_quantize_weights(fp16_model, cto.OptimizationConfig(op_config))
    nbits = {"palettize6": 6, "palettize4": 4}[variant]
    op_config = cto.OpPalettizerConfig(mode="kmeans", nbits=nbits, granularity="per_tensor")
    return cto.palettize_weights(fp16_model, cto.OptimizationConfig(op_config))


def _walk_ops(block, counts: Counter) -> None:
    for op in block.operations:
        counts[op.type] += 1
        for inner in op.blocks:
            _walk_ops(inner, counts)


def op_counts(mlmodel) -> dict[str, int]:
    """Operation types of the ML program's main function and how often each occurs."""
    spec = mlmodel.get_spec()
    if not spec.HasField("mlProgram"):
        raise ValueError("the model is not an ML program (expected convert_to='mlprogram')")
    counts: Counter = Counter()
    for fn in spec.mlProgram.functions.values():
        for block in fn.block_specializations.values():
            _walk_ops(block, counts)
    return dict(counts.most_common())


def io_description(mlmodel) -> dict[str, list[dict]]:
    """Inputs and outputs of the model: name, element type and shape."""
    from coremltools.proto import FeatureTypes_pb2

    names = FeatureTypes_pb2.ArrayFeatureType.ArrayDataType

    def describe(features):
        out = []
        for f in features:
            arr = f.type.multiArrayType
            out.append(
                {
                    "name": f.name,
                    "dtype": names.Name(arr.dataType).lower(),
                    "shape": list(arr.shape),
                }
            )
        return out

    desc = mlmodel.get_spec().description
    return {"inputs": describe(desc.input), "outputs": describe(desc.output)}


def package_bytes(path: str | Path) -> int:
    """Size on disk of an .mlpackage (a folder): the sum of its files, in bytes."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no package at {path}")
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def decompressed_weights(mlmodel) -> dict[str, np.ndarray]:
    """Every weight constant of the program with at least 2 dims, compressed ones expanded back
    to dense float16, keyed by the op name coremltools gave it (derived from the torch name)."""
    import coremltools.optimize.coreml as cto
    from coremltools.converters.mil.frontend.milproto.load import load as milproto_load

    dense = cto.decompress_weights(mlmodel)
    spec = dense.get_spec()
    prog = milproto_load(
        spec, specification_version=spec.specificationVersion, file_weights_dir=dense.weights_dir
    )
    weights = {}
    for fn in prog.functions.values():
        for op in fn.operations:
            val = op.outputs[0].val if op.op_type == "const" else None
            if isinstance(val, np.ndarray) and val.ndim >= 2 and val.dtype.kind == "f":
                weights[op.name] = val
    return weights


def _param_for(const_name: str, params: dict[str, torch.Tensor]) -> str | None:
    # coremltools names a weight constant after the torch path, dots turned to underscores, with
    # suffixes for its casts and compression: "model_layers_0_attention_wo_weight_to_fp16_...".
    for name in params:
        flat = name.replace(".", "_")
        if const_name == flat or const_name.startswith(flat + "_"):
            return name
    return None


def load_package_weights(wrapper: FixedShapeLM, mlmodel) -> tuple[FixedShapeLM, dict]:
    """A copy of `wrapper` whose 2-D weights are the package's (decompressed) ones.

    Returns the copy and {"replaced": n, "weight_rel_err": ||W_pkg - W|| / ||W|| over all}.
    Raises if a weight matrix of the model has no counterpart in the package.
    """
    twin = copy.deepcopy(wrapper)
    params = dict(twin.named_parameters())
    matrices = {n for n, p in params.items() if p.dim() >= 2}
    found: dict[str, np.ndarray] = {}
    for const_name, value in decompressed_weights(mlmodel).items():
        name = _param_for(const_name, params)
        if name in matrices and tuple(value.shape) == tuple(params[name].shape):
            found[name] = value
    missing = matrices - set(found)
    if missing:
        raise ValueError(f"weights not found in the Core ML package: {sorted(missing)}")
    err2 = ref2 = 0.0
    with torch.no_grad():
        for name, value in found.items():
            new = torch.from_numpy(value.astype(np.float32))
            err2 += (new - params[name]).pow(2).sum().item()
            ref2 += params[name].pow(2).sum().item()
            params[name].copy_(new)
    return twin, {"replaced": len(found), "weight_rel_err": (err2 / ref2) ** 0.5}


def emulate(wrapper: FixedShapeLM, mlmodel, tokens: torch.Tensor) -> tuple[np.ndarray, dict]:
    """Logits of the PyTorch model holding the package's weights, computed in float16 on the
    CPU (the package's compute precision): an estimate of Core ML's output where Core ML
    cannot run."""
    twin, info = load_package_weights(wrapper, mlmodel)
    with torch.no_grad():
        logits = twin.half()(tokens).float().numpy()
    return logits, info


def predict(mlmodel, tokens: torch.Tensor) -> np.ndarray:
    """Core ML's own prediction (macOS only)."""
    if not can_predict():
        raise CoreMLUnavailableError(
            f"Core ML prediction needs macOS; this is {platform.system()}: conversion and "
            "compression ran, prediction was skipped"
        )
    out = mlmodel.predict({"tokens": tokens.numpy().astype(np.int32)})
    return np.asarray(out["logits"], dtype=np.float32)


def load(path: str | Path):
    import coremltools as ct

    return ct.models.MLModel(str(path), skip_model_load=not can_predict())
