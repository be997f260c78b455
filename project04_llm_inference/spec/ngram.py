"""Prompt-lookup proposals (n-gram speculation): no second model, only the sequence itself.

The sequence's last n tokens (n from `max_n` down to `min_n`, the longest that matches wins) are
looked for earlier in its tokens; the tokens that followed the most recent earlier occurrence are
proposed. The copy may run into the suffix itself (a repeating pattern shorter than k): then it
continues the pattern, as an overlapping copy does. No match: no proposal, and the sequence
decodes normally. The proposal is a point mass, so the verifier uses q = one-hot.

Cost: a vectorised scan of the sequence per n, O(length) per sequence per step on the host.
"""

from __future__ import annotations

import numpy as np


def propose(tokens: list[int] | np.ndarray, k: int, min_n: int, max_n: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the longest suffix n-gram
    (min_n <= n <= max_n) of `tokens`; [] when none occurs earlier."""
    if k < 1:
        return []
    arr = np.asarray(tokens, dtype=np.int64)
    length = len(arr)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = arr[length - n :]
        # candidate starts 0 .. length - n - 1 (the suffix's own position excluded)
        windows = np.lib.stride_tricks.sliding_window_view(arr[: length - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n  # the most recent occurrence's continuation
            ext = arr.tolist()
            for j in range(k):
                ext.append(ext[start + j])  # start + j < len(ext) always: an overlapping copy
            return ext[length:]
    return []


class NgramProposer:
    """`propose` for the engine: point-mass drafts from each sequence's own tokens."""

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n

    def propose(self, seqs, ks: list[int], generator=None) -> tuple[list[list[int]], None]:
        drafts = [propose(s.all_token_ids, k, self.min_n, self.max_n) for s, k in zip(seqs, ks)]
        return drafts, None  # q = None: one-hot at each draft

    def release(self, seq) -> None:  # no per-sequence state
        pass

    def retain(self, running) -> None:
        pass

    def live(self) -> list:
        return []
