"""Speculative decoding behind the engine's `Speculator` interface (`engine/speculator.py`).

Each step, before scheduling, `propose` gives every decoding sequence with room for them up to
k draft tokens (`Sequence.spec_token_ids`); the scheduler keeps a prefix of them (or none), and
the engine's default step runs the last token and the drafts in one target forward and calls
`verify` with the logits rows: the acceptance rule (`spec.rejection`) keeps a prefix of the
drafts and adds one token. With a draft model and the fused greedy program
(`EngineArgs.spec_fused_greedy`), `propose` may instead plan a step the program runs whole
(`launch`): it then returns that step's `StepOutput` itself, one chunk per verification round.

Both hand back chunks (the accepted drafts and the token after them), which the engine commits
like any other step's tokens: a stop inside a chunk cuts it, a later chunk (round) is dropped,
and the sequence's computed length counts only the kept tokens' K/V, so the K/V of rejected
drafts lie past it and are overwritten, and only blocks of kept tokens reach the prefix cache.
Speculation reads every step's tokens before the next is scheduled: the engine runs it without
asynchronous scheduling. A request with structured output is not speculated (its drafts would
have to be checked against its grammar): it gets no drafts (`room` 0) and is sampled under its
grammar's mask by the default step, beside the others' verifications; a batch holding one does
not run the fused program.
"""

from __future__ import annotations

from ..engine.outputs import Chunk, SeqResult, StepOutput
from ..engine.sequence import Sequence
from .draft import DraftProposer
from .fused import PENDING, FusedGreedySpec, FusedItem
from .ngram import NgramProposer
from .verifier import SpecGroup, verify_groups

# Speculative steps of up to this many sequences replay CUDA graphs (each graph holds logits for
# batch x (k + 1) rows: speculation pays at small batches, and the logits stay small)
SPEC_GRAPH_MAX_BATCH = 32


def build(args, *, device, dtype, max_model_len: int, vocab_size: int):
    """The speculator of `args.speculative_method` ('ngram' or 'draft')."""
    if args.speculative_method == "ngram":
        proposer = NgramProposer(args.ngram_prompt_lookup_min, args.ngram_prompt_lookup_max)
        return ProposerSpeculator(args, proposer, max_model_len)
    proposer = DraftProposer(
        args, device=device, dtype=dtype, max_model_len=max_model_len, vocab_size=vocab_size
    )
    return DraftSpeculator(args, proposer, max_model_len)


class ProposerSpeculator:
    """Drafts from a proposer, verified by the engine's default step."""

    fused: FusedGreedySpec | None = None

    def __init__(self, args, proposer, max_model_len: int) -> None:
        self.args, self.proposer = args, proposer
        self.k = args.num_speculative_tokens
        self.max_model_len = max_model_len
        self._q = None  # the draft model's q of this step's proposals
        self._q_rows: dict[int, int] = {}  # id(sequence) -> its row in _q

    def bytes_per_block(self) -> int:
        return 0

    def attach(self, runner, block_manager, num_blocks: int) -> None:
        self.runner, self.block_manager = runner, block_manager
        if runner.graphs:  # verification in CUDA graphs: the last token and up to k drafts
            runner.enable_multi_token(self.k + 1, min(SPEC_GRAPH_MAX_BATCH, self.args.max_num_seqs))

    def release(self, seq: Sequence) -> None:
        self.proposer.release(seq)

    def room(self, s: Sequence) -> int:
        """Drafts a decoding sequence may get: no more than could be emitted (max_tokens and
        max_model_len bound the run); none for a request with structured output."""
        if s.grammar is not None:
            return 0
        return min(
            self.k,
            self.max_model_len - s.num_tokens,
            s.params.max_tokens - len(s.output_token_ids) - 1,
        )

    def propose(self, scheduler, generator) -> list[Sequence]:
        seqs, ks = [], []
        for s in scheduler.running:
            if s.num_uncomputed != 1:
                continue  # not decoding (a prompt in progress)
            room = self.room(s)
            if room >= 1:
                seqs.append(s)
                ks.append(room)
        self.proposer.retain(scheduler.running)
        self._q, self._q_rows = None, {}
        if not seqs:
            return []
        drafts, q = self.proposer.propose(seqs, ks, generator)
        proposed = []
        for i, (s, d) in enumerate(zip(seqs, drafts)):
            if d:
                s.spec_token_ids = list(d)
                self._q_rows[id(s)] = i
                proposed.append(s)
        self._q = q
        return proposed

    def launch(self, batch) -> StepOutput | None:
        return None

    def verify(self, logits, groups: list[tuple[Sequence, int]], generator) -> list[Chunk]:
        spec = [SpecGroup(s, row, self._q_rows.get(id(s))) for s, row in groups]
        verified, logprobs = verify_groups(logits, spec, self._q, generator, self.k)
        return [
            Chunk(
                verified.tokens[i],
                logprobs[i] if logprobs is not None and g.seq.params.logprobs else None,
                num_drafts=len(g.seq.spec_token_ids),
                num_accepted=verified.num_accepted[i],
            )
            for i, g in enumerate(spec)
        ]


