"""A deterministic synthetic token stream with learnable structure, sharded by rank.

Each sequence is a walk on a fixed random graph: every token has `branching` possible
successors, taken with skewed probabilities. A model can learn the table, so the loss falls
from ln(vocab) towards the walk's entropy (about 0.9 nats with the defaults): loss curves mean
something, and no data set needs downloading.

Determinism: sample `g` of the stream (g = step * global_batch + j) is drawn from a generator
seeded by (seed, g) alone. So the global batch is the same for any world size, each rank takes
its contiguous slice, and resuming from `state_dict()` continues with exactly the batches an
uninterrupted run would have seen.
"""

from __future__ import annotations

import math

import numpy as np
import torch

# Probabilities of a token's 1st..4th successor.
_SUCCESSOR_PROBS = np.array([0.7, 0.15, 0.1, 0.05])


class SyntheticTokens:
    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        global_batch: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in a world of size {world_size}")
        if global_batch < 1 or global_batch % world_size:
            raise ValueError(
                f"global_batch ({global_batch}) must be a positive multiple of the world size "
                f"({world_size}) so that every rank gets the same number of sequences"
            )
        self.vocab_size, self.seq_len, self.global_batch = vocab_size, seq_len, global_batch
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.local_batch = global_batch // world_size
        self.step = 0
        table_rng = np.random.default_rng([seed, 0x5EED])
        k = len(_SUCCESSOR_PROBS)
        self._successors = table_rng.integers(0, vocab_size, size=(vocab_size, k))
        self._cdf = np.cumsum(_SUCCESSOR_PROBS)

    @property
    def entropy(self) -> float:
        """Entropy of the next token given the previous one, in nats: the loss floor."""
        p = _SUCCESSOR_PROBS
        return float(-(p * np.log(p)).sum())

    @property
    def uniform_loss(self) -> float:
        return math.log(self.vocab_size)

    def _draws(self, g: int) -> tuple[int, np.ndarray]:
        """Sequence g's random draws: its first token and its successor choices (seq_len,)."""
        rng = np.random.default_rng([self.seed, g])
        u = rng.random(self.seq_len)
        first = int(rng.integers(0, self.vocab_size))
        choice = np.searchsorted(self._cdf, u, side="right").clip(max=len(self._cdf) - 1)
        return first, choice

    def batch_at(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's (inputs, targets) of global step `step`, each (local_batch, seq_len)."""
        first = step * self.global_batch + self.rank * self.local_batch
        draws = [self._draws(first + j) for j in range(self.local_batch)]
        seqs = np.empty((self.local_batch, self.seq_len + 1), dtype=np.int64)
        seqs[:, 0] = [d[0] for d in draws]
        choice = np.stack([d[1] for d in draws])  # (local_batch, seq_len)
        # The walk is sequential in t but vectorised over the batch.
        for t in range(self.seq_len):
            seqs[:, t + 1] = self._successors[seqs[:, t], choice[:, t]]
        out = torch.from_numpy(seqs)
        return out[:, :-1].contiguous(), out[:, 1:].contiguous()

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        batch = self.batch_at(self.step)
        self.step += 1
        return batch

    def __iter__(self):
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict:
        return {
            "step": self.step,
            "seed": self.seed,
            "vocab_size": self.vocab_size,
            "seq_len": self.seq_len,
            "global_batch": self.global_batch,
        }

    def load_state_dict(self, state: dict) -> None:
        for key in ("seed", "vocab_size", "seq_len", "global_batch"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(
                    f"data state has {key}={state[key]} but this stream has "
                    f"{key}={getattr(self, key)}: it belongs to another run configuration"
                )
        self.step = int(state["step"])
