"""Continuous batching (`Scheduler`) driven without a model: each step's items are "computed"
by advancing `num_computed_tokens` (as `LLMEngine.step` does) and a finished prefill or decode
appends a fake sampled token. Checks the step token budget, chunked prefill, FCFS admission,
`max_num_seqs`, preemption of the newest request, and (through a dummy engine) the refusal of a
request that could never fit the KV pool.
"""

from __future__ import annotations

import random

import pytest

from project04_llm_inference import LLM, SamplingParams
from project04_llm_inference.engine.block_manager import BlockManager
from project04_llm_inference.engine.scheduler import Scheduler
from project04_llm_inference.engine.sequence import Sequence, Status

BS = 4


def _seq(rid: str, n_prompt: int, max_tokens: int = 8, base: int = 0) -> Sequence:
    return Sequence(
        rid, [base + i % 50 for i in range(n_prompt)], SamplingParams(max_tokens=max_tokens)
    )


def _sched(num_blocks=64, budget=32, max_seqs=8, chunked=True, caching=False):
    bm = BlockManager(num_blocks, BS, enable_prefix_caching=caching)
    return Scheduler(
        bm, max_num_seqs=max_seqs, max_num_batched_tokens=budget, enable_chunked_prefill=chunked
    )


def _step(s: Scheduler):
    """Schedule, then do what the engine does with the batch (no model)."""
    batch = s.schedule()
    for seq, n in batch.items:
        assert n >= 1
        seq.num_computed_tokens += n
        s.bm.register_computed(seq)
        if seq.num_computed_tokens == seq.num_tokens:  # reached the end: one token sampled
            seq.output_token_ids.append(7)
            if len(seq.output_token_ids) >= seq.params.max_tokens:
                s.remove(seq)
    return batch


def test_token_budget_and_max_num_seqs_hold_every_step():
    rng = random.Random(0)
    s = _sched(num_blocks=40, budget=24, max_seqs=5, caching=True)
    seqs = []
    for step in range(300):
        if rng.random() < 0.3:
            seq = _seq(str(step), rng.randint(1, 60), rng.randint(1, 12), base=rng.randrange(3))
            seqs.append(seq)
            s.add(seq)
        batch = _step(s)
        assert batch.num_tokens <= 24
        assert len(batch.items) <= 5 and len(s.running) <= 5
        assert len({id(q) for q, _ in batch.items}) == len(batch.items)
        s.bm.check_no_leaks(s.running)
    while s.has_unfinished():
        _step(s)
    assert all(q.status is Status.FINISHED for q in seqs)
    assert all(len(q.output_token_ids) == q.params.max_tokens for q in seqs)
    s.bm.check_no_leaks([])


def test_chunked_prefill_splits_a_long_prompt_and_mixes_with_decodes():
    s = _sched(budget=16)
    short = _seq("short", 5, max_tokens=50)
    s.add(short)
    assert [(q.request_id, n) for q, n in _step(s).items] == [("short", 5)]
    long = _seq("long", 40, base=1)
    s.add(long)
    chunks = []
    for _ in range(4):
        items = dict((q.request_id, n) for q, n in _step(s).items)
        assert items["short"] == 1, "the running decode goes first, every step"
        chunks.append(items["long"])
        if len(chunks) < 3:
            assert long.output_token_ids == [], "no token is sampled before the prompt's end"
    assert chunks == [15, 15, 10, 1]  # budget 16 minus the decode; then long decodes too
    assert len(long.output_token_ids) == 2


def test_without_chunked_prefill_a_prompt_is_never_split():
    s = _sched(budget=64, chunked=False)
    a, b, c = _seq("a", 50, 20), _seq("b", 64, base=1), _seq("c", 5, base=2)
    for q in (a, b, c):
        s.add(q)
    assert [(q.request_id, n) for q, n in _step(s).items] == [("a", 50)]
    # b does not fit what a's decode leaves of the budget (63): it waits whole (chunking would
    # have split it), and FCFS keeps c behind it
    for _ in range(5):
        assert [(q.request_id, n) for q, n in _step(s).items] == [("a", 1)]
        assert [q.request_id for q in s.waiting] == ["b", "c"]
    s.remove(a)
    items = _step(s).items
    assert [(q.request_id, n) for q, n in items] == [("b", 64)]
    assert [(q.request_id, n) for q, n in _step(s).items] == [("b", 1), ("c", 5)]


def test_every_prefill_item_is_whole_without_chunking_random():
    rng = random.Random(1)
    s = _sched(num_blocks=60, budget=64, max_seqs=4, chunked=False)
    for step in range(200):
        if rng.random() < 0.3:
            s.add(_seq(str(step), rng.randint(1, 64), rng.randint(1, 10)))
        before = {id(q): (q.num_computed_tokens, q.num_tokens) for q in s.running + [*s.waiting]}
        for q, n in _step(s).items:
            # every item covers all the sequence's uncomputed tokens: a whole prompt (plus its
            # outputs after a preemption) or one decode
            computed, total = before[id(q)]
            assert computed + n == total
    while s.has_unfinished():
        _step(s)
    s.bm.check_no_leaks([])


