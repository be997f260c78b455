"""Padded multi-token steps on the runner: speculative verification (the last token and up to
k drafts per sequence) and a draft model's catch-up, every item padded to the same number of
tokens so a step has a fixed shape and can replay a CUDA graph. A mixin of `ModelRunner` (its
model, KV cache, staging buffers and graph pool).
"""

from __future__ import annotations

import torch

from ..model.llama import AttnMetadata
from .inputs import build_rows, fill_tables, input_tokens
from .paged import capture_cuda_graphs, graph_batch_sizes
from .sequence import Sequence


class MultiTokenSteps:
    def enable_multi_token(
        self, q_len: int, max_batch: int, *, capture: bool = True, pad_batch: bool = False
    ) -> None:
        """Run steps whose items each have 1..q_len new tokens (speculative verification: the
        last token and up to q_len - 1 drafts; a draft model's catch-up) with every item padded
        to q_len tokens, so the step has a fixed shape: on a GPU (unless `capture` is False) it
        replays a CUDA graph captured per batch size, up to `max_batch` sequences. Padding
        tokens write no cache slot (slot -1) and their rows are never returned; causality keeps
        them out of the real rows' attention. Without graphs the padded step runs eagerly (the
        CPU tier tests the padding that way); `pad_batch` then also pads the batch to the graph
        sizes with padding sequences, as graph replay does."""
        if q_len < 2 or max_batch < 1:
            raise ValueError(
                f"multi-token steps need q_len >= 2 and max_batch >= 1, got {q_len}, {max_batch}"
            )
        self.mt_q, self.mt_max_batch = q_len, max_batch
        sizes = graph_batch_sizes(max_batch)
        self.mt_sizes = sizes if pad_batch else ()
        dev, mb, t = self.device, self.max_blocks_per_seq, max(sizes) * q_len
        self.mt_ids = torch.zeros(t, dtype=torch.int64, device=dev)
        self.mt_pos = torch.zeros(t, dtype=torch.int64, device=dev)
        self.mt_slots = torch.full((t,), -1, dtype=torch.int64, device=dev)
        self.mt_tables = torch.zeros(max(sizes), mb, dtype=torch.int32, device=dev)
        self.mt_ctx = torch.full((max(sizes),), q_len, dtype=torch.int32, device=dev)
        self.mt_cu = (torch.arange(max(sizes) + 1, dtype=torch.int32) * q_len).to(dev)
        if not capture or dev.type != "cuda" or self.args.enforce_eager:
            return

        def setup(b: int):
            meta, ids = self._mt_meta(b), self.mt_ids[: b * q_len]
            return lambda: self.model.compute_logits(self.model(ids, meta, self.kv_caches))

        self.mt_graphs, self.mt_logits, self._pool = capture_cuda_graphs(sizes, setup, self._pool)

    def _mt_meta(self, b: int) -> AttnMetadata:
        q = self.mt_q
        return AttnMetadata(
            num_decodes=0,
            positions=self.mt_pos[: b * q],
            slot_mapping=self.mt_slots[: b * q],
            decode_block_tables=self.mt_tables[:0],
            decode_context_lens=self.mt_ctx[:0],
            max_context_len=0,
            prefill_block_tables=self.mt_tables[:b],
            cu_seqlens_q=self.mt_cu[: b + 1],
            prefill_context_lens=self.mt_ctx[:b],
            max_seqlen_q=q,
        )

    def _multi_token_fits(self, items: list[tuple[Sequence, int]]) -> bool:
        q = self.mt_q
        if not q or len(items) > self.mt_max_batch:
            return False
        for seq, n in items:
            c = seq.num_computed_tokens
            # every item continues a sequence whose tokens up to c are cached (a decode, a
            # verification, a short catch-up): not a prompt's chunk; padded positions must stay
            # inside the RoPE table and the block table
            if n > q or c + q > self.max_model_len or c + n < seq.num_tokens:
                return False
        return True

    def _mt_plan(self, items: list[tuple[Sequence, int]], width: int):
        """Host inputs of a padded multi-token step: rows ids, positions, slots, (first
        `width` entries) context lengths and (first `n_rows` entries) the logits rows to return
        in item order, (5, width * q) int64 (one copy to the device); block tables
        (width, max_blocks) int32; and n_rows."""
        q = self.mt_q
        plan_t = self._pinned("mt_plan", (5, width * q), torch.int64)
        tables_t = self._pinned("mt_tables", (width, self.max_blocks_per_seq), torch.int32)
        plan, t = plan_t.numpy(), tables_t.numpy()
        fill_tables(t, [seq.block_ids for seq, _ in items])
        starts = [seq.num_computed_tokens for seq, _ in items]
        # bottom-right causal: real query j sees positions <= c + j; padding sequences run
        # positions 0..q-1 and write nothing
        rows = build_rows(
            t,
            starts,
            [n for _, n in items],
            self.block_size,
            width=q,
            tokens=[input_tokens(seq, n) for seq, n in items],  # last token, then drafts
            # logits rows from the last known token on
            sample_from=[max(c, seq.num_tokens - 1) for c, (seq, _) in zip(starts, items)],
        )
        n_rows = len(rows.sample_rows)
        plan[0], plan[1], plan[2] = rows.ids, rows.positions, rows.slots
        plan[3, :width] = rows.context_lens
        plan[3, width:] = q
        plan[4, :n_rows] = rows.sample_rows
        plan[4, n_rows:] = 0
        return plan_t, tables_t, n_rows

    def _run_multi_token(self, items: list[tuple[Sequence, int]]) -> torch.Tensor:
        b, q = len(items), self.mt_q
        sizes = self.mt_graphs or self.mt_sizes
        width = min(s for s in sizes if s >= b) if sizes else b
        plan, tables, n_rows = self._mt_plan(items, width)
        dev = plan.to(self.device, non_blocking=True)
        t = width * q
        self.mt_ids[:t].copy_(dev[0], non_blocking=True)
        self.mt_pos[:t].copy_(dev[1], non_blocking=True)
        self.mt_slots[:t].copy_(dev[2], non_blocking=True)
        self.mt_ctx[:width].copy_(dev[3, :width], non_blocking=True)
        self.mt_tables[:width].copy_(tables, non_blocking=True)
        if self.mt_graphs:
            self.mt_graphs[width].replay()
            logits = self.mt_logits[width]
        else:
            hidden = self.model(self.mt_ids[:t], self._mt_meta(width), self.kv_caches)
            logits = self.model.compute_logits(hidden)
        # the rows came with the plan: no tensor built from a list, no pinned allocation per step
        return logits.index_select(0, dev[4, :n_rows])
