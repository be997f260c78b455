"""The engine's own execution modes: one step (sampling every sequence that reaches its last
token, verifying the drafts of speculating ones) and multi-step decoding (k greedy decode steps
per host round trip). Each queues its device work and returns a `Launched`: how to read the
result as a `StepOutput` later, and the device tensor of each sequence's newest token, from which
a step queued behind it takes its inputs (asynchronous scheduling) without reading it.

A mode works on the sequences' state as scheduled, before the engine moves their computed
lengths past this step (`LLMEngine._advance`); what it reads later (`read`) depends only on what
it captured here.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .inputs import device_tensor
from .model_runner import DeviceTokens, ModelRunner
from .outputs import Chunk, SeqResult, StepOutput
from .sampler import sample
from .sequence import Sequence


@dataclass
class Launched:
    """Device work queued by a mode whose tokens the host has not read yet."""

    read: Callable[[], StepOutput]  # waits for the device, then describes what it computed
    tokens: DeviceTokens | None  # each sequence's newest token; None: read before queuing more
    overlap_flag: str = "async_scheduling"  # the EngineArgs switch that lets work queue behind
    assumed: dict[int, int] = field(default_factory=dict)  # id(seq) -> tokens it will sample
    running_now: int = 0  # running sequences when queued (the peak counter)
    # it sampled for a request with structured output: read before the next step is queued
    constrained: bool = False
    # when its step began (before scheduling): a step read before the next one is queued
    # spans t0 to its commit, its host work included, not only the wait for the device
    t0: float = field(default_factory=time.perf_counter)


def launch_single_step(
    runner: ModelRunner, batch, prev: DeviceTokens | None, generator, speculator=None
) -> Launched:
    """One forward over the scheduled items; sample the rows of every item that reaches its
    last token. Speculating items (drafts scheduled) are verified now, which reads the
    device: such a step cannot have another queued behind it."""
    logits = runner.run(batch.items, prev)
    plain_rows, plain, groups, prefill, decoding = [], [], [], 0, {}
    row = 0
    for s, n in sorted(batch.items, key=lambda it: it[1] != 1):  # the runner's row order
        if n > 1 and not s.spec_token_ids:
            prefill += n  # prompt tokens (a prefill chunk, or a preempted sequence's recompute)
        rows = n - s.num_uncomputed + 1  # positions from the last known token on
        if rows <= 0:
            continue  # a prefill chunk short of the prompt's end
        decoding[id(s)] = n == 1  # a one-token step counts as a decode, whatever the phase
        if s.spec_token_ids:
            groups.append((s, row))
        else:
            plain_rows.append(row)
            plain.append(s)
        row += rows
    tokens = lps = None
    if plain:
        # a copy of those rows (masks may be applied in place), the index queued without a
        # wait: indexing by a Python list would copy it from pageable memory and sync the stream
        rows = device_tensor(plain_rows, logits.device, torch.int64)
        tokens, lps = sample(logits.index_select(0, rows), plain, generator)
        host_tok = runner.to_host("tok", tokens)
        host_lps = runner.to_host("lps", lps) if lps is not None else None
    verified = speculator.verify(logits, groups, generator) if groups else []
    done = runner.done_event()

    def read() -> StepOutput:
        results = []
        if plain:
            if done is not None:
                done.synchronize()
            toks = host_tok.tolist()
            lp = host_lps.tolist() if host_lps is not None else None
            for i, s in enumerate(plain):
                chunk = Chunk([toks[i]], [lp[i]] if lp is not None and s.params.logprobs else None)
                results.append(SeqResult(s, [chunk], decoding=decoding[id(s)]))
        for (s, _), chunk in zip(groups, verified):
            results.append(SeqResult(s, [chunk]))
        return StepOutput(results, prefill_tokens=prefill)

    device_tokens = None
    if plain and not groups:
        device_tokens = DeviceTokens(tokens, {id(s): i for i, s in enumerate(plain)})
    launched = Launched(read, device_tokens)
    launched.constrained = any(s.grammar is not None for s in plain)
    return launched


def multi_step_rooms(batch, scheduler, k: int, max_model_len: int) -> list[int]:
    """Tokens each sequence of this batch may decode in one multi-step run (empty: run one
    step as usual). Multi-step runs only when it cannot change what is computed or when:
    every item decodes greedily (its tokens then come from the device's argmax, which is what
    a single step picks) and no waiting request could join the batch meanwhile (the queue is
    empty or the batch is at `max_num_seqs`). A sequence's room ends at its max_tokens or
    max_model_len (its pending tokens counted), and at the blocks the pool can give it. A
    request with structured output never runs multi-step: each token's mask needs the one
    before it committed to the grammar."""
    if k <= 1 or batch.preempted:
        return []
    if any(s.grammar is not None for s, _ in batch.items):
        return []
    if scheduler.waiting and len(scheduler.running) < scheduler.max_num_seqs:
        return []
    rooms = []
    for seq, n in batch.items:
        p = seq.params
        if n != 1 or seq.num_uncomputed != 1 or not p.greedy or seq.spec_token_ids:
            return []
        ahead = seq.num_pending
        rooms.append(
            min(
                k,
                p.max_tokens - len(seq.output_token_ids) - ahead,
                max_model_len - seq.num_tokens - ahead,
            )
        )
    if max(rooms) <= 1:
        return []
    bm = scheduler.bm
    for i, (seq, _) in enumerate(batch.items):
        if rooms[i] > 1 and not bm.allocate(seq, rooms[i]):
            # the pool is short: as many tokens as the blocks it holds allow (>= 1, the
            # scheduler gave it this step's token)
            rooms[i] = len(seq.block_ids) * bm.block_size - seq.num_computed_tokens
    return rooms


def launch_multi_step(
    runner: ModelRunner, batch, rooms: list[int], prev: DeviceTokens | None
) -> Launched:
    """k = max(rooms) greedy decode steps of the batch, one read-back for all of them. Each
    step is its own chunk of one token: a stop inside the run drops the steps after it."""
    seqs = [s for s, _ in batch.items]
    want_lp = any(s.params.logprobs for s in seqs)
    run = runner.launch_multi(seqs, rooms, max(rooms), logprobs=want_lp, prev=prev)

    def read() -> StepOutput:
        tokens, logprobs = runner.collect_multi(run)
        results = []
        for i, s in enumerate(run.seqs):
            lps = logprobs[i] if logprobs is not None and s.params.logprobs else None
            chunks = [
                Chunk([tokens[i][j]], [lps[j]] if lps is not None else None)
                for j in range(run.rooms[i])
            ]
            results.append(SeqResult(s, chunks, assumed=run.rooms[i]))
        return StepOutput(results, num_steps=run.k)

    rows = {id(s): i for i, s in enumerate(seqs)}
    assumed = {id(s): r for s, r in zip(seqs, rooms)}
    return Launched(read, DeviceTokens(run.last, rows), "async_multi_step", assumed)


__all__ = ["Launched", "launch_multi_step", "launch_single_step", "multi_step_rooms", "Sequence"]
