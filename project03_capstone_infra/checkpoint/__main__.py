"""Inspect and maintain a checkpoint directory (no process group needed).

    python -m project03_capstone_infra.checkpoint list DIR
    python -m project03_capstone_infra.checkpoint verify DIR [--step N]
    python -m project03_capstone_infra.checkpoint prune DIR --keep-last 3 --milestone-every 100 [--dry-run]
    python -m project03_capstone_infra.checkpoint compare DIR_A/step_00000040 DIR_B/step_00000040

(the same as `python -m project03_capstone_infra checkpoint ...`). DIR is a checkpoint root
(holding step_XXXXXXXX directories), e.g. <run_dir>/checkpoints, or for `list` and `verify` one
step directory. `verify` exits 1 when a checkpoint fails or there is nothing to verify;
`compare` exits 1 when the model or optimizer state differs in a single bit. `prune` counts only
checkpoints that verify (retention.py) and takes the run lock (lock.py): it is refused while a
trainer runs in the directory. Nothing here runs code from a checkpoint file (safe_read.py).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from tyro.conf import OmitSubcommandPrefixes, Positional, subcommand

from shared.cli import input_dir

from . import lock
from .compare import compare_checkpoints
from .layout import (
    MANIFEST,
    QUARANTINE,
    CheckpointError,
    list_checkpoints,
    parse_step,
    read_latest,
    step_dir_name,
)
from .retention import plan_prune, prune
from .verify import verify_checkpoint


@dataclass
class List:
    """List the committed checkpoints: step, size, world size, time, and which is latest."""

    root: Positional[str]
    """a checkpoint root or one step directory"""
    checksums: bool = False
    """also verify every file's sha256 (slower)"""


@dataclass
class Verify:
    """Verify checkpoints (sizes, sha256, safe content); exit 1 on a failure or when none."""

    root: Positional[str]
    """a checkpoint root or one step directory"""
    step: int = -1
    """only this step (-1: all)"""


@dataclass
class Prune:
    """Apply the retention policy: keep the newest K that verify plus every multiple of N."""

    root: Positional[str]
    """a checkpoint root"""
    keep_last: int = 3
    """the newest checkpoints that verify to keep (K)"""
    milestone_every: int = 0
    """also keep every step that is a multiple of this (N; 0: none)"""
    dry_run: bool = False
    """only say what would be removed"""


@dataclass
class Compare:
    """Bitwise comparison of the model and optimizer state of two checkpoints."""

    a: Positional[str]
    """a step directory"""
    b: Positional[str]
    """the step directory to compare it with"""


@dataclass
class CheckpointCommand:
    """List, verify, prune or compare the checkpoints of a run (no process group needed)."""

    command: OmitSubcommandPrefixes[
        Annotated[List, subcommand("list")]
        | Annotated[Verify, subcommand("verify")]
        | Annotated[Prune, subcommand("prune")]
        | Annotated[Compare, subcommand("compare")]
    ]


def _root(path: str) -> Path:
    return input_dir("root", path)


def _step_dirs(path: Path, step: int = -1) -> tuple[Path, list[Path]]:
    """(checkpoint root, the step directories to look at). `path` is a checkpoint root or one
    step directory (a folder named step_XXXXXXXX or holding a manifest)."""
    if parse_step(path.name) is not None or (path / MANIFEST).exists():
        if step >= 0 and parse_step(path.name) != step:
            raise ValueError(f"--step {step}: {path} is the step directory {path.name}")
        return path.parent, [path]
    if step >= 0:
        return path, [path / step_dir_name(step)]
    return path, list_checkpoints(path)


def cmd_list(args: List) -> int:
    root = _root(args.root)
    root, dirs = _step_dirs(root)
    latest = read_latest(root)
    if not dirs:
        print(f"no checkpoints under {root}")
        return 0
    print(
        f"{'step':>10} {'size MiB':>10} {'world':>6} {'status':>8}  saved (UTC)                 latest"
    )
    for d in dirs:
        info = verify_checkpoint(d, checksums=args.checksums, root=root)
        m = info.manifest or {}
        status = "ok" if info.ok else "BAD"
        mark = "<-" if d.name == latest else ""
        print(
            f"{info.step:>10} {info.total_bytes / 2**20:>10.2f} {m.get('world_size', '?'):>6} {status:>8}  {m.get('time', '?'):<27} {mark}"
        )
        for p in info.problems:
            print(f"{'':>12}{p}")
    q = root / QUARANTINE
    if q.is_dir() and not q.is_symlink() and any(q.iterdir()):
        print(f"quarantined: {', '.join(sorted(p.name for p in q.iterdir()))}")
    return 0


def cmd_verify(args: Verify) -> int:
    if args.step < -1:
        raise ValueError(f"--step must be a step >= 0 (or -1: all), got {args.step}")
    root, dirs = _step_dirs(_root(args.root), args.step)
    if not dirs:
        print(f"no checkpoints under {root}: nothing verified")
        return 1
    bad = 0
    for d in dirs:
        info = verify_checkpoint(d, root=root)
        if info.ok:
            print(
                f"{d.name}: ok ({len(info.manifest['files'])} files, {info.total_bytes / 2**20:.2f} MiB)"
            )
        else:
            bad += 1
            print(f"{d.name}: FAILED: " + "; ".join(info.problems))
    return 1 if bad else 0


def cmd_prune(args: Prune) -> int:
    if args.keep_last < 1:
        raise ValueError(
            f"--keep-last must be >= 1 (the newest is always kept), got {args.keep_last}"
        )
    if args.milestone_every < 0:
        raise ValueError(f"--milestone-every must be >= 0, got {args.milestone_every}")
    root = _root(args.root)
    key = None
    if not args.dry_run:  # not while a trainer is saving and pruning in the same directory
        key = lock.acquire(root)
    try:
        plan = plan_prune(root, args.keep_last, args.milestone_every)
        for p, why in plan.unverified:
            print(f"not counted (does not verify; left in place): {p.name}: {why}")
        if args.dry_run:
            print("would remove: " + (", ".join(p.name for p in plan.remove) or "nothing"))
            return 0
        removed = prune(root, args.keep_last, args.milestone_every, plan=plan)
    finally:
        if key is not None:
            lock.release(key)
    print("removed: " + (", ".join(p.name for p in removed) or "nothing"))
    print("kept: " + ", ".join(d.name for d in list_checkpoints(root)))
    return 0


def cmd_compare(args: Compare) -> int:
    input_dir("a", args.a)
    input_dir("b", args.b)
    try:
        diffs, n = compare_checkpoints(args.a, args.b)
    except CheckpointError as e:  # does not verify, or cannot be read
        print(e)
        return 1
    if diffs:
        print(f"{len(diffs)} of {n} entries differ:")
        for d in diffs[:20]:
            print("  " + d)
        return 1
    print(f"bitwise identical: {n} model and optimizer entries")
    return 0


HANDLERS = {List: cmd_list, Verify: cmd_verify, Prune: cmd_prune, Compare: cmd_compare}


def command(cfg: CheckpointCommand) -> int:
    """`checkpoint <list|verify|prune|compare>`: the sub-command's exit status."""
    try:
        return HANDLERS[type(cfg.command)](cfg.command)
    except CheckpointError as e:  # e.g. prune while a trainer holds the directory
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # `python -m <this package>` runs its command of the package
    from project03_capstone_infra.__main__ import main

    sys.exit(main(["checkpoint", *sys.argv[1:]]))
