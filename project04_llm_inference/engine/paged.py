"""Paged addressing and CUDA-graph capture, written once for every runner and program.

`kv_slots` is the one place the host turns a sequence's positions into cache slots through its
block table; `engine/inputs.py` lays out every model call's rows with it (the device mirror is
`kernels.spec_rounds`' reference and kernel, for programs that form their inputs on the
device). `capture_cuda_graphs` is the one capture loop: the decode graphs, the multi-token
graphs and the fused speculative program all go through it, sharing one memory pool.
"""

from __future__ import annotations

import numpy as np
import torch


def graph_batch_sizes(max_batch: int) -> list[int]:
    sizes = [b for b in (1, 2, 4, 8) if b <= max_batch]
    return sizes + list(range(16, max_batch + 1, 16))


def kv_slots(
    tables: np.ndarray, positions: np.ndarray, block_size: int, rows: np.ndarray | None = None
) -> np.ndarray:
    """Cache slots of `positions` through block tables: the one place the paged address is
    formed on the host. tables (..., max_blocks) int, positions broadcastable against the
    tables' leading dims plus one trailing dim of positions; or, with `rows`, positions and rows
    of one shape: position k through table rows[k] (a packed batch). A position past the table
    reads its last entry (callers mask those)."""
    idx = np.minimum(positions // block_size, tables.shape[-1] - 1)
    if rows is not None:
        blocks = tables[rows, idx].astype(np.int64)
    else:
        blocks = np.take_along_axis(tables, idx, axis=-1).astype(np.int64)
    return blocks * block_size + positions % block_size


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
