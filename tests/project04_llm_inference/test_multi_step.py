"""Multi-step decoding (`EngineArgs.num_scheduler_steps`) on the CPU path with the tiny model.

Running k greedy decode steps back to back (inputs of step j+1 = the argmax of step j, on the
device) must give exactly what k single steps give: the same tokens, finish reasons, logprobs
and no leaked block, including when a sequence stops inside the k steps (max_tokens, a stop
token, max_model_len), when the pool cannot hold k more tokens for everyone, under preemption,
and with prefix-cache hits. Multi-step must also stay out of the way where it cannot apply
(sampling, a queue that could be admitted).

Why exact equality holds: both paths compute each token's logits with the same float32 ops on
the same cached K/V; they differ only in which other rows share a matmul (a finished row keeps
computing, discarded, inside a multi-step run). Row results of a matmul do not depend on the
other rows here, and even if the last bits did, a flip of the argmax would need two logits of
a random-weight model within ~1e-6 of each other; the tests' prompts have no such tie (the
single-step run is their reference). Logprobs are compared to 1e-5 (float32 log_softmax of
logits of size ~1, a few ulps).
"""

from __future__ import annotations

import random

import pytest

from project04_llm_inference import LLM, EngineArgs, SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")


def _tiny(**kw) -> LLM:
    kw.setdefault("max_model_len", 256)
    return LLM(load_format="dummy", dummy_shape="tiny", device="cpu", **kw)


def _workload(n: int, seed: int, shared_prefix: int = 0):
    rng = random.Random(seed)
    prefix = [rng.randrange(3, 256) for _ in range(shared_prefix)]
    prompts = [
        prefix + [rng.randrange(3, 256) for _ in range(rng.randint(1, 40))] for _ in range(n)
    ]
    params = [
        SamplingParams(
            max_tokens=rng.choice([1, 2, 3, rng.randint(4, 40)]),
            temperature=0.0,
            stop_token_ids=rng.choice([[], [rng.randrange(3, 256)]]),
            logprobs=rng.random() < 0.5,
        )
        for _ in range(n)
    ]
    return prompts, params


def _generate(llm: LLM, prompts, params, *, streams: bool = True):
    """Step the engine to the end; every stream must concatenate to its final tokens."""
    eng = llm.engine
    for i, (p, sp) in enumerate(zip(prompts, params)):
        eng.add_request(str(i), p, sp)
    got: dict[str, list[int]] = {}
    final = {}
    while eng.has_unfinished():
        for out in eng.step():
            got.setdefault(out.request_id, []).extend(out.new_token_ids)
            if streams:
                assert got[out.request_id] == out.token_ids
            if out.finished:
                final[out.request_id] = out
    eng.block_manager.check_no_leaks([])
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
    return [final[str(i)] for i in range(len(prompts))]


def _multi_steps(llm: LLM) -> int:
    return sum(r.num_steps for r in llm.engine.step_log if r.num_steps > 1)


def _assert_same(a, b):
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids
        assert x.finish_reason == y.finish_reason
        if x.logprobs is None:
            assert y.logprobs is None
        else:
            assert y.logprobs == pytest.approx(x.logprobs, abs=1e-5)


@pytest.mark.parametrize("k", [2, 4, 7])
def test_multi_step_equals_single_step(k):
    """More requests than max_num_seqs (a full batch with a queue: multi-step runs while no one
    can join), ragged max_tokens including 1-3 (stops inside a run), stop tokens, logprobs."""
    prompts, params = _workload(14, seed=k)
    ref = _generate(_tiny(max_num_seqs=5, max_num_batched_tokens=64), prompts, params)
    llm = _tiny(max_num_seqs=5, max_num_batched_tokens=64, num_scheduler_steps=k)
    out = _generate(llm, prompts, params)
    _assert_same(ref, out)
    assert _multi_steps(llm) > 0, "no multi-step run happened: the test would prove nothing"
    assert max(r.num_steps for r in llm.engine.step_log) <= k


def test_multi_step_with_prefix_hits_and_a_small_pool():
    """A shared prefix (cache hits), and a pool too small to hold k tokens more for every
    sequence, so rooms are cut to the blocks held and preemption happens."""
    prompts, params = _workload(12, seed=11, shared_prefix=20)
    for p in params:
        p.max_tokens = max(p.max_tokens, 30)
    kw = dict(max_num_seqs=6, max_num_batched_tokens=48, num_gpu_blocks=14)
    ref_llm = _tiny(**kw)
    ref = _generate(ref_llm, prompts, params)
    llm = _tiny(**kw, num_scheduler_steps=8)
    out = _generate(llm, prompts, params)
    _assert_same(ref, out)
    st = llm.engine.stats()
    assert _multi_steps(llm) > 0
    assert st["prefix_cache_hits"] > 0 and st["num_preemptions"] > 0, st


def test_multi_step_stops_at_max_model_len():
    llm_ref = _tiny(max_model_len=40)
    llm = _tiny(max_model_len=40, num_scheduler_steps=8)
    prompts = [[5, 6, 7] * 10, [9] * 3]
    params = [SamplingParams(max_tokens=100, temperature=0)] * 2
    ref = _generate(llm_ref, prompts, params)
    out = _generate(llm, prompts, params)
    _assert_same(ref, out)
    assert [o.finish_reason for o in out] == ["length", "length"]
    assert [len(p) + len(o.token_ids) for p, o in zip(prompts, out)] == [40, 40]


