"""The host staging of an asynchronous save: `PersistentStager`, a DCP `AsyncStager` whose host
buffers are kept across saves.

What torch.distributed.checkpoint (DCP) already provides, and what the manager uses of it:
`dcp.async_save` stages the state dict through an `AsyncStager` (its `stage()` may return a
Future), then writes it on a background thread while training goes on. DCP's own
`DefaultStager` (`StagingOptions`: pinned memory, shared memory, staging on a background
thread, non-blocking copies) copies every tensor to host memory and caches the host storages
while the same instance is reused (keyed by the source tensors' storages). What `dcp.async_save`
does with a stager (torch 2.11 to 2.13): it first replaces top-level `Stateful` values by their
`state_dict()` (a shallow copy; the manager passes plain dicts from `get_state_dict`, so nothing
is called), hands the dict to `stage()`, and, since `stage()` returns a Future, its writer
thread waits for that Future before `dcp.save` runs on the staged dict; the caller gets the
Future's completion as `AsyncSaveResponse.staging_completion`. DCP's `DefaultStager` stays
available to the manager (`stager="dcp"`).

What this stager does differently:
- buffers are keyed by the state dict's structure (paths, dtypes, shapes, devices, meshes,
  placements), allocated once and reused by every save with that structure; `build()` can
  allocate them ahead of the first save (the manager's `prestage`, also on a background thread);
- a large pinned buffer is its own anonymous mapping of exactly the tensor's size, faulted in and
  registered with `cudaHostRegister` (the CUDA host allocator would round it up to a power of
  two: up to twice the memory pinned);
- the copies run on a side stream that first waits for the caller's stream, and the caller's
  stream can wait for them on the GPU (`wait_on_current_stream`): the optimizer step is queued
  behind the copy without the host blocking. DCP's `DefaultStager` waits for its copies on the
  host (its staging thread synchronizes its stream), and the manager synchronizes the training
  stream before handing it the state;
- non-tensor values are deep-copied, and a DTensor is staged as a DTensor around the host copy
  of its local shard (what DCP's own stager produces), so DCP plans and writes it unchanged.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.checkpoint.staging import AsyncStager

from .layout import CheckpointError

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
