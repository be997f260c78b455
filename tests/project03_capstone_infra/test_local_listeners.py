"""A one-process trainer listens on nothing but the loopback: its process group rendezvouses
through an in-process store (no TCPStore on every interface)."""

from __future__ import annotations

import os
import sys

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads the sockets from /proc (Linux)"
)


def _listening_addresses() -> list[str]:
    """Local addresses (hex, as /proc writes them) of this process's listening TCP sockets."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                    found.append(cols[1].split(":")[0])
    return found


LOOPBACK = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1, ::1


def test_a_world_of_one_listens_only_on_loopback(monkeypatch):
    import torch.distributed as dist

    from shared.distributed import init_distributed

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    before = set(_listening_addresses())
    init_distributed(device="cpu")
    try:
        new = [a for a in _listening_addresses() if a not in before]
        assert all(a in LOOPBACK for a in new), new  # 00000000: every interface
        store = dist.distributed_c10d._get_default_store()
        assert isinstance(getattr(store, "underlying_store", store), dist.HashStore)
    finally:
        dist.destroy_process_group()
