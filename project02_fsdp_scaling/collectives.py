"""A collective-communication benchmark in the manner of nccl-tests: all-reduce, all-gather,
reduce-scatter, all-to-all and broadcast over a sweep of message sizes, each timed and turned
into algorithm and bus bandwidth.

    python -m project02_fsdp_scaling collectives                          # CPU: 2 gloo ranks
    python -m project02_fsdp_scaling collectives --world-size 8           # 8 GPUs, NCCL
    NCCL_ALGO=Tree python -m project02_fsdp_scaling collectives --world-size 8 --name coll_tree

Without torchrun around it, the command starts its own `torchrun --standalone` of --world-size
ranks (GPUs when CUDA is visible, else CPU processes over gloo) and writes the record from the
ranks' answers; under torchrun it is one of the ranks.

Sizes follow nccl-tests: "size" is the bytes of the whole buffer (all-gather: the gathered
output; reduce-scatter: the input before scattering; all-to-all: each rank's send buffer), so
each rank's piece of an all-gather or reduce-scatter is size / n. For n ranks and time t:
    algbw = size / t
    busbw = algbw x factor, factor = 2 (n - 1) / n for all-reduce, (n - 1) / n for all-gather,
            reduce-scatter and all-to-all, 1 for broadcast,
so that busbw is comparable with the link's peak whatever the collective and the rank count
(nccl-tests' doc/PERFORMANCE.md). Time: the slowest rank's mean over `iters` back-to-back calls
after `warmup` (CUDA events on a GPU, wall time on the CPU).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import torch
import torch.distributed as dist

from project02_fsdp_scaling import PROJECT
from shared.hardware import match_gpu_name

OpName = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"]
OPS: tuple[str, ...] = get_args(OpName)


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor of `op` on n ranks."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op == "broadcast":
        return 1.0
    raise ValueError(f"op must be one of {OPS}, got {op!r}")


def message_sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """min_bytes, min_bytes x factor, ... up to max_bytes (nccl-tests' -b, -e, -f)."""
    sizes, s = [], min_bytes
    while s <= max_bytes:
        sizes.append(s)
        s *= factor
    return sizes


@dataclass
class CollectivesConfig:
    """nccl-tests-style sweep of all-reduce, all-gather, reduce-scatter, all-to-all and broadcast
    over message sizes: time, algorithm bandwidth and bus bandwidth per size, one JSON record
    (NCCL version, NCCL_ALGO / NCCL_PROTO and the GPU topology on GPUs) and a bus-bandwidth
    chart."""

    world_size: int = 2
    """ranks to start when not under torchrun (GPUs, or CPU processes over gloo)"""
    ops: tuple[OpName, ...] = OPS
    """the collectives, in this order"""
    min_bytes: int = 8
    """smallest message (nccl-tests -b)"""
    max_bytes: int = 0
    """largest message (nccl-tests -e); 0: 1 GiB on GPUs, 4 MiB on the CPU (gloo copies
    through host memory: 256 MiB is possible, and slow)"""
    factor: int = 4
    """each size is the last times this (nccl-tests -f)"""
    warmup: int = 5
    """untimed calls per size"""
    iters: int = 20
    """timed calls per size (their mean is the time)"""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """element type of the buffers"""
    reports_dir: str | None = None
    """results go to <reports-dir>/project02_fsdp_scaling/ (None: a new runs/<UTC time>/;
    reports/ only when named)"""
    name: str = ""
    """result file stem; default collectives_gpu or collectives_cpu"""
    timeout_s: int = 1800
    """wall-clock limit of the torchrun job"""

    def validate(self) -> CollectivesConfig:
        from project02_fsdp_scaling.config import check_name

        check_name(self.name)
        for name in ("world_size", "min_bytes", "warmup", "iters", "timeout_s"):
            if getattr(self, name) < (0 if name == "warmup" else 1):
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.factor < 2:
            raise ValueError(f"factor must be >= 2, got {self.factor}")
        if self.max_bytes and self.max_bytes < self.min_bytes:
            raise ValueError(
                f"max_bytes ({self.max_bytes}) must be >= min_bytes ({self.min_bytes})"
            )
        for op in self.ops:
            if op not in OPS:
                raise ValueError(f"ops: {op!r} is not one of {OPS}")
        return self

    def resolved_max_bytes(self, on_gpu: bool) -> int:
        return self.max_bytes or (2**30 if on_gpu else 4 * 2**20)


# ---- one rank's measurements ----------------------------------------------------------------
def _buffers(op: str, size: int, n: int, dtype: torch.dtype, device) -> tuple:
    """(input, output) of `op` for a message of `size` bytes, rounded down to whole elements
    per rank (at least one each)."""
    elem = torch.tensor([], dtype=dtype).element_size()
    count = max(n, (size // elem) // n * n)  # elements of the whole buffer
    if op == "all_gather":
        return torch.ones(count // n, dtype=dtype, device=device), torch.empty(
            count, dtype=dtype, device=device
        )
    if op == "reduce_scatter":
        return torch.ones(count, dtype=dtype, device=device), torch.empty(
            count // n, dtype=dtype, device=device
        )
    if op == "all_to_all":
        return torch.ones(count, dtype=dtype, device=device), torch.empty(
            count, dtype=dtype, device=device
        )
    return torch.ones(count, dtype=dtype, device=device), None


def _call(op: str, inp: torch.Tensor, out: torch.Tensor | None) -> None:
    if op == "all_reduce":
        dist.all_reduce(inp)
    elif op == "all_gather":
        dist.all_gather_single(out, inp)
    elif op == "reduce_scatter":
        dist.reduce_scatter_single(out, inp)
    elif op == "all_to_all":
        dist.all_to_all_single(out, inp)
    else:
        dist.broadcast(inp, src=0)


def time_op(op: str, size: int, cfg: CollectivesConfig, device: torch.device) -> dict:
    """One size of one collective on this rank: the mean time of `iters` calls, in seconds,
    the slowest rank's (a collective ends when its last rank does)."""
    import time

    n = dist.get_world_size()
    dtype = getattr(torch, cfg.dtype)
    inp, out = _buffers(op, size, n, dtype, device)
    nbytes = (out if op == "all_gather" else inp).numel() * inp.element_size()
    for _ in range(cfg.warmup):
        _call(op, inp, out)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    dist.barrier()
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(cfg.iters):
            _call(op, inp, out)
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3 / cfg.iters
    else:
        t = time.perf_counter()
        for _ in range(cfg.iters):
            _call(op, inp, out)
        seconds = (time.perf_counter() - t) / cfg.iters
    slowest = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    seconds = float(slowest.item())
    algbw = nbytes / seconds / 1e9
    return {
        "bytes": nbytes,
        "count": nbytes // inp.element_size(),  # elements of the whole buffer
        "time_us": seconds * 1e6,
        "algbw_gbs": algbw,
        "busbw_gbs": algbw * bus_factor(op, n),
    }


def measure(cfg: CollectivesConfig, device: torch.device, *, log=print) -> dict:
    """Every op over every size on this rank (a collective: all ranks call it)."""
    on_gpu = device.type == "cuda"
    sizes = message_sizes(cfg.min_bytes, cfg.resolved_max_bytes(on_gpu), cfg.factor)
    results = {}
    for op in cfg.ops:
        rows = []
        for size in sizes:
            row = time_op(op, size, cfg, device)
            rows.append(row)
            log(
                f"{op:>14} {row['bytes']:>12} B {row['time_us']:>11.1f} us "
                f"algbw {row['algbw_gbs']:8.3f} GB/s busbw {row['busbw_gbs']:8.3f} GB/s"
            )
        results[op] = rows
    return results


# ---- the system around the numbers ----------------------------------------------------------
def _run(cmd: list[str]) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def nvlink_links(status: str | None) -> dict | None:
    """Active NVLink links of GPU 0 and their speed, from `nvidia-smi nvlink --status`
    (the "Link <i>: <speed> GB/s" lines under "GPU 0: ...")."""
    import re

    if not status:
        return None
    gpu0 = status.split("GPU 1:")[0]
    speeds = [float(s) for s in re.findall(r"Link \d+: ([\d.]+) GB/s", gpu0)]
    if not speeds:
        return None
    return {"links": len(speeds), "gbs_per_link": speeds[0], "gbs_total": sum(speeds)}


def link_peak_gbs(gpu_name: str | None) -> float | None:
    """One-direction NVLink peak per GPU (GB/s) of the GPU named, from shared.hardware's table;
    None for a GPU without NVLink in the table (or no GPU)."""
    spec = match_gpu_name(gpu_name) if gpu_name else None
    return spec.nvlink_gbs.value if spec is not None and spec.nvlink_gbs is not None else None


def system(device: torch.device) -> dict:
    """The communication stack: backend, NCCL version and its algorithm/protocol settings,
    the GPU topology matrix and NVLink links (GPUs only)."""
    info = {
        "backend": dist.get_backend(),
        "world_size": dist.get_world_size(),
        "nccl_version": None,
        "nccl_env": {k: v for k, v in os.environ.items() if k in ("NCCL_ALGO", "NCCL_PROTO")},
        "topology": None,
        "nvlink": None,
        "link_peak_gbs": None,
    }
    if device.type == "cuda":
        info["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
        info["topology"] = _run(["nvidia-smi", "topo", "-m"])
        info["nvlink"] = nvlink_links(_run(["nvidia-smi", "nvlink", "--status", "-i", "0"]))
        info["link_peak_gbs"] = link_peak_gbs(torch.cuda.get_device_name())
    return info


# ---- the command ----------------------------------------------------------------------------
def _rank_main(cfg: CollectivesConfig, out: str) -> int:
    """One rank under torchrun: measure; rank 0 writes the raw answers to `out`."""
    import json

    from shared.distributed import cleanup, init_distributed

    info = init_distributed()
    try:
        results = measure(cfg, info.device, log=print if info.is_main else (lambda *_: None))
        if info.is_main:
            Path(out).write_text(json.dumps({"results": results, "system": system(info.device)}))
    finally:
        cleanup()
    return 0


def run(cfg: CollectivesConfig) -> Path | int:
    """`collectives`: start the ranks under torchrun (or be one of them), then write
    <reports-dir>/project02_fsdp_scaling/<name>.json, its Markdown and chart."""
    import json
    import tempfile

    from project02_fsdp_scaling.collectives_report import render
    from project02_fsdp_scaling.config import check_reports_dir
    from project02_fsdp_scaling.scaling import launch
    from shared.results import load_result, output_root, save_result

    cfg.validate()
    inner = os.environ.get("P02_COLLECTIVES_OUT")
    if inner:  # a rank of the job below
        return _rank_main(cfg, inner)
    check_reports_dir(cfg.reports_dir)
    on_gpu = torch.cuda.is_available()
    if on_gpu and torch.cuda.device_count() < cfg.world_size:
        raise ValueError(
            f"world_size {cfg.world_size} needs {cfg.world_size} GPUs, "
            f"{torch.cuda.device_count()} visible"
        )
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.json"
        os.environ["P02_COLLECTIVES_OUT"] = str(raw)
        try:
            flags = ["--ops", *cfg.ops, "--dtype", cfg.dtype]
            for name in ("min_bytes", "max_bytes", "factor", "warmup", "iters"):
                flags += ["--" + name.replace("_", "-"), str(getattr(cfg, name))]
            rc, tail = launch(
                cfg.world_size, "collectives", flags, on_gpu=on_gpu, timeout_s=cfg.timeout_s
            )
        finally:
            del os.environ["P02_COLLECTIVES_OUT"]
        if rc != 0:
            raise RuntimeError(f"the collectives job exited {rc}:\n{tail}")
        answer = json.loads(raw.read_text())
    name = cfg.name or ("collectives_gpu" if on_gpu else "collectives_cpu")
    root = output_root(cfg.reports_dir)
    config = {
        **{k: v for k, v in vars(cfg).items() if k not in ("reports_dir", "name")},
        "max_bytes": cfg.resolved_max_bytes(on_gpu),
        "ops": list(cfg.ops),
    }
    path = save_result(
        PROJECT,
        name,
        {"system": answer["system"], "ops": answer["results"]},
        config=config,
        reports_dir=root,
    )
    render(load_result(path), path.parent, path.stem)
    print(f"wrote {path}")
    return path
