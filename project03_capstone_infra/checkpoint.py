"""Versioned, verified, sharded checkpoints on top of `torch.distributed.checkpoint` (DCP).

Layout of a checkpoint root:

    root/
      step_00000100/             one committed checkpoint per step
        .metadata                DCP's index of every shard
        __0_0.distcp ...         each rank's shards (DCP names them __<rank>_<n>.distcp)
        manifest.json            step, config hash, git commit, world size, time, sha256 per file
      latest                     text: the name of the newest committed step directory
      .tmp-step_00000110-<pid>/  a save in progress (never loaded; removed at the next start)
      quarantine/                checkpoints that failed verification, kept for inspection
      .lock                      flock of the trainer that owns the directory (run_lock.py)

Commit protocol (why a crash never leaves a checkpoint that looks whole): every rank writes its
shards into the temporary directory (DCP fsyncs each file), hashes its own files and sends the
digests to rank 0; rank 0 writes manifest.json, fsyncs it and the directory, then renames the
directory to step_XXXXXXXX and fsyncs the root. A directory named step_* therefore always has a
manifest that lists every file with its checksum. `latest` is replaced atomically after that; the
loader does not trust it blindly: it walks the step directories newest first, verifies each, and
loads the first good one, logging why each newer one was skipped.

Checkpoint files are untrusted input: the manifest passes a typed loader (manifest.py), a step
directory is verified without following links (verify.py), and DCP's pickles are read without
running code from them (safe_format.py). Retention counts only checkpoints that verify
(retention.py); rank 0 holds an OS lock on the root for the manager's life (run_lock.py) and
checks at construction that it can write there. This module re-exports those names.

What a checkpoint holds: the caller's state (model and optimizer from
`torch.distributed.checkpoint.state_dict.get_state_dict`, sharded DTensors), a JSON blob of
trainer state (step, LR schedule, data position, counters) and, per rank, the RNG states of
Python, NumPy, torch CPU and every CUDA device under the key `rng.rank_<r>`. DCP reshards model
and optimizer on load, so a run saved on N ranks resumes on M.

Saves are synchronous or asynchronous (`dcp.async_save`). An asynchronous save blocks training
only while the state is staged into host memory; the write, the checksums and the commit run on
a background thread with their own gloo process group, so they never interleave with the
training collectives. `SaveStats.blocking_s` is the time training was actually held.

Staging goes through `PersistentStager` (DCP's `AsyncStager` protocol): host buffers allocated
once (pinned on GPUs, optionally ahead of the first save with `prestage`) and reused by every
save, filled by non-blocking copies on a side stream that the optimizer step waits for on the
GPU. What `dcp.async_save` does with it (torch 2.11 to 2.13): it first replaces top-level
`Stateful` values by their `state_dict()` (a shallow copy; the manager passes plain dicts from
`get_state_dict`, so nothing is called), hands the dict to `stage()`, and, since `stage()`
returns a Future, its writer thread waits for that Future before `dcp.save` runs on the staged
dict; the caller gets the Future's completion as `AsyncSaveResponse.staging_completion`.
DCP's own `DefaultStager` stays available (`stager="dcp"`).
"""

from __future__ import annotations

import base64
import concurrent.futures
import datetime as _dt
import json
import os
import random
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.staging import AsyncStager

from shared.results import atomic_write_text

from .manifest import (  # noqa: F401 - re-exported: the checkpoint API in one place
    FORMAT_VERSION,
    MANIFEST,
    CheckpointError,
    Manifest,
    ManifestError,
    fsync_dir,
    hash_files,
    load_manifest,
    parse_step,
    read_manifest,
    sha256_file,
    step_dir_name,
)
from .retention import PrunePlan, plan_prune, prune, retained_steps  # noqa: F401
from .run_lock import RunDirLocked  # noqa: F401
from .safe_format import (  # noqa: F401
    SafeFileSystemReader,
    SafeLoadPlanner,
    UnsafeCheckpointError,
    first_error,
    read_full_state,
)
from .verify import (  # noqa: F401
    LATEST,
    QUARANTINE,
    CheckpointInfo,
    VerifiedCache,
    has_history,
    list_checkpoints,
    quarantine,
    read_latest,
    verify_checkpoint,
)

# --- RNG state (per rank), as JSON (read back through weights_only: see safe_format.py) -------


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.cpu().contiguous().numpy().tobytes()).decode("ascii")


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()


