"""What a checkpoint root looks like on disk: names, the manifest's schema, checksums and the
atomic commit. Every other module of the package builds on these; none of it needs torch.

Layout of a checkpoint root:

    root/
      step_00000100/             one committed checkpoint per step
        .metadata                DCP's index of every shard
        __0_0.distcp ...         each rank's shards (DCP names them __<rank>_<n>.distcp)
        manifest.json            step, config hash, git commit, world size, time, sha256 per file
      latest                     text: the name of the newest committed step directory
      .tmp-step_00000110-<pid>/  a save in progress (never loaded; removed at the next start)
      quarantine/                checkpoints that failed verification, kept for inspection
      .lock                      flock of the trainer that owns the directory (lock.py)

Commit protocol (why a crash never leaves a checkpoint that looks whole): every rank writes its
shards into the temporary directory (DCP fsyncs each file), hashes its own files and sends the
digests to rank 0; rank 0 writes manifest.json, fsyncs it and the directory (`write_manifest`),
then renames the directory to step_XXXXXXXX and fsyncs the root (`commit`). A directory named
step_* therefore always has a manifest that lists every file with its checksum. `latest` is
replaced atomically after that; the loader does not trust it blindly (manager.py).

`manifest.json` is the only file of a step directory the loader reads before it has decided
whether the directory is usable, so it is parsed as untrusted input: JSON only, at most
`MAX_MANIFEST_BYTES`, and every field checked for type and range before anything uses it
(`Manifest.from_json`). A manifest that is a number, a list, a string, a directory, lacks a
field, names a file outside its step directory or gives a size that is not a non-negative int is
a `ManifestError` (a `CheckpointError`): the checkpoint is reported as bad, never a crash.

File names in a manifest are confined to what DCP writes (`.metadata`, `__<rank>_<n>.distcp`):
no separators, no `..`, nothing else, so a manifest cannot name a file outside its directory.
Links are checked where files are opened (verify.py).
"""

from __future__ import annotations

import concurrent.futures
import datetime as _dt
import hashlib
import json
import math
import os
import re
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.results import atomic_write_text

MANIFEST = "manifest.json"
LATEST = "latest"  # names the newest committed step directory
QUARANTINE = "quarantine"  # checkpoints that failed verification
METADATA = ".metadata"  # DCP's index of every shard (a pickle: see safe_read.py)
FORMAT_VERSION = 1
MAX_MANIFEST_BYTES = 16 << 20  # a manifest lists a few files per rank: far below this
_STEP_RE = re.compile(r"^step_(\d{8})$")
_FILE_RE = re.compile(r"^(\.metadata|__\d{1,9}_\d{1,9}\.distcp)$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_HASH_CHUNK = 8 << 20  # bytes read per hashlib update (hashlib releases the GIL on large blocks)


class CheckpointError(RuntimeError):
    """A checkpoint could not be saved or no good checkpoint could be loaded."""


class ManifestError(CheckpointError):
    """A manifest that cannot be trusted: unreadable, not JSON, or not of the expected schema."""


def step_dir_name(step: int) -> str:
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    return f"step_{step:08d}"


def parse_step(name: str) -> int | None:
    m = _STEP_RE.match(name)
    return int(m.group(1)) if m else None


def is_checkpoint_file_name(name: str) -> bool:
    """Whether `name` is a file DCP writes into a step directory (and nothing else)."""
    return isinstance(name, str) and _FILE_RE.match(name) is not None


# --- files: fsync, hashing -------------------------------------------------------------------


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a directory's entries (new, renamed or removed files) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    # O_NOFOLLOW: a link put in place of a shard is refused, not followed.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with open(fd, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def hash_files(paths: Iterable[Path], threads: int = 8) -> dict[str, dict]:
    """{file name: {"sha256", "bytes"}}, hashed on a thread pool (one file per thread)."""
    paths = list(paths)
    if not paths:
        return {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(threads, len(paths)))) as ex:
        digests = list(ex.map(sha256_file, paths))
    return {p.name: {"sha256": d, "bytes": p.stat().st_size} for p, d in zip(paths, digests)}


