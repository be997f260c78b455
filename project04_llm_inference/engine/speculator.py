"""The one interface between the engine and speculative decoding.

The engine knows speculation only through a `Speculator`: it is asked for drafts before each
step is scheduled (`propose`: draft tokens go into `Sequence.spec_token_ids`, which the scheduler
counts), may run a whole step itself (`launch`: the fused draft-and-verify program), verifies
the drafts the default step scheduled (`verify`, from the target's logits) and forgets a
sequence that finished, was aborted or preempted (`release`). Every one of them hands back
`Chunk`s / a `StepOutput`, which the engine commits like any other step.

`spec/` implements it and imports `engine/`; `engine/` never imports `spec/` by name:
`load_speculator` finds the implementation of `EngineArgs.speculative_method` through
`spec.speculator.build`, looked up once when the engine is built.
"""

from __future__ import annotations

import importlib
from typing import Protocol

import torch

from .outputs import Chunk, StepOutput
from .sequence import Sequence

SPEC_PACKAGE = "spec.speculator"  # relative to the project's package


class Speculator(Protocol):
    proposer: object  # the proposer's own state (benchmarks and tests read it)
    fused: object | None  # the fused greedy program, when enabled

    def bytes_per_block(self) -> int:
        """What each KV block costs beyond the target's (a draft model's cache)."""

    def attach(self, runner, block_manager, num_blocks: int) -> None:
        """Called once the target's runner and KV pool exist."""

    def propose(self, scheduler, generator: torch.Generator | None) -> list[Sequence]:
        """Before scheduling: drafts for the running sequences; returns those that got some."""

    def launch(self, batch) -> StepOutput | None:
        """Run the scheduled step whole (synchronously), or None: the default step runs it."""

    def verify(self, logits: torch.Tensor, groups: list[tuple[Sequence, int]], generator):
        """One Chunk per (sequence, first logits row) whose drafts the default step ran."""

    def release(self, seq: Sequence) -> None:
        """Forget seq (finished, aborted or preempted)."""


def load_speculator(args, **kwargs) -> Speculator | None:
    """The speculator of `args.speculative_method` ('none': None)."""
    if args.speculative_method == "none":
        return None
    root = __package__.rsplit(".", 1)[0]
    return importlib.import_module(f"{root}.{SPEC_PACKAGE}").build(args, **kwargs)


__all__ = ["Chunk", "Speculator", "StepOutput", "load_speculator"]
