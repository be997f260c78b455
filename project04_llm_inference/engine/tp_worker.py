"""Tensor-parallel execution: worker processes that run every model call on their shard.

One scheduler, one model runner, one sampler and one commit path live in the engine's process,
which is rank 0. `load_model` starts ranks 1..N-1 (torch.multiprocessing, spawn) and returns
a `TensorParallelModel`: rank 0's shard behind the model interface the runner calls
(`model(ids, meta, kv_caches)` and `compute_logits(hidden)`). Each call first sends the call's
inputs (token ids, the attention metadata, the KV pool's size) to every worker through a
queue, then runs rank 0's shard; the workers run the same call on theirs, and the shards meet
in the layers' collectives (gloo on the CPU, NCCL on GPUs, one rank per GPU). So every runner
path that calls the model eagerly runs tensor-parallel unchanged, and only rank 0 samples.

The control plane is a queue per worker (a worker waits there between steps for as long as the
engine idles, with no collective timeout running); the data plane is the process group. The
inputs travel as host arrays, so on a GPU each call reads its metadata back first: TP steps
run eagerly, without CUDA graphs and without overlapping the host with the device.

Shutdown: `close()` (also run when the model is garbage-collected and at interpreter exit)
sends every worker an exit message, joins it and terminates what does not exit; workers are
daemonic and watch their parent, exiting when it is gone (a killed engine leaves no orphans);
Ctrl-C reaches the workers too, which exit quietly.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import threading
import time
import traceback
import weakref
from datetime import timedelta

import torch

JOIN_TIMEOUT_S = 30.0  # how long close() waits for a worker to exit before terminating it
PARENT_POLL_S = 1.0  # how often a worker checks that the engine's process still exists
# a collective that waits longer than this fails instead of hanging (a rank died mid-step)
GROUP_TIMEOUT_S = 600
_META_TENSORS = (
    "positions",
    "slot_mapping",
    "decode_block_tables",
    "decode_context_lens",
    "prefill_block_tables",
    "cu_seqlens_q",
    "prefill_context_lens",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _backend(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def _rank_device(device: torch.device, rank: int) -> torch.device:
    return torch.device("cuda", rank) if device.type == "cuda" else device


def _init_group(rank: int, size: int, port: int, device: torch.device):
    import torch.distributed as dist

    from ..model.parallel import TensorParallel

    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        _backend(device),
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=size,
        timeout=timedelta(seconds=GROUP_TIMEOUT_S),
        device_id=device if device.type == "cuda" else None,
    )
    return TensorParallel(rank=rank, size=size, group=dist.group.WORLD)


def _pack_call(ids: torch.Tensor, meta, num_blocks: int) -> dict:
    """The inputs of one model call as host arrays (what the workers rebuild the call from)."""
    fields = {k: v for k, v in vars(meta).items() if k not in _META_TENSORS}
    arrays = {
        k: getattr(meta, k).cpu().numpy() for k in _META_TENSORS if getattr(meta, k) is not None
    }
    return dict(ids=ids.cpu().numpy(), fields=fields, arrays=arrays, num_blocks=num_blocks)


def _unpack_call(call: dict, device: torch.device):
    from ..model.llama import AttnMetadata

    tensors = {k: None for k in _META_TENSORS}
    tensors.update({k: torch.from_numpy(a).to(device) for k, a in call["arrays"].items()})
    meta = AttnMetadata(**call["fields"], **tensors)
    return torch.from_numpy(call["ids"]).to(device), meta


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(PARENT_POLL_S)
        if os.getppid() != parent:
            os._exit(1)  # the engine is gone: nothing will ever send this rank work


def _worker_main(rank, size, port, spec, inbox, ready) -> None:
    """Rank `rank`: build its shard, then run each call rank 0 sends until told to exit."""
    threading.Thread(target=_watch_parent, args=(spec["parent"],), daemon=True).start()
    try:
        torch.set_num_threads(spec["threads"])
        device = _rank_device(torch.device(spec["device"]), rank)
        tp = _init_group(rank, size, port, device)
        model = _build(spec, device, tp)
        ready.put((rank, None))
        _serve(model, spec, device, inbox)
    except KeyboardInterrupt:
        pass  # Ctrl-C reaches every process of the terminal's group: rank 0 reports it
    except BaseException:
        ready.put((rank, traceback.format_exc()))
        raise
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def _build(spec: dict, device: torch.device, tp):
    from ..model.loader import build_model

    return build_model(
        spec["hf_config"],
        model_dir=spec["model_dir"],
        dtype=spec["dtype"],
        device=device,
        max_positions=spec["max_positions"],
        seed=spec["seed"],
        tp=tp,
        quantization=spec["quantization"],
    )


@torch.inference_mode()
def _serve(model, spec: dict, device: torch.device, inbox) -> None:
    cfg, kv = model.cfg, []
    while True:
        msg = inbox.get()
        if msg[0] == "exit":
            return
        if msg[0] == "forward":
            call = msg[1]
            if not kv or kv[0][0].shape[0] != call["num_blocks"]:
                kv = []  # rank 0 resized its pool (profiling, then the real one): follow it
                shape = (call["num_blocks"], spec["block_size"], cfg.num_key_value_heads)
                shape += (cfg.head_dim,)
                kv = [
                    tuple(torch.zeros(shape, dtype=spec["kv_dtype"], device=device) for _ in "kv")
                    for _ in range(cfg.num_hidden_layers)
                ]
            ids, meta = _unpack_call(call, device)
            model(ids, meta, kv)  # the hidden states stay here; rank 0 sends the rows it keeps
        elif msg[0] == "logits":
            import torch.distributed as dist

            rows = torch.empty(msg[1], dtype=spec["dtype"], device=device)
            dist.broadcast(rows, src=0, group=model.tp.group)
            model.compute_logits(rows)  # its part of the all-gather; rank 0 keeps the logits


class TensorParallelModel:
    """Rank 0's shard of a tensor-parallel model; each call is mirrored on the workers."""

    def __init__(self, model, workers, inboxes) -> None:
        self.model, self.workers, self.inboxes = model, workers, inboxes
        self.cfg, self.norm, self.tp = model.cfg, model.norm, model.tp
        self.tensor_parallel_size = model.tp.size
        # runs on close(), when the model is collected, or at interpreter exit
        self._finalizer = weakref.finalize(self, _shutdown, workers, inboxes)

    def __getattr__(self, name):
        if name == "model":
            raise AttributeError(name)
        return getattr(self.model, name)

    def _send(self, msg) -> None:
        for w, q in zip(self.workers, self.inboxes):
            if not w.is_alive():
                raise RuntimeError(
                    f"tensor-parallel worker {w.name} exited (code {w.exitcode}); see its error "
                    "above"
                )
            q.put(msg)

    def __call__(self, ids: torch.Tensor, meta, kv_caches) -> torch.Tensor:
        self._send(("forward", _pack_call(ids, meta, kv_caches[0][0].shape[0])))
        return self.model(ids, meta, kv_caches)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        hidden = hidden.contiguous()
        self._send(("logits", tuple(hidden.shape)))
        dist.broadcast(hidden, src=0, group=self.tp.group)
        return self.model.compute_logits(hidden)

    def close(self) -> None:
        """Stop the workers and leave the process group (idempotent)."""
        self._finalizer()


