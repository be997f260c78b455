"""Asynchronous scheduling (`EngineArgs.async_scheduling`, the default) against the synchronous
engine on the CPU path, float32, tiny dummy model.

The asynchronous engine queues step N + 1 before reading step N's tokens, its inputs gathered
from step N's output on the device. It must give exactly the synchronous engine's tokens: the
same float32 computation per sequence and step (greedy, and seeded sampling, whose draws come
from each request's own generator), so tokens are compared exactly; logprobs within float32
summation-order noise (a batch may hold one more row, see `_assert_same`). Covered: stops
found only when the token is read (stop tokens, EOS, stop strings, max_tokens) with a step
already queued for the sequence, aborts while a step is in flight, preemption while a step is
queued, prefix-cache hits, multi-step decoding and speculation (which falls back to synchronous
steps), and a seeded add/step/abort stress that leaks no block.
"""

from __future__ import annotations

import json
import random

import pytest

from project04_llm_inference import LLM, SamplingParams
from project04_llm_inference.config import DUMMY_SHAPES

pytestmark = pytest.mark.usefixtures("one_thread")


def _tiny(**kw) -> LLM:
    kw.setdefault("max_model_len", 256)
    return LLM(load_format="dummy", dummy_shape="tiny", device="cpu", **kw)


def _workload(n: int, seed: int, *, shared_prefix: int = 0, stop_prob: float = 0.3):
    """Prompts of ragged lengths (optionally sharing a prefix), ragged max_tokens (1 included:
    a request that ends with its first token), greedy and seeded sampled requests, stop
    tokens drawn from the vocabulary (some hit), logprobs on some."""
    rng = random.Random(seed)
    prefix = [rng.randrange(3, 256) for _ in range(shared_prefix)]
    prompts, params = [], []
    for i in range(n):
        prompts.append(prefix + [rng.randrange(3, 256) for _ in range(rng.randrange(1, 20))])
        sampled = i % 3 == 2
        params.append(
            SamplingParams(
                max_tokens=rng.choice([1, 2, 3, 7, 12, 20]),
                temperature=0.8 if sampled else 0.0,
                seed=1000 + i if sampled else None,
                stop_token_ids=[rng.randrange(3, 256)] if rng.random() < stop_prob else [],
                logprobs=i % 4 == 1,
            )
        )
    return prompts, params


def _generate(llm: LLM, prompts, params, *, check_inflight=None):
    """Step to the end; streams concatenate to the final tokens; no block leaks."""
    eng = llm.engine
    for i, (p, sp) in enumerate(zip(prompts, params)):
        eng.add_request(str(i), p, sp)
    got, final = {}, {}
    while eng.has_unfinished():
        for out in eng.step():
            got.setdefault(out.request_id, []).extend(out.new_token_ids)
            assert got[out.request_id] == list(out.token_ids)
            if out.logprobs is not None:
                assert len(out.logprobs) == len(out.token_ids)
                assert len(out.new_logprobs) == len(out.new_token_ids)
            if out.finished:
                final[out.request_id] = out
        if check_inflight is not None:
            check_inflight(eng)
    eng.block_manager.check_no_leaks([])
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
    return [final[str(i)] for i in range(len(prompts))]


def _assert_same(a, b):
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids
        assert x.finish_reason == y.finish_reason
        assert (x.logprobs is None) == (y.logprobs is None)
        if x.logprobs is not None:
            # a sequence whose stop is found late still rides in the next step's batch, so the
            # batch's row count, and with it the GEMMs' float32 summation order, may differ:
            # a few ulps of logits of magnitude ~10 (1e-6), far below this bound
            assert list(y.logprobs) == pytest.approx(list(x.logprobs), abs=1e-5)


class _Overlap:
    """Counts steps that found a step still in flight (the overlap the test relies on)."""

    def __init__(self):
        self.seen = 0

    def __call__(self, eng):
        self.seen += eng._inflight is not None


def _both(prompts, params, **kw):
    ref = _generate(_tiny(async_scheduling=False, **kw), prompts, params)
    overlap = _Overlap()
    llm = _tiny(**kw)
    assert llm.engine.args.async_scheduling, "asynchronous scheduling is the default"
    got = _generate(llm, prompts, params, check_inflight=overlap)
    assert overlap.seen > 0, "no step was queued behind another: the test would prove nothing"
    _assert_same(ref, got)
    return llm


