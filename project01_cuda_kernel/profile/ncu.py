"""Nsight Compute for the profile commands: find `ncu`, run it over a command, read its CSV.

`run_ncu(cmd, metrics, ...)` runs `ncu --clock-control none --csv --page raw --metrics ... <cmd>`
(clocks left as the GPU runs them, so figures match the benchmark's conditions), optionally
again without the metrics this GPU does not know, and returns ncu's output. `read_csv` splits
that output into its header, units row and one row per profiled launch; `parse_raw_csv` makes
those rows dicts: {"id", "kernel", "block_size", "grid_size", metric: float}.
`profile_command` is the three in one; `occupancy_limiter(row)` names what caps the blocks per SM
(registers, shared memory, warps per block, or the block limit).
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

# ncu metric -> short name used in reports.
OCCUPANCY_METRICS = {
    "gpu__time_duration.sum": "duration_ns",
    "launch__registers_per_thread": "registers_per_thread",
    "launch__block_size": "block_size_threads",
    "launch__grid_size": "grid_size_blocks",
    "launch__shared_mem_per_block_static": "static_smem_bytes",
    "launch__shared_mem_per_block_dynamic": "dynamic_smem_bytes",
    "launch__occupancy_limit_registers": "block_limit_registers",
    "launch__occupancy_limit_shared_mem": "block_limit_shared_mem",
    "launch__occupancy_limit_warps": "block_limit_warps",
    "launch__occupancy_limit_blocks": "block_limit_blocks",
    "sm__maximum_warps_per_active_cycle_pct": "theoretical_occupancy_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occupancy_pct",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_throughput_pct",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_throughput_pct",
    "dram__bytes_read.sum": "dram_read_bytes",
    "dram__bytes_write.sum": "dram_write_bytes",
}

_LIMITS = {
    "block_limit_registers": "registers",
    "block_limit_shared_mem": "shared memory",
    "block_limit_warps": "block size (warps)",
    "block_limit_blocks": "max blocks per SM",
}


class NcuError(RuntimeError):
    """ncu is missing, failed, or printed nothing that could be parsed."""


def find_ncu() -> str | None:
    """ncu from the PATH, the CUDA toolkit, or an Nsight Compute install."""
    found = shutil.which("ncu")
    if found:
        return found
    roots = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda", "/opt/nvidia/nsight-compute"]
    for root in filter(None, roots):
        r = Path(root)
        if not r.exists():
            continue
        for p in sorted(r.glob("**/ncu"), reverse=True):  # newest version first
            if p.is_file() and os.access(p, os.X_OK):
                return str(p)
    return None


def _number(text: str) -> float | str:
    t = text.replace(",", "").strip()
    try:
        return float(t)
    except ValueError:
        return text


def read_csv(text: str) -> tuple[list[str], list[str], list[list[str]]]:
    """(header, units row, launch rows) of `ncu --csv --page raw` output; other lines (e.g.
    '==PROF==', the program's own output) are skipped. Empty lists when there is no CSV."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    if not lines:
        return [], [], []
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    header, body = rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]
    if "Kernel Name" not in header:
        raise NcuError(f"ncu CSV has no 'Kernel Name' column: {header[:8]}")
    units = next((r for r in body if not r[header.index("ID")].strip().isdigit()), [])
    launches = [r for r in body if r[header.index("ID")].strip().isdigit()]
    return header, units, launches


def parse_raw_csv(text: str, metrics: dict[str, str]) -> list[dict]:
    """One dict per launch of `ncu --csv --page raw` output, in launch order: its id, kernel
    name, block and grid size, and each of `metrics` (ncu name -> short name) found."""
    header, _, launches = read_csv(text)
    col = {name: i for i, name in enumerate(header)}
    rows = []
    for rec in launches:
        row = {
            "id": int(rec[col["ID"]]),
            "kernel": rec[col["Kernel Name"]],
            "block_size": rec[col["Block Size"]] if "Block Size" in col else None,
            "grid_size": rec[col["Grid Size"]] if "Grid Size" in col else None,
        }
        for metric, short in metrics.items():
            if metric in col:
                row[short] = _number(rec[col[metric]])
        rows.append(row)
    return sorted(rows, key=lambda r: r["id"])


