"""Where a training step's time goes, read from a torch.profiler trace (Chrome trace JSON).

Per profiled step (the `ProfilerStep#N` spans):
- compute: the union of compute intervals (GPU: every kernel, copy and memset that is not a
  collective; CPU: every `aten::`/`fsdp::` op of the training thread),
- communication: the union of collective intervals (GPU: NCCL kernels; CPU: gloo's
  `gloo:<collective>` spans on its worker threads),
- exposed communication: communication time during which no compute runs (what overlap failed
  to hide), overlapped = communication - exposed,
- other: the rest of the step (the device idle: launch gaps, host work, synchronisation).
compute + exposed + other = step time. Intervals are clipped to the step and merged before they
are measured, so nested or concurrent events are never counted twice.

On a GPU trace also `kernel_time`: the device time of the step's kernels, copies and memsets
summed by kind (`kernel_kind`: GEMMs, attention, Inductor's compiled kernels, the optimizer,
copies and casts, other eager element-wise kernels, collectives), each with its count and its
share of the total, the kernels that took the most time, and `by_origin`: the same time
charged to where the host launched each kernel (the innermost `FSDP::...` or `Optimizer.step`
span of the launching thread, else the autograd node of the backward), which tells, say, FSDP's
gradient accumulation between micro-batches from the model's own element-wise work. A sum of
durations (where two streams overlap, both count), so it answers "which kernels hold the
device", and compute_ms above "how long the device computed".

    python -m project02_fsdp_scaling comm-analysis reports/project02_fsdp_scaling/trace_1b_ws2_rank0.json.gz
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import tyro

Interval = tuple[float, float]  # (start, end) in microseconds

_STEP = re.compile(r"^ProfilerStep#\d+$")
_COLLECTIVES = (
    "allgather",
    "reducescatter",
    "allreduce",
    "broadcast",
    "alltoall",
    "sendrecv",
    "send",
    "recv",
    "reduce",
    "barrier",
)


def load_trace(path: str | Path) -> dict:
    """A Chrome trace written by `torch.profiler` (`.json` or `.json.gz`)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no profiler trace at {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    if not isinstance(trace, dict) or "traceEvents" not in trace:
        raise ValueError(f"{path} is not a Chrome trace (no 'traceEvents')")
    return trace


def merge(intervals: list[Interval]) -> list[Interval]:
    """Sorted, non-overlapping union of intervals."""
    out: list[list[float]] = []
    for s, e in sorted(i for i in intervals if i[1] > i[0]):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def total(intervals: list[Interval]) -> float:
    return sum(e - s for s, e in intervals)


def clip(intervals: list[Interval], lo: float, hi: float) -> list[Interval]:
    return [(max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi]


def subtract(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Parts of merged intervals `a` not covered by merged intervals `b`."""
    out, j = [], 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def collective_kind(name: str) -> str | None:
    """'allgather', 'reducescatter', ... for a collective's event name; None otherwise."""
    low = name.lower()
    if "nccl" not in low and not low.startswith("gloo:"):
        return None
    flat = re.sub(
        r"[^a-z]", "", low.split("(")[0].replace("nccldevkernel", "").replace("ncclkernel", "")
    )
    for kind in _COLLECTIVES:
        if kind in flat:
            return kind
    return "other"


# Kernel kinds by name, lower-cased; the first kind one of whose fragments the name contains wins
# (attention before GEMM: cuDNN's attention kernels carry "wgmma" too; Inductor's GEMM templates
# before its other kernels; copies before the optimizer: FSDP's all-gather copy-in is a foreach
# copy, `multi_tensor_apply_kernel<..., CopyFunctor<...>>`). Names as CUDA 13 / torch 2.11 /
# cuDNN 9 print them on Hopper.
KERNEL_KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("attention", ("sdpa", "fmha", "flash", "attention", "cudnn::fusion")),
    ("gemm", ("nvjet", "gemm", "cutlass", "xmma", "triton_tem_", "scaled_mm")),
    ("compiled (Inductor)", ("triton_",)),
    ("copy / cast", ("copy", "memcpy", "chunk_cat", "cat_cuda", "split_with_sizes")),
    ("optimizer", ("multi_tensor_apply", "adam")),
    ("eager element-wise", ("elementwise", "reduce_kernel", "fill", "memset")),
)


def kernel_kind(name: str) -> str:
    """The KERNEL_KINDS kind of a GPU event's name: "collective" for NCCL, "other" when none
    matches."""
    if collective_kind(name) is not None:
        return "collective"
    low = name.lower()
    for kind, fragments in KERNEL_KINDS:
        if any(f in low for f in fragments):
            return kind
    return "other"


def kernel_time(
    kernels: list[dict],
    steps: list[Interval],
    top: int = 10,
    origins: dict[int, str] | None = None,
) -> dict:
    """Per step (ms): the GPU events (kernels, copies, memsets) that start inside the step
    spans, summed by `kernel_kind` with counts and shares, and the `top` kernels by time (name
    cut at 100 characters). With `origins` (`launch_origins` of the trace) also `by_origin`:
    the time summed by (launch origin, kind), the `top` largest, e.g. FSDP's gradient
    accumulation between micro-batches ("FSDP::post_backward_accumulate", element-wise)."""
    by_kind: dict[str, float] = defaultdict(float)
    n_kind: dict[str, int] = defaultdict(int)
    by_name: dict[str, float] = defaultdict(float)
    n_name: dict[str, int] = defaultdict(int)
    by_origin: dict[tuple[str, str], float] = defaultdict(float)
    n_origin: dict[tuple[str, str], int] = defaultdict(int)
    for e in kernels:
        start, end = _span(e)
        if not any(lo <= start < hi for lo, hi in steps):
            continue
        name = str(e.get("name", ""))
        kind = "copy / cast" if e.get("cat") == "gpu_memcpy" else kernel_kind(name)
        by_kind[kind] += end - start
        n_kind[kind] += 1
        by_name[name[:100]] += end - start
        n_name[name[:100]] += 1
        if origins is not None:
            corr = e.get("args", {}).get("correlation")
            site = (
                origins.get(int(corr), "(launch not traced)")
                if corr is not None
                else "(launch not traced)",
                kind,
            )
            by_origin[site] += end - start
            n_origin[site] += 1
    n, all_us = len(steps), sum(by_kind.values())
    origin_rows = (
        {}
        if origins is None
        else {
            "by_origin": [
                {
                    "origin": origin,
                    "kind": kind,
                    "ms_per_step": v / n / 1e3,
                    "count_per_step": n_origin[origin, kind] / n,
                    "share": v / all_us if all_us else 0.0,
                }
                for (origin, kind), v in sorted(by_origin.items(), key=lambda kv: -kv[1])[:top]
            ]
        }
    )
    return {
        "total_ms_per_step": all_us / n / 1e3,
        "kinds": {
            k: {
                "ms_per_step": v / n / 1e3,
                "count_per_step": n_kind[k] / n,
                "share": v / all_us if all_us else 0.0,
            }
            for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])
        },
        "top": [
            {
                "name": name,
                "kind": kernel_kind(name),
                "ms_per_step": v / n / 1e3,
                "count_per_step": n_name[name] / n,
            }
            for name, v in sorted(by_name.items(), key=lambda kv: -kv[1])[:top]
        ],
        **origin_rows,
    }


_LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
_BACKWARD_OP = "autograd::engine::evaluate_function: "


def _origin_name(name: str) -> str:
    """An annotation's name without its per-instance part: "FSDP::pre_forward (layers.3)" ->
    "FSDP::pre_forward", "FSDP::backward_prefetch for layers.3" -> "FSDP::backward_prefetch",
    "Optimizer.step#AdamW.step" -> "Optimizer.step"."""
    name = re.sub(r" (\(.*\)|for \S+)$", "", name)
    return name.split("#", 1)[0]


def launch_origins(events: list[dict]) -> dict[int, str]:
    """Correlation id -> where the host launched it: the innermost enclosing annotation of the
    launching thread (FSDP's `FSDP::...` spans, `Optimizer.step`, ...; step spans left out), or
    else the autograd node whose backward launched it ("backward: MulBackward0"), or else
    "(no annotation)" (the forward's and the loss's own kernels)."""
    spans: dict[tuple, list[dict]] = defaultdict(list)
    launches: dict[tuple, list[dict]] = defaultdict(list)
    for e in events:
        cat, name = e.get("cat"), str(e.get("name", ""))
        key = (e.get("pid"), e.get("tid"))
        if cat in _LAUNCH_CATS and "correlation" in e.get("args", {}):
            launches[key].append(e)
        elif (cat == "user_annotation" and not _STEP.match(name)) or (
            cat == "cpu_op" and name.startswith(_BACKWARD_OP)
        ):
            spans[key].append(e)
    out: dict[int, str] = {}
    for key, ls in launches.items():
        todo = sorted(spans.get(key, []), key=lambda e: (float(e["ts"]), -float(e["dur"])))
        stack: list[dict] = []
        i = 0
        for launch in sorted(ls, key=lambda e: float(e["ts"])):
            ts = float(launch["ts"])
            while i < len(todo) and float(todo[i]["ts"]) <= ts:
                stack.append(todo[i])
                i += 1
            stack = [s for s in stack if _span(s)[1] >= ts]  # launches come in time order
            open_ = [s for s in stack if _span(s)[0] <= ts]
            note = [s for s in open_ if s.get("cat") == "user_annotation"]
            if note:
                origin = _origin_name(str(max(note, key=lambda s: float(s["ts"]))["name"]))
            elif open_:
                node = str(max(open_, key=lambda s: float(s["ts"]))["name"])
                origin = "backward: " + node.removeprefix(_BACKWARD_OP)
            else:
                origin = "(no annotation)"
            out[int(launch["args"]["correlation"])] = origin
    return out


