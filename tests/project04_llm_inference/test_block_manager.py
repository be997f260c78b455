"""The paged KV cache's bookkeeping (`BlockManager`), driven directly with `Sequence` objects:
reference counts, prefix hashing (the chain of parent hashes, the exact-token check), caching
only blocks whose K/V are computed, LRU eviction, all-or-nothing allocation, leak checks.

No model runs here: "computing" a sequence's tokens is setting `num_computed_tokens`, as the
engine does after a step, then `register_computed`. A simulated KV pool (what every slot holds:
the whole token prefix its K/V were computed from) checks that every prefix-cache hit serves
exactly the K/V the sequence would have computed itself.
"""

from __future__ import annotations

import random

import pytest

from project04_llm_inference.config import SamplingParams
from project04_llm_inference.engine.block_manager import BlockManager
from project04_llm_inference.engine.sequence import Sequence

BS = 4  # block size: small, so a few tokens make several blocks


def _seq(tokens, rid: str = "r") -> Sequence:
    return Sequence(rid, list(tokens), SamplingParams())


def _compute(bm: BlockManager, seq: Sequence, upto: int | None = None) -> None:
    """What a step does once the model ran: the K/V of tokens up to `upto` are in the cache."""
    seq.num_computed_tokens = seq.num_tokens if upto is None else upto
    bm.register_computed(seq)


def _admit(bm: BlockManager, seq: Sequence) -> list[int]:
    """Admit seq as the scheduler does (prefix hits, then fresh blocks for the rest)."""
    hits = bm.find_cached_prefix(seq)
    assert bm.allocate(seq, seq.num_tokens - len(hits) * BS, hits)
    return hits


def _state(bm: BlockManager, *seqs: Sequence):
    return (
        list(bm.ref_counts),
        list(bm.free),
        dict(bm.cached),
        list(bm.block_hash),
        list(bm.block_tokens),
        [
            (list(s.block_ids), list(s.block_hashes), s.num_hashed_blocks, s.num_computed_tokens)
            for s in seqs
        ],
    )


# --- reference counts ------------------------------------------------------------------------


def test_allocate_and_free_reference_counts():
    bm = BlockManager(8, BS)
    s = _seq(range(10, 20))  # 10 tokens: 3 blocks
    assert bm.blocks_needed(s, 10) == 3
    assert bm.allocate(s, 10)
    assert len(s.block_ids) == 3 and len(set(s.block_ids)) == 3
    assert all(bm.ref_counts[b] == 1 for b in s.block_ids)
    assert bm.num_free_blocks == 5 and bm.usage() == pytest.approx(3 / 8)
    assert bm.blocks_needed(s, 12) == 0 and bm.blocks_needed(s, 13) == 1
    bm.check_no_leaks([s])
    bm.free_seq(s)
    assert s.block_ids == [] and s.num_computed_tokens == 0
    assert bm.ref_counts == [0] * 8 and bm.num_free_blocks == 8
    bm.check_no_leaks([])


def test_growing_a_sequence_takes_a_block_only_at_a_block_boundary():
    bm = BlockManager(8, BS)
    s = _seq(range(10, 14))  # exactly one block
    assert bm.allocate(s, 4)
    _compute(bm, s)
    s.output_token_ids.append(99)  # the 5th token needs a second block
    assert bm.blocks_needed(s, 1) == 1
    assert bm.allocate(s, 1) and len(s.block_ids) == 2
    _compute(bm, s)
    s.output_token_ids.append(98)  # the 6th fits the second block
    assert bm.blocks_needed(s, 1) == 0
    assert bm.allocate(s, 1) and len(s.block_ids) == 2
    bm.check_no_leaks([s])


def test_shared_prefix_blocks_are_counted_once_per_holder():
    bm = BlockManager(8, BS)
    a = _seq(range(10, 19), "a")  # 9 tokens: blocks 0-1 full, block 2 partial
    assert bm.allocate(a, 9)
    _compute(bm, a)
    b = _seq(list(range(10, 18)) + [99, 98], "b")  # the same first 8 tokens
    hits = bm.find_cached_prefix(b)
    assert hits == a.block_ids[:2]
    assert bm.allocate(b, 2, hits)
    assert b.block_ids[:2] == hits and b.block_ids[2] not in a.block_ids
    assert b.num_computed_tokens == 8 and b.num_hashed_blocks == 2
    assert [bm.ref_counts[x] for x in hits] == [2, 2]
    bm.check_no_leaks([a, b])
    bm.free_seq(a)
    assert [bm.ref_counts[x] for x in hits] == [1, 1]
    assert a.block_ids == [] and set(bm.free).isdisjoint(b.block_ids)
    bm.check_no_leaks([b])
    bm.free_seq(b)
    bm.check_no_leaks([])
    assert bm.num_free_blocks == 8


