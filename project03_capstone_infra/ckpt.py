"""Inspect and maintain a checkpoint directory (no process group needed).

    python -m project03_capstone_infra.ckpt list DIR
    python -m project03_capstone_infra.ckpt verify DIR [--step N]
    python -m project03_capstone_infra.ckpt prune DIR --keep-last 3 --milestone-every 100 [--dry-run]
    python -m project03_capstone_infra.ckpt compare DIR_A/step_00000040 DIR_B/step_00000040

DIR is a checkpoint root (holding step_XXXXXXXX directories), e.g. <run_dir>/checkpoints.
`verify` exits 1 when a checkpoint fails; `compare` exits 1 when the model or optimizer state
differs in a single bit.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from tyro.conf import Positional

from shared.cli import input_dir, main_guard

from .checkpoint import (
    compare_states,
    list_checkpoints,
    prune,
    read_full_state,
    read_latest,
    retained_steps,
    step_dir_name,
    verify_checkpoint,
)


@dataclass
class List:
    """List the committed checkpoints: step, size, world size, time, and which is latest."""

    root: Positional[str]
    checksums: bool = False  # also verify every file's sha256 (slower)


@dataclass
class Verify:
    """Verify checkpoints against their manifests (sizes and sha256); exit 1 on any failure."""

    root: Positional[str]
    step: int = -1  # only this step (-1: all)


@dataclass
class Prune:
    """Apply the retention policy: keep the newest K plus every multiple of N."""

    root: Positional[str]
    keep_last: int = 3
    milestone_every: int = 0
    dry_run: bool = False


@dataclass
class Compare:
    """Bitwise comparison of the model and optimizer state of two checkpoints."""

    a: Positional[str]
    b: Positional[str]


def _root(path: str) -> Path:
    return input_dir("root", path)


def cmd_list(args: List) -> int:
    root = _root(args.root)
    dirs = list_checkpoints(root)
    latest = read_latest(root)
    if not dirs:
        print(f"no checkpoints under {root}")
        return 0
    print(
        f"{'step':>10} {'size MiB':>10} {'world':>6} {'status':>8}  saved (UTC)                 latest"
    )
    for d in dirs:
        info = verify_checkpoint(d, checksums=args.checksums)
        m = info.manifest or {}
        status = "ok" if info.ok else "BAD"
        mark = "<-" if d.name == latest else ""
        print(
            f"{info.step:>10} {info.total_bytes / 2**20:>10.2f} {m.get('world_size', '?'):>6} {status:>8}  {m.get('time', '?'):<27} {mark}"
        )
        for p in info.problems:
            print(f"{'':>12}{p}")
    q = root / "quarantine"
    if q.is_dir() and any(q.iterdir()):
        print(f"quarantined: {', '.join(sorted(p.name for p in q.iterdir()))}")
    return 0


def cmd_verify(args: Verify) -> int:
    if args.step < -1:
        raise ValueError(f"--step must be a step >= 0 (or -1: all), got {args.step}")
    root = _root(args.root)
    dirs = list_checkpoints(root) if args.step < 0 else [root / step_dir_name(args.step)]
    bad = 0
    for d in dirs:
        info = verify_checkpoint(d)
        if info.ok:
            print(
                f"{d.name}: ok ({len(info.manifest['files'])} files, {info.total_bytes / 2**20:.2f} MiB)"
            )
        else:
            bad += 1
            print(f"{d.name}: FAILED: " + "; ".join(info.problems))
    if not dirs:
        print(f"no checkpoints under {root}")
    return 1 if bad else 0


def cmd_prune(args: Prune) -> int:
    if args.keep_last < 1:
        raise ValueError(
            f"--keep-last must be >= 1 (the newest is always kept), got {args.keep_last}"
        )
    if args.milestone_every < 0:
        raise ValueError(f"--milestone-every must be >= 0, got {args.milestone_every}")
    root = _root(args.root)
    dirs = list_checkpoints(root)
    steps = [int(d.name.split("_")[1]) for d in dirs]
    keep = retained_steps(steps, args.keep_last, args.milestone_every)
    if args.dry_run:
        drop = [
            d.name for d, s in zip(dirs, steps) if s not in keep and d.name != read_latest(root)
        ]
        print("would remove: " + (", ".join(drop) or "nothing"))
        return 0
    removed = prune(root, args.keep_last, args.milestone_every)
    print("removed: " + (", ".join(p.name for p in removed) or "nothing"))
    print("kept: " + ", ".join(d.name for d in list_checkpoints(root)))
    return 0


def cmd_compare(args: Compare) -> int:
    input_dir("a", args.a)
    input_dir("b", args.b)
    for p in (args.a, args.b):
        info = verify_checkpoint(p)
        if not info.ok:
            print(f"{p}: does not verify: " + "; ".join(info.problems))
            return 1
    a, b = read_full_state(args.a), read_full_state(args.b)
    diffs = compare_states(a, b)
    n = sum(1 for k in a if k.startswith(("model.", "optim.")))
    if diffs:
        print(f"{len(diffs)} of {n} entries differ:")
        for d in diffs[:20]:
            print("  " + d)
        return 1
    print(f"bitwise identical: {n} model and optimizer entries")
    return 0


@main_guard
def main(argv: list[str] | None = None) -> int:
    import tyro

    from shared.cli import run_tyro

    cmd = run_tyro(
        tyro.extras.subcommand_cli_from_dict,
        {"list": List, "verify": Verify, "prune": Prune, "compare": Compare},
        args=argv,
        description=__doc__.split("\n\n")[0],
    )
    handlers = {List: cmd_list, Verify: cmd_verify, Prune: cmd_prune, Compare: cmd_compare}
    return handlers[type(cmd)](cmd)


if __name__ == "__main__":
    sys.exit(main())
