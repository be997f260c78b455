"""Continuous batching: which sequences run this step, and how many tokens each.

Each step has a token budget (`max_num_batched_tokens`): a decode costs 1, a prefill chunk its
length. Running sequences go first, in arrival order; a prompt longer than what is left of the
budget is split (chunked prefill) and continues next step, mixed with other sequences' decodes.
When the KV pool cannot hold a running sequence's next tokens, the newest running sequence is
preempted: its blocks are freed and it goes back to the front of the queue, to be recomputed
(its full blocks may still be in the prefix cache then). Waiting requests are admitted in
arrival order (FCFS) while the budget, `max_num_seqs` and the pool allow, and not in a step that
had to preempt.

Asynchronous scheduling: a sequence may have tokens still being sampled on the device
(`Sequence.num_pending`); they count as its next positions, so it is scheduled for the step after
them. A sequence whose pending tokens already reach its max_tokens or max_model_len is left out
(it finishes when they are read). Preempting one with tokens pending is safe: they are committed
when read (it is then waiting) and recomputed with the rest when it is admitted again.

Speculative decoding: a decoding sequence with draft tokens (`spec_token_ids`) is scheduled with
1 + drafts tokens when the budget and the pool allow it without taking blocks that the running
sequences after it need for their own next tokens; otherwise its drafts are cut (to what the
budget holds) or dropped, and it decodes one token as usual. Drafts never cause a preemption.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .block_manager import BlockManager
from .sequence import Sequence, Status


@dataclass
class ScheduledBatch:
    items: list[tuple[Sequence, int]] = field(default_factory=list)  # (sequence, new tokens)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.items)

    def __bool__(self) -> bool:
        return bool(self.items)


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_chunked_prefill: bool = True,
        max_model_len: int | None = None,
    ) -> None:
        self.bm = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.chunked = enable_chunked_prefill
        self.max_model_len = max_model_len
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, seq: Sequence) -> None:
        """Take seq out (finished or aborted) and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.bm.free_seq(seq)
        seq.status = Status.FINISHED

    def _done_pending(self, seq: Sequence) -> bool:
        """Whether seq's pending tokens end it by length: nothing more to schedule for it."""
        if not seq.num_pending:
            return False
        n = seq.num_tokens + seq.num_pending
        max_len = self.max_model_len
        return len(seq.output_token_ids) + seq.num_pending >= seq.params.max_tokens or (
            max_len is not None and n >= max_len
        )

    def _preempt(self, seq: Sequence) -> None:
        self.bm.free_seq(seq)  # recompute later: num_computed_tokens goes back to 0
        seq.status = Status.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        # blocks the running sequences need for their own next tokens (drafts aside): drafts
        # may only take what is left beyond them
        reserve = 0
        if any(s.spec_token_ids for s in self.running):
            reserve = sum(self.bm.blocks_needed(s, s.num_uncomputed) for s in self.running)
        idx = 0
        while idx < len(self.running) and budget > 0:
            seq = self.running[idx]
            if self._done_pending(seq):
                idx += 1
                continue
            if reserve:
                reserve -= self.bm.blocks_needed(seq, seq.num_uncomputed)
            if seq.spec_token_ids:
                n = min(1 + len(seq.spec_token_ids), budget)
                room = self.bm.num_free_blocks - max(reserve, 0)
                if n > 1 and self.bm.blocks_needed(seq, n) <= room:
                    allocated = self.bm.allocate(seq, n)
                    assert allocated, "the room was checked just above"
                    del seq.spec_token_ids[n - 1 :]
                    batch.items.append((seq, n))
                    budget -= n
                    idx += 1
                    continue
                seq.spec_token_ids.clear()  # no room: a plain decode this step
            n = min(seq.num_uncomputed, budget)
            while not self.bm.allocate(seq, n):
                victim = self.running.pop()  # the newest request gives way
                self._preempt(victim)
                batch.preempted.append(victim)
                if victim is seq:
                    break
            else:
                batch.items.append((seq, n))
                budget -= n
                idx += 1
                continue
            break  # seq itself was preempted: nothing after it can run either
        if batch.preempted:
            return batch
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if seq.num_pending:  # preempted with a token still being read: next step
                break
            cached = self.bm.find_cached_prefix(seq)
            n = seq.num_tokens - len(cached) * self.bm.block_size
            if n > budget:
                if not self.chunked:
                    break
                n = budget
            if not self.bm.allocate(seq, n, cached):
                break
            self.waiting.popleft()
            seq.status = Status.RUNNING
            self.running.append(seq)
            self.bm.prefix_queries += seq.num_tokens
            self.bm.prefix_hits += len(cached) * self.bm.block_size
            if not seq.output_token_ids:
                seq.num_cached_prompt_tokens = len(cached) * self.bm.block_size
            batch.items.append((seq, n))
            budget -= n
        return batch