def _count_dropped(llm: LLM) -> list[int]:
    """Wrap update_from_output: results for sequences that had already stopped (or were
    aborted) when read, i.e. tokens computed by a step queued before the stop was known."""
    eng, dropped = llm.engine, [0]
    update = eng.update_from_output

    def counted(out, launched=None):
        dropped[0] += sum(r.seq.finish_reason is not None for r in out.results)
        return update(out, launched)

    eng.update_from_output = counted
    return dropped


def test_async_equals_sync_with_stops_found_late():
    """More requests than max_num_seqs (admission while a step is in flight), ragged
    max_tokens, seeded sampling and logprobs, and stop tokens taken from each request's own
    output (so they hit mid-stream): those sequences stop on a token read after the next step
    was queued for them, whose extra token must be dropped."""
    prompts, params = _workload(16, seed=1, stop_prob=0.0)
    free = _generate(_tiny(async_scheduling=False, max_num_seqs=6), prompts, params)
    rng = random.Random(11)
    for p, out in zip(params, free):
        if len(out.token_ids) > 3:
            p.stop_token_ids = [out.token_ids[rng.randrange(1, len(out.token_ids) - 1)]]
    ref = _generate(_tiny(async_scheduling=False, max_num_seqs=6), prompts, params)
    llm = _tiny(max_num_seqs=6)
    dropped = _count_dropped(llm)
    _assert_same(ref, _generate(llm, prompts, params))
    assert dropped[0] > 0, "no stop was found late: the test would prove nothing"
    assert sum(o.finish_reason == "stop" for o in ref) >= 4


def test_async_equals_sync_under_preemption_and_prefix_hits():
    """A pool too small for the batch: sequences are preempted while their next step is
    queued (their pending token is committed when read, then recomputed); shared prefixes hit
    the prefix cache, including the blocks a preempted sequence filled."""
    prompts, params = _workload(10, seed=2, shared_prefix=20, stop_prob=0.1)
    for p in params:
        p.max_tokens = max(p.max_tokens, 12)
    kw = dict(num_gpu_blocks=14, max_num_batched_tokens=32, max_num_seqs=8)
    llm = _both(prompts, params, **kw)
    s = llm.engine.stats()
    assert s["num_preemptions"] > 0 and s["prefix_cache_hits"] > 0


def test_preemption_while_a_step_is_queued_happens():
    """The previous test's premise, checked directly: a sequence preempted with a token still
    in flight."""
    prompts, params = _workload(10, seed=2, shared_prefix=20, stop_prob=0.1)
    for p in params:
        p.max_tokens = max(p.max_tokens, 12)
    llm = _tiny(num_gpu_blocks=14, max_num_batched_tokens=32, max_num_seqs=8)
    sched, seen = llm.engine.scheduler, []
    preempt = sched._preempt

    def watched(seq):
        seen.append(seq.num_pending)
        preempt(seq)

    sched._preempt = watched
    _generate(llm, prompts, params)
    assert any(n > 0 for n in seen)


def test_async_multi_step_and_single_steps_agree():
    """Multi-step runs queued behind single steps and behind each other (both switches on)."""
    prompts, params = _workload(12, seed=3)
    for p in params:
        p.temperature, p.seed = 0.0, None
    _both(prompts, params, max_num_seqs=4, num_scheduler_steps=4)


def test_abort_while_a_step_is_in_flight():
    """An abort with the request's next token on the device: it frees its blocks at once, gets
    no more output, and the others decode as without it."""
    prompts, _ = _workload(3, seed=4)
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    ref = _generate(_tiny(async_scheduling=False), prompts[:1] + prompts[2:], [params] * 2)
    llm = _tiny()
    eng = llm.engine
    for i, p in enumerate(prompts):
        eng.add_request(str(i), p, params)
    got = {}
    for _ in range(4):
        for out in eng.step():
            got.setdefault(out.request_id, []).extend(out.new_token_ids)
    seq = eng.requests["1"]
    assert eng._inflight is not None and seq.num_pending == 1
    assert eng.abort("1") and seq.block_ids == []
    final = {}
    while eng.has_unfinished():
        for out in eng.step():
            assert out.request_id != "1"
            got.setdefault(out.request_id, []).extend(out.new_token_ids)
            final[out.request_id] = out
    assert len(got["1"]) < 20
    assert [final["0"].token_ids, final["2"].token_ids] == [r.token_ids for r in ref]
    eng.block_manager.check_no_leaks([])


def test_speculation_falls_back_to_synchronous_steps():
    """Drafts need every token on the host: with a speculator nothing is queued ahead, and the
    tokens are those of the engine without speculation."""
    prompts, params = _workload(6, seed=5)
    for p in params:
        p.temperature, p.seed = 0.0, None
    ref = _generate(_tiny(async_scheduling=False), prompts, params)

    def never_inflight(eng):
        assert eng._inflight is None

    llm = _tiny(speculative_method="ngram", num_speculative_tokens=3)
    _assert_same(ref, _generate(llm, prompts, params, check_inflight=never_inflight))
    assert llm.engine.stats()["spec_proposed_tokens"] > 0


