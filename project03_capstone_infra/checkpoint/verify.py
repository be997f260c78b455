"""Verifying and quarantining step directories (no process group needed: the `checkpoint`
command line uses the same functions as the trainer).

A step directory is usable when it is a real directory directly under the checkpoint root (not
a link), its manifest passes the typed loader, every file it names is a regular file (not a
link) of the listed size and sha256, it holds no file the manifest does not name, and its
DCP content passes the safe readers' checks (`safe_read.check_dcp_content`). Anything else is
reported with the reason, never raised.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .layout import (
    MANIFEST,
    QUARANTINE,
    CheckpointError,
    fsync_dir,
    hash_files,
    load_manifest,
    parse_step,
)

REASON_FILE = "QUARANTINE_REASON.txt"


@dataclass
class CheckpointInfo:
    path: Path
    step: int
    ok: bool
    problems: list[str]
    manifest: dict | None  # the checked manifest (None when it did not pass the typed loader)

    @property
    def total_bytes(self) -> int:
        files = (self.manifest or {}).get("files", {})
        return sum(int(v["bytes"]) for v in files.values())


def verify_checkpoint(
    path: str | os.PathLike,
    *,
    checksums: bool = True,
    threads: int = 8,
    root: str | os.PathLike | None = None,
) -> CheckpointInfo:
    """Check a step directory (see the module docstring); `root`, when given, is the checkpoint
    root the directory must lie directly in after resolving links. Returns the problems found."""
    from .safe_read import check_dcp_content

    path = Path(path)
    step = parse_step(path.name)
    step = -1 if step is None else step

    def fail(why: str) -> CheckpointInfo:
        return CheckpointInfo(path, step, False, [why], None)

    if path.is_symlink():
        return fail(
            f"{path.name} is a symbolic link (to {os.readlink(path)}): refused, a checkpoint is "
            "read only from a real directory inside the checkpoint root"
        )
    if not path.is_dir():
        return fail(
            f"{path.name} is not a directory" if path.exists() else f"{path} does not exist"
        )
    if root is not None and path.resolve().parent != Path(root).resolve():
        return fail(f"{path} is not inside the checkpoint root {root}: refused")
    try:
        manifest = load_manifest(path)
    except CheckpointError as e:
        return fail(str(e))
    problems: list[str] = []
    if step >= 0 and manifest.step != step:
        problems.append(f"manifest says step {manifest.step} but the directory is {path.name}")
    try:
        present = sorted(p.name for p in path.iterdir())
    except OSError as e:
        return fail(f"{path.name} cannot be listed ({e.strerror or e})")
    for name in present:
        if name != MANIFEST and name not in manifest.files:
            problems.append(f"{name}: not named in the manifest (refused: nothing else is read)")
    to_hash = []
    for name, meta in sorted(manifest.files.items()):
        f = path / name
        try:
            st = os.lstat(f)
        except FileNotFoundError:
            problems.append(f"{name}: missing")
            continue
        if stat.S_ISLNK(st.st_mode):
            problems.append(
                f"{name}: a symbolic link (refused: files are read inside the directory)"
            )
            continue
        if not stat.S_ISREG(st.st_mode):
            problems.append(f"{name}: not a regular file")
            continue
        if st.st_size != meta.bytes:
            problems.append(
                f"{name}: {st.st_size} bytes on disk, manifest says {meta.bytes} (truncated or overwritten)"
            )
            continue
        to_hash.append(f)
    if checksums and to_hash:
        try:
            got = hash_files(to_hash, threads=threads)
        except OSError as e:
            got = {}
            problems.append(f"cannot be read ({e.strerror or e})")
        for name, meta in got.items():
            want = manifest.files[name].sha256
            if meta["sha256"] != want:
                problems.append(
                    f"{name}: sha256 {meta['sha256'][:12]}... does not match the manifest's "
                    f"{want[:12]}... (corrupted)"
                )
    if not problems:  # bytes as the manifest says: now what they would make the loader do
        try:
            check_dcp_content(path, manifest)
        except CheckpointError as e:
            problems.append(str(e))
    return CheckpointInfo(path, manifest.step, not problems, problems, manifest.raw)


def quarantine(
    root: str | os.PathLike, path: Path, why: str, warn: Callable[[str], None]
) -> Path | None:
    """Move a bad step directory to root/quarantine/ with the reason. Returns where it went, or
    None (with a warning) when it could not be moved: the caller skips it in place. Never
    writes through a link: a linked step directory is moved as the link, its reason beside it."""
    root = Path(root)
    qdir = root / QUARANTINE
    try:
        if qdir.is_symlink() or (qdir.exists() and not qdir.is_dir()):
            raise OSError(f"{qdir} is not a directory")
        qdir.mkdir(exist_ok=True)
        base = f"{path.name}-{int(time.time())}"
        dest, n = qdir / base, 1
        while os.path.lexists(dest):
            dest, n = qdir / f"{base}-{n}", n + 1
        os.replace(path, dest)
    except OSError as e:
        warn(f"could not move {path.name} to {QUARANTINE}/ ({e}); skipping it where it is")
        return None
    real_dir = dest.is_dir() and not dest.is_symlink()
    reason = dest / REASON_FILE if real_dir else qdir / f"{dest.name}.{REASON_FILE}"
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(reason, flags, 0o644)
        with open(fd, "w") as f:
            f.write(why + "\n")
        fsync_dir(root)
    except OSError as e:
        warn(f"could not write the reason for quarantining {path.name} ({e})")
    warn(f"moved {path.name} to {QUARANTINE}/{dest.name}")
    return dest


class VerifiedCache:
    """Step directories verified in this process, keyed by the names, sizes and modification
    times of their files: retention counts them as verified without hashing them again unless
    a file changed since (an overwrite or truncation changes both)."""

    def __init__(self) -> None:
        self._sigs: dict[str, tuple] = {}

    @staticmethod
    def _signature(path: Path) -> tuple | None:
        try:
            with os.scandir(path) as it:
                return tuple(
                    sorted(
                        (
                            e.name,
                            e.stat(follow_symlinks=False).st_size,
                            e.stat(follow_symlinks=False).st_mtime_ns,
                        )
                        for e in it
                    )
                )
        except OSError:
            return None

    def remember(self, path: Path) -> None:
        sig = self._signature(path)
        if sig is not None and not path.is_symlink():
            self._sigs[path.name] = sig

    def holds(self, path: Path) -> bool:
        sig = self._sigs.get(path.name)
        return sig is not None and not path.is_symlink() and sig == self._signature(path)
