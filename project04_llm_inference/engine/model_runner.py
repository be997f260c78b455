"""Turns a scheduled batch into tensors, runs the model over the paged cache, samples.

Owns the model, the KV cache (one K and one V tensor per layer, (num_blocks, block_size, Hkv, D))
and the CUDA graphs. Decode-only batches up to `cuda_graph_max_batch` replay a graph captured for
the next larger captured size (padding rows have context length 0 and slot -1: they read and
write nothing); everything else runs eagerly.

Multi-step decoding (`run_multi`, `EngineArgs.num_scheduler_steps`): a greedy decode-only batch
runs k steps back to back on the device. The host computes every step's positions, slots and
context lengths at once (the blocks for k tokens are allocated beforehand), copies them in one
transfer, and each step's input ids are the previous step's argmax, copied on the device; the
host reads the k x batch tokens back once. The GPU then never waits for the host's per-step
bookkeeping, which at batch 1 is as long as the step itself. `launch_multi` queues a run and
returns; `collect_multi` reads its tokens.

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
from ..model.llama import AttnMetadata, LlamaForCausalLM
from .sampler import argmax_rows
from .sequence import Sequence


@dataclass
class DeviceTokens:
    """Each sequence's newest token as sampled by work still queued on the device."""

    last: torch.Tensor  # (b,) int64 on the device
    rows: dict[int, int]  # id(sequence) -> its row in `last`


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


def graph_batch_sizes(max_batch: int) -> list[int]:
    sizes = [b for b in (1, 2, 4, 8) if b <= max_batch]
    return sizes + list(range(16, max_batch + 1, 16))