def test_multi_step_leaves_sampling_and_admission_alone():
    """A sampled request keeps the batch on single steps (its draws must come from the
    sampler); the seeded tokens are those of an engine without multi-step. A queue that could
    be admitted also keeps single steps, so new requests start at once."""
    prompts, _ = _workload(4, seed=3)
    params = [SamplingParams(max_tokens=12, temperature=0.0) for _ in prompts]
    params[1] = SamplingParams(max_tokens=12, temperature=1.0, seed=7)
    ref = _generate(_tiny(), prompts, params)
    llm = _tiny(num_scheduler_steps=4)
    out = _generate(llm, prompts, params)
    _assert_same(ref, out)
    # multi-step only once the sampled request is done (its 12 tokens end with the others')
    assert all(r.num_steps == 1 for r in llm.engine.step_log[:12])

    llm = _tiny(num_scheduler_steps=4, max_num_seqs=8)
    eng = llm.engine
    eng.add_request("a", [4, 5, 6], SamplingParams(max_tokens=30, temperature=0))
    eng.step()  # prefill
    eng.add_request("b", [7, 8, 9], SamplingParams(max_tokens=30, temperature=0))
    eng.step()  # b is admitted now (room in the batch), a decodes one token
    assert eng.step_log[-1].num_steps == 1 and eng.step_log[-1].prefill_tokens == 3


@pytest.mark.parametrize(
    "kw",
    [
        dict(num_scheduler_steps=0),
        dict(num_scheduler_steps=65),
        dict(num_scheduler_steps=True),
        dict(num_scheduler_steps=4, speculative_method="ngram"),
    ],
)
def test_bad_num_scheduler_steps(kw):
    with pytest.raises(ValueError, match="num_scheduler_steps"):
        EngineArgs(load_format="dummy", dummy_shape="tiny", **kw)


def _count_queued_behind(llm: LLM) -> list[int]:
    """Wrap the runner's launch_multi: the number of runs queued behind a step still in flight
    (their first inputs taken from its tokens on the device)."""
    runner, calls = llm.engine.runner, [0]
    launch = runner.launch_multi

    def counted(*args, **kw):
        if kw.get("prev") is not None:
            calls[0] += 1
        return launch(*args, **kw)

    runner.launch_multi = counted
    return calls


@pytest.mark.parametrize("k", [2, 5])
def test_async_multi_step_equals_sync_and_single_steps(k):
    """Queuing the next run before reading the last one's tokens (the default) gives what
    reading each run first gives, and what single steps give: ragged max_tokens and stop
    tokens end sequences inside runs whose successors were already queued."""
    prompts, params = _workload(14, seed=20 + k)
    kw = dict(max_num_seqs=5, max_num_batched_tokens=64)
    ref = _generate(_tiny(**kw), prompts, params)
    sync = _tiny(**kw, num_scheduler_steps=k, async_multi_step=False, async_scheduling=False)
    queued = _count_queued_behind(sync)
    _assert_same(ref, _generate(sync, prompts, params))
    assert queued[0] == 0
    llm = _tiny(**kw, num_scheduler_steps=k)
    queued = _count_queued_behind(llm)
    _assert_same(ref, _generate(llm, prompts, params))
    assert queued[0] > 0, "no run was queued behind another: the test would prove nothing"


def test_async_multi_step_with_a_small_pool_and_max_model_len():
    """Rooms cut by the blocks the pool still has and by max_model_len, for runs queued ahead."""
    prompts, params = _workload(10, seed=31, shared_prefix=12)
    for p in params:
        p.max_tokens = max(p.max_tokens, 40)
    kw = dict(max_num_seqs=5, max_num_batched_tokens=48, num_gpu_blocks=16, max_model_len=72)
    ref = _generate(_tiny(**kw), prompts, params)
    llm = _tiny(**kw, num_scheduler_steps=6)
    queued = _count_queued_behind(llm)
    _assert_same(ref, _generate(llm, prompts, params))
    assert queued[0] > 0


def test_async_multi_step_abort_and_join_while_a_run_is_queued():
    """A request aborted while a run for it is queued frees its blocks and returns nothing
    more; one added meanwhile waits for the queued run, then joins; the rest decode exactly
    as without multi-step."""
    prompts, _ = _workload(4, seed=41)
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    extra = [11, 12, 13, 14]
    ref = _generate(_tiny(max_num_seqs=3), prompts[:3] + [extra], [params] * 4, streams=False)

    llm = _tiny(max_num_seqs=3, num_scheduler_steps=4)
    eng = llm.engine
    queued = _count_queued_behind(llm)
    for i in range(3):
        eng.add_request(str(i), prompts[i], params)
    got: dict[str, list[int]] = {}
    final = {}

    def step():
        for out in eng.step():
            got.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.finished:
                final[out.request_id] = out

    while queued[0] == 0:
        step()
    assert eng._inflight is not None
    assert eng.abort("1")  # its queued tokens are discarded
    step()
    assert "1" not in got or len(got["1"]) < 30
    eng.add_request("3", extra, params)  # the batch has room: no run is queued behind this one
    while eng.has_unfinished():
        step()
    eng.block_manager.check_no_leaks([])
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
    assert "1" not in final
    for rid, want in (("0", ref[0]), ("2", ref[2]), ("3", ref[3])):
        assert final[rid].token_ids == want.token_ids and got[rid] == want.token_ids