def test_admission_is_first_come_first_served():
    s = _sched(budget=100, max_seqs=3)
    seqs = [_seq(str(i), 10 + i, base=i) for i in range(6)]
    for q in seqs:
        s.add(q)
    batch = _step(s)
    assert [q.request_id for q, _ in batch.items] == ["0", "1", "2"]  # max_num_seqs = 3
    assert [q.request_id for q in s.running] == ["0", "1", "2"]
    assert [q.request_id for q in s.waiting] == ["3", "4", "5"]
    s.remove(seqs[1])
    _step(s)
    assert [q.request_id for q in s.running] == ["0", "2", "3"]


def test_a_long_head_blocks_later_requests_when_the_pool_is_short():
    # FCFS: a short request behind a waiting long one does not overtake it.
    s = _sched(num_blocks=8, budget=100)
    a = _seq("a", 20, max_tokens=30)  # 5 blocks
    s.add(a)
    _step(s)
    big, small = _seq("big", 16, base=1), _seq("small", 2, base=2)  # 4 blocks, 1 block
    s.add(big)
    s.add(small)
    _step(s)
    assert [q.request_id for q in s.running] == ["a"]
    assert [q.request_id for q in s.waiting] == ["big", "small"]


def test_preemption_takes_the_newest_and_puts_it_first_in_line():
    # 6 blocks of 4: three 8-token sequences fill them; decoding needs a 3rd block each.
    s = _sched(num_blocks=6, budget=100, max_seqs=8)
    a, b, c = _seq("a", 8, 20), _seq("b", 8, 20, base=1), _seq("c", 8, 20, base=2)
    w = _seq("w", 3, base=3)
    for q in (a, b, c):
        s.add(q)
    _step(s)
    assert s.bm.num_free_blocks == 0
    s.add(w)
    batch = _step(s)  # a needs a block: c (the newest) gives way; then b needs one: c's
    assert batch.preempted == [c]
    assert [q.request_id for q, _ in batch.items] == ["a", "b"]
    assert [q.request_id for q in s.running] == ["a", "b"]
    assert list(s.waiting) == [c, w], "the preempted request goes to the front of the queue"
    assert c.status is Status.WAITING and c.block_ids == [] and c.num_computed_tokens == 0
    assert c.num_preemptions == 1 and s.num_preemptions == 1
    assert c.output_token_ids == [7]  # kept: it is recomputed, not resampled
    s.bm.check_no_leaks(s.running)
    # no admission in a step that had to preempt
    assert w not in [q for q, _ in batch.items]


def test_preemption_of_the_only_candidate_returns_it_and_progress_continues():
    s = _sched(num_blocks=4, budget=100)
    a, b = _seq("a", 8, 6), _seq("b", 7, 6, base=1)
    s.add(a)
    s.add(b)
    steps = 0
    while s.has_unfinished():
        _step(s)
        s.bm.check_no_leaks(s.running)
        steps += 1
        assert steps < 100, "no progress"
    assert s.num_preemptions > 0
    assert a.output_token_ids == [7] * 6 and b.output_token_ids == [7] * 6


def test_preempted_sequence_keeps_its_prompt_tokens_and_resumes():
    s = _sched(num_blocks=5, budget=100)
    a, b = _seq("a", 8, 10), _seq("b", 8, 10, base=1)
    s.add(a)
    s.add(b)
    preempted = []
    while s.has_unfinished():
        preempted += _step(s).preempted
        s.bm.check_no_leaks(s.running)
    assert b in preempted and a not in preempted  # the older one always keeps going
    assert len(a.output_token_ids) == len(b.output_token_ids) == 10


def _tiny(**kw) -> LLM:
    return LLM(load_format="dummy", dummy_shape="tiny", device="cpu", max_model_len=256, **kw)


def test_request_that_can_never_fit_the_pool_is_refused():
    llm = _tiny(num_gpu_blocks=4)  # 4 blocks of 16: 64 tokens
    eng = llm.engine
    with pytest.raises(ValueError, match="KV pool"):
        eng.add_request("big", list(range(3, 53)), SamplingParams(max_tokens=15))  # 65
    assert not eng.has_unfinished() and "big" not in eng.requests
    # exactly the pool: accepted, and it runs to the end alone
    eng.add_request("fits", list(range(3, 53)), SamplingParams(max_tokens=14, ignore_eos=True))
    outs = []
    while eng.has_unfinished():
        outs += eng.step()
    assert outs[-1].finished and len(outs[-1].token_ids) == 14
    eng.block_manager.check_no_leaks([])