def kv_slots(tables: np.ndarray, positions: np.ndarray, block_size: int) -> np.ndarray:
    """Cache slots of `positions` through block tables: the one place the paged address is
    formed on the host. tables (..., max_blocks) int, positions broadcastable against the
    tables' leading dims plus one trailing dim of positions; a position past the table reads
    its last entry (callers mask those)."""
    idx = np.minimum(positions // block_size, tables.shape[-1] - 1)
    blocks = np.take_along_axis(tables, idx, axis=-1).astype(np.int64)
    return blocks * block_size + positions % block_size


def capture_cuda_graphs(sizes: list[int], setup, pool=None):
    """Capture one CUDA graph per batch width, largest first so the smaller ones reuse its
    memory pool. setup(w) prepares width w's static buffers and returns the function to
    capture (device work only, returning its output tensor). Each is run twice outside the
    graph first, so lazy initialisation stays out of it. Returns ({w: graph}, {w: output},
    the pool)."""
    graphs, outputs = {}, {}
    with torch.inference_mode():
        for w in sorted(sizes, reverse=True):
            fn = setup(w)
            for _ in range(2):
                fn()
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                outputs[w] = fn()
            pool = g.pool()
            graphs[w] = g
    torch.cuda.synchronize()
    return graphs, outputs, pool


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, args: EngineArgs, *, max_model_len: int):
        self.model, self.args = model, args
        self.cfg = model.cfg
        self.device = model.norm.device
        self.dtype = model.norm.dtype
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
        elem = torch.empty((), dtype=self.dtype).element_size()
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
                torch.zeros(shape, dtype=self.dtype, device=self.device),
                torch.zeros(shape, dtype=self.dtype, device=self.device),
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
        bs = self.block_size
        ids, pos, slots, sample_rows, dst, src = [], [], [], [], [], []
        dec_tables, dec_lens, pre_tables, pre_lens, cu = [], [], [], [], [0]
        num_decodes = 0
        for seq, n in items:
            c = seq.num_computed_tokens
            known = seq.all_token_ids[c : c + n]
            toks = list(known)
            if len(toks) < n and seq.spec_token_ids:  # the last sampled token, then drafts
                toks += seq.spec_token_ids[: n - len(toks)]
            elif len(toks) < n:  # the newest token, pending on the device
                tok, row = self._input_token(seq, c + len(toks), prev)
                dst.append(len(ids) + len(toks))
                src.append(row)
                toks.append(tok)
            ids.extend(toks)
            pos.extend(range(c, c + n))
            table = seq.block_ids
            slots.extend(kv_slots(np.asarray(table), np.arange(c, c + n), bs).tolist())
            padded = table + [0] * (self.max_blocks_per_seq - len(table))
            if n == 1 and not pre_lens:  # a one-token step is a decode, whatever the phase
                num_decodes += 1
                dec_tables.append(padded)
                dec_lens.append(c + 1)
            else:
                pre_tables.append(padded)
                pre_lens.append(c + n)
                cu.append(cu[-1] + n)
            # one row per position from the last known (or pending) token on: 1, or 1 + drafts
            first = max(c, seq.num_tokens + seq.num_pending - 1)
            sample_rows.extend(range(len(ids) - (c + n - first), len(ids)))
        i32, i64 = torch.int32, torch.int64
        meta = AttnMetadata(
            num_decodes=num_decodes,
            positions=self._tensor(pos, i64),
            slot_mapping=self._tensor(slots, i64),
            decode_block_tables=self._tensor(dec_tables or [[0] * self.max_blocks_per_seq], i32)[
                :num_decodes
            ],
            decode_context_lens=self._tensor(dec_lens, i32),
            max_context_len=max(dec_lens, default=0),
        )
        if pre_lens:
            meta.prefill_block_tables = self._tensor(pre_tables, i32)
            meta.cu_seqlens_q = self._tensor(cu, i32)
            meta.prefill_context_lens = self._tensor(pre_lens, i32)
            meta.max_seqlen_q = max(b - a for a, b in zip(cu, cu[1:]))
        input_ids = self._tensor(ids, i64)
        self._gather_pending(input_ids, dst, src, prev)
        return input_ids, meta, sample_rows

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
            return logits if len(rows) == b else logits[rows]
        ids, meta, rows = self.prepare(items, prev)
        hidden = self.model(ids, meta, self.kv_caches)
        return self.model.compute_logits(hidden[rows])

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
        bs, b = self.block_size, len(seqs)
        tables = self._pinned(f"tables{slot}", (width, self.max_blocks_per_seq), torch.int32)
        t = tables.numpy()
        t.fill(0)
        c = np.empty(b, dtype=np.int64)
        plan_t = self._pinned(f"plan{slot}", (1 + 3 * k, width), torch.int64)
        plan = plan_t.numpy()
        dst, src = [], []
        for i, seq in enumerate(seqs):
            t[i, : len(seq.block_ids)] = seq.block_ids
            c[i] = seq.num_computed_tokens
            plan[0, i], row = self._input_token(seq, int(c[i]), prev)
            if row is not None:
                dst.append(i)
                src.append(row)
        plan[:, b:] = 0
        plan[1 + 2 * k :, b:] = 0  # padding rows: context 0
        plan[1 + k : 1 + 2 * k, b:] = -1  # and no slot
        j = np.arange(k)[None, :]
        p = c[:, None] + j  # (b, k) positions
        valid = j < np.asarray(rooms)[:, None]
        plan[1 : 1 + k, :b] = np.where(valid, p, 0).T
        plan[1 + k : 1 + 2 * k, :b] = np.where(valid, kv_slots(t[:b], p, bs), -1).T
        plan[1 + 2 * k :, :b] = np.where(valid, p + 1, 1).T
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

    # --- multi-token steps in CUDA graphs ------------------------------------------------------

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
        q, bs = self.mt_q, self.block_size
        plan_t = self._pinned("mt_plan", (5, width * q), torch.int64)
        tables_t = self._pinned("mt_tables", (width, self.max_blocks_per_seq), torch.int32)
        plan, t = plan_t.numpy(), tables_t.numpy()
        t.fill(0)
        plan[0] = 0
        plan[1].reshape(width, q)[:] = np.arange(q)  # padding sequences: positions 0..q-1
        plan[2] = -1
        plan[3] = q
        rows: list[int] = []
        for i, (seq, n) in enumerate(items):
            c, base = seq.num_computed_tokens, i * q
            toks = seq.all_token_ids[c : c + n]
            if len(toks) < n:  # a speculative item: the last sampled token, then the drafts
                toks = toks + seq.spec_token_ids[: n - len(toks)]
            t[i, : len(seq.block_ids)] = seq.block_ids
            plan[0, base : base + n] = toks
            plan[1, base : base + q] = np.arange(c, c + q)
            real = np.arange(c, c + n)
            plan[2, base : base + n] = kv_slots(t[i], real, bs)
            plan[3, i] = c + q  # bottom-right causal: real query j sees positions <= c + j
            first = max(c, seq.num_tokens - 1) - c  # rows from the last known token on
            rows.extend(range(base + first, base + n))
        plan[4, : len(rows)] = rows
        plan[4, len(rows) :] = 0
        return plan_t, tables_t, len(rows)

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
