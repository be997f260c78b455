"""Structured output on the GPU: the mask applied to the logits a CUDA graph's forward wrote
(outside the graph), in decode batches that mix constrained and free requests: every constrained
output validates, with CUDA graphs and without."""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = pytest.mark.gpu

pytest.importorskip("tokenizers")
pytest.importorskip("xgrammar", reason="structured output needs the 'structured' extra (xgrammar)")
jsonschema = pytest.importorskip("jsonschema")

from project04_llm_inference import LLM, SamplingParams  # noqa: E402
from project04_llm_inference import StructuredOutputsParams as SO  # noqa: E402
from project04_llm_inference.bench.structured_validity import SCHEMAS  # noqa: E402

from .conftest import write_bpe_model_dir  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    d = tmp_path_factory.mktemp("bpe-gpu")
    write_bpe_model_dir(d)
    return d


def _batch(constrained: bool):
    params = []
    for i in range(12):
        so = SO(json=SCHEMAS[i % len(SCHEMAS)]) if constrained and i % 2 == 0 else None
        params.append(SamplingParams(max_tokens=150, temperature=0.0, structured_outputs=so))
    return params


def test_structured_under_cuda_graphs_mixed_batches(model_dir):
    """bfloat16 (the engine's kernels take 16-bit dtypes on CUDA), CUDA graphs on: every
    constrained request of a batch that mixes them with free ones ends by its grammar and
    validates (random weights never write valid JSON unmasked), in the graph engine and in an
    eager one; the free requests decode to their token budget. Tokens are not compared between
    the two engines: graph batches are padded to a captured size, and bf16 results may then
    part at a near-tie of random weights."""
    kw = dict(model=str(model_dir), load_format="dummy", device="cuda", dtype="bfloat16")
    prompts = ["hello"] * 12
    for enforce_eager in (False, True):
        llm = LLM(enforce_eager=enforce_eager, **kw)
        got = llm.generate(prompts, _batch(True))
        if not enforce_eager:
            assert llm.engine.stats()["cuda_graph_sizes"], "the decode steps did not use graphs"
        for i, o in enumerate(got):
            if i % 2 == 0:
                assert o.finish_reason == "stop", o.text
                jsonschema.validate(json.loads(o.text), SCHEMAS[i % len(SCHEMAS)])
            else:
                assert len(o.token_ids) == 150 or o.finish_reason == "stop"
        del llm
        torch.cuda.empty_cache()
