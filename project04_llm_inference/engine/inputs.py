"""The one host input builder: positions, cache slots and context lengths of a model call.

Every way the engine calls a model lays out its query rows the same way. Item i (a sequence's
scheduled tokens) runs rows at positions starts[i], starts[i] + 1, ... through its block table;
its first counts[i] rows are real and write the cache (`paged.kv_slots`), the rest are padding
that writes nothing (slot -1). What differs between the execution modes is only which of a few
conventions they need, chosen by keyword:

- layout: packed (`width=None`: item i has counts[i] rows, concatenated: the eager batch) or
  padded (`width=w`: every item has w rows, item-major, and the batch is padded with padding
  items up to the block tables' rows: CUDA graphs, multi-step plans, the fused program);
- context lengths: "query", one per item, starts + rows (bottom-right causal over the item's
  query: a decode's c + 1, a chunk's c + n, a padded query's c + w), or "rows", one per row,
  position + 1 (each row read as a decode row: a multi-step's steps, a verified draft);
- rows past an item's real ones: "keep" their positions (a fixed-shape query that stays inside
  the model's positions), or "reset" them to position 0 and context 1 (rows that may lie past
  the sequence's blocks and positions: a multi-step's steps past a sequence's room);
- padding items are items of start 0 and count 0 unless `idle_context` is given, whose value
  (0: the decode kernels read nothing) replaces their context lengths.

The arithmetic is numpy over the whole batch: the only per-item Python work left to callers is
reading each sequence's block ids and tokens (`fill_tables`, `input_tokens`). On the device,
`kernels.spec_rounds.round_inputs` mirrors the fused program's layout for its later rounds.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch

from .paged import kv_slots


@dataclass
class StepRows:
    """Host arrays of one model call's query rows (int64; flat, item-major)."""

    ids: np.ndarray  # (rows,) the items' tokens as given, 0 elsewhere (padding, pending)
    positions: np.ndarray  # (rows,)
    slots: np.ndarray  # (rows,) cache slot of each row, -1: writes nothing
    context_lens: np.ndarray  # (items,) with context="query", (rows,) with context="rows"
    offsets: np.ndarray  # (items + 1,) each item's first row, then the number of rows
    sample_rows: np.ndarray  # rows whose logits are read, in item order (see `build_rows`)


def fill_tables(out: np.ndarray, block_ids) -> None:
    """Block tables into out (rows, max_blocks): row i from block_ids[i], 0 past its blocks and
    in the rows past the list (padding items read block 0 and write nothing)."""
    out.fill(0)
    for i, ids in enumerate(block_ids):
        out[i, : len(ids)] = ids


def input_tokens(seq, n: int) -> list[int]:
    """The known input tokens of seq's next n positions (from its computed length): its tokens,
    then its speculative drafts. One short of n when the newest token is still pending on the
    device (asynchronous scheduling): the caller gathers it there."""
    c = seq.num_computed_tokens
    toks = list(seq.all_token_ids[c : c + n])
    if len(toks) < n and getattr(seq, "spec_token_ids", None):
        toks += seq.spec_token_ids[: n - len(toks)]
    return toks


def build_rows(
    tables: np.ndarray,
    starts,
    counts,
    block_size: int,
    *,
    width: int | None = None,
    context: str = "query",
    past: str = "keep",
    idle_context: int | None = None,
    tokens: list[list[int]] | None = None,
    sample_from=None,
) -> StepRows:
    """The query rows of items (module doc). tables (w, max_blocks) int, one row per item and,
    padded, per padding item (w >= len(starts)); starts, counts (items,) int: each item's first
    position and real rows. tokens: each item's first input ids (at most its rows). sample_from
    (items,): the first position of each item whose logits are read (its real rows from there
    are `sample_rows`); None: no rows."""
    starts = np.asarray(starts, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    b, w = len(starts), tables.shape[0]
    if context not in ("query", "rows") or past not in ("keep", "reset"):
        raise ValueError(f"context must be query|rows and past keep|reset, got {context}, {past}")
    if w < b or (width is None and w != b):
        raise ValueError(f"{w} block tables for {b} items (width {width})")
    first = np.full(w, np.iinfo(np.int64).max)  # padding items: nothing to sample
    if sample_from is not None:
        first[:b] = sample_from
    if width is None:  # packed: item i's rows are offsets[i]..offsets[i + 1]
        offsets = np.zeros(b + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        item = np.repeat(np.arange(b), counts)
        j = np.arange(offsets[-1]) - offsets[:-1][item]
        pos = starts[item] + j
        real = np.ones(len(pos), dtype=bool)
        slots = kv_slots(tables, pos, block_size, rows=item)
        sample = pos >= first[item]
        ctx = starts + counts if context == "query" else pos + 1
    else:  # padded: (w, width), flattened item-major at the end
        if b < w:
            starts = np.concatenate((starts, np.zeros(w - b, dtype=np.int64)))
            counts = np.concatenate((counts, np.zeros(w - b, dtype=np.int64)))
        offsets = np.arange(w + 1, dtype=np.int64) * width
        j = np.arange(width)[None, :]
        pos = starts[:, None] + j
        real = j < counts[:, None]
        slots = np.where(real, kv_slots(tables, pos, block_size), -1)
        sample = real & (pos >= first[:, None])
        if past == "reset":
            pos = np.where(real, pos, 0)
        ctx = starts + width if context == "query" else pos + 1
        if idle_context is not None:
            ctx[b:] = idle_context
    ids = np.zeros(pos.shape, dtype=np.int64)
    if tokens is not None:
        have = np.fromiter(map(len, tokens), dtype=np.int64, count=b)
        if width is None:
            mask = j < have[item]
        else:
            mask = j < np.concatenate((have, np.zeros(w - b, dtype=np.int64)))[:, None]
        flat = itertools.chain.from_iterable(tokens)
        ids[mask] = np.fromiter(flat, dtype=np.int64, count=int(have.sum()))
    return StepRows(
        ids=ids.reshape(-1),
        positions=pos.reshape(-1),
        slots=slots.reshape(-1),
        context_lens=ctx.reshape(-1),
        offsets=offsets,
        sample_rows=np.flatnonzero(sample & real),
    )


def device_tensor(values: list, device: torch.device, dtype: torch.dtype | None = None):
    """A small per-row parameter tensor on `device`, copied without waiting for the device: a
    plain `torch.tensor(values, device=cuda)` copies from pageable memory, which synchronizes
    the stream, so the host would wait for the queued forward before it could go on (the
    overlap asynchronous scheduling relies on would be lost). From pinned memory the copy is
    queued behind the forward like any kernel."""
    t = torch.tensor(values, dtype=dtype)
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
