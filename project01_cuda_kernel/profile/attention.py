"""Nsight Compute figures for our attention kernels: occupancy, throughput, tensor-pipe use.

Runs `ncu` (clocks left alone: --clock-control none; `profile.ncu`) over a child process that
launches our forward and backward once at one benchmark shape, reads the chosen metrics from
ncu's CSV with their units, and writes <reports-dir>/project01_cuda_kernel/attention_ncu.json.

    python -m project01_cuda_kernel profile-attention [--head-dim 128] [--seq-len 4096] [--causal]
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from project01_cuda_kernel import PROJECT

from . import ncu as ncu_tool

KERNEL_REGEX = "flash_(fwd|bwd)(_hopper)?_kernel"  # ncu's regex syntax

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
    "smsp__issue_active.avg.pct_of_peak_sustained_active": ("issue slots busy", "%"),
    # Where the warps wait: warps stalled for each reason per cycle with an instruction issued.
    # In the warp-specialised Hopper kernels the producer warps spin on mbarriers, so their
    # waits count here too.
    **{
        f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio": (
            f"stall: {reason.replace('_', ' ')}",
            "",
        )
        for reason in (
            "long_scoreboard",
            "barrier",
            "wait",
            "math_pipe_throttle",
            "mio_throttle",
            "short_scoreboard",
            "lg_throttle",
            "membar",
            "sleeping",
            "dispatch_stall",
        )
    },
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


@dataclass
class AttentionProfileConfig:
    """Nsight Compute (--clock-control none) over one forward and one backward of our attention
    kernels at one benchmark shape (and the FlashAttention-2 forward too on a Hopper GPU)."""

    head_dim: Literal[64, 128] = 128
    """head dimension"""
    seq_len: int = 4096
    """sequence length (divides --total-tokens)"""
    causal: bool = False
    """causal mask"""
    total_tokens: int = 16384
    """tokens per batch: batch = total_tokens // seq_len"""
    hidden: int = 2048
    """model width: heads = hidden // head_dim"""
    reports_dir: str | None = None
    """results go to <reports-dir>/project01_cuda_kernel/ (None: a new runs/<UTC time>/; reports/ only when named)"""

    def __post_init__(self) -> None:
        for name in ("seq_len", "total_tokens", "hidden"):
            if getattr(self, name) < 1:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag}: expected an integer >= 1, got {getattr(self, name)}")
        if self.total_tokens % self.seq_len or self.hidden % self.head_dim:
            raise ValueError(
                "--seq-len must divide --total-tokens and --head-dim must divide --hidden"
            )
        if self.reports_dir is not None and not str(self.reports_dir).strip():
            raise ValueError("--reports-dir: expected a folder, got an empty path")