def _shutdown(workers, inboxes) -> None:
    import torch.distributed as dist

    for w, q in zip(workers, inboxes):
        if w.is_alive():
            with contextlib.suppress(OSError, ValueError):  # a queue already torn down
                q.put(("exit",))
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    for w in workers:
        w.join(max(0.0, deadline - time.monotonic()))
        if w.is_alive():
            w.terminate()
            w.join(5.0)
    if dist.is_initialized():
        dist.destroy_process_group()


def load_model(args, hf_config: dict, *, dtype, device, max_positions: int):
    """The engine's model: `build_model` in this process, or with tensor_parallel_size > 1,
    rank 0's shard as a `TensorParallelModel` with the other ranks started and loaded."""
    from ..model.loader import build_model
    from ..model.parallel import check_tensor_parallel
    from .model_runner import kv_cache_dtype

    size = args.tensor_parallel_size
    model_dir = None if args.load_format == "dummy" else args.model
    common = dict(model_dir=model_dir, dtype=dtype, max_positions=max_positions, seed=args.seed)
    if size == 1:
        return build_model(hf_config, device=device, quantization=args.quantization, **common)
    check_tensor_parallel(hf_config, size, device.type)
    if args.quantization == "fp8":
        from ..model.quant import check_fp8_device

        check_fp8_device(_rank_device(device, 0))
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if dist.is_initialized():
        raise RuntimeError(
            "tensor_parallel_size > 1 starts its own process group; this process already has one"
        )
    ctx = mp.get_context("spawn")
    port = _free_port()
    spec = dict(
        hf_config=hf_config,
        device=device.type,
        block_size=args.block_size,
        quantization=args.quantization,
        kv_dtype=kv_cache_dtype(args, dtype),
        parent=os.getpid(),
        threads=max(1, torch.get_num_threads() // size),
        **common,
    )
    ready = ctx.Queue()
    inboxes = [ctx.SimpleQueue() for _ in range(1, size)]
    workers = [
        ctx.Process(
            target=_worker_main,
            args=(r, size, port, spec, inboxes[r - 1], ready),
            name=f"tp-rank{r}",
            daemon=True,
        )
        for r in range(1, size)
    ]
    for w in workers:
        w.start()
    try:
        tp = _init_group(0, size, port, _rank_device(device, 0))
        model = build_model(
            hf_config,
            device=_rank_device(device, 0),
            tp=tp,
            quantization=args.quantization,
            **common,
        )
        started = 0
        while started < len(workers):
            try:
                rank, err = ready.get(timeout=PARENT_POLL_S)
            except queue.Empty:
                dead = [w.name for w in workers if not w.is_alive()]
                if dead:
                    raise RuntimeError(
                        f"tensor-parallel worker(s) {dead} exited while loading"
                    ) from None
                continue
            if err is not None:
                raise RuntimeError(f"tensor-parallel rank {rank} failed to start:\n{err}")
            started += 1
    except BaseException:
        _shutdown(workers, inboxes)
        raise
    return TensorParallelModel(model, workers, inboxes)


def shutdown(model) -> None:
    """Stop a tensor-parallel model's workers (nothing for a single-process model)."""
    if isinstance(model, TensorParallelModel):
        model.close()


__all__ = ["TensorParallelModel", "load_model", "shutdown"]
