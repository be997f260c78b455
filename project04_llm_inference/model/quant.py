"""Weight quantization applied to a loaded model: FP8 e4m3 with per-output-channel scales.

The model is loaded in its 16-bit (or float32) dtype first, then each decoder layer's four
projections (qkv, o, gate|up, down) are replaced by `kernels.fp8.Fp8Weight`, one layer at a
time, so the full-precision copy of a layer is freed as soon as its FP8 copy exists. The
embedding, the LM head and the norms stay in the model dtype (as vLLM's FP8 path keeps them):
they are a small share of the bytes of a decode step and the LM head sets the logits directly.
Under tensor parallelism each rank quantizes its own shard: a row-parallel projection's scale
then covers that rank's input columns only.
"""

from __future__ import annotations

import torch

from ..kernels.fp8 import FP8_DTYPE, MIN_FP8_CAPABILITY, Fp8Weight

PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def check_fp8_device(device: torch.device, capability: tuple[int, int] | None = None) -> None:
    """Refuse FP8 on a CUDA GPU without e4m3 tensor cores (compute capability < 8.9), naming
    its capability. The CPU runs the dequantizing reference and is always accepted."""
    if torch.device(device).type != "cuda":
        return
    if capability is None:
        capability = torch.cuda.get_device_capability(torch.device(device))
    if tuple(capability) < MIN_FP8_CAPABILITY:
        need = ".".join(map(str, MIN_FP8_CAPABILITY))
        raise ValueError(
            f"EngineArgs.quantization 'fp8' needs a GPU of compute capability >= {need} (Ada, "
            f"Hopper or newer); this GPU has compute capability {capability[0]}.{capability[1]}"
        )


@torch.no_grad()
def quantize_model_fp8(model) -> None:
    """Replace every decoder layer's projection weights by FP8 e4m3 with per-row scales."""
    for layer in model.layers:
        for name in PROJECTIONS:
            w = getattr(layer, name)
            if isinstance(w, Fp8Weight):
                continue
            q = Fp8Weight.from_float(w.data)
            delattr(layer, name)  # the Parameter goes, its memory with it
            setattr(layer, name, q)


@torch.no_grad()
def fp8_slots(model) -> None:
    """Replace every decoder layer's projection weights by an empty `Fp8Weight` of their shape,
    for a checkpoint that stores them in FP8 to be read into (`loader.load_safetensors`)."""
    for layer in model.layers:
        for name in PROJECTIONS:
            w = getattr(layer, name)
            n, k = w.shape
            q = torch.empty((n, k), dtype=FP8_DTYPE, device=w.device)
            scale = torch.empty((n,), dtype=torch.float32, device=w.device)
            delattr(layer, name)
            setattr(layer, name, Fp8Weight(q, scale))
