"""Turns a scheduled batch into tensors, runs the model over the paged cache, samples.

Owns the model, the KV cache (one K and one V tensor per layer, (num_blocks, block_size, Hkv, D))
and the CUDA graphs. Decode-only batches up to `cuda_graph_max_batch` replay a graph captured for
the next larger captured size (padding rows have context length 0 and slot -1: they read and
write nothing); everything else runs eagerly.

Multi-step decoding runs (`engine/decode_runs.py`) and padded multi-token steps
(`engine/multi_token.py`) are the runner's other two ways to run the model; they are mixed into
`ModelRunner` from their own modules and share its inputs, staging buffers and graphs. Every
path's positions, cache slots and context lengths come from one builder, `engine/inputs.py`;
what stays here is each path's own layout of them in its buffers.

Asynchronous scheduling: the engine may queue a step before reading the tokens of the one before
it. A sequence whose newest token is still on the device (`Sequence.num_pending`) then gets it as
its input from that step's output tensor (`DeviceTokens`), gathered on the device by every input
path (`prepare`, the decode graphs, multi-step runs). Host staging buffers alternate between two
slots, so filling the next step's never overwrites what a queued copy still reads.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from ..config import EngineArgs
from ..kernels.fp8 import FP8_DTYPE
from ..model.llama import AttnMetadata, LlamaForCausalLM
from .decode_runs import DecodeRuns, MultiRun
from .inputs import build_rows, device_tensor, fill_tables, input_tokens
from .multi_token import MultiTokenSteps
from .paged import capture_cuda_graphs, graph_batch_sizes, kv_slots
from .sequence import Sequence

__all__ = [
    "DeviceTokens",
    "ModelRunner",
    "MultiRun",
    "capture_cuda_graphs",
    "graph_batch_sizes",
    "kv_slots",
]


def kv_cache_dtype(args: EngineArgs, model_dtype: torch.dtype) -> torch.dtype:
    """The KV cache's element type: the model's, or float8_e4m3fn (`--kv-cache-dtype fp8`)."""
    return model_dtype if args.kv_cache_dtype == "auto" else FP8_DTYPE


@dataclass
class DeviceTokens:
    """Each sequence's newest token as sampled by work still queued on the device."""

    last: torch.Tensor  # (b,) int64 on the device
    rows: dict[int, int]  # id(sequence) -> its row in `last`