# --- the manifest: written at commit, read through a typed loader ------------------------------------------------------------------------


@dataclass(frozen=True)
class FileEntry:
    sha256: str  # 64 lowercase hex digits
    bytes: int  # size on disk


@dataclass(frozen=True)
class Manifest:
    """The fields the loader relies on, checked; `raw` keeps the whole object (config, time,
    git commit, torch version) for display."""

    format_version: int
    step: int
    world_size: int
    config_hash: str
    files: dict[str, FileEntry]
    raw: dict = field(default_factory=dict, repr=False)

    @property
    def total_bytes(self) -> int:
        return sum(f.bytes for f in self.files.values())

    @classmethod
    def from_json(cls, obj: Any, where: str = MANIFEST) -> Manifest:
        def bad(what: str) -> ManifestError:
            return ManifestError(f"{where}: {what}")

        if not isinstance(obj, dict):
            raise bad(f"expected a JSON object, got {_json_type(obj)}")
        for key in ("format_version", "step", "files", "world_size", "config_hash"):
            if key not in obj:
                raise bad(f"lacks {key!r}")
        if not _is_int(obj["format_version"]) or obj["format_version"] != FORMAT_VERSION:
            raise bad(f"format_version {obj['format_version']!r} is not {FORMAT_VERSION}")
        if not _is_int(obj["step"]) or obj["step"] < 0:
            raise bad(f"'step' must be a non-negative int, got {obj['step']!r}")
        if not _is_int(obj["world_size"]) or obj["world_size"] < 1:
            raise bad(f"'world_size' must be a positive int, got {obj['world_size']!r}")
        if not isinstance(obj["config_hash"], str):
            raise bad(f"'config_hash' must be a string, got {_json_type(obj['config_hash'])}")
        for key, types in (
            ("config", dict),
            ("git_commit", (str, type(None))),
            ("time", str),
            ("save_mode", str),
            ("torch", str),
        ):
            if key in obj and not isinstance(obj[key], types):
                raise bad(f"{key!r} has the wrong type ({_json_type(obj[key])})")
        if "unix_time" in obj and not (_is_number(obj["unix_time"])):
            raise bad(f"'unix_time' must be a finite number, got {obj['unix_time']!r}")
        files = obj["files"]
        if not isinstance(files, dict):
            raise bad(f"'files' must be an object of file name -> entry, got {_json_type(files)}")
        if METADATA not in files:
            raise bad(f"does not list DCP's {METADATA}")
        entries = {}
        for name, entry in files.items():
            if not is_checkpoint_file_name(name):
                raise bad(
                    f"file name {name!r} is not one DCP writes ({METADATA} or __<rank>_<n>.distcp): "
                    "refused (a manifest names files inside its own directory only)"
                )
            if not isinstance(entry, dict):
                raise bad(f"files[{name!r}] must be an object, got {_json_type(entry)}")
            for key in ("sha256", "bytes"):
                if key not in entry:
                    raise bad(f"files[{name!r}] lacks {key!r}")
            if not isinstance(entry["sha256"], str) or not _SHA256_RE.match(entry["sha256"]):
                raise bad(f"files[{name!r}].sha256 is not 64 lowercase hex digits")
            if not _is_int(entry["bytes"]) or entry["bytes"] < 0:
                raise bad(
                    f"files[{name!r}].bytes must be a non-negative int, got {entry['bytes']!r}"
                )
            entries[name] = FileEntry(entry["sha256"], entry["bytes"])
        return cls(
            obj["format_version"],
            obj["step"],
            obj["world_size"],
            obj["config_hash"],
            entries,
            dict(obj),
        )


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _json_type(v: Any) -> str:
    names = {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        type(None): "null",
    }
    return names.get(type(v), type(v).__name__)