def worker(head_dim: int, seq_len: int, causal: bool, total_tokens: int, hidden: int) -> None:
    """Launch our forward once and the FlashAttention-2 backward once, named (the profiled
    process); on a Hopper GPU the FlashAttention-2 forward and the Hopper backward too, so both
    forwards and both backwards are profiled whatever "auto" runs."""
    import torch

    from ..attention import (
        check_inputs,
        flash_attention,
        flash_backward,
        flash_forward,
        resolve_fwd_kernel,
    )

    b, h = total_tokens // seq_len, hidden // head_dim
    q, k, v, do = (
        torch.randn(b, h, seq_len, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(4)
    )
    for t in (q, k, v):
        t.requires_grad_(True)
    out = flash_attention(q, k, v, causal=causal, bwd_kernel="fa2")
    out.backward(do)
    if resolve_fwd_kernel("auto") == "hopper":
        with torch.no_grad():
            scale = check_inputs(q, k, v, causal, None)
            qd, kd, vd = q.detach(), k.detach(), v.detach()
            flash_forward(qd, kd, vd, causal, scale, kernel="fa2")
            o, lse = flash_forward(qd, kd, vd, causal, scale)
            flash_backward(do, qd, kd, vd, o, lse, causal, scale, bwd_kernel="hopper")
    torch.cuda.synchronize()


def kernel_label(name: str) -> str:
    """Short column name for a profiled kernel."""
    if "hopper" in name:
        return "forward (Hopper)" if "fwd" in name else "backward (Hopper)"
    return "forward (FA2)" if "fwd" in name else "backward"


def parse_ncu_csv(text: str) -> list[dict]:
    """One dict per profiled launch of `ncu --csv --page raw` output: the kernel name, each
    metric of METRICS present under its short name, converted to the report's unit where the
    conversion is known (else ncu's own unit), and those units."""
    header, units, launches = ncu_tool.read_csv(text)
    if not header:
        raise ValueError('no ncu CSV header (a line starting with "ID") in the output')
    out = []
    for r in launches:
        rec = {"kernel": r[header.index("Kernel Name")], "units": {}}
        for metric, (short, unit) in METRICS.items():
            if metric not in header:
                continue
            raw = r[header.index(metric)].replace(",", "")
            try:
                val = float(raw)
            except ValueError:
                continue
            src = units[header.index(metric)].strip() if units else ""
            factor = _UNIT_FACTORS.get((src.lower(), unit))
            if factor is not None:
                val *= factor
            elif src and src != unit:
                unit = src  # not a conversion we know: keep ncu's own unit
            rec[short] = val
            rec["units"][short] = unit
        out.append(rec)
    return out


def run(cfg: AttentionProfileConfig) -> Path:
    """Profile and write <reports-dir>/project01_cuda_kernel/attention_ncu.json; returns its
    path. Raises NcuError when ncu is missing or fails."""
    from shared.cli import writable_dir
    from shared.results import output_root, save_result

    from .._build import require_cuda
    from ..attention import build

    reports_dir = output_root(cfg.reports_dir)
    writable_dir("--reports-dir", reports_dir / PROJECT)
    require_cuda()
    ncu = ncu_tool.find_ncu()
    if ncu is None:
        raise ncu_tool.NcuError("ncu (Nsight Compute) was not found: nothing profiled.")
    build()  # compile outside the profiled process
    child = [sys.executable, "-c", f"from {__name__} import worker; worker{_shape(cfg)!r}"]
    out, metrics = ncu_tool.run_ncu(
        child, list(METRICS), kernel_regex=KERNEL_REGEX, launch_count=5, drop_unknown=True, ncu=ncu
    )
    kernels = parse_ncu_csv(out)
    # The Hopper backward needs a forward's out and lse, so the Hopper forward runs twice: one
    # column per kernel (its first launch).
    first: dict[str, dict] = {}
    for k in kernels:
        first.setdefault(k["kernel"], k)
    kernels = list(first.values())
    shape = {
        "head_dim": cfg.head_dim,
        "seq_len": cfg.seq_len,
        "batch": cfg.total_tokens // cfg.seq_len,
        "heads": cfg.hidden // cfg.head_dim,
        "causal": cfg.causal,
        "dtype": "bfloat16",
    }
    for k in kernels:
        k["kernel_short"] = kernel_label(k["kernel"])
    return save_result(
        PROJECT,
        "attention_ncu",
        {"shape": shape, "kernels": kernels, "metrics": {m: METRICS[m] for m in metrics}},
        config={"ncu": ncu, "clock_control": "none", "kernel_filter": f"regex:{KERNEL_REGEX}"},
        reports_dir=reports_dir,
    )


def _shape(cfg: AttentionProfileConfig) -> tuple:
    """The worker's arguments for `cfg`."""
    return (cfg.head_dim, cfg.seq_len, cfg.causal, cfg.total_tokens, cfg.hidden)


def main(cfg: AttentionProfileConfig) -> int:
    """`profile-attention`: run, then print each kernel's figures."""
    from shared.results import load_result

    try:
        path = run(cfg)
    except ncu_tool.NcuError as e:
        print(f"attention profile: {e}")
        return 1
    for k in load_result(path)["results"]["kernels"]:
        print(k["kernel_short"], {n: round(v, 1) for n, v in k.items() if isinstance(v, float)})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":  # `python -m <this module>` runs its command of the package
    import sys

    from project01_cuda_kernel.__main__ import main

    sys.exit(main(["profile-attention", *sys.argv[1:]]))
