"""Multi-step decoding on the runner (`EngineArgs.num_scheduler_steps`): a greedy decode-only
batch runs k steps back to back on the device.

The host computes every step's positions, slots and context lengths at once (`_decode_plan`,
through `engine/inputs.py`; the blocks for k tokens are allocated beforehand), copies them in
one transfer, and each step's input ids are the previous step's argmax, copied on the device;
the host reads the k x batch tokens back once. The GPU then never waits for the host's
per-step bookkeeping, which at batch 1 is as long as the step itself. `launch_multi` queues a
run and returns; `collect_multi` reads its tokens. A mixin of `ModelRunner` (its graphs,
staging buffers and inputs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..model.llama import AttnMetadata
from .sampler import argmax_rows
from .sequence import Sequence

if TYPE_CHECKING:
    from .model_runner import DeviceTokens


@dataclass
class MultiRun:
    """A multi-step run queued on the device (`ModelRunner.launch_multi`)."""

    seqs: list[Sequence]
    rooms: list[int]
    k: int
    b: int
    out: torch.Tensor  # (k, b) int64 on the device: step j's token of sequence i
    last: torch.Tensor  # (b,) int64 on the device: each sequence's last token, out[room - 1]
    host: torch.Tensor  # its copy on the host (pinned on a GPU), valid once `done` has passed
    host_lps: torch.Tensor | None
    done: torch.cuda.Event | None  # None on the CPU (the run finished when launch returned)


class DecodeRuns:
    def run_multi(self, seqs: list[Sequence], rooms: list[int], k: int, logprobs: bool = False):
        """k greedy decode steps of seqs without reading back in between. Each sequence must
        hold blocks for rooms[i] <= k more tokens; steps past its room are discarded.

        Returns (tokens (b, k) list of lists, logprobs (b, k) list of lists or None)."""
        return self.collect_multi(self.launch_multi(seqs, rooms, k, logprobs=logprobs))

    @torch.inference_mode()
    def launch_multi(
        self,
        seqs: list[Sequence],
        rooms: list[int],
        k: int,
        *,
        logprobs: bool = False,
        prev: DeviceTokens | None = None,
    ) -> MultiRun:
        """Queue k greedy decode steps of seqs on the device and return without waiting.

        prev: queued work whose newest token of a sequence is this run's first input (it need
        not have been read). `collect_multi` waits for the result."""
        b = len(seqs)
        use_graph = self.device.type == "cuda" and self.graphs and b <= max(self.graphs)
        width = min(s for s in self.graphs if s >= b) if use_graph else b
        slot = self._next_slot()
        plan, tables, dst, src = self._decode_plan(seqs, rooms, k, width, slot, prev)
        max_ctx = int(plan[1 + 2 * k :, :b].max())
        dev_plan = plan.to(self.device, non_blocking=True)
        dev_tables = tables.to(self.device, non_blocking=True)
        lens32 = dev_plan[1 + 2 * k :].to(torch.int32)
        out = torch.empty(k, b, dtype=torch.int64, device=self.device)
        lps = torch.empty(k, b, dtype=torch.float32, device=self.device) if logprobs else None
        if use_graph:
            self.g_tables[:width].copy_(dev_tables)
        ids = dev_plan[0].clone()
        self._gather_pending(ids, dst, src, prev)
        for j in range(k):
            if use_graph:
                self.g_ids[:width].copy_(ids[:width])
                self.g_pos[:width].copy_(dev_plan[1 + j])
                self.g_slots[:width].copy_(dev_plan[1 + k + j])
                self.g_lens[:width].copy_(lens32[j])
                self.graphs[width].replay()
                logits = self.g_logits[width][:b]
            else:
                meta = AttnMetadata(
                    num_decodes=b,
                    positions=dev_plan[1 + j],
                    slot_mapping=dev_plan[1 + k + j],
                    decode_block_tables=dev_tables,
                    decode_context_lens=lens32[j],
                    max_context_len=max_ctx,
                )
                logits = self.model.compute_logits(self.model(ids[:b], meta, self.kv_caches))
            out[j] = argmax_rows(logits)
            if lps is not None:
                lps[j] = logits.log_softmax(-1).gather(-1, out[j][:, None])[:, 0]
            if j + 1 < k:
                nxt = torch.zeros(width, dtype=torch.int64, device=self.device)
                nxt[:b] = out[j]
                ids = nxt
        # each sequence's last token, out[rooms[i] - 1, i]: the next queued step's input
        flat = self._pinned(f"last{slot}", (b,), torch.int64)
        flat.numpy()[:] = (np.asarray(rooms) - 1) * b + np.arange(b)
        last = out.view(-1).index_select(0, flat.to(self.device, non_blocking=True))
        host = self.to_host("out", out)
        host_lps = self.to_host("lps", lps) if lps is not None else None
        return MultiRun(list(seqs), list(rooms), k, b, out, last, host, host_lps, self.done_event())

    def collect_multi(self, run: MultiRun):
        """Wait for a run queued by `launch_multi`: (tokens (b, k), logprobs (b, k) or None)."""
        if run.done is not None:
            run.done.synchronize()
        tokens = run.host.t().tolist()
        return tokens, (run.host_lps.t().tolist() if run.host_lps is not None else None)
