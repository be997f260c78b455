"""The engine: requests in, token streams out, one `step()` at a time.

`add_request` / `abort` / `step` are what a server drives. A step is schedule -> execute ->
update: the scheduler picks this step's (sequence, new tokens) items; one execution mode queues
the device work (`engine.execute`: one step, or multi-step decoding; or the speculator's fused
program); `update_from_output` commits what a step computed. Every mode returns one result type
(`StepOutput`), so the token commit, stop checks, prefix-cache registration, frees and counters
are written once, here.

Asynchronous scheduling (`EngineArgs.async_scheduling`, on by default): the step queued now is
not read at once. The next `step()` schedules and queues the step after it first, taking its
input tokens from the device tensor of the step in flight, and only then reads that step's
tokens: the host's scheduling and bookkeeping overlap the device's work instead of leaving it
idle. `step()` then returns the tokens of the step before the one it queued, still one token per
request and step. The schedule counts the tokens in flight (`Sequence.num_pending`) as each
sequence's next positions; a sequence found to have stopped when its tokens are read gets what
the next step computed for it discarded (its K/V land in its own blocks, freed before anyone can
read them, and the device runs steps in order). Steps with speculation read their tokens before
the next is scheduled (the drafts depend on them): the engine then runs synchronously.

Structured output (`engine.structured`): a constrained request's mask for a step is filled from
its grammar matcher, which must have taken the token of the step before. A step that samples
for a constrained request is therefore read before the next is queued: the engine runs
synchronously while a constrained request is decoding (steps without one still overlap). Of the
two correct choices this is the simpler; the other, scheduling a constrained request only every
other step so the overlap goes on for the rest, halves the constrained request's rate and needs
a second kind of schedule. Constrained requests never run multi-step, and are not speculated
(they get no drafts; the others in the batch still do).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..config import DUMMY_SHAPES, EngineArgs, SamplingParams
from ..model.loader import read_config
from ..model.tokenizer import Tokenizer
from .block_manager import BlockManager
from .execute import Launched, launch_multi_step, launch_single_step, multi_step_rooms
from .model_runner import ModelRunner
from .outputs import PrefixView, RequestOutput, StepLog, StepOutput, StepRecord
from .scheduler import Scheduler
from .sequence import Sequence, Status
from .speculator import load_speculator
from .stops import StopChecker
from .structured import Grammars
from .tp_worker import load_model

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass
class _Counters:
    prefill_tokens_computed: int = 0
    decode_tokens: int = 0  # (sequence, decode step) pairs kept
    peak_running_seqs: int = 0
    steps: int = 0
    finished: int = 0
    aborted: int = 0
    spec_proposed: int = 0  # draft tokens verified by the target
    spec_accepted: int = 0  # of those, accepted
    spec_verifications: int = 0  # (sequence, step) pairs that verified drafts


def _merge(first: list[RequestOutput], then: list[RequestOutput]) -> list[RequestOutput]:
    """One output per request: a step that commits the step in flight and then its own
    (one that cannot be overlapped) joins a request's two outputs into one."""
    if not first:
        return then
    by_id = {o.request_id: o for o in first}
    merged = list(first)
    for o in then:
        a = by_id.get(o.request_id)
        if a is None:
            merged.append(o)
            continue
        o.new_token_ids = a.new_token_ids + o.new_token_ids
        if o.new_logprobs is not None:
            o.new_logprobs = (a.new_logprobs or []) + o.new_logprobs
        merged[merged.index(a)] = o
    return merged


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("EngineArgs.device: 'cuda' asked for, but torch sees no CUDA GPU")
    return torch.device(name)


