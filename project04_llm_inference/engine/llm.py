"""Offline batches: `LLM(model_dir).generate(prompts, SamplingParams(...))`."""

from __future__ import annotations

from ..config import EngineArgs, SamplingParams
from .llm_engine import LLMEngine, RequestOutput


class LLM:
    """An engine run to completion over a list of prompts.

    `LLM("path/to/model")`, `LLM(EngineArgs(...))` or `LLM(load_format="dummy", ...)`."""

    def __init__(self, model: str | EngineArgs | None = None, **kwargs) -> None:
        if isinstance(model, EngineArgs):
            if kwargs:
                raise TypeError("give EngineArgs or keyword arguments, not both")
            args = model
        else:
            args = EngineArgs(model=model, **kwargs)
        self.engine = LLMEngine(args)
        self._next_id = 0

    @property
    def hf_config(self) -> dict:
        return self.engine.hf_config

    def generate(
        self,
        prompts: list[str] | list[list[int]] | str,
        params: SamplingParams | list[SamplingParams] | None = None,
        *,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Generate for every prompt (text or token ids); outputs in the prompts' order.

        Whatever ends the call early (a prompt the engine refuses, an error in a step,
        Ctrl-C) aborts the requests it added, so the engine holds none of them afterwards."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        if not isinstance(prompts, (list, tuple)):
            raise TypeError(
                "prompts must be a string, a list of token ids, or a list of either, got "
                f"{type(prompts).__name__}"
            )
        if isinstance(params, list):
            if len(params) != len(prompts):
                raise ValueError(f"params: {len(params)} given for {len(prompts)} prompts")
        else:
            params = [params or SamplingParams()] * len(prompts)
        for p in params:
            if not isinstance(p, SamplingParams):
                raise TypeError(f"params must be SamplingParams, got {type(p).__name__}")
        ids: list[str] = []
        try:
            return self._run(prompts, params, ids, use_tqdm)
        finally:
            for rid in ids:  # no-op for the requests that finished
                self.engine.abort(rid)

    def _run(self, prompts, params, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        for prompt, p in zip(prompts, params):
            rid = str(self._next_id)
            self._next_id += 1
            self.engine.add_request(rid, prompt, p)
            ids.append(rid)
        wanted = set(ids)
        done: dict[str, RequestOutput] = {}
        progress = None
        if use_tqdm:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            progress = Progress(
                TextColumn("generate"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                transient=True,
            )
            task = progress.add_task("generate", total=len(ids))
            progress.start()
        try:
            while self.engine.has_unfinished():
                for out in self.engine.step():
                    if out.finished and out.request_id in wanted:
                        done[out.request_id] = out
                        if progress is not None:
                            progress.advance(task)
        finally:
            if progress is not None:
                progress.stop()
        return [done[r] for r in ids]
