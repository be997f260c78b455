"""Nsight Compute figures for our attention kernels: occupancy, throughput, tensor-pipe use.

Runs `ncu` (clocks left alone: --clock-control none) over a child process that launches our
forward and backward once at one benchmark shape, reads the chosen metrics from ncu's CSV, and
writes reports/project01_cuda_kernel/attention_ncu.json. Run:
python -m project01_cuda_kernel.profile_attention [--head-dim 128] [--seq-len 4096] [--causal]
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from shared.cli import main_guard

PROJECT = "project01_cuda_kernel"
KERNEL_REGEX = "regex:flash_(fwd|bwd)(_hopper)?_kernel"

# ncu metric -> (short name, unit) for the report.
METRICS = {
    "gpu__time_duration.sum": ("duration", "us"),
    "launch__registers_per_thread": ("registers/thread", ""),
    "launch__shared_mem_per_block_dynamic": ("dynamic shared/CTA", "KiB"),
    "launch__occupancy_limit_registers": ("CTA limit by registers", ""),
    "launch__occupancy_limit_shared_mem": ("CTA limit by shared mem", ""),
    "sm__maximum_warps_per_active_cycle_pct": ("theoretical occupancy", "%"),
    "sm__warps_active.avg.pct_of_peak_sustained_active": ("achieved occupancy", "%"),
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": ("SM throughput", "%"),
    # On the H200 this counts wgmma as well as mma.sync (72% for the Hopper forward, which
    # issues no mma.sync); the gmma-specific pipe metric returned no value there.
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": (
        "tensor pipe active",
        "%",
    ),
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": (
        "memory throughput",
        "%",
    ),
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": ("DRAM throughput", "%"),
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum": ("shared bank conflicts", ""),
}


# (ncu unit, lowercased; unit we report) -> factor
_UNIT_FACTORS = {
    ("nsecond", "us"): 1e-3,
    ("ns", "us"): 1e-3,
    ("usecond", "us"): 1.0,
    ("us", "us"): 1.0,
    ("msecond", "us"): 1e3,
    ("byte", "KiB"): 1 / 1024,
    ("b", "KiB"): 1 / 1024,
    ("kbyte", "KiB"): 1000 / 1024,
    ("kib", "KiB"): 1.0,
    ("%", "%"): 1.0,
    ("register/thread", ""): 1.0,
    ("block", ""): 1.0,
    ("", ""): 1.0,
}


def find_ncu() -> str | None:
    found = shutil.which("ncu")
    if found:
        return found
    for root in ("/usr/local/cuda/bin", "/opt/nvidia/nsight-compute"):
        for p in sorted(Path(root).glob("**/ncu")) if Path(root).exists() else []:
            if p.is_file() and os.access(p, os.X_OK):
                return str(p)
    return None


def worker(head_dim: int, seq_len: int, causal: bool, total_tokens: int, hidden: int) -> None:
    """Launch our forward once and our backward once (the profiled process); on a Hopper GPU
    the FlashAttention-2 forward too, so both forwards are profiled."""
    import torch

    from project01_cuda_kernel.attention import (
        check_inputs,
        flash_attention,
        flash_forward,
        resolve_fwd_kernel,
    )

    b, h = total_tokens // seq_len, hidden // head_dim
    q, k, v, do = (
        torch.randn(b, h, seq_len, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(4)
    )
    for t in (q, k, v):
        t.requires_grad_(True)
    out = flash_attention(q, k, v, causal=causal)
    out.backward(do)
    if resolve_fwd_kernel("auto") == "hopper":
        with torch.no_grad():
            scale = check_inputs(q, k, v, causal, None)
            flash_forward(q.detach(), k.detach(), v.detach(), causal, scale, kernel="fa2")
    torch.cuda.synchronize()


def kernel_label(name: str) -> str:
    """Short column name for a profiled kernel."""
    if "hopper" in name:
        return "forward (Hopper)"
    return "forward (FA2)" if "fwd" in name else "backward"


def unknown_metrics(output: str) -> list[str]:
    """Metrics of METRICS that ncu said it does not know on this GPU ("Failed to find metric")."""
    missing = set(re.findall(r"Failed to find metric\s+(\S+)", output))
    return [
        m for m in METRICS if any(x.strip("'\".,").startswith(m.split(".")[0]) for x in missing)
    ]


def parse_ncu_csv(text: str) -> list[dict]:
    """Rows of `ncu --csv --page raw` (header, units row, one row per kernel) as dicts."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        raise ValueError('no ncu CSV header (a line starting with "ID") in the output')
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header, units, data = rows[0], rows[1], rows[2:]
    out = []
    for r in data:
        if len(r) != len(header):
            continue
        rec = {"kernel": r[header.index("Kernel Name")], "units": {}}
        for metric, (short, unit) in METRICS.items():
            if metric not in header:
                continue
            raw = r[header.index(metric)].replace(",", "")
            try:
                val = float(raw)
            except ValueError:
                continue
            src = units[header.index(metric)].strip()
            factor = _UNIT_FACTORS.get((src.lower(), unit))
            if factor is not None:
                val *= factor
            elif src and src != unit:
                unit = src  # not a conversion we know: keep ncu's own unit
            rec[short] = val
            rec["units"][short] = unit
        out.append(rec)
    return out


