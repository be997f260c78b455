"""LiteRT (TFLite): the shared transformer through `litert-torch`, run by `ai-edge-litert`.

    fp32    litert_torch.convert of the fixed-shape model (torch.export underneath)
    int8    the same with the dynamic-range recipe: int8 weights per channel, activations
            quantized on the fly inside each fully connected op (no calibration data)

The interpreter runs on Linux and macOS with the XNNPACK CPU delegate (its default), so parity
with PyTorch and CPU latency are measured here, next to PyTorch eager in the same process.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import torch

from apple_track.model import LITERT_VARIANTS, FixedShapeLM


def convert(wrapper: FixedShapeLM, example: torch.Tensor, variant: str, path: str | Path) -> Path:
    """Convert to a .tflite flatbuffer at `path`; returns the path."""
    if not isinstance(wrapper, FixedShapeLM):
        raise TypeError(f"wrapper must be a FixedShapeLM, got {type(wrapper).__name__}")
    if variant not in LITERT_VARIANTS:
        raise ValueError(
            f"unsupported LiteRT variant {variant!r}; expected one of {', '.join(LITERT_VARIANTS)}"
        )
    if example.dtype != torch.int32 or tuple(example.shape) != (wrapper.batch, wrapper.seq_len):
        raise ValueError(
            f"example must be int32 of shape {(wrapper.batch, wrapper.seq_len)}, "
            f"got {example.dtype} {tuple(example.shape)}"
        )
    import litert_torch

    quant_config = None
    if variant == "int8":
        from litert_torch.generative.quantize import quant_recipes

        quant_config = quant_recipes.full_dynamic_recipe()  # int8 weights, channel-wise
    edge_model = litert_torch.convert(wrapper.eval(), (example,), quant_config=quant_config)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    edge_model.export(str(path))
    return path


def interpreter(path: str | Path, *, threads: int = 1, delegates: bool = True):
    """An allocated interpreter; delegates=False runs the built-in kernels without XNNPACK."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    if not Path(path).exists():
        raise FileNotFoundError(f"no .tflite model at {path}")
    resolver = (
        OpResolverType.AUTO if delegates else OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    )
    it = Interpreter(
        model_path=str(path), num_threads=threads, experimental_op_resolver_type=resolver
    )
    it.allocate_tensors()
    return it


def run(it, tokens: torch.Tensor | np.ndarray) -> np.ndarray:
    """One inference: tokens (B, S) int32 -> logits (B, S, vocab) float32."""
    (inp,), (out,) = it.get_input_details(), it.get_output_details()
    x = np.asarray(tokens, dtype=np.int32)
    expected = tuple(int(n) for n in inp["shape"])
    if tuple(x.shape) != expected:
        raise ValueError(f"tokens must have shape {expected}, got {tuple(x.shape)}")
    it.set_tensor(inp["index"], x)
    it.invoke()
    return it.get_tensor(out["index"])


def constant_tensors(path: str | Path) -> dict[str, dict[str, int]]:
    """Tensors stored in the flatbuffer (weights, tables, masks), by element type:
    {"int8": {"tensors": n, "elements": e}, ...}. Read from the schema, not the interpreter,
    so activations never count."""
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(Path(path).read_bytes(), 0)
    type_names = {v: k.lower() for k, v in vars(schema.TensorType).items() if k.isupper()}
    out: dict[str, dict[str, int]] = {}
    for graph in model.subgraphs:
        for t in graph.tensors:
            buf = model.buffers[t.buffer]
            if not ((buf.data is not None and len(buf.data)) or (buf.size or 0)):
                continue
            entry = out.setdefault(
                type_names.get(t.type, str(t.type)), {"tensors": 0, "elements": 0}
            )
            entry["tensors"] += 1
            entry["elements"] += int(np.prod(t.shape)) if t.shape is not None else 1
    return out


def describe(path: str | Path) -> dict:
    """Ops of the graph (counted without delegation), constant tensors by dtype, inputs/outputs."""
    it = interpreter(path, delegates=False)
    ops = Counter(op["op_name"] for op in it._get_ops_details())

    def io(details):
        return [
            {"name": d["name"], "dtype": np.dtype(d["dtype"]).name, "shape": d["shape"].tolist()}
            for d in details
        ]

    return {
        "op_counts": dict(ops.most_common()),
        "constants_by_dtype": constant_tensors(path),
        "inputs": io(it.get_input_details()),
        "outputs": io(it.get_output_details()),
    }
