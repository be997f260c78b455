"""Prompt-lookup proposals (n-gram speculation): no second model, only the sequence itself.

The sequence's last n tokens (n from `max_n` down to `min_n`, the longest that matches wins) are
looked for earlier in its tokens; the tokens that followed the most recent earlier occurrence are
proposed. The copy may run into the suffix itself (a repeating pattern shorter than k): then it
continues the pattern, as an overlapping copy does. No match: no proposal, and the sequence
decodes normally. The proposal is a point mass, so the verifier uses q = one-hot.

Cost, per sequence and step on the host: one comparison of the sequence with its last token
(the candidates), then at most max_n - 1 comparisons over the candidates only; a handful of
numpy calls whatever the length, since this runs before every speculative step.
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
    top = min(max_n, length - 1)
    if top < max(min_n, 1):
        return []
    # an earlier n-gram equal to the suffix ends at e <= length - 2 with arr[e] == arr[-1]
    ends = np.flatnonzero(arr[: length - 1] == arr[-1])
    if ends.size == 0:
        return []
    matched = np.ones(ends.size, dtype=np.int64)  # how many tokens back each one matches
    for m in range(1, top):
        back = ends - m
        ok = (matched == m) & (back >= 0)
        ok[ok] = arr[back[ok]] == arr[length - 1 - m]
        matched += ok
    n = int(matched.max())
    if n < min_n:
        return []
    start = int(ends[matched >= n].max()) + 1  # the most recent occurrence's continuation
    # past the end the copy runs into what it copies: period length - start
    return arr[start + np.arange(k) % (length - start)].tolist()


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