def unknown_metrics(output: str, metrics: Sequence[str]) -> list[str]:
    """The metrics of `metrics` that ncu said it does not know on this GPU ("Failed to find
    metric")."""
    missing = set(re.findall(r"Failed to find metric\s+(\S+)", output))
    return [
        m for m in metrics if any(x.strip("'\".,").startswith(m.split(".")[0]) for x in missing)
    ]


def occupancy_limiter(row: dict) -> str | None:
    """What caps resident blocks per SM: the smallest of ncu's per-resource block limits."""
    limits = {
        name: row[key]
        for key, name in _LIMITS.items()
        if isinstance(row.get(key), float) and row[key] > 0
    }
    if not limits:
        return None
    lowest = min(limits.values())
    return " = ".join(name for name, v in limits.items() if v == lowest)


def run_ncu(
    cmd: list[str],
    metrics: Sequence[str],
    *,
    kernel_regex: str | None = None,
    nvtx_include: str | None = None,
    launch_count: int | None = None,
    drop_unknown: bool = False,
    timeout_s: float = 900,
    env: dict[str, str] | None = None,
    ncu: str | None = None,
) -> tuple[str, list[str]]:
    """Profile every launch of `cmd` that matches `kernel_regex` (ncu's regex syntax, without
    the 'regex:' prefix) and/or lies inside the NVTX range `nvtx_include` (e.g. 'profile/'), the
    first `launch_count` of them when given. With `drop_unknown`, metrics this GPU does not know
    are said in one line and left out. Returns (ncu's stdout, the metrics measured); raises
    NcuError when ncu is missing or fails."""
    ncu = ncu or find_ncu()
    if ncu is None:
        raise NcuError("ncu (Nsight Compute) was not found on PATH or under the CUDA toolkit.")
    metrics = list(metrics)

    def profile(metrics: list[str]) -> subprocess.CompletedProcess:
        fixed = "--clock-control none --csv --page raw --target-processes all"
        args = [ncu, *fixed.split(), "--metrics", ",".join(metrics)]
        if kernel_regex:
            args += ["--kernel-name", f"regex:{kernel_regex}"]
        if nvtx_include:
            args += ["--nvtx", "--nvtx-include", nvtx_include]
        if launch_count:
            args += ["--launch-count", str(launch_count)]
        return subprocess.run(
            [*args, *cmd],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={**os.environ, **(env or {})},
        )

    proc = profile(metrics)
    dropped = unknown_metrics(proc.stdout + proc.stderr, metrics) if proc.returncode else []
    if drop_unknown and dropped:  # e.g. the wgmma pipe metric before Hopper: profile without
        print(f"ncu does not know {dropped} on this GPU: profiling without them")
        metrics = [m for m in metrics if m not in dropped]
        proc = profile(metrics)
    if proc.returncode != 0 or not read_csv(proc.stdout)[2]:
        tail = (proc.stdout[-1500:] + "\n" + proc.stderr[-1500:]).strip()
        raise NcuError(f"ncu exited with {proc.returncode} and no profiled launch:\n{tail}")
    return proc.stdout, metrics


def profile_command(
    cmd: list[str],
    *,
    kernel_regex: str | None = None,
    nvtx_include: str | None = None,
    metrics: dict[str, str] | None = None,
    timeout_s: float = 900,
    env: dict[str, str] | None = None,
    ncu: str | None = None,
) -> list[dict]:
    """`run_ncu` then `parse_raw_csv`, with each launch's occupancy limiter: one dict per
    launch, in launch order. Raises NcuError."""
    metrics = metrics or OCCUPANCY_METRICS
    out, _ = run_ncu(
        cmd,
        list(metrics),
        kernel_regex=kernel_regex,
        nvtx_include=nvtx_include,
        timeout_s=timeout_s,
        env=env,
        ncu=ncu,
    )
    rows = parse_raw_csv(out, metrics)
    for r in rows:
        r["occupancy_limiter"] = occupancy_limiter(r)
    return rows
