"""Draft-model speculation: a small model with the target's vocabulary proposes k tokens.

The draft runs on the engine's own machinery: a second `ModelRunner` (its own paged KV cache of
as many blocks as the target's, CUDA graphs for its one-token steps when the target has them)
and a second `BlockManager` without prefix caching. Each request the draft works for has a
`DraftSeq`: the draft's copy of the request's tokens, its blocks and how many of its positions
have K/V in the draft cache.

One proposal round, for the decoding sequences of an engine step:
1. sync: the draft's tokens are the target's tokens at the last round plus the draft's own
   proposals. They are cut back to the longest common prefix with the target's tokens now
   (the accepted drafts survive, the first rejected one and everything after it go) and the
   target's newer tokens are appended; the draft's computed length is rolled back to that prefix
   (the K/V past it are overwritten later, as the target's are).
2. one forward over every sequence's uncomputed tokens (a whole prompt the first time, then
   usually 1 or 2 tokens): q_1 at the last position, x_1 drawn from it;
3. k - 1 one-token steps: x_i goes in, q_{i+1} comes out, x_{i+1} is drawn. When every
   sequence is greedy these run back to back on the device (`ModelRunner.run_multi`), with
   one read-back for all of them.
Tokens are drawn from q after the request's temperature / top-k / top-p / min-p (argmax when
greedy), with the request's own generator when it has a seed; q is returned for the verifier.

A sequence gets no proposal (it decodes normally) when its draft blocks do not fit or it would
pass the draft's longest position. The draft's blocks are released when the request finishes,
is aborted or is preempted (the engine calls `release`), and at each round for sequences that no
longer run (`retain`), so the draft pool never holds more than the running batch needs.
The first catch-up forward of a sequence is one unchunked prefill of its whole prompt: cheap for
a draft a tenth of the target's size, but it does not count against the step's token budget.
"""

from __future__ import annotations

import torch

from ..config import EngineArgs
from ..engine.block_manager import BlockManager
from ..engine.model_runner import ModelRunner
from ..engine.sampler import argmax_rows, exponential_noise, race, request_probs
from ..engine.sequence import Sequence
from ..model.loader import build_model, read_config


class DraftSeq:
    """The draft model's view of one request (what `ModelRunner` and `BlockManager` read)."""

    def __init__(self, owner: Sequence) -> None:
        self.owner = owner
        self.tokens: list[int] = []
        self.synced = 0  # how many of `tokens` were the target's at the last round
        self.num_computed_tokens = 0
        self.num_pending = 0  # (the draft's tokens are always read before its next step)
        self.block_ids: list[int] = []
        self.block_hashes: list[int] = []  # (unused: no prefix caching in the draft pool)
        self.num_hashed_blocks = 0

    @property
    def all_token_ids(self) -> list[int]:
        return self.tokens

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def num_uncomputed(self) -> int:
        return len(self.tokens) - self.num_computed_tokens

    def sync(self, target: list[int]) -> None:
        """Roll back to the longest common prefix with `target`, then append the rest of it."""
        common = min(self.synced, len(self.tokens))
        end = min(len(self.tokens), len(target))
        while common < end and self.tokens[common] == target[common]:
            common += 1
        del self.tokens[common:]
        self.tokens.extend(target[common:])
        self.synced = len(target)
        # K/V past the common prefix belong to rejected drafts; at least one token goes in
        self.num_computed_tokens = min(self.num_computed_tokens, common, len(target) - 1)


class DraftProposer:
    def __init__(
        self,
        args: EngineArgs,
        *,
        device: torch.device,
        dtype: torch.dtype,
        max_model_len: int,
        vocab_size: int,
    ) -> None:
        cfg = read_config(args.speculative_model)
        self.max_len = min(max_model_len, int(cfg.get("max_position_embeddings", max_model_len)))
        model = build_model(
            cfg,
            model_dir=args.speculative_model,
            dtype=dtype,
            device=device,
            max_positions=self.max_len,
            seed=args.seed,
        )
        if model.cfg.vocab_size != vocab_size:
            raise ValueError(
                f"EngineArgs.speculative_model: the draft's vocabulary has {model.cfg.vocab_size} "
                f"tokens, the target's {vocab_size}; they must share one tokenizer"
            )
        self.device = device
        self.vocab_size = vocab_size
        self.k = args.num_speculative_tokens
        self.runner = ModelRunner(model, args, max_model_len=self.max_len)
        self.block_manager: BlockManager | None = None
        self.seqs: dict[int, DraftSeq] = {}  # id(target sequence) -> its draft state

    def bytes_per_block(self) -> int:
        return self.runner.bytes_per_block()

    def allocate(self, num_blocks: int, block_size: int) -> None:
        self.runner.allocate_kv_cache(num_blocks)
        if self.runner.graphs:
            # the catch-up forward after a verification feeds 1 or 2 tokens per sequence
            # (the target's replacement token, or the last draft and the bonus token)
            self.runner.enable_multi_token(2, min(32, self.runner.args.max_num_seqs))
        self.block_manager = BlockManager(num_blocks, block_size, enable_prefix_caching=False)

    # --- bookkeeping ---------------------------------------------------------------------------

    def release(self, seq: Sequence) -> None:
        d = self.seqs.pop(id(seq), None)
        if d is not None:
            self.block_manager.free_seq(d)

    def retain(self, running: list[Sequence]) -> None:
        """Free the draft state of every sequence not in `running`."""
        live = {id(s) for s in running}
        for key in [k for k in self.seqs if k not in live]:
            self.block_manager.free_seq(self.seqs.pop(key))

    def live(self) -> list[DraftSeq]:
        return list(self.seqs.values())

    def _state(self, seq: Sequence) -> DraftSeq:
        d = self.seqs.get(id(seq))
        if d is not None and d.owner is not seq:  # a recycled id(): a different request
            self.block_manager.free_seq(d)
            d = None
        if d is None:
            d = self.seqs[id(seq)] = DraftSeq(seq)
        return d

    # --- proposing -----------------------------------------------------------------------------

    @torch.inference_mode()
    def propose(
        self, seqs: list[Sequence], ks: list[int], generator: torch.Generator | None
    ) -> tuple[list[list[int]], torch.Tensor | None]:
        """Up to ks[i] draft tokens for seqs[i]; and q (len(seqs), k, V), the draft's
        distribution at each draft position (None when every sequence is greedy)."""
        drafts: list[list[int]] = [[] for _ in seqs]
        active: list[tuple[int, int]] = []  # (index into seqs, tokens to feed)
        for i, (seq, k) in enumerate(zip(seqs, ks)):
            if k < 1 or seq.num_tokens + k - 1 > self.max_len:
                continue
            d = self._state(seq)
            d.sync(seq.all_token_ids)
            n = d.num_tokens - d.num_computed_tokens
            if self.block_manager.allocate(d, n):
                active.append((i, n))
        if not active:
            return drafts, None
        active.sort(key=lambda it: it[1] != 1)  # the runner's order: one-token items first
        q = None
        if not all(seqs[i].params.greedy for i, _ in active):
            q = torch.zeros(len(seqs), self.k, self.vocab_size, device=self.device)
        step = 0
        while active:
            if step == 1 and q is None:
                self._propose_rest_greedy(seqs, ks, active, drafts)
                break
            items = [(self.seqs[id(seqs[i])], n) for i, n in active]
            logits = self.runner.run(items)
            rows = [i for i, _ in active]
            tokens = self._draw(logits, [seqs[i] for i in rows], generator, q, rows, step)
            nxt = []
            for (i, _), tok in zip(active, tokens):
                d = self.seqs[id(seqs[i])]
                d.num_computed_tokens = d.num_tokens
                d.tokens.append(tok)
                drafts[i].append(tok)
                if len(drafts[i]) < ks[i] and self.block_manager.allocate(d, 1):
                    nxt.append((i, 1))
            active = nxt
            step += 1
        return drafts, q

    def plan_fused(self, seqs: list[Sequence], ks: list[int], draft_fits) -> list | None:
        """The draft's side of a fused greedy step (`spec.fused`), before scheduling: per
        sequence (DraftSeq, catch-up tokens, drafts) or None (no proposal: ks[i] < 1 or past the
        draft's positions), with the draft's blocks for all of it allocated. None for the whole
        step when a catch-up is longer than the fused program's (a sequence's first round after
        its prompt), would pass the draft's positions (`draft_fits`), or the pool is short: the
        step then proposes as usual (`propose` repeats the sync, and allocating what is already
        held is a no-op)."""
        from .fused import CATCH_UP

        plan: list = []
        for seq, k in zip(seqs, ks):
            if k < 1 or seq.num_tokens + k - 1 > self.max_len:
                plan.append(None)
                continue
            d = self._state(seq)
            d.sync(seq.all_token_ids)
            n = d.num_tokens - d.num_computed_tokens
            if n > CATCH_UP or not draft_fits(d.num_computed_tokens):
                return None
            # K/V for the catch-up and for drafts 1..k-1 (the last draft is only proposed)
            if not self.block_manager.allocate(d, n + k - 1):
                return None
            plan.append((d, n, k))
        return plan

    def finish_fused(self, d: DraftSeq, drafts: list[int]) -> None:
        """A fused step's drafts into the draft's state: K/V written for all but the newest."""
        d.tokens.extend(drafts)
        d.num_computed_tokens = d.num_tokens - 1

    def finish_rounds(self, d: DraftSeq, emitted: list[int], num_computed: int) -> None:
        """After a fused program of rounds (`FusedGreedySpec`): the target emitted `emitted`
        after the tokens the draft was synced to when the step was planned; the draft holds
        those too now, its K/V valid for the first num_computed."""
        d.tokens.extend(emitted)
        d.synced = len(d.tokens)
        d.num_computed_tokens = min(num_computed, len(d.tokens) - 1)

    def _propose_rest_greedy(self, seqs, ks, active, drafts) -> None:
        """Greedy rounds after the first draft token: the remaining one-token steps run back to
        back on the device (`ModelRunner.run_multi`), one read-back instead of one per token;
        the same argmax as step by step."""
        bs = self.block_manager.block_size
        ds = [self.seqs[id(seqs[i])] for i, _ in active]
        rooms = []
        for (i, _), d in zip(active, ds):
            r = ks[i] - len(drafts[i])
            if not self.block_manager.allocate(d, r):  # short: what its blocks hold (>= 1)
                r = len(d.block_ids) * bs - d.num_computed_tokens
            rooms.append(r)
        tokens, _ = self.runner.run_multi(ds, rooms, max(rooms))
        for (i, _), d, r, t in zip(active, ds, rooms, tokens):
            d.tokens.extend(t[:r])
            drafts[i].extend(t[:r])
            d.num_computed_tokens = d.num_tokens - 1  # the newest token has no K/V yet

    def _draw(self, logits, seqs, generator, q, rows, step) -> list[int]:
        tokens = argmax_rows(logits)
        params = [s.params for s in seqs]
        if not all(p.greedy for p in params):
            probs = request_probs(logits, params)
            q[rows, step] = probs
            gens = [None if p.greedy else s.generator for s, p in zip(seqs, params)]
            drawn = race(probs, exponential_noise(probs.shape, gens, generator, self.device))
            greedy = torch.tensor([p.greedy for p in params], device=self.device)
            tokens = torch.where(greedy, tokens, drawn)
        return tokens.tolist()