def test_freeing_twice_is_caught():
    bm = BlockManager(4, BS)
    s = _seq(range(10, 16))
    assert bm.allocate(s, 6)
    ids = list(s.block_ids)
    bm.free_seq(s)
    s.block_ids = ids  # a stale copy of the table, as a double-free bug would hold
    with pytest.raises(AssertionError, match="freed twice"):
        bm.free_seq(s)


# --- prefix hashing ----------------------------------------------------------------------------


def test_hit_needs_the_same_whole_prefix_not_just_the_same_block():
    bm = BlockManager(16, BS)
    a = _seq([1, 2, 3, 4, 5, 6, 7, 8, 9], "a")
    assert bm.allocate(a, 9)
    _compute(bm, a)
    assert len(bm.cached) == 2
    # block 1's tokens (5 6 7 8) after a different block 0: K/V differ, so no hit at all
    assert bm.find_cached_prefix(_seq([50, 51, 52, 53, 5, 6, 7, 8, 9])) == []
    # block 1's tokens at position 0: no hit either
    assert bm.find_cached_prefix(_seq([5, 6, 7, 8, 9, 10])) == []
    # the same block 0, a different block 1: exactly one hit
    assert bm.find_cached_prefix(_seq([1, 2, 3, 4, 50, 51, 52, 53, 9])) == a.block_ids[:1]
    # the same 8 tokens and more: both
    assert bm.find_cached_prefix(_seq([1, 2, 3, 4, 5, 6, 7, 8, 60, 61])) == a.block_ids[:2]


def test_the_last_token_is_never_served_from_the_cache():
    # Its logits are needed, so it must be computed: a prompt of exactly two cached blocks hits
    # only the first.
    bm = BlockManager(16, BS)
    a = _seq(range(1, 9), "a")
    assert bm.allocate(a, 8)
    _compute(bm, a)
    assert len(bm.cached) == 2
    assert bm.find_cached_prefix(_seq(range(1, 9))) == a.block_ids[:1]
    assert bm.find_cached_prefix(_seq(range(1, 10))) == a.block_ids[:2]


def test_hash_collision_is_no_hit(monkeypatch):
    # Every block hashes alike: only the exact-token check tells blocks apart.
    bm = BlockManager(16, BS)
    monkeypatch.setattr(bm, "_hash", lambda parent, tokens: 12345)
    a = _seq([1, 2, 3, 4, 5], "a")
    assert bm.allocate(a, 5)
    _compute(bm, a)
    assert bm.find_cached_prefix(_seq([9, 9, 9, 9, 5])) == []
    assert bm.find_cached_prefix(_seq([1, 2, 3, 4, 5])) == a.block_ids[:1]


def test_block_key_is_a_digest_of_the_parent_key_and_the_tokens():
    # A child's key must change whenever its parent's does: with Python's hash of (parent, ids),
    # parents p and p + (2**61 - 1) (equal modulo the int hash's prime) gave the same child key,
    # and the exact-token check sees only the block's own tokens, so two different prefixes
    # could share later blocks. BLAKE2b over the parent's digest and the ids closes that.
    import hashlib
    import struct

    bm = BlockManager(16, BS)
    first = bm._hash(None, (1, 2, 3, 4))
    want = hashlib.blake2b(b"\0" * 16 + struct.pack("<4q", 1, 2, 3, 4), digest_size=16)
    assert first == want.digest()
    other = bm._hash(None, (9, 2, 3, 4))
    assert bm._hash(first, (5, 6, 7, 8)) != bm._hash(other, (5, 6, 7, 8))
    p = 12345
    assert hash((p, (5, 6, 7, 8))) == hash((p + 2**61 - 1, (5, 6, 7, 8)))  # the old weakness


def test_prefix_caching_off_caches_nothing():
    bm = BlockManager(16, BS, enable_prefix_caching=False)
    a = _seq(range(1, 10), "a")
    assert bm.allocate(a, 9)
    _compute(bm, a)
    assert bm.cached == {} and a.num_hashed_blocks == 0
    assert bm.find_cached_prefix(_seq(range(1, 10))) == []


# --- only computed blocks are cached -----------------------------------------------------------


