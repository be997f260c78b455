"""`python -m project03_capstone_infra`: the entry points of this package."""

ENTRY_POINTS = {
    "train": "fault-tolerant FSDP training (run under torchrun for several ranks)",
    "ckpt": "list | verify | prune | compare checkpoints",
    "chaos": "reference run vs the same run under injected faults; writes the report",
    "health": "GPU health snapshot, pre-flight checks, Prometheus metrics",
    "bench_checkpoint": "GPU: sync vs async checkpoint blocking time and time to resume (1b)",
    "tune": "Ray Tune HPO over lr, weight decay and warm-up with ASHA (and a random-search baseline)",
    "cost": "on-demand vs spot vs spot with Young/Daly checkpoints, fp32 vs bf16, Monte Carlo check",
    "data_pipeline": "resumable DataLoader and DALI pipelines: throughput comparison",
    "report": "redraw every chart and summary.md from the JSON records (no rerun)",
}


def main() -> int:
    print("python -m project03_capstone_infra.<command> --help\n")
    for name, what in ENTRY_POINTS.items():
        print(f"  {name:<17} {what}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
