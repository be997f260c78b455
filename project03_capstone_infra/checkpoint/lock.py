"""One trainer per checkpoint directory: an OS file lock, released when its process dies.

`flock(LOCK_EX | LOCK_NB)` on `<checkpoint root>/.lock`. The kernel drops the lock when the
holding process ends, however it ends (kill -9 included), so a killed run restarts at once,
while a second trainer started on the same directory is refused before it touches anything
(start-up removes interrupted saves: it must never remove another trainer's save in flight).
The holder writes its pid, host and start time into the file, for the refusal message.

Within one process the lock is re-entrant (counted): several managers of the same directory in
one process (tests, an in-process rollback) share it. flock is advisory and, on network file
systems, only as good as their lock support (NFSv4 and Lustre with flock enabled provide it).
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import os
import socket
import threading
from pathlib import Path

from .layout import CheckpointError

LOCK_FILE = ".lock"
_held: dict[str, list] = {}  # resolved root -> [fd, count]
_mutex = threading.Lock()


class RunDirLocked(CheckpointError):
    """Another process holds the checkpoint directory."""


def acquire(root: str | os.PathLike) -> str:
    """Lock `root` for this process (re-entrant); returns the key for `release`. Raises
    RunDirLocked naming the holder when another process has it."""
    root = Path(root)
    key = str(root.resolve())
    with _mutex:
        if key in _held:
            _held[key][1] += 1
            return key
        path = root / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise RunDirLocked(
                f"{root} is in use by another trainer ({holder}): refusing to start a second one "
                "on the same run directory (it would remove that trainer's saves in flight). "
                "Wait for it to end, stop it, or use another --run-dir."
            ) from None
        except BaseException:
            os.close(fd)
            raise
        stamp = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        info = f"pid {os.getpid()} on {socket.gethostname()} since {stamp}\n".encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, info, 0)
        _held[key] = [fd, 1]
        return key


def release(key: str) -> None:
    with _mutex:
        entry = _held.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del _held[key]
            os.close(entry[0])  # closing the last descriptor drops the lock


def _read_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return text or "holder unknown"
