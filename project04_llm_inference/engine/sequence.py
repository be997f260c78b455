"""A request's state as the engine sees it: tokens, how many have their K/V cached, its blocks."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from ..config import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival: float = field(default_factory=time.monotonic)
    output_token_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    status: Status = Status.WAITING
    num_computed_tokens: int = 0  # positions whose K/V are in the cache or queued to be
    # tokens sampled by work queued on the device whose values the host has not read yet
    # (asynchronous scheduling): they count as the sequence's next positions, so the next step
    # can be scheduled and queued behind them
    num_pending: int = 0
    block_ids: list[int] = field(default_factory=list)
    num_hashed_blocks: int = 0  # leading full blocks registered in the prefix cache
    block_hashes: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    output_text: str = ""
    num_cached_prompt_tokens: int = 0  # prompt tokens served from the prefix cache
    num_preemptions: int = 0
    first_token_time: float | None = None
    generator: torch.Generator | None = None  # per-request seed: the same tokens every time
    # speculative decoding: this step's draft tokens, scheduled after the last sampled token
    # (they are not part of the sequence until the verifier accepts them)
    spec_token_ids: list[int] = field(default_factory=list)
    # incremental detokenization for stop strings (`engine.stops`), created on first use
    text_tail: object | None = field(default=None, repr=False)
    # structured output: the grammar matcher of the committed tokens (`engine.structured`)
    grammar: object | None = field(default=None, repr=False)

    _all: list[int] = field(default_factory=list, repr=False)

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt + outputs, kept as one list extended as outputs are appended (outputs only
        grow), so a step costs O(new tokens), not O(sequence length). Do not modify it."""
        n_prompt = len(self.prompt_token_ids)
        if not self._all:
            self._all = list(self.prompt_token_ids)
        have = len(self._all) - n_prompt
        if have < len(self.output_token_ids):
            self._all.extend(self.output_token_ids[have:])
        return self._all

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed(self) -> int:
        """Positions, known or pending, whose K/V are not computed yet: what a step may
        schedule (1 for a decoding sequence, whether its last token is known or pending)."""
        return self.num_tokens + self.num_pending - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED
