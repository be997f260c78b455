"""Greedy draft-model speculation as one device program per step (`EngineArgs.spec_fused_greedy`).

The default speculative step waits for the device three times (the draft's first token, its
other drafts, the target's argmax) and builds every forward's inputs between those waits. At
batch 1 on a small target the host is the bottleneck, so a wait saves nothing unless the host
work around it goes too. Here a step of all-greedy decoding sequences is one program:

1. the draft's catch-up forward, every sequence padded to 2 tokens (after a verification the
   draft is 1 or 2 tokens behind: the target's replacement token, or its last draft and the
   bonus token); its first draft is the argmax of its last real row;
2. k - 1 one-token draft steps, each input the previous step's argmax, on the device;
3. the drafts written into the target's inputs (the last token, then k drafts: k + 1 tokens per
   sequence, padded like `ModelRunner.enable_multi_token`'s verification), one target forward
   whose attention takes the k + 1 tokens as decode rows (row j at context L + j + 1);
4. the greedy acceptance on the device (`kernels.spec_rounds.accept`, one launch on a GPU): the
   argmax of every row, the leading drafts equal to it (up to the drafts each sequence was
   scheduled with), the argmax after them.

The host fills two pinned buffers (int64 and int32) with every input of that program (token
ids, positions, cache slots, context lengths, block tables of both models), copies each to the
device in one transfer, runs the program and copies its (batch, 2 + k) result back
(accepted count, the token after them, the k drafts) without blocking, then waits on one event.
On a GPU (no `enforce_eager`) the program is captured as one CUDA graph per batch width (the
decode graphs' sizes up to the speculative graph limit; the batch is padded with padding rows
that write no cache slot), so a step is: host bookkeeping, 2 copies, 1 graph launch, 1 copy
back, 1 wait. On the CPU it runs eagerly with the same padding (what the CPU tests check).

The engine uses it only when nothing else can be in the step: every running sequence decodes
greedily without logprobs, nobody waits to be admitted, every draft catch-up is at most 2
tokens and every padded position fits both models. Otherwise the step runs the default way.

Rounds (`EngineArgs.spec_fused_rounds` = R > 1): R rounds of 1-4 in one program and one
read-back, each round's inputs formed on the device from the state the last one left
(`_program_rounds`), so the host's share of a step is paid once per R verifications. Per
sequence the state is the target's computed length L and its last token, and the draft's
computed length and its 1 or 2 catch-up tokens; after a round that accepted a of k drafts
(bonus token b): L += a + 1, last = b, the draft keeps the K/V of min(a, k - 1) drafts and
catches up on b (a < k) or on its last draft and b (a = k). It runs when every sequence of the
step has its k drafts scheduled, its blocks for R (k + 1) more tokens in both pools, and the
positions for them. A sequence that stops inside the program (stop token, EOS, max_tokens)
keeps the tokens up to the stop; the rounds after it were computed and are dropped, as
multi-step decoding drops the steps after a stop.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..engine.inputs import build_rows, fill_tables
from ..engine.model_runner import ModelRunner
from ..engine.paged import capture_cuda_graphs, graph_batch_sizes
from ..engine.sampler import argmax_rows
from ..engine.sequence import Sequence
from ..kernels.spec_rounds import CATCH_UP, accept, round_inputs, slab_layout
from ..model.llama import AttnMetadata

PENDING = -1  # a draft token counted by the scheduler, computed later on the device


@dataclass
class FusedItem:
    """One scheduled sequence of a fused step."""

    seq: Sequence  # the target's sequence (decoding: num_computed_tokens == num_tokens - 1)
    n_drafts: int  # drafts the target verifies (what the scheduler kept), 0..k
    draft: object | None = None  # its DraftSeq, or None: no proposal (draft rows are padding)
    catch_up: int = 0  # draft tokens to feed before proposing (1 or 2)
    k: int = 0  # drafts the draft model proposes (>= n_drafts)


class _Slab:
    """Every input and output of the program at one batch width, as views of two device
    buffers filled from two host buffers (one copy each)."""

    def __init__(
        self, w: int, k: int, mbd: int, mbt: int, device, pinned: bool, rounds: int = 1
    ) -> None:
        self.w, self.k, self.q, self.rounds = w, k, k + 1, rounds
        i64, i32 = slab_layout(w, k, mbd, mbt, rounds)  # (kernels/spec_rounds.py)
        self.host64, self.dev64, self.h, self.d = self._alloc(i64, torch.int64, device, pinned)
        self.host32, self.dev32, h32, d32 = self._alloc(i32, torch.int32, device, pinned)
        self.h |= h32
        self.d |= d32
        h = self.h
        h["d_cu"][:] = np.arange(w + 1) * CATCH_UP
        shape = (w, 2 + k) if rounds == 1 else (rounds, w, 2 + k)
        self.out = torch.zeros(shape, dtype=torch.int64, device=device)
        self.out_host = torch.zeros(shape, dtype=torch.int64)
        if pinned:
            self.out_host = self.out_host.pin_memory()

    @staticmethod
    def _alloc(layout, dtype, device, pinned):
        align = 32  # every view starts 128-byte aligned (int32) or more, as kernels may load wide
        sizes = [-(-int(np.prod(shape)) // align) * align for _, shape in layout]
        total = sum(sizes)
        host = torch.zeros(max(total, 1), dtype=dtype)
        if pinned:
            host = host.pin_memory()
        dev = torch.zeros(max(total, 1), dtype=dtype, device=device)
        hv, dv, off = {}, {}, 0
        arr = host.numpy()
        for (name, shape), size in zip(layout, sizes):
            n = int(np.prod(shape))
            hv[name] = arr[off : off + n].reshape(shape)
            dv[name] = dev[off : off + n].view(shape)
            off += size
        return host, dev, hv, dv


class FusedGreedySpec:
    """The fused greedy speculative step of a target runner and a draft model's runner."""

    def __init__(
        self,
        target: ModelRunner,
        draft: ModelRunner,
        k: int,
        max_batch: int,
        *,
        capture: bool,
        rounds: int = 1,
    ) -> None:
        if k < 1 or max_batch < 1 or rounds < 1:
            raise ValueError(
                "fused speculation needs k >= 1, max_batch >= 1 and rounds >= 1, got "
                f"{k}, {max_batch}, {rounds}"
            )
        self.target, self.draft, self.k = target, draft, k
        self.max_batch = max_batch
        self.rounds = rounds
        self.sizes = graph_batch_sizes(max_batch)
        self.device = target.device
        self.pinned = self.device.type == "cuda"
        self.slabs: dict[int, _Slab] = {}  # one round a program, by batch width
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.round_slabs: dict[int, _Slab] = {}  # `rounds` rounds a program (rounds > 1)
        self.round_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.runs = 0  # fused steps run (tests, benchmarks)
        self.round_runs = 0  # of those, programs of `rounds` rounds
        if capture and self.device.type == "cuda":
            self._capture()

    # --- limits the engine checks before choosing this path -------------------------------------

    def target_fits(self, seq: Sequence) -> bool:
        """The padded verification stays inside the target's positions."""
        return seq.num_computed_tokens + self.k + 1 <= self.target.max_model_len

    def draft_fits(self, num_computed: int) -> bool:
        """The padded catch-up stays inside the draft's positions."""
        return num_computed + CATCH_UP <= self.draft.max_model_len

    def rounds_fit(self, num_computed: int) -> bool:
        """`rounds` rounds from a target computed length of num_computed stay inside both
        models' positions (the furthest a round writes is its last draft position, L + k, with
        L at most num_computed + (rounds - 1)(k + 1))."""
        end = num_computed + self.rounds_tokens()
        return end <= min(self.target.max_model_len, self.draft.max_model_len)

    def rounds_tokens(self) -> int:
        """Positions past the target's computed length that a program of `rounds` rounds may
        write, in either model (the blocks to hold before running one)."""
        return self.rounds * (self.k + 1)

    # --- the device program -----------------------------------------------------------------------

    def _slab(self, w: int, rounds: int = 1) -> _Slab:
        slabs = self.slabs if rounds == 1 else self.round_slabs
        s = slabs.get(w)
        if s is None:
            s = _Slab(
                w,
                self.k,
                self.draft.max_blocks_per_seq,
                self.target.max_blocks_per_seq,
                self.device,
                self.pinned,
                rounds,
            )
            d = s.d
            s.d_meta = AttnMetadata(
                num_decodes=0,
                positions=d["d_pos"],
                slot_mapping=d["d_slots"],
                decode_block_tables=d["d_tables"][:0],
                decode_context_lens=d["d_ctx"][:0],
                max_context_len=0,
                prefill_block_tables=d["d_tables"],
                cu_seqlens_q=d["d_cu"],
                prefill_context_lens=d["d_ctx"],
                max_seqlen_q=CATCH_UP,
            )
            s.s_meta = [
                AttnMetadata(
                    num_decodes=w,
                    positions=d["s_pos"][j],
                    slot_mapping=d["s_slots"][j],
                    decode_block_tables=d["d_tables"],
                    decode_context_lens=d["s_lens"][j],
                    max_context_len=self.draft.max_model_len,
                )
                for j in range(self.k - 1)
            ]
            # The verification's k + 1 tokens per sequence as w * q decode rows (row j at
            # context L + j + 1: causal, as a chunk aligned bottom-right): the decode kernel
            # splits the context over the GPU, where the chunked-prefill kernel gave a handful
            # of CTAs per sequence the whole context each (slow at batch 1).
            s.t_meta = AttnMetadata(
                num_decodes=w * s.q,
                positions=d["t_pos"],
                slot_mapping=d["t_slots"],
                decode_block_tables=d["t_rtables"],
                decode_context_lens=d["t_lens"],
                max_context_len=self.target.max_model_len,
            )
            self._fill(s, [])  # every row padding
            if rounds > 1:
                self._pad_state(s, 0)
            slabs[w] = s
        return s

    @torch.inference_mode()
    def _program(self, s: _Slab) -> None:
        """Draft catch-up, k - 1 draft steps, verification, acceptance: device work only (no
        host reads), so it can be captured."""
        if s.rounds == 1:
            self._round(s, s.out)
        else:
            self._program_rounds(s)

    def _round(self, s: _Slab, out: torch.Tensor) -> None:
        """One round over the slab's inputs; out (w, 2 + k): accepted drafts, the token after
        them, the k drafts."""
        dm, tm, d = self.draft.model, self.target.model, s.d
        dkv, tkv = self.draft.kv_caches, self.target.kv_caches
        drafts = out[:, 2:]
        hidden = dm(d["d_ids"], s.d_meta, dkv)
        tok = argmax_rows(dm.compute_logits(hidden.index_select(0, d["d_rows"])))
        drafts[:, 0].copy_(tok)
        for j in range(self.k - 1):
            tok = argmax_rows(dm.compute_logits(dm(tok, s.s_meta[j], dkv)))
            drafts[:, j + 1].copy_(tok)
        d["t_ids"].view(s.w, s.q)[:, 1:].copy_(drafts)
        logits = tm.compute_logits(tm(d["t_ids"], s.t_meta, tkv))
        accept(argmax_rows(logits), d["nd"], out, k=self.k)  # one launch on a GPU

    # --- rounds: every round's inputs formed on the device ------------------------------------------

    def _program_rounds(self, s: _Slab) -> None:
        """`s.rounds` rounds, each formed from the state the one before left (module doc):
        `kernels.spec_rounds.round_inputs` advances the state and writes the round's inputs,
        one launch on a GPU."""
        dbs, tbs = self.draft.block_size, self.target.block_size
        for r in range(s.rounds):
            prev = s.out[r - 1] if r else None
            round_inputs(s.d, prev, k=self.k, dbs=dbs, tbs=tbs)
            self._round(s, s.out[r])

    def _capture(self) -> None:
        """One CUDA graph per batch width for one round a program, and one for `rounds`."""
        kinds = [(1, self.graphs)] + ([(self.rounds, self.round_graphs)] if self.rounds > 1 else [])
        pool = self.target._pool
        for rounds, graphs in kinds:

            def setup(w: int, rounds=rounds):
                s = self._slab(w, rounds)
                s.dev64.copy_(s.host64)  # every row padding: no cache slot is written
                s.dev32.copy_(s.host32)
                return lambda: self._program(s)

            captured, _, pool = capture_cuda_graphs(self.sizes, setup, pool)
            graphs.update(captured)
        self.target._pool = pool

    # --- one step ---------------------------------------------------------------------------------

    def _pad_state(self, s: _Slab, start: int) -> None:
        """Rows start.. of a program of rounds: a padding row's state (positions from 0, no
        slot, never advanced) and tables."""
        h = s.h
        for name in ("L", "last", "cd", "dtok", "real"):
            h[name][start:] = 0
        h["dn"][start:] = 1
        h["nd"][start:] = 0
        h["d_tables"][start:] = 0
        h["t_tables"][start:] = 0
        h["t_rtables"][start * s.q :] = 0

    def _fill_rounds(self, s: _Slab, items: list[FusedItem]) -> None:
        """The state and block tables of a program of rounds (`round_inputs` forms the rest)."""
        h = s.h
        for i, it in enumerate(items):
            seq, d = it.seq, it.draft
            c, cd, n = seq.num_computed_tokens, d.num_computed_tokens, it.catch_up
            h["L"][i] = c
            h["last"][i] = seq.all_token_ids[c]
            h["cd"][i] = cd
            h["dn"][i] = n
            h["dtok"][i] = 0
            h["dtok"][i, :n] = d.tokens[cd : cd + n]
            h["real"][i] = 1
            h["nd"][i] = it.n_drafts
            for name, ids in (("d_tables", d.block_ids), ("t_tables", seq.block_ids)):
                table = h[name][i]
                table[:] = 0
                table[: len(ids)] = ids
            h["t_rtables"][i * s.q : (i + 1) * s.q] = h["t_tables"][i]
        self._pad_state(s, len(items))

    def _fill(self, s: _Slab, items: list[FusedItem]) -> None:
        """Every input of one round (`engine.inputs.build_rows`); rows past the items, and the
        draft rows of an item without a proposal, are padding: no slot written, positions 0..,
        contexts that read only their own padding."""
        h, w, q, k = s.h, s.w, s.q, self.k
        dbs, tbs = self.draft.block_size, self.target.block_size
        drafts = [it.draft for it in items]
        fill_tables(h["d_tables"], [d.block_ids if d is not None else [] for d in drafts])
        dc = np.array(
            [d.num_computed_tokens if d is not None else 0 for d in drafts], dtype=np.int64
        )
        dn = np.array([it.catch_up if it.draft is not None else 0 for it in items], dtype=np.int64)
        # 1. the catch-up, padded to CATCH_UP rows (bottom-right causal: context c + CATCH_UP)
        up = build_rows(
            h["d_tables"],
            dc,
            dn,
            dbs,
            width=CATCH_UP,
            tokens=[
                d.tokens[c : c + n] if d is not None else [] for d, c, n in zip(drafts, dc, dn)
            ],
        )
        h["d_ids"][:], h["d_pos"][:], h["d_slots"][:] = up.ids, up.positions, up.slots
        h["d_ctx"][:] = up.context_lens
        last = np.zeros(w, dtype=np.int64)  # each catch-up's last real row (padding: its first)
        last[: len(items)] = np.maximum(dn - 1, 0)
        h["d_rows"][:] = np.arange(w) * CATCH_UP + last
        # 2. draft step j feeds draft j + 1 at position c + n + j: steps past a sequence's
        # drafts, and padding, reset (position 0, no slot, context 1)
        steps = [min(max(it.k - 1, 0), k - 1) if it.draft is not None else 0 for it in items]
        st = build_rows(
            h["d_tables"], dc + dn, steps, dbs, width=k - 1, context="rows", past="reset"
        )
        h["s_pos"][:] = st.positions.reshape(w, k - 1).T
        h["s_slots"][:] = st.slots.reshape(w, k - 1).T
        h["s_lens"][:] = st.context_lens.reshape(w, k - 1).T
        # 3. the verification: the last token and the drafts kept, as q decode rows (row j at
        # context c + j + 1)
        seqs = [it.seq for it in items]
        fill_tables(h["t_tables"], [seq.block_ids for seq in seqs])
        tc = [seq.num_computed_tokens for seq in seqs]
        ver = build_rows(
            h["t_tables"],
            tc,
            [1 + it.n_drafts for it in items],
            tbs,
            width=q,
            context="rows",
            tokens=[[seq.all_token_ids[c]] for seq, c in zip(seqs, tc)],
        )
        h["t_ids"][:], h["t_pos"][:], h["t_slots"][:] = ver.ids, ver.positions, ver.slots
        h["t_lens"][:] = ver.context_lens
        h["t_rtables"][:] = np.repeat(h["t_tables"], q, axis=0)
        h["nd"][: len(items)] = [it.n_drafts for it in items]
        h["nd"][len(items) :] = 0

    def can_run_rounds(self, items: list[FusedItem]) -> bool:
        """Whether these items may run as a program of `rounds` rounds: every one drafts k and
        verifies all k (nothing cut by the scheduler) and its positions fit (`rounds_fit`). The
        caller holds the blocks (`rounds_tokens`)."""
        if self.rounds == 1 or not 0 < len(items) <= self.max_batch:
            return False
        return all(
            it.draft is not None
            and it.k == self.k
            and it.n_drafts == self.k
            and 1 <= it.catch_up <= CATCH_UP
            and self.rounds_fit(it.seq.num_computed_tokens)
            for it in items
        )

    @torch.inference_mode()
    def run_rounds(self, items: list[FusedItem]) -> np.ndarray:
        """`rounds` rounds over items (`can_run_rounds` holds); returns (rounds, len(items),
        2 + k) int64: per round, accepted drafts, the token after them, the k drafts."""
        if not self.can_run_rounds(items):
            raise ValueError("fused rounds: these items cannot run as a program of rounds")
        b = len(items)
        w = min(x for x in self.sizes if x >= b)
        s = self._slab(w, self.rounds)
        self._fill_rounds(s, items)
        out = self._launch(s, self.round_graphs.get(w))
        self.runs += 1
        self.round_runs += 1
        return out[:, :b].copy()

    def _launch(self, s: _Slab, g) -> np.ndarray:
        """Inputs to the device, the program (its graph when captured), the result back."""
        s.dev64.copy_(s.host64, non_blocking=True)
        s.dev32.copy_(s.host32, non_blocking=True)
        if g is not None:
            g.replay()
        else:
            self._program(s)
        s.out_host.copy_(s.out, non_blocking=True)
        if self.device.type == "cuda":
            done = torch.cuda.Event()
            done.record()
            done.synchronize()  # the step's one wait (the host buffers are reused next step)
        return s.out_host.numpy()

    @torch.inference_mode()
    def run(self, items: list[FusedItem]) -> np.ndarray:
        """The program over items; returns (len(items), 2 + k) int64: accepted drafts, the
        token after them, then the k drafts proposed (row i's first items[i].k are real)."""
        b = len(items)
        if not 0 < b <= self.max_batch:
            raise ValueError(f"fused step: 1..{self.max_batch} sequences, got {b}")
        w = min(x for x in self.sizes if x >= b)
        s = self._slab(w)
        self._fill(s, items)
        out = self._launch(s, self.graphs.get(w))
        self.runs += 1
        return out[:b].copy()
