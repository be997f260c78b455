"""Folders whose safetensors already hold FP8 weights (compressed-tensors, fbgemm_fp8) are read as
FP8 as stored, and give what quantizing the float32 folder at load gives.

With per-channel scales the stored q and scale are exactly what `quantize_rows` computes from
the float32 weights at load (the same function wrote them), so the logits are equal bit for bit.
With one scale per tensor the q differ; their rounding stays within e4m3's 2^-4 relative bound
of the float32 weights for values in the tensor's normal range, and the greedy tokens of the
tiny model (top-2 logit gaps far wider than that error moves them) are checked to agree.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from project04_llm_inference.bench.fp8_accuracy import window_logits
from project04_llm_inference.kernels.fp8 import FP8_DTYPE, FP8_MAX, Fp8Weight, quantize_rows
from project04_llm_inference.model.fp8_checkpoint import checkpoint_quantization
from project04_llm_inference.model.loader import build_model, read_config

CPU = torch.device("cpu")
IDS = torch.tensor([3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32, 79, 50, 28])


def _quant_config(method: str, strategy: str) -> dict:
    if method == "fbgemm_fp8":
        return {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0}
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "strategy": strategy},
                "input_activations": {"num_bits": 8, "type": "float", "dynamic": True},
            }
        },
        "ignore": ["lm_head"],
    }


def write_fp8_folder(src, dst, method="compressed-tensors", strategy="channel", extra=None):
    """Copy a float32 Llama folder with its projections stored in FP8 in `method`'s layout."""
    from safetensors.torch import load_file, save_file

    dst.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for f in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    out = {}
    for name, t in tensors.items():
        if not (name.startswith("model.layers.") and name.endswith("_proj.weight")):
            out[name] = t.contiguous()
            continue
        if strategy == "channel":
            q, s = quantize_rows(t)
            s = s[:, None]  # (N, 1), as both exporters write it
        else:
            s = (t.abs().max() / FP8_MAX).reshape(1)
            q = (t / s).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
        out[name] = q.contiguous()
        out[name + "_scale"] = s.contiguous()
        if method == "compressed-tensors":
            out[name.removesuffix("weight") + "input_scale"] = torch.ones(1)  # static: unused
    out.update(extra or {})
    save_file(out, str(dst / "model.safetensors"))
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = _quant_config(method, strategy)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _load(folder, quantization="none"):
    return build_model(
        read_config(folder),
        model_dir=folder,
        dtype=torch.float32,
        device=CPU,
        max_positions=64,
        quantization=quantization,
    )


@pytest.fixture(scope="module")
def quantized_at_load(hf_model_dir):
    return _load(hf_model_dir, "fp8")


@pytest.mark.parametrize("method", ["compressed-tensors", "fbgemm_fp8"])
def test_a_per_channel_fp8_folder_loads_exactly_what_quantizing_at_load_gives(
    method, hf_model_dir, quantized_at_load, tmp_path
):
    folder = write_fp8_folder(hf_model_dir, tmp_path / method, method)
    model = _load(folder)  # quantization "none": implied by the folder
    for ours, ref in zip(model.layers, quantized_at_load.layers):
        for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
            a, b = getattr(ours, name), getattr(ref, name)
            assert isinstance(a, Fp8Weight)
            assert torch.equal(a.qweight.view(torch.uint8), b.qweight.view(torch.uint8))
            assert torch.equal(a.scale, b.scale)
    torch.testing.assert_close(
        window_logits(model, IDS), window_logits(quantized_at_load, IDS), rtol=0, atol=0
    )


def test_a_per_tensor_fp8_folder_keeps_each_parts_scale(hf_model_dir, tmp_path):
    """Each HF tensor's one scale lands on its rows of the fused weight, so every dequantized
    weight is within e4m3's rounding of the float32 one: 2^-4 relative, or 2^-10 of its scale
    below the normal range (float32 products add 2^-22 relative)."""
    from safetensors.torch import load_file

    folder = write_fp8_folder(hf_model_dir, tmp_path / "tensor", strategy="tensor")
    model = _load(folder, "fp8")  # asked for explicitly: accepted
    layer = model.layers[0]
    qkv, q_rows = layer.qkv_proj, layer.q_size
    assert torch.all(qkv.scale[:q_rows] == qkv.scale[0])  # q_proj's one scale
    assert qkv.scale[q_rows] != qkv.scale[0]  # k_proj's own
    ref = load_file(str(next(hf_model_dir.glob("*.safetensors"))))
    w = torch.cat([ref[f"model.layers.0.self_attn.{n}_proj.weight"] for n in "qkv"])
    s = qkv.scale[:, None]
    bound = torch.maximum((2.0**-4 + 2.0**-22) * w.abs(), 2.0**-10 * s)
    assert ((qkv.dequantize() - w).abs() <= bound).all()