class DraftSpeculator(ProposerSpeculator):
    """A draft model's proposals; all-greedy steps as the fused program (`spec.fused`)."""

    def __init__(self, args, proposer: DraftProposer, max_model_len: int) -> None:
        super().__init__(args, proposer, max_model_len)
        self._plan: dict[int, tuple] | None = None

    def bytes_per_block(self) -> int:
        return self.proposer.bytes_per_block()

    def attach(self, runner, block_manager, num_blocks: int) -> None:
        super().attach(runner, block_manager, num_blocks)
        self.proposer.allocate(num_blocks, self.args.block_size)
        if self.args.fused_greedy:
            self.fused = FusedGreedySpec(
                runner,
                self.proposer.runner,
                self.k,
                min(SPEC_GRAPH_MAX_BATCH, self.args.max_num_seqs),
                capture=runner.device.type == "cuda" and not self.args.enforce_eager,
                rounds=self.args.fused_rounds,
            )

    def propose(self, scheduler, generator) -> list[Sequence]:
        self._plan = self._plan_fused(scheduler) if self.fused is not None else None
        if self._plan is not None:
            return [s for s in scheduler.running if s.spec_token_ids]
        return super().propose(scheduler, generator)

    def _plan_fused(self, scheduler) -> dict[int, tuple] | None:
        """A fused step's plan, before scheduling: id(sequence) -> (DraftSeq, catch-up, k) for
        every running sequence that proposes (its `spec_token_ids` are k placeholders for the
        scheduler to count), or None: this step runs the default way. Fused needs a batch that
        can only hold these sequences' decodes: nobody waiting (no admission), every running
        sequence decoding greedily without logprobs within the padded positions."""
        fused, running = self.fused, scheduler.running
        if scheduler.waiting or not running or len(running) > fused.max_batch:
            return None
        for s in running:
            p = s.params
            if not p.greedy or p.logprobs or s.num_uncomputed != 1 or not fused.target_fits(s):
                return None
            if s.grammar is not None:
                return None
        self.proposer.retain(running)
        self._q, self._q_rows = None, {}
        ks = [self.room(s) for s in running]
        plan = self.proposer.plan_fused(running, ks, fused.draft_fits)
        if plan is None:
            return None
        out = {}
        for s, entry in zip(running, plan):
            if entry is not None:
                s.spec_token_ids = [PENDING] * entry[2]
                out[id(s)] = entry
        return out

    def launch(self, batch) -> StepOutput | None:
        plan, self._plan = self._plan, None
        if plan is None:
            return None
        items = []
        for seq, n in batch.items:
            entry = plan.get(id(seq))
            # the scheduler keeps a prefix of the drafts (or none): those are verified
            items.append(FusedItem(seq, n - 1, *entry) if entry else FusedItem(seq, n - 1))
        if self._hold_rounds(items):
            return self._launch_rounds(items)
        results = []
        for it, row in zip(items, self.fused.run(items).tolist()):
            n_acc, final, drafts = row[0], row[1], row[2:]
            if it.draft is not None:
                self.proposer.finish_fused(it.draft, drafts[: it.k])
            chunk = Chunk(drafts[:n_acc] + [final], None, it.n_drafts, n_acc if it.n_drafts else 0)
            results.append(SeqResult(it.seq, [chunk]))
        return StepOutput(results)

    def _hold_rounds(self, items: list[FusedItem]) -> bool:
        """Whether this fused step runs `spec_fused_rounds` rounds: the items qualify
        (`FusedGreedySpec.can_run_rounds`) and both pools give every sequence the blocks for
        them (blocks taken for a step that then runs one round stay with their sequence)."""
        fused = self.fused
        if not fused.can_run_rounds(items):
            return False
        ahead = fused.rounds_tokens()
        draft_bm = self.proposer.block_manager
        for it in items:
            seq, d = it.seq, it.draft
            if not self.block_manager.allocate(seq, ahead):
                return False
            if not draft_bm.allocate(d, seq.num_computed_tokens + ahead - d.num_computed_tokens):
                return False
        return True

    def _launch_rounds(self, items: list[FusedItem]) -> StepOutput:
        """A program of `spec_fused_rounds` rounds: one chunk per round; once the engine has
        kept the rounds up to a stop, the draft's state follows those rounds (`on_commit`)."""
        res = self.fused.run_rounds(items)  # (rounds, len(items), 2 + k)
        k = self.fused.k
        results = []
        for i, it in enumerate(items):
            chunks = []
            for r in range(res.shape[0]):
                n_acc, final = int(res[r, i, 0]), int(res[r, i, 1])
                drafts = res[r, i, 2:].tolist()
                chunks.append(Chunk(drafts[:n_acc] + [final], None, k, n_acc))
            results.append(SeqResult(it.seq, chunks))

        def follow_kept_rounds(out: StepOutput) -> None:
            for it, r in zip(items, out.results):
                cd, dn = it.draft.num_computed_tokens, it.catch_up
                for chunk in r.chunks[: r.kept_chunks]:
                    # the draft keeps min(n_acc, k - 1) drafts' K/V and catches up on the rest
                    a = chunk.num_accepted
                    cd, dn = cd + dn + min(a, k - 1), 1 + (a == k)
                emitted = it.seq.output_token_ids[len(it.seq.output_token_ids) - r.kept_tokens :]
                self.proposer.finish_rounds(it.draft, emitted, cd)

        return StepOutput(results, num_steps=res.shape[0], on_commit=follow_kept_rounds)