class ModelRunner(DecodeRuns, MultiTokenSteps):
    def __init__(self, model: LlamaForCausalLM, args: EngineArgs, *, max_model_len: int):
        self.model, self.args = model, args
        self.cfg = model.cfg
        self.device = model.norm.device
        self.dtype = model.norm.dtype
        self.kv_dtype = kv_cache_dtype(args, self.dtype)
        self.block_size = args.block_size
        self.max_model_len = max_model_len
        self.max_blocks_per_seq = -(-max_model_len // self.block_size)
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.num_blocks = 0
        self._staging: dict[str, torch.Tensor] = {}
        self._slot = 1  # the host staging buffers of the last launch (0 or 1, `_next_slot`)
        self._pool = None  # the CUDA graphs' shared memory pool
        # multi-token steps padded to mt_q tokens per sequence (speculative verification, a
        # draft's catch-up): replayed from mt_graphs on a GPU, run eagerly padded elsewhere
        self.mt_q, self.mt_sizes = 0, ()
        self.mt_graphs: dict[int, torch.cuda.CUDAGraph] = {}

    # --- the KV pool -------------------------------------------------------------------------

    def bytes_per_block(self) -> int:
        c = self.cfg
        elem = torch.empty((), dtype=self.kv_dtype).element_size()  # bytes: 1 for FP8
        return 2 * c.num_hidden_layers * self.block_size * c.num_key_value_heads * c.head_dim * elem

    @torch.inference_mode()
    def profile_num_blocks(self, extra_bytes_per_block: int = 0) -> int:
        """Blocks that fit: on a GPU, what `gpu_memory_utilization` leaves after the weights and
        the peak activations of a full-budget prefill (measured by running one); on the CPU, the
        `cpu_kv_cache_gib` budget. `extra_bytes_per_block`: what each block costs elsewhere too
        (a draft model's cache of the same number of blocks)."""
        if self.args.num_gpu_blocks is not None:
            return self.args.num_gpu_blocks
        per_block = self.bytes_per_block() + extra_bytes_per_block
        if self.device.type != "cuda":
            return max(1, int(self.args.cpu_kv_cache_gib * 2**30) // per_block)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        n_tokens = min(
            self.args.max_num_batched_tokens, self.args.max_num_seqs * self.max_model_len
        )
        lens = []
        while sum(lens) < n_tokens:
            lens.append(min(self.max_model_len, n_tokens - sum(lens)))
        blocks = sum(-(-n // self.block_size) for n in lens)
        self._allocate_kv(blocks)
        self._dummy_prefill(lens)
        torch.cuda.synchronize()
        peak_activations = (
            torch.cuda.max_memory_allocated() - base - blocks * self.bytes_per_block()
        )
        self.kv_caches = []
        torch.cuda.empty_cache()
        _, total = torch.cuda.mem_get_info()
        slack = 512 * 2**20  # CUDA graphs' pool and the sampler's (batch, vocab) logits
        budget = total * self.args.gpu_memory_utilization - base - peak_activations - slack
        if budget < per_block:
            raise RuntimeError(
                f"no room for a KV cache: {total / 2**30:.1f} GiB x gpu_memory_utilization "
                f"{self.args.gpu_memory_utilization} leaves {budget / 2**30:.2f} GiB after weights "
                f"({base / 2**30:.2f} GiB) and activations ({peak_activations / 2**30:.2f} GiB)"
            )
        return int(budget // per_block)

    def _allocate_kv(self, num_blocks: int) -> None:
        c = self.cfg
        shape = (num_blocks, self.block_size, c.num_key_value_heads, c.head_dim)
        self.kv_caches = [
            (
                torch.zeros(shape, dtype=self.kv_dtype, device=self.device),
                torch.zeros(shape, dtype=self.kv_dtype, device=self.device),
            )
            for _ in range(c.num_hidden_layers)
        ]
        self.num_blocks = num_blocks

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self._allocate_kv(num_blocks)
        if (
            self.device.type == "cuda"
            and not self.args.enforce_eager
            and self.args.cuda_graph_max_batch
            and self.args.tensor_parallel_size == 1  # TP calls send their inputs: eager
        ):
            self.capture_graphs()

    def _dummy_prefill(self, lens: list[int]) -> None:
        items, start = [], 0
        for n in lens:
            blocks = list(range(start, start + -(-n // self.block_size)))
            start += len(blocks)
            seq = Sequence("profile", [0] * n, None)  # type: ignore[arg-type]
            seq.block_ids = blocks
            items.append((seq, n))
        ids, meta, _ = self.prepare(items)
        self.model(ids, meta, self.kv_caches)

    # --- inputs ------------------------------------------------------------------------------

    def _tensor(self, data, dtype) -> torch.Tensor:
        t = torch.tensor(data, dtype=dtype)
        if self.device.type == "cuda":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t

    def _input_token(self, seq: Sequence, pos: int, prev: DeviceTokens | None):
        """The token at position pos of seq as an input: (id, None), or (0, row of `prev`)
        when it is the newest token, still pending on the device."""
        if pos < seq.num_tokens:
            return seq.all_token_ids[pos], None
        if prev is None or id(seq) not in prev.rows:
            raise RuntimeError(f"request {seq.request_id}: input token {pos} is not known")
        return 0, prev.rows[id(seq)]

    def _gather_pending(self, ids: torch.Tensor, dst: list[int], src: list[int], prev) -> None:
        """ids[dst] = prev.last[src] on the device: pending tokens as inputs, never read back."""
        if dst:
            src_t = self._tensor(src, torch.int64)
            ids.index_copy_(0, self._tensor(dst, torch.int64), prev.last.index_select(0, src_t))

    def prepare(self, items: list[tuple[Sequence, int]], prev: DeviceTokens | None = None):
        """Packed inputs for (sequence, new tokens) items; decodes (1 token) must come first.

        An item may reach past the sequence's tokens into its `spec_token_ids` (speculative
        decoding): it then runs as a multi-token query (bottom-right causal over the cache) and
        gets a logits row at each position from its last sampled token on. A pending last
        token (asynchronous scheduling) is gathered from `prev` on the device.

        Returns (input_ids (T,), AttnMetadata, logits row index of each sampling position)."""
        b = len(items)
        tables = np.empty((b, self.max_blocks_per_seq), dtype=np.int32)
        fill_tables(tables, [seq.block_ids for seq, _ in items])
        starts = np.empty(b, dtype=np.int64)
        counts = np.empty(b, dtype=np.int64)
        first = np.empty(b, dtype=np.int64)
        toks, dst, src, row0 = [], [], [], 0
        for i, (seq, n) in enumerate(items):
            c = seq.num_computed_tokens
            known = input_tokens(seq, n)  # its tokens, then drafts
            if len(known) < n:  # the newest token, pending on the device
                tok, row = self._input_token(seq, c + len(known), prev)
                dst.append(row0 + len(known))
                src.append(row)
                known.append(tok)
            toks.append(known)
            starts[i], counts[i], row0 = c, n, row0 + n
            # one row per position from the last known (or pending) token on: 1, or 1 + drafts
            first[i] = max(c, seq.num_tokens + seq.num_pending - 1)
        rows = build_rows(tables, starts, counts, self.block_size, tokens=toks, sample_from=first)
        # a one-token step is a decode, whatever the phase; decodes lead the batch
        not_decode = np.flatnonzero(counts != 1)
        nd = int(not_decode[0]) if len(not_decode) else b
        ctx = rows.context_lens  # (b,) c + n: the new tokens included
        i32, i64 = torch.int32, torch.int64
        meta = AttnMetadata(
            num_decodes=nd,
            positions=self._tensor(rows.positions, i64),
            slot_mapping=self._tensor(rows.slots, i64),
            decode_block_tables=self._tensor(tables[: max(nd, 1)], i32)[:nd],
            decode_context_lens=self._tensor(ctx[:nd], i32),
            max_context_len=int(ctx[:nd].max()) if nd else 0,
        )
        if nd < b:
            meta.prefill_block_tables = self._tensor(tables[nd:], i32)
            meta.cu_seqlens_q = self._tensor(rows.offsets[nd:] - rows.offsets[nd], i32)
            meta.prefill_context_lens = self._tensor(ctx[nd:], i32)
            meta.max_seqlen_q = int(counts[nd:].max())
        input_ids = self._tensor(rows.ids, i64)
        self._gather_pending(input_ids, dst, src, prev)
        return input_ids, meta, rows.sample_rows.tolist()

    # --- running -----------------------------------------------------------------------------

    @torch.inference_mode()
    def run(
        self, items: list[tuple[Sequence, int]], prev: DeviceTokens | None = None
    ) -> torch.Tensor:
        """Logits (float32) of every item that reaches its last token, in item order (decodes
        first): one row per item, or 1 + drafts rows for a speculative item. Decode-only batches
        replay the decode CUDA graphs; batches of short items (verification, a draft's
        catch-up) the multi-token graphs when enabled (`enable_multi_token`); the rest, prefill
        chunks among them, run eagerly. `prev`: the queued step whose tokens are pending inputs.
        Queues the work and returns without waiting for it."""
        self._next_slot()
        # decodes first (the attention kernels take them as one group)
        items = sorted(items, key=lambda it: it[1] != 1)
        all_decode = all(n == 1 for _, n in items)
        b = len(items)
        if not all_decode and prev is None and self._multi_token_fits(items):
            return self._run_multi_token(items)
        if all_decode and self.graphs and b <= max(self.graphs):
            logits = self._replay(items, prev)
            rows = [i for i, (s, n) in enumerate(items) if s.num_uncomputed == n]
            # a one-token prefill chunk that does not reach the prompt's end has no row
            if len(rows) == b:
                return logits
            return logits.index_select(0, device_tensor(rows, logits.device, torch.int64))
        ids, meta, rows = self.prepare(items, prev)
        hidden = self.model(ids, meta, self.kv_caches)
        # rows indexed on the device without a wait (a Python list index would sync the stream)
        rows_t = device_tensor(rows, hidden.device, torch.int64)
        return self.model.compute_logits(hidden.index_select(0, rows_t))

    # --- CUDA graphs -------------------------------------------------------------------------

    def capture_graphs(self) -> None:
        maxb = min(self.args.cuda_graph_max_batch, self.args.max_num_seqs)
        dev, mb = self.device, self.max_blocks_per_seq
        self.g_ids = torch.zeros(maxb, dtype=torch.int64, device=dev)
        self.g_pos = torch.zeros(maxb, dtype=torch.int64, device=dev)
        self.g_slots = torch.full((maxb,), -1, dtype=torch.int64, device=dev)
        self.g_tables = torch.zeros(maxb, mb, dtype=torch.int32, device=dev)
        self.g_lens = torch.zeros(maxb, dtype=torch.int32, device=dev)

        def setup(b: int):
            meta = AttnMetadata(
                num_decodes=b,
                positions=self.g_pos[:b],
                slot_mapping=self.g_slots[:b],
                decode_block_tables=self.g_tables[:b],
                decode_context_lens=self.g_lens[:b],
                max_context_len=self.max_model_len,
            )
            return lambda: self.model.compute_logits(
                self.model(self.g_ids[:b], meta, self.kv_caches)
            )

        t0 = time.perf_counter()
        self.graphs, self.g_logits, self._pool = capture_cuda_graphs(
            graph_batch_sizes(maxb), setup, self._pool
        )
        self.graph_capture_s = time.perf_counter() - t0

    def _next_slot(self) -> int:
        """Alternate the host staging buffers between launches: a launch never refills the
        buffers of the one before it, whose copies may still be queued (the one before that
        has been read back, so its copies are done)."""
        self._slot = 1 - self._slot
        return self._slot

    def _replay(self, items: list[tuple[Sequence, int]], prev: DeviceTokens | None):
        b = len(items)
        gb = min(s for s in self.graphs if s >= b)
        seqs = [s for s, _ in items]
        plan, tables, dst, src = self._decode_plan(seqs, [1] * b, 1, gb, self._slot, prev)
        ids = plan.to(self.device, non_blocking=True)
        self.g_tables[:gb].copy_(tables, non_blocking=True)
        self.g_ids[:gb].copy_(ids[0], non_blocking=True)
        self._gather_pending(self.g_ids, dst, src, prev)
        self.g_pos[:gb].copy_(ids[1], non_blocking=True)
        self.g_slots[:gb].copy_(ids[2], non_blocking=True)
        self.g_lens[:gb].copy_(ids[3], non_blocking=True)
        self.graphs[gb].replay()
        return self.g_logits[gb][:b]

    # --- multi-step decoding -----------------------------------------------------------------

    def _decode_plan(
        self,
        seqs: list[Sequence],
        rooms: list[int],
        k: int,
        width: int,
        slot: int,
        prev: DeviceTokens | None = None,
    ):
        """Host arrays for k decode steps of seqs (padded to `width` rows): row 0 the first
        input ids, then per step positions, slots and context lengths ((1 + 3k, width) int64),
        and the block tables ((width, max_blocks) int32); both host tensors ready to copy. Step j of
        sequence i is valid while j < rooms[i]; an invalid entry writes nothing (slot -1) and
        reads one cached token of its own (context 1), so it is harmless and is discarded.
        A first input still pending on the device is left 0 in row 0 and listed in the
        returned (dst rows, src rows of prev) for `_gather_pending`.
        slot: which of the two staging buffers to fill (`_next_slot`)."""
        b = len(seqs)
        tables = self._pinned(f"tables{slot}", (width, self.max_blocks_per_seq), torch.int32)
        t = tables.numpy()
        fill_tables(t, [seq.block_ids for seq in seqs])
        plan_t = self._pinned(f"plan{slot}", (1 + 3 * k, width), torch.int64)
        plan = plan_t.numpy()
        starts = np.empty(b, dtype=np.int64)
        dst, src = [], []
        for i, seq in enumerate(seqs):
            starts[i] = seq.num_computed_tokens
            plan[0, i], row = self._input_token(seq, int(starts[i]), prev)
            if row is not None:
                dst.append(i)
                src.append(row)
        plan[0, b:] = 0
        # (width, k) per sequence and step; steps past a room reset, padding rows context 0
        rows = build_rows(
            t, starts, rooms, self.block_size, width=k, context="rows", past="reset", idle_context=0
        )
        plan[1 : 1 + k] = rows.positions.reshape(width, k).T
        plan[1 + k : 1 + 2 * k] = rows.slots.reshape(width, k).T
        plan[1 + 2 * k :] = rows.context_lens.reshape(width, k).T
        return plan_t, tables, dst, src

    def _pinned(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A host staging buffer reused across steps (pinned on a GPU machine, so its copies are
        asynchronous). Names carry the staging slot where steps may be queued back to back
        (`_next_slot`)."""
        buf = self._staging.get(name)
        numel = int(np.prod(shape))
        if buf is None or buf.numel() < numel or buf.dtype != dtype:
            buf = torch.empty(max(numel, 1), dtype=dtype)
            if self.device.type == "cuda":
                buf = buf.pin_memory()
            self._staging[name] = buf
        return buf[:numel].view(shape)

    @torch.inference_mode()
    def to_host(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """Queue a copy of a device result into a staging buffer of this launch's slot (read
        it once `done_event`'s event has passed)."""
        host = self._pinned(f"{name}{self._slot}", tuple(x.shape), x.dtype)
        host.copy_(x, non_blocking=True)
        return host

    def done_event(self) -> torch.cuda.Event | None:
        """An event after everything queued so far (None on the CPU: work is done on return)."""
        if self.device.type != "cuda":
            return None
        done = torch.cuda.Event()
        done.record()
        return done