def test_the_engine_serves_an_fp8_folder_with_the_quantize_at_load_tokens(hf_model_dir, tmp_path):
    from project04_llm_inference import LLM, SamplingParams

    folder = write_fp8_folder(hf_model_dir, tmp_path / "engine", "fbgemm_fp8")
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    prompts = [[5, 17, 42, 99, 3], list(range(30, 45))]
    runs = {}
    for name, path, q in (("stored", folder, "none"), ("at-load", hf_model_dir, "fp8")):
        llm = LLM(str(path), device="cpu", num_gpu_blocks=16, quantization=q)
        runs[name] = [o.token_ids for o in llm.generate(prompts, params)]
    assert runs["stored"] == runs["at-load"]


def test_checkpoint_kv_scales_are_read_per_layer(hf_model_dir, tmp_path):
    extra = {
        "model.layers.0.self_attn.k_scale": torch.tensor(0.5),
        "model.layers.0.self_attn.v_scale": torch.tensor([0.25, 0.125]),  # one per KV head
    }
    folder = write_fp8_folder(hf_model_dir, tmp_path / "kv", extra=extra)
    model = _load(folder)
    assert model.layers[0].k_scale.tolist() == [0.5, 0.5]
    assert model.layers[0].v_scale.tolist() == [0.25, 0.125]
    assert model.layers[1].k_scale.tolist() == [1.0, 1.0]  # none stored: 1


@pytest.mark.parametrize(
    ("qc", "words"),
    [
        ({"quant_method": "awq", "bits": 4}, r"quant_method 'awq' is not supported"),
        ({"quant_method": "gptq"}, r"quant_method 'gptq' is not supported"),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int"}}},
            },
            r"group 'g' has weights num_bits=4, type='int'",
        ),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "g": {"weights": {"num_bits": 8, "type": "float", "strategy": "block"}}
                },
            },
            r"strategy='block'",
        ),
    ],
)
def test_unknown_or_unsupported_schemes_are_refused_naming_them(qc, words):
    with pytest.raises(ValueError, match=words):
        checkpoint_quantization({"quantization_config": qc})


def test_an_unknown_quant_method_is_one_line_at_the_engine(hf_model_dir, tmp_path):
    folder = tmp_path / "awq"
    shutil.copytree(hf_model_dir, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "awq"}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"^config\.json quantization_config\.quant_method 'awq'"):
        _load(folder)


def test_bad_scales_in_an_fp8_folder_are_refused(hf_model_dir, tmp_path):
    bad = {"model.layers.0.self_attn.k_scale": torch.tensor([1.0, 2.0, 3.0])}
    folder = write_fp8_folder(hf_model_dir, tmp_path / "bad", extra=bad)
    with pytest.raises(ValueError, match=r"k_scale has shape \(3,\): expected one scale or one"):
        _load(folder)
    neg = {"model.layers.1.self_attn.v_scale": torch.tensor(-1.0)}
    folder = write_fp8_folder(hf_model_dir, tmp_path / "neg", extra=neg)
    with pytest.raises(ValueError, match=r"v_scale must hold finite scales > 0"):
        _load(folder)


def test_each_tensor_parallel_rank_reads_its_shard_of_weights_and_scales(hf_model_dir, tmp_path):
    """Loading needs no collective, so two ranks' shards are built here side by side. Column-
    parallel projections (q|k|v, gate|up) take their rows with their per-channel scales: what
    quantizing the rank's rows at load gives, bit for bit. Row-parallel ones (o, down) take
    their columns and keep every output row's whole-row scale: dequantized, the two ranks'
    shards side by side are the TP=1 weight. Per-head KV scales go with the rank's KV heads."""
    from project04_llm_inference.model.parallel import TensorParallel

    kv = {"model.layers.0.self_attn.v_scale": torch.tensor([0.25, 0.125])}  # 2 KV heads
    folder = write_fp8_folder(hf_model_dir, tmp_path / "tp", extra=kv)
    whole = _load(folder)
    ranks = []
    for r in range(2):
        kw = dict(dtype=torch.float32, device=CPU, max_positions=64, tp=TensorParallel(r, 2))
        stored = build_model(read_config(folder), model_dir=folder, **kw)
        at_load = build_model(
            read_config(hf_model_dir), model_dir=hf_model_dir, quantization="fp8", **kw
        )
        for name in ("qkv_proj", "gate_up_proj"):
            a, b = getattr(stored.layers[1], name), getattr(at_load.layers[1], name)
            assert torch.equal(a.qweight.view(torch.uint8), b.qweight.view(torch.uint8))
            assert torch.equal(a.scale, b.scale)
        assert stored.layers[0].v_scale.tolist() == [[0.25], [0.125]][r]
        ranks.append(stored)
    for name in ("o_proj", "down_proj"):
        parts = [getattr(m.layers[1], name).dequantize() for m in ranks]
        assert torch.equal(torch.cat(parts, 1), getattr(whole.layers[1], name).dequantize())
