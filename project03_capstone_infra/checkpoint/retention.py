"""Retention: which checkpoints to keep, counted over checkpoints that verify.

The policy keeps the newest `keep_last` checkpoints plus every step that is a multiple of
`milestone_every`; the one `latest` names is never removed. "Newest" counts only checkpoints
that verify: walking from the newest, each is verified until `keep_last` good ones are found;
the bad ones met on the way are left in place (loading quarantines them) and count for
nothing; only checkpoints older than the last of the good ones are removed. So the newest
valid checkpoint is never removed, and a corrupt newest one never pushes a good one out.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .layout import fsync_dir, list_checkpoints, parse_step, read_latest
from .verify import VerifiedCache, verify_checkpoint


def retained_steps(steps: Iterable[int], keep_last: int, milestone_every: int = 0) -> set[int]:
    """The steps a retention policy keeps: the newest `keep_last`, plus every step that is a
    multiple of `milestone_every` (when > 0) as a milestone."""
    if keep_last < 1:
        raise ValueError(
            f"keep_last must be >= 1 (the newest checkpoint is always kept), got {keep_last}"
        )
    if milestone_every < 0:
        raise ValueError(
            f"milestone_every must be >= 0 (0 disables milestones), got {milestone_every}"
        )
    ordered = sorted(set(steps))
    keep = set(ordered[-keep_last:])
    if milestone_every:
        keep |= {s for s in ordered if s % milestone_every == 0}
    return keep


@dataclass
class PrunePlan:
    remove: list[Path] = field(default_factory=list)  # oldest first
    keep: list[Path] = field(default_factory=list)
    unverified: list[tuple[Path, str]] = field(default_factory=list)  # left in place: (path, why)


def plan_prune(
    root: str | os.PathLike,
    keep_last: int,
    milestone_every: int = 0,
    *,
    checksums: bool = True,
    threads: int = 8,
    cache: VerifiedCache | None = None,
) -> PrunePlan:
    """What `prune` removes and keeps (see the module docstring); verifies as it walks."""
    retained_steps([], keep_last, milestone_every)  # validates both
    root = Path(root)
    dirs = list_checkpoints(root)
    latest = read_latest(root)
    plan = PrunePlan()
    good: list[Path] = []
    walked = 0
    for p in reversed(dirs):
        if len(good) == keep_last:
            break
        walked += 1
        if cache is not None and cache.holds(p):
            good.append(p)
            continue
        info = verify_checkpoint(p, checksums=checksums, threads=threads, root=root)
        if info.ok:
            good.append(p)
            if cache is not None:
                cache.remember(p)
        else:
            plan.unverified.append((p, "; ".join(info.problems)))
    older = dirs[: len(dirs) - walked]  # not walked: older than the keep_last-th good one
    for p in older:
        step = parse_step(p.name)
        milestone = milestone_every and step % milestone_every == 0
        if milestone or p.name == latest:
            plan.keep.append(p)
        elif p.is_symlink() or not p.is_dir():
            plan.unverified.append((p, "not a checkpoint directory"))
        else:
            plan.remove.append(p)
    plan.keep += sorted(good)
    plan.keep.sort()
    plan.unverified.sort()
    return plan


def prune(
    root: str | os.PathLike,
    keep_last: int,
    milestone_every: int = 0,
    *,
    checksums: bool = True,
    threads: int = 8,
    cache: VerifiedCache | None = None,
    plan: PrunePlan | None = None,
) -> list[Path]:
    """Delete the step directories the retention policy does not keep; returns what was removed."""
    root = Path(root)
    if plan is None:
        plan = plan_prune(
            root, keep_last, milestone_every, checksums=checksums, threads=threads, cache=cache
        )
    removed = []
    for p in plan.remove:
        # Rename first (atomic): a crash mid-delete leaves a temporary directory, removed at
        # the next start, never a step directory with files missing.
        doomed = root / f".tmp-{p.name}-deleting-{os.getpid()}"
        os.replace(p, doomed)
        shutil.rmtree(doomed)
        removed.append(p)
    if removed:
        fsync_dir(root)
    return removed
