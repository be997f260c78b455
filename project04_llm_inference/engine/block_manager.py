"""The paged KV cache's bookkeeping: a fixed pool of blocks, reference counts, prefix caching.

A full block whose K/V are computed is registered under a hash of its tokens and of every token
before it (the chain of parent hashes), so two requests with the same prefix share its blocks.
The hash is a cryptographic digest (BLAKE2b, 128 bits) of the parent's digest and the block's
token ids: a hit means the whole prefix matches, short of a BLAKE2b collision. (Python's 64-bit
`hash` would let a client search for a prompt whose chain collides with another's and read its
cached K/V.)
Blocks nobody references sit in a free list in LRU order; a cached one keeps its contents until
it is reused, so a later request can still hit it. The cache holds only blocks whose K/V were
computed: a block is hashed when the sequence's computed tokens cover it, never when its token
ids are merely known (the newest sampled token has no K/V yet).
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict

from .sequence import Sequence


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[bytes | None] = [None] * num_blocks
        self.block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self.cached: dict[bytes, int] = {}  # digest -> block id
        # unreferenced blocks, least recently freed first: allocation takes from the front
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.prefix_queries = 0  # prompt tokens looked up
        self.prefix_hits = 0  # of those, found cached

    # --- queries ---------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    def usage(self) -> float:
        return 1.0 - len(self.free) / self.num_blocks

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        total = seq.num_computed_tokens + num_new_tokens
        return max(0, -(-total // self.block_size) - len(seq.block_ids))

    def _hash(self, parent: bytes | None, tokens: tuple[int, ...]) -> bytes:
        """The digest of a block: its parent's digest (none for the first) and its token ids as
        little-endian int64 (ids are checked to lie in the vocabulary before they get here)."""
        h = hashlib.blake2b(digest_size=16)
        h.update(parent if parent is not None else b"\0" * 16)
        h.update(struct.pack(f"<{len(tokens)}q", *tokens))
        return h.digest()

    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """Block ids of the longest cached prefix of seq's tokens (full blocks only, and never
        the last token: its logits must be computed)."""
        if not self.enable_prefix_caching:
            return []
        tokens = seq.all_token_ids
        n_full = (len(tokens) - 1) // self.block_size
        hits, parent = [], None
        for i in range(n_full):
            chunk = tuple(tokens[i * self.block_size : (i + 1) * self.block_size])
            h = self._hash(parent, chunk)
            b = self.cached.get(h)
            if (
                b is None or self.block_tokens[b] != chunk
            ):  # exact check: no false hit on a collision
                break
            hits.append(b)
            parent = h
        return hits

    # --- changes ---------------------------------------------------------------------------

    def _take(self, block: int) -> None:
        if self.ref_counts[block] == 0:
            del self.free[block]
        self.ref_counts[block] += 1

    def _allocate_fresh(self) -> int:
        block, _ = self.free.popitem(last=False)
        old = self.block_hash[block]
        if old is not None:  # evict: its contents are about to be overwritten
            if self.cached.get(old) == block:
                del self.cached[old]
            self.block_hash[block] = self.block_tokens[block] = None
        self.ref_counts[block] = 1
        return block

    def allocate(self, seq: Sequence, num_new_tokens: int, cached: list[int] = ()) -> bool:
        """Give seq the blocks for num_new_tokens more tokens (after taking `cached` prefix hits,
        for a sequence with no blocks yet). False, with nothing changed, when the pool is short."""
        if cached:
            assert not seq.block_ids and seq.num_computed_tokens == 0
        n_cached_free = sum(1 for b in cached if self.ref_counts[b] == 0)
        total = seq.num_computed_tokens + len(cached) * self.block_size + num_new_tokens
        need = max(0, -(-total // self.block_size) - len(seq.block_ids) - len(cached))
        if need + n_cached_free > len(self.free):
            return False
        if cached:
            for b in cached:
                self._take(b)
            seq.block_ids.extend(cached)
            seq.block_hashes = [self.block_hash[b] for b in cached]
            seq.num_hashed_blocks = len(cached)
            seq.num_computed_tokens = len(cached) * self.block_size
        for _ in range(need):
            seq.block_ids.append(self._allocate_fresh())
        return True

    def register_computed(self, seq: Sequence) -> None:
        """Put seq's newly completed full blocks (K/V computed) into the prefix cache."""
        n_full = seq.num_computed_tokens // self.block_size
        if not self.enable_prefix_caching or seq.num_hashed_blocks >= n_full:
            return  # the common decode step: no block completed
        tokens = seq.all_token_ids
        while seq.num_hashed_blocks < n_full:
            i = seq.num_hashed_blocks
            chunk = tuple(tokens[i * self.block_size : (i + 1) * self.block_size])
            parent = seq.block_hashes[i - 1] if i else None
            h = self._hash(parent, chunk)
            b = seq.block_ids[i]
            seq.block_hashes.append(h)
            seq.num_hashed_blocks += 1
            if h in self.cached:  # the same content is cached already: keep that copy
                continue
            self.cached[h] = b
            self.block_hash[b], self.block_tokens[b] = h, chunk

    def free_seq(self, seq: Sequence) -> None:
        """Release seq's blocks; tail blocks go to the free list first, so they are evicted
        before the prefix blocks that other requests are likelier to share."""
        for b in reversed(seq.block_ids):
            self.ref_counts[b] -= 1
            assert self.ref_counts[b] >= 0, f"block {b} freed twice"
            if self.ref_counts[b] == 0:
                self.free[b] = None
        seq.block_ids = []
        seq.block_hashes = []
        seq.num_hashed_blocks = 0
        seq.num_computed_tokens = 0

    def check_no_leaks(self, live: list[Sequence]) -> None:
        """Every block is either free or referenced exactly as often as live sequences hold it."""
        expected = [0] * self.num_blocks
        for s in live:
            for b in s.block_ids:
                expected[b] += 1
        assert expected == self.ref_counts, "block reference counts disagree with the sequences"
        assert set(self.free) == {b for b in range(self.num_blocks) if expected[b] == 0}
