"""`CheckpointManager`: versioned, verified, sharded checkpoints of one run, on top of
`torch.distributed.checkpoint` (DCP).

What DCP already provides, and the manager uses as it is:
- the sharded format and its I/O: `dcp.save` has every rank write its own shards
  (`FileSystemWriter`: `__<rank>_<n>.distcp` files, written by `thread_count` threads, fsynced
  with `sync_files`) and the coordinator write `.metadata`, DCP's index of every shard (a pickle
  of `Metadata`: each entry's type, shape, dtype, chunks and where its bytes lie);
- resharding: `dcp.load` reads a checkpoint written by N ranks into the state dicts of M ranks
  (model and optimizer from `torch.distributed.checkpoint.state_dict.get_state_dict`, FSDP2
  DTensors), so a run saved on N ranks resumes on M;
- asynchronous saves: `dcp.async_save` stages the state into host memory through an
  `AsyncStager` and writes it on a background thread (its `AsyncSaveResponse` carries the
  staging and the upload completion), and DCP's `DefaultStager` does that staging with pinned
  memory and non-blocking copies (stager.py says what `PersistentStager` does instead).

What the manager adds:
- a checksummed manifest (step, config hash, git commit, world size, time, sha256 and size of
  every file; layout.py) and an atomic commit: a save is written into a temporary directory
  and renamed to step_XXXXXXXX only once every rank's files are hashed and the manifest is
  durable, then `latest` is replaced. DCP writes into the directory it is given (its
  `.metadata` last), checksums nothing, and knows no versions or newest checkpoint: after a
  crash or a flipped bit, nothing but a failed (or wrong) load would tell;
- verified loading with fallback: the loader walks the step directories newest first, verifies
  each (manifest, sizes, sha256, no foreign or linked files, safe content; verify.py), moves a
  bad one to quarantine/ with the reason and loads the newest good one, saying why each newer
  one was skipped. It refuses to start over when the run has checkpointed before but nothing
  usable is left;
- untrusted input: `.metadata` and every non-tensor entry are read without running code from
  them (safe_read.py), where DCP's reader unpickles both;
- retention counted over checkpoints that verify (retention.py) and one trainer per directory
  (an OS lock held by rank 0 for the manager's life, and a write check at construction;
  lock.py);
- the non-tensor state: the caller's JSON (step, LR schedule, data position) and every rank's
  RNG states (state.py);
- asynchronous saves that never interleave with training collectives: the write, the checksums
  and the commit run on a thread of their own with a gloo process group of their own;
  `SaveStats.blocking_s` is the time training was actually held. A failed async save is said
  once and makes every later save synchronous, instead of failing every other save.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from . import lock
from .layout import (
    LATEST,
    MANIFEST,
    METADATA,
    QUARANTINE,
    CheckpointError,
    Manifest,
    build_manifest,
    commit,
    has_history,
    hash_files,
    list_checkpoints,
    read_latest,
    step_dir_name,
    write_manifest,
)
from .lock import RunDirLocked
from .retention import plan_prune, prune, retained_steps
from .safe_read import SafeFileSystemReader, SafeLoadPlanner, first_error
from .stager import PersistentStager
from .state import load_targets, read_extra, restore_rng_state, rng_key, with_non_tensor_state
from .verify import VerifiedCache, quarantine, verify_checkpoint


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
        # CUDA a reused DefaultStager failed at its second save: KeyError: <class 'type'>, then
        # RecursionError, inside DCP's StateDictStager).
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
        root = self.root
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            return "io", f"checkpoint directory {root} cannot be made ({e.strerror or e})"
        if not root.is_dir():
            return "io", f"checkpoint directory {root} exists and is not a directory"
        try:
            self._lock_key = lock.acquire(root)
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
        if self._lock_key is not None:
            lock.release(self._lock_key)
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
        return with_non_tensor_state(state, extra, self.rank)

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
            files.update(hash_files([tmp / METADATA]))
            manifest = build_manifest(
                step=stats.step,
                files=files,
                config_hash=self.config_hash,
                config=self.config,
                git_commit=self.git_commit,
                world_size=self.world_size,
                save_mode=stats.mode,
                torch_version=torch.__version__,
            )
            write_manifest(tmp, manifest)
            commit(self.root, tmp, stats.step)
            self._verified.remember(final)  # hashed above, from the bytes just written
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
        files the manifest names are read (see safe_read.py)."""
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
            full = load_targets(state, self.rank, keys)
            with _single_process_quiet():
                dcp.load(
                    full,
                    storage_reader=reader,
                    planner=planner,
                    process_group=self.pg,
                    no_dist=self.pg is None,
                )
            extra = read_extra(full)
            rng_restored = rng_key(self.rank) in keys
            if rng_restored:
                restore_rng_state(full[rng_key(self.rank)])
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
