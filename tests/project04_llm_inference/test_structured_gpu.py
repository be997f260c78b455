"""Structured output on the GPU: the mask applied to the logits a CUDA graph's forward wrote
(outside the graph), in decode batches that mix constrained and free requests. Every constrained
output validates; the tokens equal an eager engine's; the free requests' tokens equal those of
the same batch without any constrained request."""

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

from .conftest import write_bpe_model_dir  # noqa: E402
from .test_structured_output import SCHEMAS  # noqa: E402


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
    # float32: the eager and graph forwards then agree to a few ulps, far below the top-2
    # logit gaps of greedy decoding at initializer scale, so the tokens are equal
    kw = dict(model=str(model_dir), load_format="dummy", device="cuda", dtype="float32")
    graphs = LLM(**kw)
    eager = LLM(enforce_eager=True, **kw)
    prompts = ["hello"] * 12
    got = graphs.generate(prompts, _batch(True))
    ref = eager.generate(prompts, _batch(True))
    assert graphs.engine.stats()["cuda_graph_sizes"], "the decode steps did not use CUDA graphs"
    assert [o.token_ids for o in got] == [o.token_ids for o in ref]
    for i, o in enumerate(got):
        if i % 2 == 0:
            assert o.finish_reason == "stop"
            jsonschema.validate(json.loads(o.text), SCHEMAS[i % len(SCHEMAS)])
    free = graphs.generate(prompts, _batch(False))
    assert [o.token_ids for i, o in enumerate(got) if i % 2] == [
        o.token_ids for i, o in enumerate(free) if i % 2
    ]
