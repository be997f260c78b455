"""Asynchronous scheduling on a GPU, bf16, CUDA graphs: the step queued behind another takes its
input tokens from that step's output tensor inside the decode graphs' static buffers, and gives
the synchronous engine's tokens."""

from __future__ import annotations

import random

import pytest

from project04_llm_inference import LLM, SamplingParams

pytestmark = pytest.mark.gpu


def _prompts(n, lo, hi, seed):
    rng = random.Random(seed)
    return [[rng.randrange(3, 512) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def _count_replays_with_pending(llm: LLM) -> list[int]:
    runner, calls = llm.engine.runner, [0]
    replay = runner._replay

    def counted(items, prev):
        calls[0] += prev is not None
        return replay(items, prev)

    runner._replay = counted
    return calls


@pytest.mark.smoke
def test_async_graph_replay_equals_sync_bitwise(d64_dir):
    """Every request decodes the same number of tokens, so the batch is the same in every step
    of both engines: the same graphs replay on the same inputs and the bf16 logits, logprobs
    and tokens are bitwise equal. The asynchronous engine's decode graphs take pending inputs
    (gathered on the device) in most steps."""
    prompts = _prompts(16, 10, 300, seed=7)
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True, logprobs=True)
    kw = dict(max_model_len=1024, num_gpu_blocks=512)
    sync = LLM(str(d64_dir), async_scheduling=False, **kw).generate(prompts, params)
    llm = LLM(str(d64_dir), **kw)
    assert llm.engine.runner.graphs, "decode CUDA graphs were not captured"
    pending = _count_replays_with_pending(llm)
    got = llm.generate(prompts, params)
    assert pending[0] >= 16, "the decode graphs never took a token still on the device"
    for a, b in zip(sync, got):
        assert a.token_ids == b.token_ids and list(a.logprobs) == list(b.logprobs)
    llm.engine.block_manager.check_no_leaks([])


def test_async_bf16_with_stops_preemption_and_sampling(d64_dir):
    """Ragged max_tokens and stop tokens (stops found a step late, their extra row computed
    and dropped), seeded sampling, a pool small enough to preempt, shared prefixes. A finished
    row that rides one extra step can change the graph's batch size, and a different GEMM shape
    may flip a near-tie of random bf16 weights, so most (not all) requests must agree, as CUDA
    graphs and eager do in test_engine_gpu.py."""
    rng = random.Random(3)
    system = _prompts(1, 48, 48, seed=8)[0]
    prompts = [system + p for p in _prompts(16, 5, 80, seed=9)]
    params = [
        SamplingParams(
            max_tokens=rng.randrange(4, 40),
            temperature=0.0 if i % 2 else 0.7,
            seed=None if i % 2 else i,
            stop_token_ids=[rng.randrange(3, 512)],
        )
        for i in range(16)
    ]
    kw = dict(max_model_len=512, num_gpu_blocks=40, max_num_batched_tokens=256)
    sync = LLM(str(d64_dir), async_scheduling=False, **kw).generate(prompts, params)
    llm = LLM(str(d64_dir), **kw)
    got = llm.generate(prompts, params)
    s = llm.engine.stats()
    assert s["num_preemptions"] > 0 and s["prefix_cache_hits"] > 0
    assert sum(a.token_ids == b.token_ids for a, b in zip(sync, got)) >= 13
    llm.engine.block_manager.check_no_leaks([])