def capture_rng_state() -> str:
    """The RNG states of Python, NumPy, torch CPU and every CUDA device, as a JSON string."""
    np_state = np.random.get_state()
    state = {
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
        "numpy": {
            "kind": np_state[0],
            "key": np_state[1].tolist(),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "gauss": float(np_state[4]),
        },
        "torch_cpu": _b64(torch.get_rng_state()),
        "torch_cuda": (
            [_b64(s) for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_initialized() else []
        ),
    }
    return json.dumps(state)


def restore_rng_state(blob: str) -> None:
    state = json.loads(blob)
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state(
        (n["kind"], np.array(n["key"], dtype=np.uint32), n["pos"], n["has_gauss"], n["gauss"])
    )
    torch.set_rng_state(_unb64(state["torch_cpu"]))
    cuda_states = state.get("torch_cuda") or []
    if cuda_states and torch.cuda.is_available():
        # A run resumed on fewer devices restores the ones it has.
        for i, s in enumerate(cuda_states[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(_unb64(s), device=i)


def compare_states(
    a: dict[str, Any], b: dict[str, Any], prefixes=("model.", "optim.")
) -> list[str]:
    """Bitwise comparison of the tensors under `prefixes`; returns the differences (empty: equal)."""
    diffs = []
    keys_a = {k for k in a if k.startswith(prefixes)}
    keys_b = {k for k in b if k.startswith(prefixes)}
    for k in sorted(keys_a ^ keys_b):
        diffs.append(f"{k}: only in {'first' if k in keys_a else 'second'}")
    for k in sorted(keys_a & keys_b):
        x, y = a[k], b[k]
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.dtype != y.dtype or x.shape != y.shape:
                diffs.append(f"{k}: {x.dtype}{tuple(x.shape)} vs {y.dtype}{tuple(y.shape)}")
                continue
            xb = x.contiguous().reshape(-1).view(torch.uint8)
            yb = y.contiguous().reshape(-1).view(torch.uint8)
            if not torch.equal(xb, yb):
                diff = (
                    (x.double() - y.double()).abs().max().item() if x.is_floating_point() else None
                )
                diffs.append(f"{k}: bits differ (max abs diff {diff})")
        elif x != y:
            diffs.append(f"{k}: {repr(x)[:200]} vs {repr(y)[:200]}")
    return diffs


# --- staging for async saves: host buffers kept across saves ----------------------------------

_Path = tuple  # a leaf's position in a nested state dict: (("d", key) | ("l", index), ...)


def _walk(obj: Any, path: _Path = ()):
    """(path, tensor) for every tensor leaf of a nested dict / list / tuple, in a fixed order."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk(v, (*path, ("d", k)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _walk(v, (*path, ("l", i)))


def _rebuild(obj: Any, staged: dict, path: _Path = ()) -> Any:
    """A new container tree with every tensor replaced by its staged copy and every other value
    deep-copied (a value, never a reference to the caller's object)."""
    import copy

    if isinstance(obj, torch.Tensor):
        return staged[path]
    if isinstance(obj, dict):
        return {k: _rebuild(v, staged, (*path, ("d", k))) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        out = [_rebuild(v, staged, (*path, ("l", i))) for i, v in enumerate(obj)]
        return out if isinstance(obj, list) else tuple(out)
    return copy.deepcopy(obj)


def _dtensor_type():
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without DTensor
        return None
    return DTensor


def _local(t: torch.Tensor, dtensor_type) -> torch.Tensor:
    return t.to_local() if dtensor_type is not None and isinstance(t, dtensor_type) else t


def _leaf_meta(t: torch.Tensor, dtensor_type) -> tuple:
    """What the staging buffer of a leaf depends on: a change rebuilds the buffers."""
    if dtensor_type is not None and isinstance(t, dtensor_type):
        loc = t.to_local()
        return (
            "dtensor",
            t.dtype,
            tuple(loc.shape),
            loc.device,
            tuple(t.shape),
            tuple(t.stride()),
            t.device_mesh,
            tuple(t.placements),
        )
    return ("tensor", t.dtype, tuple(t.shape), t.device)


@dataclass
class _Slot:
    buf: torch.Tensor  # host memory of the leaf's local data, owned by the stager
    staged: torch.Tensor  # what the staged state dict holds: buf, or a DTensor around it
    pinned: bool


class PersistentStager(AsyncStager):
    """DCP `AsyncStager` that keeps its host buffers across saves (pinned memory on GPUs).

    The first `stage` (or an earlier `build`) allocates one host buffer per tensor of the state
    dict: the LOCAL data of a DTensor (an FSDP2 shard), or a plain tensor as it is. Buffers of
    CUDA tensors are page-locked (anonymous memory mapped for that buffer alone, faulted in,
    then registered with `cudaHostRegister`; small ones come from the CUDA host allocator) so
    the device-to-host copy is a real DMA that overlaps training. Every later save with the
    same structure (same keys, dtypes, shapes, devices, meshes and placements) copies into the
    same buffers; a change rebuilds them.

    `stage(state_dict)` returns a Future of the staged state dict:
    - CUDA tensors are copied with non-blocking copies on a stream of the stager's own that
      first waits for the caller's current stream (so the values are those of the step that
      just ran), and an event is recorded after the copies; the Future completes on the
      stager's thread once the event has completed. Until then the caller must not modify the
      sources: `wait_on_current_stream()` makes the caller's stream wait for the copy (no host
      block), `synchronize_staging()` waits on the host.
    - CPU tensors (optimizer step counters, ...) are copied before `stage` returns, and every
      non-tensor value (RNG state, JSON, learning rates) is deep-copied: nothing in the staged
      dict aliases the caller's objects.
    - A DTensor comes back as a DTensor with the same mesh, placements, global shape and stride
      around the host copy of its local shard (what DCP's own stager produces), so DCP plans
      and writes it as it would the original.
    Without CUDA (or with `pin_memory=False`) buffers are plain memory and copies synchronous.

    The staged dict is valid until the next `stage`, which overwrites the same buffers: a caller
    must let the previous save finish writing first (`CheckpointManager` does). Errors while
    staging are delivered through the Future (so DCP's writer fails the save) rather than
    raised from `stage`.
    """

    _synchronize_after_execute = False  # DCP's AsyncStager protocol: stage() returns a Future

    def __init__(self, *, pin_memory: bool | None = None, small_bytes: int = 1 << 20) -> None:
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self.small_bytes = small_bytes  # below this, pinned buffers come from the host allocator
        self._dt = _dtensor_type()
        self._lock = threading.RLock()
        self._signature: list | None = None
        self._slots: dict[_Path, _Slot] = {}
        self._registered: list[tuple[int, Any]] = []  # (pointer, mmap) registered with CUDA
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self._events: list[tuple[torch.device, torch.cuda.Event]] = []
        self._future: concurrent.futures.Future | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self.builds = 0
        self.last_build: dict | None = None  # seconds, bytes, pinned bytes, tensors
        self.last_stage_s = 0.0  # host time of the last stage() call

    @property
    def should_synchronize_after_execute(self) -> bool:
        return self._synchronize_after_execute

    # -- buffers --

    def _alloc(self, like: torch.Tensor) -> tuple[torch.Tensor, bool, float]:
        """A host tensor of like's shape and dtype owning exactly its own storage (DCP copies a
        tensor whose storage is larger than the tensor); pinned when like is on a GPU."""
        import mmap

        nbytes = like.numel() * like.element_size()
        if not (self.pin_memory and like.is_cuda) or nbytes == 0:
            return torch.empty(like.shape, dtype=like.dtype), False, 0.0
        if nbytes < self.small_bytes:
            return torch.empty(like.shape, dtype=like.dtype, pin_memory=True), True, 0.0
        # Large: the CUDA host allocator would round up to a power of two (up to 2x the memory
        # pinned); a mapping of exactly this size is page-aligned and shares no page.
        mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)
        raw = torch.frombuffer(mm, dtype=torch.uint8)
        raw.zero_()  # fault the pages in (parallel), so that registering only locks them
        t0 = time.perf_counter()
        err = int(torch.cuda.cudart().cudaHostRegister(raw.data_ptr(), nbytes, 0))
        pin_s = time.perf_counter() - t0
        if err != 0:
            raise CheckpointError(f"cudaHostRegister of {nbytes} bytes failed (cudaError {err})")
        self._registered.append((raw.data_ptr(), mm))
        return raw.view(like.dtype).view(like.shape), True, pin_s

    def _free(self) -> None:
        self._slots = {}
        self._signature = None
        for ptr, _mm in self._registered:
            torch.cuda.cudart().cudaHostUnregister(ptr)
        # The mappings go when the last tensor viewing them does (a staged dict still held by
        # someone stays readable, just no longer page-locked).
        self._registered = []

    def _build(self, leaves: list, signature: list) -> None:
        t0 = time.perf_counter()
        self._wait_copies()
        self._free()
        slots, total, pinned, pin_s = {}, 0, 0, 0.0
        for path, t in leaves:
            loc = _local(t, self._dt)
            buf, is_pinned, dt = self._alloc(loc)
            pin_s += dt
            staged = buf
            if loc is not t:  # a DTensor: same mesh, placements, global shape and stride
                staged = self._dt(buf, t._spec, requires_grad=False)
            slots[path] = _Slot(buf, staged, is_pinned)
            n = buf.numel() * buf.element_size()
            total += n
            pinned += n if is_pinned else 0
        self._slots, self._signature = slots, signature
        self.builds += 1
        self.last_build = {
            "seconds": time.perf_counter() - t0,
            "register_s": pin_s,
            "bytes": total,
            "pinned_bytes": pinned,
            "tensors": len(slots),
        }

    def _signature_of(self, state_dict: dict) -> tuple[list, list]:
        leaves = list(_walk(state_dict))
        return leaves, [(p, _leaf_meta(t, self._dt)) for p, t in leaves]

    def build(self, state_dict: dict) -> bool:
        """Allocate (and pin) the buffers for this state dict's structure now, e.g. at start-up,
        so that the first save does not pay for it. Copies nothing. Returns whether it built."""
        with self._lock, torch.no_grad():
            leaves, sig = self._signature_of(state_dict)
            if sig == self._signature:
                return False
            self._build(leaves, sig)
            return True

    @property
    def staged_bytes(self) -> int:
        return sum(s.buf.numel() * s.buf.element_size() for s in self._slots.values())

    # -- staging --

    def _stream(self, device: torch.device) -> torch.cuda.Stream:
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device=device)
        return self._streams[device]

    def _wait_copies(self) -> None:
        for _, ev in self._events:
            ev.synchronize()
        self._events = []

    def stage(self, state_dict: dict) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        t0 = time.perf_counter()
        try:
            with self._lock, torch.no_grad():
                leaves, sig = self._signature_of(state_dict)
                self._wait_copies()  # a previous copy into these buffers (normally long done)
                if sig != self._signature:
                    self._build(leaves, sig)
                by_device: dict[torch.device, list] = {}
                for path, t in leaves:
                    slot, src = self._slots[path], _local(t, self._dt)
                    if src.is_cuda and slot.pinned:
                        by_device.setdefault(src.device, []).append((slot.buf, src))
                    else:
                        slot.buf.copy_(src)  # synchronous: the value at this call
                staged = _rebuild(state_dict, {p: s.staged for p, s in self._slots.items()})
                events, keep = [], []
                for device, pairs in by_device.items():
                    stream = self._stream(device)
                    stream.wait_stream(torch.cuda.current_stream(device))
                    with torch.cuda.stream(stream):
                        for buf, src in pairs:
                            buf.copy_(src, non_blocking=True)
                    ev = torch.cuda.Event()
                    ev.record(stream)
                    events.append((device, ev))
                    keep.extend(src for _, src in pairs)  # sources stay alive until copied
                self._events = events
        except Exception as e:  # noqa: BLE001 - reported through the Future, see the docstring
            fut.set_exception(e)
            self._future = fut
            return fut
        finally:
            self.last_stage_s = time.perf_counter() - t0
        if not events:
            fut.set_result(staged)
            self._future = fut
            return fut
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(1, "ckpt-staging")
        self._future = self._executor.submit(self._finish, events, staged, keep)
        return self._future

    @staticmethod
    def _finish(events: list, staged: dict, keep: list) -> dict:
        for _, ev in events:
            ev.synchronize()  # releases the GIL while it waits
        del keep
        return staged

    def wait_on_current_stream(self) -> bool:
        """Make the caller's current CUDA stream wait for the staging copy (the host does not
        block): kernels queued after this, e.g. the optimizer step, run once the copy is done.
        Returns False when there is no copy in flight."""
        events = self._events
        for device, ev in events:
            torch.cuda.current_stream(device).wait_event(ev)
        return bool(events)

    def synchronize_staging(self) -> None:
        """Block until the last staging has completed (re-raises its error)."""
        if self._future is not None:
            self._future.result()

    def close(self) -> None:
        with self._lock:
            try:
                if self._future is not None:
                    self._future.exception()  # wait; an error was reported to DCP already
                self._wait_copies()
            finally:
                self._free()
                self._future = None
                if self._executor is not None:
                    self._executor.shutdown(wait=True)
                    self._executor = None


# --- the manager -----------------------------------------------------------------------------


@dataclass
class SaveStats:
    step: int
    mode: str  # "sync" or "async"
    blocking_s: float  # training held: the whole save (sync) or staging only (async)
    total_s: float | None = None  # until committed (async: filled in when the commit lands)
    bytes: int | None = None
    path: str | None = None


@dataclass
class LoadResult:
    step: int
    path: Path
    extra: dict
    seconds: float  # verification + read + resharding
    verify_s: float
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (directory, why)
    rng_restored: bool = True
    manifest: dict = field(default_factory=dict)  # the checked manifest (its config included)


def _dist_on() -> bool:
    return dist.is_available() and dist.is_initialized()


def _single_process_quiet():
    """DCP warns on every call without a process group, which is the intended use here."""
    import contextlib
    import warnings

    stack = contextlib.ExitStack()
    if not _dist_on():
        stack.enter_context(warnings.catch_warnings())
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    return stack


class CheckpointManager:
    """Saves, verifies, loads and prunes checkpoints of one run (see the module docstring).

    Every rank constructs one with the same arguments; with a process group, `save` and `load`
    are collective. Without one (a single process), they run locally.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        *,
        keep_last: int = 3,
        milestone_every: int = 0,
        config_hash: str = "",
        config: dict | None = None,
        git_commit: str | None = None,
        write_threads: int = 1,
        verify_threads: int = 8,
        async_staging: bool | None = None,
        stager: str = "persistent",
        reuse_staging_buffers: bool = False,
        log: Callable[[str], None] | None = None,
        warn: Callable[[str], None] | None = None,
        on_commit: Callable[[SaveStats], None] | None = None,
    ) -> None:
        retained_steps([], keep_last, milestone_every)  # validates both
        if write_threads < 1:
            raise ValueError(f"write_threads must be >= 1, got {write_threads}")
        if stager not in ("persistent", "dcp"):
            raise ValueError(f"stager must be 'persistent' or 'dcp', got {stager!r}")
        self.root = Path(root)
        self.keep_last, self.milestone_every = keep_last, milestone_every
        self.config_hash, self.config, self.git_commit = config_hash, config or {}, git_commit
        self.write_threads, self.verify_threads = write_threads, verify_threads
        self._log = log or (lambda msg: None)
        self._warn = warn or self._log
        self._on_commit = on_commit
        self.rank = dist.get_rank() if _dist_on() else 0
        self.world_size = dist.get_world_size() if _dist_on() else 1
        # A gloo group of our own: async saves run collectives on a background thread, which
        # must never interleave with the training collectives on the default group; gloo also
        # gives DCP the CPU backend that async_save needs next to NCCL.
        self.pg = dist.new_group(backend="gloo") if _dist_on() else None
        use_cuda = torch.cuda.is_available()
        # On GPUs: stage into pinned host memory with non-blocking copies on a side stream.
        self.async_staging = use_cuda if async_staging is None else async_staging
        # "persistent" (default): PersistentStager, host buffers kept across saves. "dcp": DCP's
        # DefaultStager, a fresh one per save unless reuse_staging_buffers (on torch 2.11 with
        # CUDA a reused DefaultStager failed at its second save on an H200: KeyError: <class
        # 'type'>, then RecursionError, inside DCP's StateDictStager).
        self.stager_kind = stager
        self.reuse_staging_buffers = reuse_staging_buffers
        self.async_disabled = False  # set once an async save has failed: saves go synchronous
        self._stager = None
        self._prestage: threading.Thread | None = None
        self._prestage_error: BaseException | None = None
        self._pending: tuple[SaveStats, concurrent.futures.Future, float] | None = None
        self._staging_future: concurrent.futures.Future | None = None
        self._finalizer: threading.Thread | None = None
        self._finalizer_error: BaseException | None = None
        self.last_committed: SaveStats | None = None
        self._verified = VerifiedCache()  # step directories verified (or written) here
        self._lock_key: str | None = None
        # Rank 0 owns the directory: it takes the run lock, checks that it can write, and only
        # then removes interrupted saves. Its verdict goes to every rank, so that all of them
        # stop with the same message instead of waiting for rank 0 at the next collective.
        error = self._open_root() if self.rank == 0 else None
        error = self._broadcast(error)
        if error is not None:
            raise (RunDirLocked if error[0] == "locked" else CheckpointError)(error[1])

    def _open_root(self) -> tuple[str, str] | None:
        from . import run_lock

        root = self.root
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            return "io", f"checkpoint directory {root} cannot be made ({e.strerror or e})"
        if not root.is_dir():
            return "io", f"checkpoint directory {root} exists and is not a directory"
        try:
            self._lock_key = run_lock.acquire(root)
        except RunDirLocked as e:
            return "locked", str(e)
        except OSError as e:
            return "io", f"checkpoint directory {root} is not writable ({e.strerror or e})"
        # A real write (permissions, a read-only mount, a full disk), found now, not at the
        # first save: create, write, fsync and remove a file.
        probe = root / f".tmp-write-probe-{os.getpid()}"
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, b"probe")
                os.fsync(fd)
            finally:
                os.close(fd)
                probe.unlink(missing_ok=True)
        except OSError as e:
            self._release_lock()
            return "io", f"checkpoint directory {root} is not writable ({e.strerror or e})"
        for stale in root.glob(".tmp-*"):  # interrupted saves and deletions: never loadable
            if stale.is_symlink() or not stale.is_dir():
                stale.unlink(missing_ok=True)
            else:
                shutil.rmtree(stale, ignore_errors=True)
        return None

    def _release_lock(self) -> None:
        from . import run_lock

        if self._lock_key is not None:
            run_lock.release(self._lock_key)
            self._lock_key = None

    # -- small collective helpers on our group --

    def _barrier(self) -> None:
        if self.pg is not None:
            dist.barrier(group=self.pg)

    def _broadcast(self, obj: Any) -> Any:
        if self.pg is None:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.pg)
        return box[0]

    def _gather(self, obj: Any) -> list[Any] | None:
        if self.pg is None:
            return [obj]
        out = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0, group=self.pg)
        return out

    # -- saving --

    def _tmp_dir(self, step: int) -> Path:
        # Same name on every rank (rank 0 chooses it), unique per save attempt.
        name = f".tmp-{step_dir_name(step)}-{os.getpid()}-{time.monotonic_ns()}"
        return self.root / self._broadcast(name)

    def _state(self, state: dict, extra: dict) -> dict:
        full = dict(state)
        full["extra"] = json.dumps(extra, sort_keys=True)
        full[f"rng.rank_{self.rank}"] = capture_rng_state()
        return full

    def save(
        self, step: int, state: dict, extra: dict | None = None, *, mode: str = "sync"
    ) -> SaveStats:
        """Save `state` (a dict of state dicts / Stateful objects) as step `step`.

        mode "sync": returns once the checkpoint is committed. mode "async": returns once the
        state is staged (on GPU with async staging, once the copy is enqueued: call
        `wait_staging()` before the next optimizer step); the write and commit finish on a
        background thread. A save first waits for the previous one to commit.
        """
        if mode not in ("sync", "async"):
            raise ValueError(f"mode must be 'sync' or 'async', got {mode!r}")
        import torch.distributed.checkpoint as dcp

        t0 = time.perf_counter()
        mode = self._wait_before_save(mode)  # one save in flight at a time
        tmp = self._tmp_dir(step)
        if self.rank == 0:
            tmp.mkdir(parents=True)
        self._barrier()
        full = self._state(state, extra or {})
        writer = dcp.FileSystemWriter(str(tmp), thread_count=self.write_threads, sync_files=True)
        stats = SaveStats(step=step, mode=mode, blocking_s=0.0)
        if mode == "sync":
            with _single_process_quiet():
                dcp.save(
                    full, storage_writer=writer, process_group=self.pg, no_dist=self.pg is None
                )
            self._commit(stats, tmp, t0)
            stats.blocking_s = time.perf_counter() - t0
            return stats

        stager = self._async_stager()
        if torch.cuda.is_available() and not isinstance(stager, PersistentStager):
            # DCP's stager copies on its own stream: let the optimizer step it copies finish.
            # (PersistentStager's stream waits for the current stream instead.)
            torch.cuda.current_stream().synchronize()
        with _single_process_quiet():
            resp = dcp.async_save(
                full,
                storage_writer=writer,
                process_group=self.pg,
                async_stager=stager,
                no_dist=self.pg is None,
            )
        if hasattr(resp, "upload_completion"):  # async staging: AsyncSaveResponse
            self._staging_future, upload = resp.staging_completion, resp.upload_completion
        else:
            self._staging_future, upload = None, resp
        stats.blocking_s = time.perf_counter() - t0
        self._pending = (stats, upload, t0)
        self._finalizer_error = None
        self._finalizer = threading.Thread(
            target=self._finalize, args=(stats, upload, tmp, t0), name="ckpt-commit", daemon=True
        )
        self._finalizer.start()
        return stats

    def _async_stager(self):
        """The stager for this async save (None: let async_save stage synchronously)."""
        self._join_prestage()
        if self.stager_kind == "persistent":
            if self._stager is None:
                self._stager = PersistentStager(pin_memory=self.async_staging)
            return self._stager
        if self._stager is not None and not self.reuse_staging_buffers:
            self._stager.close()  # the previous save has committed (waited for above)
            self._stager = None
        if self._stager is None:
            try:
                from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
            except ImportError:  # torch < 2.9: async_save stages synchronously in the call
                return None
            on = self.async_staging
            self._stager = DefaultStager(
                StagingOptions(
                    use_pinned_memory=on,
                    use_shared_memory=False,
                    use_async_staging=on,
                    use_non_blocking_copy=on,
                )
            )
        return self._stager

    def prestage(self, state: dict, *, background: bool = False) -> None:
        """Allocate (and on GPUs pin) the async staging buffers for `state` ahead of the first
        async save, e.g. when training starts, instead of inside that save. With `background`
        it runs on a thread while training goes on; the next save waits for it. Only the
        persistent stager has buffers to prepare; otherwise this does nothing."""
        if self.stager_kind != "persistent" or self.async_disabled:
            return
        self._join_prestage()
        if self._stager is None:
            self._stager = PersistentStager(pin_memory=self.async_staging)
        stager = self._stager
        full = self._state(state, {})  # the structure a save has (non-tensor values aside)

        def run() -> None:
            try:
                stager.build(full)
            except BaseException as e:  # the save builds again and reports a real failure
                self._prestage_error = e

        if not background:
            run()
        else:
            self._prestage = threading.Thread(target=run, name="ckpt-prestage", daemon=True)
            self._prestage.start()
        self._join_prestage(wait=not background)

    def wait_prestage(self) -> None:
        """Wait for a background `prestage` to finish."""
        self._join_prestage()

    def _join_prestage(self, wait: bool = True) -> None:
        if self._prestage is not None and wait:
            self._prestage.join()
            self._prestage = None
        if self._prestage_error is not None:
            err, self._prestage_error = self._prestage_error, None
            self._warn(f"preparing the async staging buffers failed ({err}); the save builds them")

    @property
    def prestaging(self) -> bool:
        return self._prestage is not None and self._prestage.is_alive()

    def staging_info(self) -> dict | None:
        """The persistent stager's counters: builds, the last build (seconds, bytes, pinned
        bytes, tensors) and the host time of the last stage call; None for other stagers."""
        s = self._stager
        if not isinstance(s, PersistentStager):
            return None
        return {"builds": s.builds, "last_build": s.last_build, "last_stage_s": s.last_stage_s}

    def release_staging(self) -> None:
        """Free the staging buffers (after waiting for a save in flight); the next async save
        or `prestage` allocates them again."""
        self.wait()
        self._join_prestage()
        if self._stager is not None:
            self._stager.close()
            self._stager = None

    def wait_staging(self) -> float:
        """Call before mutating what the last async save staged (the optimizer step). With the
        persistent stager on a GPU, the current stream waits for the staging copy (the host
        does not block); otherwise block until the copy is done. A staging error is not raised
        here: the save fails, and the next save reports it. Returns the seconds blocked here."""
        if self._staging_future is None:
            return 0.0
        t0 = time.perf_counter()
        fut, self._staging_future = self._staging_future, None
        stager = self._stager
        if not (isinstance(stager, PersistentStager) and stager.wait_on_current_stream()):
            fut.exception()  # waits; an error is surfaced by the upload future, see above
        waited = time.perf_counter() - t0
        if self._pending is not None:
            self._pending[0].blocking_s += waited
        return waited

    def _finalize(
        self, stats: SaveStats, upload: concurrent.futures.Future, tmp: Path, t0: float
    ) -> None:
        try:
            upload.result()
            self._commit(stats, tmp, t0)
        except BaseException as e:  # surfaced by wait()
            self._finalizer_error = e

    def _wait_before_save(self, mode: str) -> str:
        """Let the previous save land. If an async save failed (on any rank), say so, and make
        this and every later save synchronous: training keeps its checkpoints instead of dying at
        every second save (torch 2.11's stager failed that way on a reused stager)."""
        failed: CheckpointError | None = None
        try:
            self.wait()
        except CheckpointError as e:
            failed = e
        flag = torch.tensor([1 if failed is not None else 0])
        if self.pg is not None:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.pg)
        if int(flag.item()):
            if not self.async_disabled:
                self._warn(
                    f"an async checkpoint save failed ({failed or 'on another rank'}); it was "
                    "not committed, and every save from now on is synchronous"
                )
            self.async_disabled = True
        return "sync" if self.async_disabled else mode

    def wait(self) -> SaveStats | None:
        """Wait for an in-flight async save to commit; re-raise its error if it failed."""
        self.wait_staging()
        if self._finalizer is None:
            return None
        self._finalizer.join()
        self._finalizer = None
        stats = self._pending[0] if self._pending else None
        self._pending = None
        if self._finalizer_error is not None:
            err, self._finalizer_error = self._finalizer_error, None
            raise CheckpointError(f"async save failed: {err}") from err
        return stats

    @property
    def in_flight(self) -> bool:
        return self._finalizer is not None and self._finalizer.is_alive()

    def _commit(self, stats: SaveStats, tmp: Path, t0: float) -> None:
        # Each rank hashes the shards it wrote; rank 0 writes the manifest and renames.
        mine = sorted(tmp.glob(f"__{self.rank}_*.distcp"))
        digests = hash_files(mine, threads=self.verify_threads)
        gathered = self._gather(digests)
        final = self.root / step_dir_name(stats.step)
        if self.rank == 0:
            files: dict = {}
            for d in gathered or []:
                files.update(d)
            files.update(hash_files([tmp / ".metadata"]))
            manifest = {
                "format_version": FORMAT_VERSION,
                "step": stats.step,
                "config_hash": self.config_hash,
                "config": self.config,
                "git_commit": self.git_commit,
                "world_size": self.world_size,
                "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "unix_time": time.time(),
                "save_mode": stats.mode,
                "torch": torch.__version__,
                "files": files,
            }
            mpath = tmp / MANIFEST
            with open(mpath, "w") as f:
                json.dump(manifest, f, indent=2, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            fsync_dir(tmp)
            if final.exists():  # a re-save of the same step (e.g. after a rollback): replace it
                trash = self.root / f".tmp-{final.name}-replaced-{os.getpid()}"
                os.replace(final, trash)
                shutil.rmtree(trash, ignore_errors=True)
            os.replace(tmp, final)
            fsync_dir(self.root)
            self._verified.remember(final)  # hashed above, from the bytes just written
            atomic_write_text(self.root / LATEST, final.name + "\n")
            stats.bytes = sum(v["bytes"] for v in files.values())
            self._apply_retention()
        stats.bytes = self._broadcast(stats.bytes)
        stats.total_s = time.perf_counter() - t0
        stats.path = str(final)
        self.last_committed = stats
        if self._on_commit is not None:
            self._on_commit(stats)

    def _apply_retention(self) -> None:
        """Retention after a commit (rank 0). Counts only checkpoints that verify (each is
        hashed once per process); a failure here is reported, the commit stands."""
        try:
            plan = plan_prune(
                self.root,
                self.keep_last,
                self.milestone_every,
                threads=self.verify_threads,
                cache=self._verified,
            )
            removed = prune(self.root, self.keep_last, self.milestone_every, plan=plan)
        except OSError as e:
            self._warn(f"retention failed ({e}); nothing more was removed")
            return
        if removed:
            self._log(f"retention: removed {', '.join(p.name for p in removed)}")
        for p, why in plan.unverified:
            self._warn(f"retention: {p.name} does not verify and is not counted: {why}")

    # -- loading --

    def _choose(self, explicit: Path | None) -> tuple[Path | None, list[tuple[str, str]], float]:
        """Rank 0 verifies candidates newest first; everyone gets the choice."""
        choice, manifest, skipped, verify_s = None, None, [], 0.0
        if self.rank == 0:
            t0 = time.perf_counter()
            candidates = (
                [explicit] if explicit is not None else list(reversed(list_checkpoints(self.root)))
            )
            for path in candidates:
                root = None if explicit is not None else self.root
                info = verify_checkpoint(path, threads=self.verify_threads, root=root)
                if info.ok:
                    choice = path
                    manifest = info.manifest
                    self._verified.remember(path)
                    break
                why = "; ".join(info.problems)
                skipped.append((path.name, why))
                self._warn(f"checkpoint {path.name} is not usable: {why}")
                if explicit is None:  # loading goes on whether or not the move succeeds
                    quarantine(self.root, path, why, self._warn)
            verify_s = time.perf_counter() - t0
            latest = read_latest(self.root)
            if choice is not None and explicit is None and latest and latest != choice.name:
                self._warn(
                    f"'latest' names {latest} but the newest good checkpoint is {choice.name}"
                )
        return self._broadcast((choice, manifest, skipped, verify_s))

    def has_checkpoint(self) -> bool:
        """Whether a step directory exists (verified or not)."""
        found = bool(list_checkpoints(self.root)) if self.rank == 0 else False
        return bool(self._broadcast(found))

    def has_history(self) -> bool:
        """Whether a run ever committed a checkpoint here (step directories, quarantined
        ones, or `latest`): such a run does not silently start over."""
        found = has_history(self.root) if self.rank == 0 else False
        return bool(self._broadcast(found))

    def load(self, state: dict, path: str | os.PathLike | None = None) -> LoadResult | None:
        """Load the newest good checkpoint (or `path`) into `state` in place (DCP reshards).

        Returns None when no checkpoint was ever committed here. Raises CheckpointError when
        checkpoints exist but none verifies, when the run has checkpointed before but none is
        left (all quarantined or removed: a silent fresh start would throw the run away), or
        when the explicit `path` does not verify.

        Nothing in the checkpoint runs code: DCP's `.metadata` goes through an allow-listed
        unpickler and non-tensor values through `torch.load(weights_only=True)`, and only the
        files the manifest names are read (see safe_format.py)."""
        import torch.distributed.checkpoint as dcp

        t0 = time.perf_counter()
        self.wait()
        explicit = Path(path) if path is not None else None
        if explicit is None and not self.has_checkpoint():
            if not self.has_history():
                return None
            raise CheckpointError(
                f"{self.root} has held checkpoints of this run (see {QUARANTINE}/ and "
                f"{LATEST}) but none is left that verifies: refusing to start over from step 0. "
                "Restore a checkpoint, or pass --resume never to start from scratch."
            )
        choice, manifest_dict, skipped, verify_s = self._choose(explicit)
        if choice is None:
            reasons = "; ".join(f"{n}: {w}" for n, w in skipped)
            raise CheckpointError(f"no good checkpoint under {self.root}: {reasons}")
        manifest = Manifest.from_json(manifest_dict, f"{choice.name}: {MANIFEST}")
        reader, planner = SafeFileSystemReader(choice, manifest), SafeLoadPlanner()
        try:
            keys = reader.read_metadata().state_dict_metadata
            rng_key = f"rng.rank_{self.rank}"
            full = dict(state)
            full["extra"] = ""
            if rng_key in keys:
                full[rng_key] = ""
            with _single_process_quiet():
                dcp.load(
                    full,
                    storage_reader=reader,
                    planner=planner,
                    process_group=self.pg,
                    no_dist=self.pg is None,
                )
            extra = json.loads(full["extra"]) if isinstance(full["extra"], str) else None
            if not isinstance(extra, dict):
                raise CheckpointError("its 'extra' entry is not a JSON object")
            rng_restored = rng_key in keys
            if rng_restored:
                restore_rng_state(full[rng_key])
        except (Exception, CheckpointException) as e:  # DCP's is a BaseException
            why = reader.refusal or planner.refusal
            why = why or (str(e) if isinstance(e, CheckpointError) else first_error(e))
            raise CheckpointError(f"{choice.name} could not be loaded: {why}") from e
        for k in state:
            state[k] = full[k]
        if not rng_restored:
            self._warn(
                f"{choice.name} has no RNG state for rank {self.rank} (saved on fewer ranks): "
                "this rank keeps its seeded RNG"
            )
        return LoadResult(
            step=manifest.step,
            path=choice,
            extra=extra,
            seconds=time.perf_counter() - t0,
            verify_s=verify_s,
            skipped=skipped,
            rng_restored=rng_restored,
            manifest=manifest.raw,
        )

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._join_prestage()
            if self._stager is not None:
                self._stager.close()
                self._stager = None
            self._release_lock()


def stats_dict(stats: SaveStats | None) -> dict | None:
    return None if stats is None else asdict(stats)
