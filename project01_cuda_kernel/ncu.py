"""Run Nsight Compute on a Python command and read its metrics (used by the profile modules).

`profile_command(cmd, kernel_regex=..., metrics=...)` runs
`ncu --clock-control none --csv --page raw --metrics ... <cmd>` (clocks left as the GPU runs them,
so figures match the benchmark's conditions) and returns one dict per profiled kernel launch:
{"id", "kernel", "block_size", "grid_size", metric: float}. `occupancy_limiter(row)` names what
caps the blocks per SM (registers, shared memory, warps per block, or the block limit).
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
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


def parse_raw_csv(text: str, metrics: dict[str, str]) -> list[dict]:
    """Rows of `ncu --csv --page raw` output (other lines, e.g. '==PROF==', are skipped)."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    if not lines:
        return []
    reader = list(csv.reader(io.StringIO("\n".join(lines))))
    header, body = reader[0], reader[1:]
    col = {name: i for i, name in enumerate(header)}
    if "Kernel Name" not in col:
        raise NcuError(f"ncu CSV has no 'Kernel Name' column: {header[:8]}")
    rows = []
    for rec in body:
        if len(rec) != len(header):
            continue
        if rec[col["ID"]] == "" or not rec[col["ID"]].strip().isdigit():
            continue  # the units row
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
    """Profile every launch of `cmd` that matches `kernel_regex` (ncu's regex syntax, without
    the 'regex:' prefix) and/or lies inside the NVTX range `nvtx_include` (e.g. 'profile/').
    Returns one dict per launch, in launch order. Raises NcuError."""
    ncu = ncu or find_ncu()
    if ncu is None:
        raise NcuError("ncu (Nsight Compute) was not found on PATH or under the CUDA toolkit.")
    metrics = metrics or OCCUPANCY_METRICS
    args = [ncu, "--clock-control", "none", "--csv", "--page", "raw", "--target-processes", "all",
            "--metrics", ",".join(metrics)]  # fmt: skip
    if kernel_regex:
        args += ["--kernel-name", f"regex:{kernel_regex}"]
    if nvtx_include:
        args += ["--nvtx", "--nvtx-include", nvtx_include]
    proc = subprocess.run(
        [*args, *cmd],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, **(env or {})},
    )
    rows = parse_raw_csv(proc.stdout, metrics)
    if proc.returncode != 0 or not rows:
        tail = (proc.stdout[-1500:] + "\n" + proc.stderr[-1500:]).strip()
        raise NcuError(f"ncu exited with {proc.returncode} and {len(rows)} parsed rows:\n{tail}")
    for r in rows:
        r["occupancy_limiter"] = occupancy_limiter(r)
    return rows