class LLMEngine:
    def __init__(self, args: EngineArgs) -> None:
        self.args = args
        self.device = resolve_device(args.device)
        dtype_name = args.dtype
        if dtype_name == "auto":
            dtype_name = "bfloat16" if self.device.type == "cuda" else "float32"
        self.dtype = _DTYPES[dtype_name]
        if args.model is not None:
            self.hf_config = read_config(args.model)
        else:
            self.hf_config = dict(DUMMY_SHAPES[args.dummy_shape])
        self.max_model_len = min(
            args.max_model_len,
            int(self.hf_config.get("max_position_embeddings", args.max_model_len)),
        )
        self.tokenizer = Tokenizer.from_dir(args.model)
        eos = self.hf_config.get("eos_token_id")
        self.eos_token_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        # one process, or rank 0 of tensor_parallel_size ranks (`engine/tp_worker.py`)
        model = load_model(
            args,
            self.hf_config,
            dtype=self.dtype,
            device=self.device,
            max_positions=self.max_model_len,
        )
        self.vocab_size = model.cfg.vocab_size
        # a draft model's weights are loaded before the KV pool is sized
        self.speculator = load_speculator(
            args,
            device=self.device,
            dtype=self.dtype,
            max_model_len=self.max_model_len,
            vocab_size=self.vocab_size,
        )
        self.runner = ModelRunner(model, args, max_model_len=self.max_model_len)
        extra = self.speculator.bytes_per_block() if self.speculator is not None else 0
        num_blocks = self.runner.profile_num_blocks(extra)
        self.runner.allocate_kv_cache(num_blocks)
        self.block_manager = BlockManager(num_blocks, args.block_size, args.enable_prefix_caching)
        if self.speculator is not None:
            self.speculator.attach(self.runner, self.block_manager, num_blocks)
        self.scheduler = Scheduler(
            self.block_manager,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            enable_chunked_prefill=args.enable_chunked_prefill,
            max_model_len=self.max_model_len,
        )
        self.stops = StopChecker(self.tokenizer, self.eos_token_ids, self.max_model_len)
        # structured output's compiler (xgrammar imported on first use)
        self.grammars = Grammars(self.tokenizer, self.vocab_size, self.eos_token_ids)
        self.requests: dict[str, Sequence] = {}
        self.step_log = StepLog()
        self.counters = _Counters()
        self.generator = torch.Generator(device=self.device).manual_seed(args.seed)
        self._inflight: Launched | None = None  # queued, its tokens not read (async)
        self._last_commit = time.perf_counter()

    @property
    def proposer(self):
        """The speculative proposer (its per-sequence state), or None."""
        return None if self.speculator is None else self.speculator.proposer

    @property
    def fused(self):
        """The fused greedy speculative program, or None."""
        return None if self.speculator is None else self.speculator.fused

    # --- requests ----------------------------------------------------------------------------

    def add_request(
        self, request_id: str, prompt: str | list[int], params: SamplingParams | None = None
    ) -> Sequence:
        params = params or SamplingParams()
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(
                    "prompt: text needs a tokenizer (tokenizer.json in the model folder); give token ids"
                )
            prompt = self.tokenizer.encode(prompt)
        ids = list(prompt)
        if not ids:
            raise ValueError("prompt: empty (at least one token is needed)")
        bad = [t for t in ids if not isinstance(t, int) or not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(
                f"prompt: token ids must be ints in [0, {self.vocab_size}), got {bad[:3]}"
            )
        if len(ids) >= self.max_model_len:
            raise ValueError(
                f"prompt: {len(ids)} tokens leave no room to generate within max_model_len {self.max_model_len}"
            )
        capacity = self.block_manager.num_blocks * self.args.block_size
        if min(len(ids) + params.max_tokens, self.max_model_len) > capacity:
            raise ValueError(
                f"prompt + max_tokens ({len(ids)} + {params.max_tokens}) exceed the whole KV pool "
                f"({capacity} tokens): the request could never finish"
            )
        if params.stop and self.tokenizer is None:
            raise ValueError("stop: stop strings need a tokenizer; use stop_token_ids")
        grammar = None
        if params.structured_outputs is not None:
            grammar = self.grammars.matcher(params.structured_outputs)
        seq = Sequence(request_id, ids, params)
        seq.grammar = grammar
        if params.seed is not None:
            seq.generator = torch.Generator(device=self.device).manual_seed(params.seed)
        self.requests[request_id] = seq
        self.scheduler.add(seq)
        return seq

    def abort(self, request_id: str) -> bool:
        """Stop a request wherever it is (waiting, mid-prefill, decoding, tokens in flight);
        frees its blocks. What a queued step computes for it is discarded when read."""
        seq = self.requests.pop(request_id, None)
        if seq is None:
            return False
        self.scheduler.remove(seq)
        if self.speculator is not None:
            self.speculator.release(seq)
        seq.finish_reason = "abort"
        self.counters.aborted += 1
        return True

    def has_unfinished(self) -> bool:
        if self.scheduler.has_unfinished():
            return True
        if self._inflight is not None:  # queued for sequences that all stopped meanwhile
            launched, self._inflight = self._inflight, None
            self._commit(launched)
        return False

    # --- one step: schedule -> execute -> update ---------------------------------------------

    def step(self) -> list[RequestOutput]:
        t_start = time.perf_counter()  # the step's host work counts from here (step_log)
        proposed = []
        if self.speculator is not None:
            proposed = self.speculator.propose(self.scheduler, self.generator)
        batch = self.scheduler.schedule()
        for seq in batch.preempted:
            if self.speculator is not None:
                self.speculator.release(seq)
        launched = self._execute(batch) if batch else None
        if launched is not None:
            launched.t0 = t_start
        for seq in proposed:  # drafts are verified (or were not scheduled) by now
            seq.spec_token_ids.clear()
        prev, self._inflight = self._inflight, None
        outputs = self._commit(prev) if prev is not None else []
        if launched is not None:
            if self._may_overlap(launched):
                self._inflight = launched  # read by the next step, after it queues its own
            else:
                outputs = _merge(outputs, self._commit(launched))
        elif prev is None and self.scheduler.has_unfinished() and not batch.preempted:
            raise RuntimeError("scheduler made no progress: no request fits the KV pool")
        return outputs

    def _may_overlap(self, launched: Launched) -> bool:
        """Whether the next step may be queued before this one is read: the mode gave its
        tokens on the device, its switch is on, and no speculator needs them on the host."""
        if launched.tokens is None or self.speculator is not None or launched.constrained:
            return False
        return bool(getattr(self.args, launched.overlap_flag))

    def _execute(self, batch) -> Launched:
        """Queue the batch's device work with the mode that runs it; then move the schedule's
        state past it (`_advance`)."""
        running_now = len(self.scheduler.running)
        prev = self._inflight.tokens if self._inflight is not None else None
        out = self.speculator.launch(batch) if self.speculator is not None else None
        if out is not None:
            launched = Launched(lambda: out, None)
        else:
            rooms = []
            if self.speculator is None:
                k = self.args.num_scheduler_steps
                rooms = multi_step_rooms(batch, self.scheduler, k, self.max_model_len)
            if rooms:
                launched = launch_multi_step(self.runner, batch, rooms, prev)
            else:
                launched = launch_single_step(
                    self.runner, batch, prev, self.generator, self.speculator
                )
        launched.running_now = running_now
        self._advance(batch, launched)
        return launched

    @staticmethod
    def _advance(batch, launched: Launched) -> None:
        """Count what was queued: each item's known (or pending) positions are computed now;
        one that reaches its last one samples `assumed` tokens (1, or a multi-step run's
        room), pending until read, whose positions but the newest get K/V in the same work.
        Drafts are not counted: what verification keeps is counted when it is read."""
        for seq, n in batch.items:
            left = seq.num_uncomputed
            seq.num_computed_tokens += min(n, left)
            if n >= left:
                assumed = launched.assumed.get(id(seq), 1)
                seq.num_computed_tokens += assumed - 1
                seq.num_pending += assumed

    def _commit(self, launched: Launched) -> list[RequestOutput]:
        return self.update_from_output(launched.read(), launched)

    def update_from_output(
        self, out: StepOutput, launched: Launched | None = None
    ) -> list[RequestOutput]:
        """The one place tokens are committed. Per sequence: its chunks in order, token by
        token, until a stop condition holds (the rest, and later chunks, are dropped); a
        sequence that had stopped or was aborted before this was read keeps nothing. The
        computed length then covers every kept token but the newest (accepted drafts, the
        steps of a run), beyond the `assumed` ones the schedule counted; full blocks of kept
        tokens enter the prefix cache; finished sequences are freed."""
        c, now = self.counters, time.monotonic()
        outputs, decode, drafts = [], 0, 0
        for r in out.results:
            seq = r.seq
            seq.num_pending -= r.assumed
            if seq.finish_reason is not None:
                continue  # stopped at an earlier token, or aborted, while this was queued
            emitted: list[int] = []
            new_lps: list[float] = []
            for chunk in r.chunks:
                if seq.finish_reason is not None:
                    break
                r.kept_chunks += 1
                decode += r.decoding
                if chunk.num_drafts:
                    drafts += chunk.num_drafts
                    c.spec_verifications += 1
                    c.spec_proposed += chunk.num_drafts
                    c.spec_accepted += chunk.num_accepted
                for j, tok in enumerate(chunk.tokens):
                    seq.output_token_ids.append(tok)
                    if seq.grammar is not None:
                        seq.grammar.accept(tok)
                    if chunk.logprobs is not None:
                        seq.output_logprobs.append(chunk.logprobs[j])
                        new_lps.append(chunk.logprobs[j])
                    emitted.append(tok)
                    self.stops.check(seq)
                    if seq.finish_reason is not None:
                        break
            r.kept_tokens = len(emitted)
            if seq.status is Status.RUNNING:
                seq.num_computed_tokens += max(len(emitted) - r.assumed, 0)
                self._register(seq)
            outputs.append(self._settle(seq, emitted, new_lps, now))
        if out.on_commit is not None:
            out.on_commit(out)
        n_decoding = sum(r.decoding for r in out.results)
        c.prefill_tokens_computed += out.prefill_tokens
        c.decode_tokens += decode
        c.steps += out.num_steps
        t = time.perf_counter()
        if launched is not None:
            c.peak_running_seqs = max(c.peak_running_seqs, launched.running_now)
        # host wall time this step added: from its step's start (schedule, launch, wait, commit),
        # or from the last commit when it was queued before that (overlapped steps: the period)
        t0 = launched.t0 if launched is not None else t
        duration = t - max(t0, self._last_commit)
        self._last_commit = t
        self.step_log.append(
            StepRecord(out.prefill_tokens, n_decoding, duration, drafts, out.num_steps)
        )
        return outputs

    def _register(self, seq: Sequence) -> None:
        """Full blocks whose tokens are all kept enter the prefix cache (positions computed
        ahead for tokens still in flight wait until those are read)."""
        ahead = seq.num_computed_tokens - seq.num_tokens
        if ahead > 0:
            seq.num_computed_tokens -= ahead
        self.block_manager.register_computed(seq)
        if ahead > 0:
            seq.num_computed_tokens += ahead

    def _settle(self, seq: Sequence, emitted: list[int], lps: list[float], now: float):
        """After a step appended `emitted` to `seq`: its first-token time, its end if it
        finished, and its output."""
        if seq.first_token_time is None:
            seq.first_token_time = now
        finished = seq.finish_reason is not None
        if finished:
            self.scheduler.remove(seq)
            if self.speculator is not None:
                self.speculator.release(seq)
            self.requests.pop(seq.request_id, None)
            self.counters.finished += 1
        want_lp = seq.params.logprobs
        lp_all = seq.output_logprobs
        return RequestOutput(
            request_id=seq.request_id,
            prompt_token_ids=seq.prompt_token_ids,
            # a copy once finished; while running, the live list (copying it every step would
            # cost O(length) per request per step)
            token_ids=list(seq.output_token_ids) if finished else seq.output_token_ids,
            new_token_ids=emitted,
            finished=finished,
            finish_reason=seq.finish_reason,
            text=seq.output_text,  # set when it finishes (`StopChecker`)
            logprobs=(list(lp_all) if finished else PrefixView(lp_all, len(lp_all)))
            if want_lp
            else None,
            num_cached_tokens=seq.num_cached_prompt_tokens,
            new_logprobs=lps if want_lp else None,
        )

    def stats(self) -> dict:
        bm, c = self.block_manager, self.counters
        return dict(
            num_kv_blocks=bm.num_blocks,
            block_size=bm.block_size,
            kv_cache_usage=bm.usage(),
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            peak_running_seqs=c.peak_running_seqs,
            num_preemptions=self.scheduler.num_preemptions,
            prefix_cache_queries=bm.prefix_queries,
            prefix_cache_hits=bm.prefix_hits,
            prefill_tokens_computed=c.prefill_tokens_computed,
            decode_tokens=c.decode_tokens,
            steps=c.steps,
            finished=c.finished,
            aborted=c.aborted,
            cuda_graph_sizes=sorted(self.runner.graphs),
            spec_proposed_tokens=c.spec_proposed,
            spec_accepted_tokens=c.spec_accepted,
            spec_verifications=c.spec_verifications,
            # accepted drafts per verification (each also emits one more token)
            spec_mean_accepted_len=c.spec_accepted / max(c.spec_verifications, 1),
            spec_acceptance_rate=c.spec_accepted / max(c.spec_proposed, 1),
        )
