"""`python -m project03_capstone_infra [<command> ...]`: the entry points of this package (each
is also `python -m project03_capstone_infra.<command>`)."""

from __future__ import annotations

import importlib
import sys

ENTRY_POINTS = {
    "train": "fault-tolerant FSDP training (run under torchrun for several ranks)",
    "ckpt": "list | verify | prune | compare checkpoints",
    "chaos": "reference run vs the same run under injected faults; writes the report",
    "reshard": "train on A ranks, continue on B (2 -> 1, 1 -> 2): loss continuity, bitwise before",
    "determinism_cost": "tokens/s of the same short run, default vs --deterministic kernels",
    "health": "GPU health snapshot, pre-flight checks, Prometheus metrics",
    "bench_checkpoint": "GPU: sync vs async checkpoint blocking time and time to resume (1b)",
    "tune": "Ray Tune HPO over lr, weight decay and warm-up with ASHA (and a random-search baseline)",
    "cost": "on-demand vs spot vs spot with Young/Daly checkpoints, fp32 vs bf16, Monte Carlo check",
    "data_pipeline": "resumable DataLoader and DALI pipelines: throughput comparison",
    "report": "redraw every chart and summary.md from the JSON records (no rerun)",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in ("-h", "--help"):
        if argv[0] not in ENTRY_POINTS:
            print(
                f"error: unknown command {argv[0]!r}; expected one of {list(ENTRY_POINTS)} "
                "(see python -m project03_capstone_infra --help)",
                file=sys.stderr,
            )
            return 2
        module = importlib.import_module(f"project03_capstone_infra.{argv[0]}")
        return module.main(argv[1:])
    print("python -m project03_capstone_infra <command> --help  (or ...capstone_infra.<command>)\n")
    for name, what in ENTRY_POINTS.items():
        print(f"  {name:<17} {what}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
