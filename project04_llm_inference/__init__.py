"""project04: a small, fast LLM inference engine in the spirit of vLLM.

Paged KV cache with prefix caching, continuous batching with chunked prefill and preemption,
CUDA graphs for decode, and its own CUDA kernels (paged decode and prefill attention, fused
RoPE + cache write). Public API:

- `LLM(model_dir).generate(prompts, SamplingParams(...))`: offline batches.
- `LLMEngine(EngineArgs(...))`: `add_request` / `step` / `abort`, per-request token streams.

Importing needs no GPU and no compiler; kernels are built on first use.
"""

from __future__ import annotations

from importlib import import_module

from .config import EngineArgs, SamplingParams, StructuredOutputsParams

PROJECT = __name__  # the results folder: reports/<PROJECT>/

_LAZY = {
    "LLM": ".engine.llm",
    "LLMEngine": ".engine.llm_engine",
    "RequestOutput": ".engine.llm_engine",
}

__all__ = [
    "LLM",
    "EngineArgs",
    "LLMEngine",
    "RequestOutput",
    "SamplingParams",
    "StructuredOutputsParams",
]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
