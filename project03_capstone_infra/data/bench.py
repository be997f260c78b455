"""Throughput of the loaders (loaders.py) against the plain in-loop stream, the baseline, in the
same process: batches/s and tokens/s of the DataLoader and of DALI at each worker count, each
loader's first batch checked against the stream's own. `command` writes
`reports/project03_capstone_infra/data.{json,png,md}` (report/data.py renders the chart and the
Markdown from the record).

    python -m project03_capstone_infra data --preset 125m --batches 40
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from project03_capstone_infra import PROJECT
from shared.data import SyntheticTokens

from .loaders import Batch, DaliLoader, ResumableLoader, dali_available


@dataclass
class DataBenchConfig:
    """Throughput of the plain stream, the DataLoader and DALI over the same token batches."""

    preset: Literal["tiny", "125m", "1b"] = "125m"
    """vocabulary and sequence length"""
    global_batch: int = 8
    batches: int = 30
    """timed batches per loader per repeat"""
    warmup: int = 3
    """batches before timing (worker start-up, DALI build)"""
    repeats: int = 3
    """the median over repeats is reported"""
    workers: str = "0,1,2"
    """DataLoader worker counts / DALI Python worker counts to try"""
    dali_threads: int = 2
    dali_device: Literal["auto", "cpu", "gpu"] = "auto"
    seed: int = 0
    reports_dir: str = ""
    out_name: str = "data"

    def validate(self) -> DataBenchConfig:
        from shared.cli import writable_dir

        for name in ("global_batch", "batches", "repeats", "dali_threads", "warmup"):
            if getattr(self, name) < 1:  # warm-up >= 1: the first batch is checked
                raise ValueError(
                    f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}"
                )
        parse_workers(self.workers)
        if not self.out_name or "/" in self.out_name or self.out_name.startswith("."):
            raise ValueError(f"--out-name must be a plain file stem, got {self.out_name!r}")
        if self.reports_dir:
            writable_dir("--reports-dir", self.reports_dir)
        return self


def parse_workers(text: str) -> list[int]:
    try:
        workers = [int(w) for w in text.split(",") if w.strip()]
    except ValueError:
        workers = []
    if not workers or any(w < 0 for w in workers):
        raise ValueError(f"--workers must be a comma-separated list of ints >= 0, got {text!r}")
    return workers


def _time_loader(make_iter, batches: int, warmup: int) -> tuple[float, list[Batch]]:
    """Seconds for `batches` after `warmup` batches, and the first batches seen (for checking)."""
    it = iter(make_iter())
    seen = []
    for _ in range(warmup):
        seen.append(next(it))
    t0 = time.perf_counter()
    for _ in range(batches):
        b = next(it)
        if b[0].device.type == "cuda":
            torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    del it
    return dt, seen


def benchmark(cfg: DataBenchConfig) -> dict:
    from shared.model import ModelArgs

    args = ModelArgs.from_preset(cfg.preset)
    workers = parse_workers(cfg.workers)

    def stream():
        return SyntheticTokens(args.vocab_size, args.max_seq_len, cfg.global_batch, cfg.seed)

    reference = stream().batch_at(0)
    tokens_per_batch = cfg.global_batch * args.max_seq_len
    runs: dict[str, dict] = {}

    def measure(label: str, kind: str, make_iter, **meta):
        times = []
        for _ in range(cfg.repeats):
            dt, seen = _time_loader(make_iter, cfg.batches, cfg.warmup)
            assert torch.equal(seen[0][0].cpu(), reference[0]), f"{label}: wrong first batch"
            times.append(dt)
        med = float(np.median(times))
        runs[label] = {
            "kind": kind,
            **meta,
            "median_s": med,
            "batches_per_s": cfg.batches / med,
            "tokens_per_s": cfg.batches * tokens_per_batch / med,
            "times_s": times,
        }
        print(
            f"{label:<32} {cfg.batches / med:8.1f} batches/s {cfg.batches * tokens_per_batch / med:12,.0f} tokens/s"
        )

    measure("in-loop stream (baseline)", "baseline", lambda: iter(stream()))
    for w in workers:
        measure(
            f"DataLoader, {w} workers",
            "dataloader",
            lambda w=w: ResumableLoader(stream(), num_workers=w),
            workers=w,
        )
    ok, dali_info = dali_available()
    dali_device = cfg.dali_device
    if dali_device == "auto":
        dali_device = "gpu" if torch.cuda.is_available() else "cpu"
    if ok:
        for w in workers:
            measure(
                f"DALI {dali_device}, {w} py workers",
                "dali",
                lambda w=w: DaliLoader(
                    stream(), device=dali_device, py_workers=w, num_threads=cfg.dali_threads
                ),
                workers=w,
            )
    base = runs["in-loop stream (baseline)"]["tokens_per_s"]
    for r in runs.values():
        r["speedup_vs_baseline"] = r["tokens_per_s"] / base
    return {
        "preset": cfg.preset,
        "seq_len": args.max_seq_len,
        "vocab_size": args.vocab_size,
        "global_batch": cfg.global_batch,
        "tokens_per_batch": tokens_per_batch,
        "dali": dali_info if ok else None,
        "dali_skipped_reason": None if ok else dali_info,
        "dali_device": dali_device if ok else None,
        "runs": runs,
    }


def write_report(cfg: DataBenchConfig, results: dict, reports_dir: Path) -> list[Path]:
    """The record (JSON, with the environment) and its report: chart and Markdown."""
    from shared.results import load_result, save_result

    from ..report import data as report

    path = save_result(
        PROJECT,
        cfg.out_name,
        results,
        baseline=results["runs"]["in-loop stream (baseline)"],
        config=asdict(cfg),
        reports_dir=reports_dir,
    )
    return [path, *report.render(load_result(path), reports_dir / PROJECT)]


def command(cfg: DataBenchConfig) -> int:
    """`data`: measure every loader, write the record and its report."""
    from shared.cli import writable_dir
    from shared.results import output_root

    cfg.validate()
    reports_dir = output_root(cfg.reports_dir)
    writable_dir("--reports-dir", reports_dir / PROJECT)
    results = benchmark(cfg)
    for p in write_report(cfg, results, reports_dir):
        print(f"wrote {p}")
    return 0