@main_guard
def main(argv: list[str] | None = None) -> int:
    from shared.cli import ArgumentParser, nonempty_path, positive_int, writable_dir

    ap = ArgumentParser(prog="python -m project01_cuda_kernel.profile attention")
    ap.add_argument("--head-dim", type=int, default=128, choices=(64, 128))
    ap.add_argument("--seq-len", type=positive_int, default=4096)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--total-tokens", type=positive_int, default=16384)
    ap.add_argument("--hidden", type=positive_int, default=2048)
    ap.add_argument("--reports-dir", type=nonempty_path, default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.total_tokens % args.seq_len or args.hidden % args.head_dim:
        ap.error("--seq-len must divide --total-tokens and --head-dim must divide --hidden")
    if args.worker:
        worker(args.head_dim, args.seq_len, args.causal, args.total_tokens, args.hidden)
        return 0

    from project01_cuda_kernel.attention import build
    from shared.results import REPORTS_DIR, environment, save_result

    writable_dir("--reports-dir", Path(args.reports_dir or REPORTS_DIR) / PROJECT)

    ncu = find_ncu()
    if ncu is None:
        print("ncu (Nsight Compute) not found on PATH: nothing profiled.")
        return 1
    build()  # compile outside the profiled process
    child = [
        sys.executable, "-m", "project01_cuda_kernel.profile_attention", "--worker",
        "--head-dim", str(args.head_dim), "--seq-len", str(args.seq_len),
        "--total-tokens", str(args.total_tokens), "--hidden", str(args.hidden),
        *(["--causal"] if args.causal else []),
    ]  # fmt: skip
    metrics = list(METRICS)

    def profile(metrics: list[str]) -> subprocess.CompletedProcess:
        cmd = [
            ncu, "--clock-control", "none", "--target-processes", "all", "-k", KERNEL_REGEX,
            "--launch-count", "3", "--csv", "--page", "raw", "--metrics", ",".join(metrics),
            *child,
        ]  # fmt: skip
        return subprocess.run(cmd, capture_output=True, text=True, timeout=900)

    proc = profile(metrics)
    dropped = unknown_metrics(proc.stdout + proc.stderr) if proc.returncode != 0 else []
    if dropped:  # e.g. the wgmma pipe metric on a pre-Hopper GPU: say so, profile without it
        print(f"ncu does not know {dropped} on this GPU: profiling without them")
        metrics = [m for m in metrics if m not in dropped]
        proc = profile(metrics)
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
        print(f"ncu failed with exit code {proc.returncode}")
        return proc.returncode
    kernels = parse_ncu_csv(proc.stdout)
    if not kernels:
        print(proc.stdout[-3000:])
        print("ncu produced no kernel rows")
        return 1
    shape = {
        "head_dim": args.head_dim,
        "seq_len": args.seq_len,
        "batch": args.total_tokens // args.seq_len,
        "heads": args.hidden // args.head_dim,
        "causal": args.causal,
        "dtype": "bfloat16",
    }
    for k in kernels:
        k["kernel_short"] = kernel_label(k["kernel"])
    reports_dir = args.reports_dir if args.reports_dir is not None else REPORTS_DIR
    path = save_result(
        PROJECT,
        "attention_ncu",
        {"shape": shape, "kernels": kernels, "metrics": {m: METRICS[m] for m in metrics}},
        config={"ncu": ncu, "clock_control": "none", "kernel_filter": KERNEL_REGEX},
        reports_dir=reports_dir,
        env=environment(),
    )
    for k in kernels:
        print(k["kernel_short"], {n: round(v, 1) for n, v in k.items() if isinstance(v, float)})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
