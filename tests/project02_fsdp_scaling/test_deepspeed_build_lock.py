"""A DeepSpeed op build killed mid-way leaves torch's `lock` file, and every later DeepSpeed run
on the machine waits on it forever: the entry point removes such locks once they are older than
any build takes, and leaves a live build's lock and other extensions' locks alone (CPU)."""

from __future__ import annotations

import os
import time

from project02_fsdp_scaling.deepspeed_zero3 import clear_stale_op_build_locks
from shared.cuda_build import STALE_LOCK_S


def _lock(folder, age_s: float):
    folder.mkdir(parents=True)
    lock = folder / "lock"
    lock.write_text("")
    t = time.time() - age_s
    os.utime(lock, (t, t))
    return lock


def test_only_stale_deepspeed_build_locks_are_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    stale = _lock(tmp_path / "py311_cpu" / "deepspeed_shm_comm", STALE_LOCK_S + 60)
    stale_flat = _lock(tmp_path / "deepspeed_cpu_adam", STALE_LOCK_S + 60)
    live = _lock(tmp_path / "py311_cpu" / "deepspeed_other_op", 5)
    other = _lock(tmp_path / "py311_cpu" / "someone_elses_ext", STALE_LOCK_S + 60)
    removed = clear_stale_op_build_locks()
    assert sorted(removed) == sorted([stale.parent, stale_flat.parent])
    assert not stale.exists() and not stale_flat.exists()
    assert live.exists() and other.exists()
    assert clear_stale_op_build_locks() == []  # nothing left to remove
