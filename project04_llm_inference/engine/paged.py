"""Paged addressing and CUDA-graph capture, written once for every runner and program.

`kv_slots` is the one place the host turns a sequence's positions into cache slots through its
block table (the device mirror is `kernels.spec_rounds`' reference and kernel, for programs that
form their inputs on the device). `capture_cuda_graphs` is the one capture loop: the decode
graphs, the multi-token graphs and the fused speculative program all go through it, sharing one
memory pool.
"""

from __future__ import annotations

import numpy as np
import torch


def graph_batch_sizes(max_batch: int) -> list[int]:
    sizes = [b for b in (1, 2, 4, 8) if b <= max_batch]
    return sizes + list(range(16, max_batch + 1, 16))


def kv_slots(tables: np.ndarray, positions: np.ndarray, block_size: int) -> np.ndarray:
    """Cache slots of `positions` through block tables: the one place the paged address is
    formed on the host. tables (..., max_blocks) int, positions broadcastable against the
    tables' leading dims plus one trailing dim of positions; a position past the table reads
    its last entry (callers mask those)."""
    idx = np.minimum(positions // block_size, tables.shape[-1] - 1)
    blocks = np.take_along_axis(tables, idx, axis=-1).astype(np.int64)
    return blocks * block_size + positions % block_size


def padded_rows(
    table: np.ndarray, start: int, n: int, width: int, block_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """One sequence's next `width` input rows from position `start`, the first n real:
    (positions (width,), cache slots (width,), -1 past the real rows: padding writes nothing).
    The packed, padded multi-token and fused builders all lay out rows this way."""
    pos = start + np.arange(width)
    slots = np.full(width, -1, dtype=np.int64)
    slots[:n] = kv_slots(table, pos[:n], block_size)
    return pos, slots


def capture_cuda_graphs(sizes: list[int], setup, pool=None):
    """Capture one CUDA graph per batch width, largest first so the smaller ones reuse its
    memory pool. setup(w) prepares width w's static buffers and returns the function to
    capture (device work only, returning its output tensor). Each is run twice outside the
    graph first, so lazy initialisation stays out of it. Returns ({w: graph}, {w: output},
    the pool)."""
    graphs, outputs = {}, {}
    with torch.inference_mode():
        for w in sorted(sizes, reverse=True):
            fn = setup(w)
            for _ in range(2):
                fn()
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                outputs[w] = fn()
            pool = g.pool()
            graphs[w] = g
    torch.cuda.synchronize()
    return graphs, outputs, pool