def test_a_block_is_cached_only_once_its_kv_are_computed():
    bm = BlockManager(16, BS)
    a = _seq([1, 2, 3, 4, 5, 6, 7], "a")  # 7 tokens: one full block, one of 3
    assert bm.allocate(a, 7)
    bm.register_computed(a)
    assert bm.cached == {}, "allocated but not computed: nothing may be cached"
    _compute(bm, a, upto=3)  # a chunk that does not fill block 0
    assert bm.cached == {}
    _compute(bm, a, upto=7)
    assert list(bm.cached.values()) == a.block_ids[:1]
    # The model sampled token 8: block 1 is now full of *token ids*, but the newest token has no
    # K/V yet, so block 1 must not become hittable.
    a.output_token_ids.append(8)
    bm.register_computed(a)
    assert len(bm.cached) == 1
    b = _seq([1, 2, 3, 4, 5, 6, 7, 8, 100], "b")
    assert bm.find_cached_prefix(b) == a.block_ids[:1]
    # The next decode step computes token 8's K/V: now block 1 is a hit.
    assert bm.allocate(a, 1)
    _compute(bm, a)
    assert bm.find_cached_prefix(b) == a.block_ids[:2]


def test_same_content_computed_twice_keeps_one_cached_copy():
    bm = BlockManager(16, BS)
    a, b = _seq(range(1, 10), "a"), _seq(range(1, 10), "b")
    assert bm.allocate(a, 9) and bm.allocate(b, 9)  # both before either is computed: no hits
    _compute(bm, a)
    _compute(bm, b)
    assert sorted(bm.cached.values()) == sorted(a.block_ids[:2])
    assert b.num_hashed_blocks == 2  # b's own copies are not registered, but hashed
    a_blocks = a.block_ids[:2]
    bm.free_seq(a)
    bm.free_seq(b)
    bm.check_no_leaks([])
    # freed, both copies are still in the pool; the registered one (a's) serves the hit
    assert bm.find_cached_prefix(_seq(range(1, 10), "c")) == a_blocks


# --- LRU eviction ------------------------------------------------------------------------------


def test_freed_blocks_are_reused_oldest_freed_first_and_tail_first():
    bm = BlockManager(6, BS)
    x, y = _seq(range(1, 9), "x"), _seq(range(20, 28), "y")
    assert bm.allocate(x, 8) and bm.allocate(y, 8)
    assert x.block_ids == [0, 1] and y.block_ids == [2, 3]
    bm.free_seq(y)
    bm.free_seq(x)
    # never-used blocks first, then y's (freed first), tail before head, then x's
    assert list(bm.free) == [4, 5, 3, 2, 1, 0]
    z = _seq(range(40, 60), "z")  # 5 blocks
    assert bm.allocate(z, 20)
    assert z.block_ids == [4, 5, 3, 2, 1]


def test_eviction_drops_the_tail_and_keeps_the_shared_head_cached():
    bm = BlockManager(4, BS)
    a = _seq(range(1, 9), "a")
    assert bm.allocate(a, 8)
    _compute(bm, a)
    head, tail = a.block_ids
    bm.free_seq(a)
    assert len(bm.cached) == 2  # unreferenced, but its contents are kept until reused
    b = _seq(range(100, 112), "b")  # 3 fresh blocks: the 2 never used, then a's tail
    assert bm.find_cached_prefix(b) == []
    assert bm.allocate(b, 12)
    assert tail in b.block_ids and head not in b.block_ids
    assert bm.block_hash[tail] is None and bm.block_tokens[tail] is None
    assert list(bm.cached.values()) == [head]
    assert bm.find_cached_prefix(_seq(range(1, 10))) == [head]


def test_a_hit_on_a_free_cached_block_takes_it_off_the_free_list():
    bm = BlockManager(4, BS)
    a = _seq(range(1, 9), "a")
    assert bm.allocate(a, 8)
    _compute(bm, a)
    bm.free_seq(a)
    b = _seq(range(1, 10), "b")
    hits = _admit(bm, b)
    assert hits == [0, 1]
    assert [bm.ref_counts[h] for h in hits] == [1, 1] and not set(hits) & set(bm.free)
    assert len(b.block_ids) == 3
    c = _seq(range(50, 54), "c")  # takes the last free block: the hits are not evicted
    assert bm.allocate(c, 4)
    assert set(c.block_ids).isdisjoint(hits) and len(bm.cached) == 2
    bm.check_no_leaks([b, c])


# --- allocation is all or nothing --------------------------------------------------------------


def test_allocate_when_short_returns_false_and_changes_nothing():
    bm = BlockManager(4, BS)
    x = _seq(range(1, 13), "x")
    assert bm.allocate(x, 12)  # 3 of 4 blocks
    y = _seq(range(20, 28), "y")  # needs 2
    before = _state(bm, x, y)
    assert not bm.allocate(y, 8)
    assert _state(bm, x, y) == before
    _compute(bm, x)
    x.output_token_ids += [0, 0]  # x needs a 4th then a 5th block
    assert bm.allocate(x, 1)
    _compute(bm, x)
    before = _state(bm, x, y)
    assert not bm.allocate(x, 4)
    assert _state(bm, x, y) == before