def load_manifest(step_dir: str | os.PathLike) -> Manifest:
    """The checked manifest of a step directory; ManifestError says what is wrong with it."""
    step_dir = Path(step_dir)
    mpath = step_dir / MANIFEST
    where = f"{step_dir.name}: {MANIFEST}"
    try:
        # O_NOFOLLOW: a manifest that is a link is not read through it.
        fd = os.open(mpath, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise ManifestError(f"{step_dir.name}: no {MANIFEST}") from None
    except OSError as e:
        raise ManifestError(f"{where} cannot be opened ({e.strerror or e})") from None
    try:
        with open(fd, "rb") as f:
            data = f.read(MAX_MANIFEST_BYTES + 1)
    except OSError as e:  # e.g. a directory named manifest.json
        raise ManifestError(f"{where} cannot be read ({e.strerror or e})") from None
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{where} is larger than {MAX_MANIFEST_BYTES} bytes: refused")
    try:
        obj = json.loads(data.decode("utf-8"), parse_constant=_no_constants)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError included
        raise ManifestError(f"{where} is not valid JSON ({e})") from None
    return Manifest.from_json(obj, where)


def _no_constants(name: str):
    raise ValueError(f"{name} is not JSON")


def read_manifest(step_dir: str | os.PathLike) -> dict:
    """The manifest of a step directory as a dict, after `load_manifest` has checked it."""
    return load_manifest(step_dir).raw


def build_manifest(
    *,
    step: int,
    files: dict[str, dict],
    config_hash: str,
    config: dict,
    git_commit: str | None,
    world_size: int,
    save_mode: str,
    torch_version: str,
) -> dict:
    """The manifest of a save: what `Manifest.from_json` checks, plus context for display."""
    return {
        "format_version": FORMAT_VERSION,
        "step": step,
        "config_hash": config_hash,
        "config": config,
        "git_commit": git_commit,
        "world_size": world_size,
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "unix_time": time.time(),
        "save_mode": save_mode,
        "torch": torch_version,
        "files": files,
    }


# --- the atomic commit -------------------------------------------------------------------------


def write_manifest(tmp: Path, manifest: dict) -> None:
    """Write manifest.json into the save's temporary directory and make it and the directory's
    entries durable (the last step before the rename)."""
    with open(tmp / MANIFEST, "w") as f:
        json.dump(manifest, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(tmp)


def commit(root: Path, tmp: Path, step: int) -> Path:
    """Rename the temporary directory to step_XXXXXXXX (replacing a re-save of the same step,
    e.g. after a rollback), fsync the root, then point `latest` at it. Returns the step
    directory."""
    final = root / step_dir_name(step)
    if final.exists():
        trash = root / f".tmp-{final.name}-replaced-{os.getpid()}"
        os.replace(final, trash)
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(tmp, final)
    fsync_dir(root)
    atomic_write_text(root / LATEST, final.name + "\n")
    return final


# --- what the root holds -----------------------------------------------------------------------


def list_checkpoints(root: str | os.PathLike) -> list[Path]:
    """Every entry named step_XXXXXXXX under root (directories, and links or files so named,
    which verification then refuses), oldest first."""
    root = Path(root)
    try:
        entries = list(root.iterdir()) if root.is_dir() else []
    except OSError:
        return []
    found = [(parse_step(p.name), p) for p in entries]
    return [p for s, p in sorted((s, p) for s, p in found if s is not None)]


def read_latest(root: str | os.PathLike) -> str | None:
    """The step directory name `latest` holds; None when it is absent, a link or not a name."""
    path = Path(root) / LATEST
    try:
        if path.is_symlink():
            return None
        text = path.read_text(errors="strict").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if parse_step(text) is not None else None


def has_history(root: str | os.PathLike) -> bool:
    """Whether a run has ever committed a checkpoint here: step directories, quarantined ones,
    or a `latest` file."""
    root = Path(root)
    if list_checkpoints(root) or os.path.lexists(root / LATEST):
        return True
    q = root / QUARANTINE
    try:
        return q.is_dir() and not q.is_symlink() and any(q.iterdir())
    except OSError:
        return False