def _span(e: dict) -> Interval:
    ts = float(e["ts"])
    return ts, ts + float(e.get("dur", 0.0))


def analyse_trace(trace: dict) -> dict:
    """Per-step averages (ms) of compute, communication, overlap and exposed communication."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    on_gpu = any(e.get("cat") == "kernel" for e in kernels)

    # Each step is annotated on the host (user_annotation) and, with CUDA, again on the device
    # timeline (gpu_user_annotation): take the device's copy when there is one, never both.
    def step_spans(cat: str) -> list[dict]:
        return [e for e in events if _STEP.match(str(e.get("name", ""))) and e.get("cat") == cat]

    step_events = step_spans("gpu_user_annotation") if on_gpu else []
    step_events = step_events or step_spans("user_annotation")
    steps = sorted(_span(e) for e in step_events)
    if not steps:
        raise ValueError("the trace has no ProfilerStep#N spans: was prof.step() called?")

    comm_raw: list[Interval] = []
    by_kind: dict[str, list[Interval]] = defaultdict(list)
    compute_raw: list[Interval] = []
    if on_gpu:
        for e in kernels:
            kind = collective_kind(str(e.get("name", "")))
            if kind is None:
                compute_raw.append(_span(e))
            else:
                comm_raw.append(_span(e))
                by_kind[kind].append(_span(e))
    else:
        step_tids = {e.get("tid") for e in step_events}
        for e in events:
            name = str(e.get("name", ""))
            kind = collective_kind(name)
            if kind is not None:
                comm_raw.append(_span(e))
                by_kind[kind].append(_span(e))
            elif (
                e.get("tid") in step_tids
                and e.get("cat") == "cpu_op"
                and name.startswith(("aten::", "fsdp::"))
            ):
                compute_raw.append(_span(e))

    compute_all, comm_all = merge(compute_raw), merge(comm_raw)
    acc = defaultdict(float)
    kind_ms: dict[str, float] = defaultdict(float)
    kind_n: dict[str, int] = defaultdict(int)
    for lo, hi in steps:
        comp = clip(compute_all, lo, hi)
        comm = clip(comm_all, lo, hi)
        exposed = subtract(comm, comp)
        busy = merge(comp + comm)
        acc["step"] += hi - lo
        acc["compute"] += total(comp)
        acc["comm"] += total(comm)
        acc["exposed"] += total(exposed)
        acc["other"] += (hi - lo) - total(busy)
        for kind, ivs in by_kind.items():
            inside = clip(ivs, lo, hi)
            kind_ms[kind] += total(merge(inside)) / 1e3
            kind_n[kind] += len(inside)
    n = len(steps)
    ms = {k: v / n / 1e3 for k, v in acc.items()}  # us -> ms, per step
    by_kernel = (
        {"kernel_time": kernel_time(kernels, steps, top=12, origins=launch_origins(events))}
        if on_gpu
        else {}
    )
    return {
        "source": "GPU kernels (CUDA)" if on_gpu else "CPU ops (gloo threads vs training thread)",
        "steps": n,
        "step_ms": ms["step"],
        "compute_ms": ms["compute"],
        "comm_ms": ms["comm"],
        "overlapped_comm_ms": ms["comm"] - ms["exposed"],
        "exposed_comm_ms": ms["exposed"],
        "other_ms": ms["other"],
        "exposed_comm_fraction": ms["exposed"] / ms["step"] if ms["step"] else 0.0,
        "overlap_fraction": (ms["comm"] - ms["exposed"]) / ms["comm"] if ms["comm"] else None,
        "collectives": {
            k: {"ms_per_step": kind_ms[k] / n, "count_per_step": kind_n[k] / n}
            for k in sorted(kind_ms)
        },
        **by_kernel,
        "unit": "ms per step",
    }


@dataclass
class CommAnalysisConfig:
    """Compute vs communication vs exposed communication of a torch.profiler trace, and on a GPU
    trace the GPU time by kernel kind (GEMM, attention, Inductor's kernels, copies, ...), as
    JSON on stdout."""

    trace: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="TRACE")]
    """Chrome trace (.json or .json.gz) written by torch.profiler"""


def run(cfg: CommAnalysisConfig) -> dict:
    """`comm-analysis`: the trace's analysis, printed and returned."""
    from shared.cli import input_file

    summary = analyse_trace(load_trace(input_file("trace", cfg.trace)))
    json.dump(summary, sys.stdout, indent=2)
    print()
    return summary


if __name__ == "__main__":  # `python -m <this module>` runs its command of the package
    import sys

    from project02_fsdp_scaling.__main__ import main

    sys.exit(main(["comm-analysis", *sys.argv[1:]]))