def test_allocate_with_prefix_hits_when_short_changes_nothing():
    bm = BlockManager(4, BS)
    a = _seq(range(1, 9), "a")
    assert bm.allocate(a, 8)
    _compute(bm, a)
    bm.free_seq(a)  # blocks 0, 1 are free and cached
    x = _seq(range(50, 58), "x")
    assert bm.allocate(x, 8)  # takes the 2 never-used blocks
    b = _seq(list(range(1, 9)) + list(range(60, 65)), "b")  # 2 hits + 5 tokens: 2 fresh
    hits = bm.find_cached_prefix(b)
    assert hits == [0, 1]
    before = _state(bm, x, b)
    # taking the 2 free hits leaves no block for the 2 fresh ones
    assert not bm.allocate(b, 5, hits)
    assert _state(bm, x, b) == before
    bm.free_seq(x)
    assert bm.allocate(b, 5, hits)
    assert b.block_ids[:2] == hits and b.num_computed_tokens == 8
    bm.check_no_leaks([b])


# --- leak check --------------------------------------------------------------------------------


def test_check_no_leaks_catches_a_missing_holder_and_a_bad_count():
    bm = BlockManager(8, BS)
    a, b = _seq(range(1, 6), "a"), _seq(range(10, 20), "b")
    assert bm.allocate(a, 5) and bm.allocate(b, 10)
    bm.check_no_leaks([a, b])
    with pytest.raises(AssertionError):
        bm.check_no_leaks([a])  # b's blocks are held by nobody the caller knows of
    bm.ref_counts[b.block_ids[0]] += 1
    with pytest.raises(AssertionError):
        bm.check_no_leaks([a, b])
    bm.ref_counts[b.block_ids[0]] -= 1
    del bm.free[next(iter(bm.free))]  # a free block lost from the free list
    with pytest.raises(AssertionError):
        bm.check_no_leaks([a, b])


# --- random: every hit serves the right K/V ----------------------------------------------------


def test_random_sharing_and_eviction_serves_correct_kv():
    """Random prompts from a few shared prefixes, admitted, computed chunk by chunk, decoded
    and freed in random order over a small pool. The simulated pool records, per slot, the token
    prefix its K/V came from; before every computation the sequence's context must be exactly
    its own prefix (a hit on a wrong or overwritten block would show here)."""
    rng = random.Random(0)
    bm = BlockManager(24, BS)
    kv: dict[tuple[int, int], tuple[int, ...]] = {}  # (block, offset) -> prefix it encodes
    prefixes = [[rng.randrange(50) for _ in range(rng.randint(3, 14))] for _ in range(4)]
    live: list[Sequence] = []
    hits_seen = 0

    def check_context(s: Sequence) -> None:
        toks = s.all_token_ids
        for p in range(s.num_computed_tokens):
            slot = (s.block_ids[p // BS], p % BS)
            assert kv.get(slot) == tuple(toks[: p + 1]), f"{s.request_id}: bad K/V at {p}"

    def compute(s: Sequence, n: int) -> None:
        check_context(s)
        toks = s.all_token_ids
        for p in range(s.num_computed_tokens, s.num_computed_tokens + n):
            kv[(s.block_ids[p // BS], p % BS)] = tuple(toks[: p + 1])
        _compute(bm, s, s.num_computed_tokens + n)

    for i in range(400):
        op = rng.random()
        if op < 0.3 and len(live) < 6:
            s = _seq(rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randint(1, 9))])
            s.request_id = str(i)
            hits = bm.find_cached_prefix(s)
            n = min(rng.randint(1, 8), s.num_tokens - len(hits) * BS)
            if bm.allocate(s, n, hits):
                hits_seen += len(hits)
                live.append(s)
                compute(s, n)
        elif op < 0.85 and live:
            s = rng.choice(live)
            if s.num_computed_tokens == s.num_tokens:
                s.output_token_ids.append(rng.randrange(50))  # sampled: no K/V yet
            n = min(rng.randint(1, 6), s.num_tokens - s.num_computed_tokens)
            if bm.allocate(s, n):
                compute(s, n)
        elif live:
            s = live.pop(rng.randrange(len(live)))
            bm.free_seq(s)
        bm.check_no_leaks(live)
    assert hits_seen > 20, "the workload should exercise the prefix cache"
    for s in live:
        bm.free_seq(s)
    bm.check_no_leaks([])
    assert bm.num_free_blocks == bm.num_blocks