def _vocab() -> dict[str, int]:
    words = ["<unk>", "<s>", "</s>"] + [f"t{i:03d}" for i in range(3, 256)]
    return {w: i for i, w in enumerate(words)}


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    """The tiny shape's config.json and a WordLevel tokenizer ("t003".."t255", fixed width)."""
    tokenizers = pytest.importorskip("tokenizers")
    path = tmp_path_factory.mktemp("tiny-tok")
    (path / "config.json").write_text(json.dumps(dict(DUMMY_SHAPES["tiny"], model_type="llama")))
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(_vocab(), unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    tok.save(str(path / "tokenizer.json"))
    return path


def test_stop_strings_found_late(tok_dir):
    """Stop strings taken from each request's own synchronous output (so they hit mid-run):
    the asynchronous engine cuts the same text at the same token."""
    kw = dict(model=str(tok_dir), load_format="dummy", device="cpu", max_model_len=256)
    prompts, _ = _workload(6, seed=6)
    plain = [SamplingParams(max_tokens=16, temperature=0, ignore_eos=True) for _ in prompts]
    free = _generate(LLM(async_scheduling=False, **kw), prompts, plain)
    params = []
    for i, out in enumerate(free):
        # the 5th token's word (and, for odd requests, a string spanning two tokens)
        words = out.text.split()
        stop = words[4] if i % 2 == 0 else f"{words[5][2:]} {words[6][:2]}"
        params.append(SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, stop=[stop]))
    ref = _generate(LLM(async_scheduling=False, **kw), prompts, params)
    got = _generate(LLM(**kw), prompts, params)
    _assert_same(ref, got)
    for r, g in zip(ref, got):
        assert r.finish_reason == "stop" and g.text == r.text and len(g.token_ids) < 16


@pytest.mark.parametrize("seed", [0, 1])
def test_random_add_step_abort_stress_leaks_no_block(seed):
    """A seeded interleaving of add / step / abort over a small pool with async scheduling:
    after every step the reference counts match the live sequences, and at the end every block
    is free again."""
    rng = random.Random(seed)
    llm = _tiny(num_gpu_blocks=12, max_num_seqs=5, max_num_batched_tokens=24)
    eng, bm = llm.engine, llm.engine.block_manager
    start = bm.num_free_blocks
    live, next_id = [], 0
    for _ in range(150):
        r = rng.random()
        if r < 0.25:
            prompt = [rng.randrange(3, 256) for _ in range(rng.randrange(1, 30))]
            sp = SamplingParams(max_tokens=rng.randrange(1, 25), temperature=rng.choice([0, 1]))
            eng.add_request(str(next_id), prompt, sp)
            live.append(str(next_id))
            next_id += 1
        elif r < 0.35 and live:
            eng.abort(live.pop(rng.randrange(len(live))))
        elif eng.has_unfinished():
            for out in eng.step():
                if out.finished and out.request_id in live:
                    live.remove(out.request_id)
        bm.check_no_leaks(list(eng.requests.values()))
    while eng.has_unfinished():
        eng.step()
    bm.check_no_leaks([])
    assert bm.num_free_blocks == start and eng._inflight is None


@pytest.mark.parametrize("asyn", [False, True])
def test_step_log_counts_the_host_work_of_a_step(asyn, monkeypatch):
    """A decode step's logged duration covers its host work (input building, launch), not only
    the wait for the device: with the runner made 20 ms slower per call, every pure decode
    step logs at least 20 ms, read before the next is queued (sync) or as the step period
    (async: the time between two commits, which holds the next step's launch; the last step,
    read with nothing queued behind it, logs only its commit and is left out). The bound is
    the sleep itself: wall time cannot run backwards."""
    import time as _time

    llm = _tiny(async_scheduling=asyn)
    run = llm.engine.runner.run

    def slow_run(*a, **kw):
        _time.sleep(0.02)
        return run(*a, **kw)

    monkeypatch.setattr(llm.engine.runner, "run", slow_run)
    llm.generate([[5, 6, 7]], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    decode = [s for s in llm.engine.step_log if s.prefill_tokens == 0 and s.decode_seqs == 1]
    if asyn:
        decode = decode[:-1]
    assert len(decode) >= 4
    assert min(s.duration_s for s in decode) >= 0.02
