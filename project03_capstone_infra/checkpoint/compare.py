"""Bitwise comparison of checkpoints: the model and optimizer tensors of two states, or of two
step directories whatever world size wrote each (read through the safe readers)."""

from __future__ import annotations

import os
from typing import Any

import torch

from .layout import CheckpointError
from .safe_read import read_full_state
from .verify import verify_checkpoint


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


def compare_checkpoints(a: str | os.PathLike, b: str | os.PathLike) -> tuple[list[str], int]:
    """(the differences, the number of model and optimizer entries of `a`) between two step
    directories, each verified first. CheckpointError says why they could not be compared."""
    for p in (a, b):
        info = verify_checkpoint(p)
        if not info.ok:
            raise CheckpointError(f"{p}: does not verify: " + "; ".join(info.problems))
    try:
        sa, sb = read_full_state(a), read_full_state(b)
    except CheckpointError as e:
        raise CheckpointError(f"cannot read: {e}") from e
    return compare_states(sa, sb), sum(1 for k in sa if k.startswith(("model.", "optim.")))
