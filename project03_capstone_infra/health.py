"""GPU health through NVML (nvidia-ml-py), pre-flight checks, and Prometheus metrics.

- `gpu_snapshot()`: per GPU utilisation, memory, temperature, power, clocks, clock-throttle
  reasons, ECC error counts, retired pages (pre-Ampere) and remapped rows (Ampere and later),
  each `None` where the card does not report it. Without NVML or a GPU it says so in
  `GPUReport.reason` and returns no GPUs: the rest of this module works the same.
- `check_gpus()` turns a snapshot into problems against `HealthThresholds` (a pure function, so
  the decision is testable without a sick GPU); `preflight()` adds a disk-space check for the
  checkpoint directory and a CUDA smoke test, and raises `PreflightError` naming the reason, so a
  bad node stops the launch instead of wasting a job.
- `TrainingMetrics`: the trainer's Prometheus metrics (step time, tokens/s, loss, checkpoint
  save/load time and size, restarts, rollbacks) in a registry of its own, plus a collector that
  reads NVML at scrape time; `serve()` exposes them over HTTP.

    python -m project03_capstone_infra.health            # snapshot + pre-flight, as a table
    python -m project03_capstone_infra.health --json     # the same as JSON
    python -m project03_capstone_infra.health --serve-port 9400 --serve-seconds 60
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

# Throttle ("clocks event") reasons that mean the hardware is protecting itself: a GPU showing
# one of these before a run starts is hot, power-starved or failing.
_BAD_THROTTLE = (
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sw_thermal_slowdown",
)
_THROTTLE_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}


@dataclass
class GPUHealth:
    index: int
    name: str
    uuid: str | None = None
    utilization_gpu_pct: float | None = None
    utilization_memory_pct: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    mem_clock_mhz: float | None = None
    throttle_reasons: list[str] | None = None
    ecc_enabled: bool | None = None
    ecc_volatile_corrected: int | None = None
    ecc_volatile_uncorrected: int | None = None
    ecc_aggregate_uncorrected: int | None = None
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None


@dataclass
class GPUReport:
    present: bool
    reason: str | None = None
    """why no GPU is reported"""
    driver: str | None = None
    gpus: list[GPUHealth] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _s(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _try(fn, *args):
    """An NVML query, or None where the card or driver does not support it."""
    import pynvml

    try:
        return fn(*args)
    except pynvml.NVMLError:
        return None


def _read_gpu(pynvml, i: int) -> GPUHealth:
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    g = GPUHealth(index=i, name=_s(pynvml.nvmlDeviceGetName(h)))
    g.uuid = _try(lambda: _s(pynvml.nvmlDeviceGetUUID(h)))
    util = _try(pynvml.nvmlDeviceGetUtilizationRates, h)
    if util is not None:
        g.utilization_gpu_pct, g.utilization_memory_pct = float(util.gpu), float(util.memory)
    mem = _try(pynvml.nvmlDeviceGetMemoryInfo, h)
    if mem is not None:
        g.memory_used_bytes, g.memory_total_bytes = int(mem.used), int(mem.total)
    g.temperature_c = _try(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)
    power = _try(pynvml.nvmlDeviceGetPowerUsage, h)  # milliwatts
    g.power_w = None if power is None else power / 1000.0
    limit = _try(pynvml.nvmlDeviceGetEnforcedPowerLimit, h)
    g.power_limit_w = None if limit is None else limit / 1000.0
    g.sm_clock_mhz = _try(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM)
    g.sm_clock_max_mhz = _try(pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_SM)
    g.mem_clock_mhz = _try(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_MEM)
    reasons_fn = (
        getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
    )
    mask = _try(reasons_fn, h)
    if mask is not None:
        g.throttle_reasons = [name for name, bit in _THROTTLE_BITS.items() if mask & bit]
    ecc = _try(pynvml.nvmlDeviceGetEccMode, h)  # (current, pending)
    if ecc is not None:
        g.ecc_enabled = bool(ecc[0])
    if g.ecc_enabled:
        err = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        g.ecc_volatile_corrected = _try(
            pynvml.nvmlDeviceGetTotalEccErrors, h, err[0], pynvml.NVML_VOLATILE_ECC
        )
        g.ecc_volatile_uncorrected = _try(
            pynvml.nvmlDeviceGetTotalEccErrors, h, err[1], pynvml.NVML_VOLATILE_ECC
        )
        g.ecc_aggregate_uncorrected = _try(
            pynvml.nvmlDeviceGetTotalEccErrors, h, err[1], pynvml.NVML_AGGREGATE_ECC
        )
    sbe = _try(
        pynvml.nvmlDeviceGetRetiredPages,
        h,
        pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
    )
    dbe = _try(
        pynvml.nvmlDeviceGetRetiredPages, h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
    )
    g.retired_pages_sbe = None if sbe is None else len(sbe)
    g.retired_pages_dbe = None if dbe is None else len(dbe)
    pending = _try(pynvml.nvmlDeviceGetRetiredPagesPendingStatus, h)
    g.retired_pages_pending = None if pending is None else bool(pending)
    rows = _try(
        pynvml.nvmlDeviceGetRemappedRows, h
    )  # (correctable, uncorrectable, pending, failed)
    if rows is not None:
        g.remapped_rows_correctable, g.remapped_rows_uncorrectable = int(rows[0]), int(rows[1])
        g.remapped_rows_pending, g.remapped_rows_failure = bool(rows[2]), bool(rows[3])
    return g


def gpu_snapshot() -> GPUReport:
    """Read every GPU NVML sees. Never raises for a missing NVML library, driver or GPU."""
    import pynvml  # nvidia-ml-py, a dependency: it imports without a driver or GPU

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return GPUReport(False, f"NVML unavailable ({e}): no NVIDIA driver or GPU here")
    try:
        driver = _try(lambda: _s(pynvml.nvmlSystemGetDriverVersion()))
        n = pynvml.nvmlDeviceGetCount()
        if n == 0:
            return GPUReport(False, "NVML found no GPU", driver)
        return GPUReport(True, None, driver, [_read_gpu(pynvml, i) for i in range(n)])
    finally:
        pynvml.nvmlShutdown()


# --- checks ----------------------------------------------------------------------------------


@dataclass
class HealthThresholds:
    max_temperature_c: float = 85.0
    max_ecc_volatile_uncorrected: int = 0
    max_memory_used_fraction: float = 0.10
    """memory held by someone else before we start"""
    bad_throttle_reasons: tuple[str, ...] = _BAD_THROTTLE


class PreflightError(RuntimeError):
    """A pre-flight check failed: the message says which and why."""


def check_gpus(
    report: GPUReport,
    thresholds: HealthThresholds | None = None,
    *,
    require_gpus: int = 0,
    gpu_indices: list[int] | None = None,
) -> list[str]:
    """Problems that should stop a launch (empty: healthy). Pure: reads only `report`.
    `gpu_indices` limits the per-GPU checks to those GPUs (a rank checks its own)."""
    t = thresholds or HealthThresholds()
    problems = []
    if require_gpus and len(report.gpus) < require_gpus:
        why = f" ({report.reason})" if report.reason else ""
        problems.append(f"need {require_gpus} GPU(s), NVML reports {len(report.gpus)}{why}")
    for g in report.gpus:
        if gpu_indices is not None and g.index not in gpu_indices:
            continue
        tag = f"GPU {g.index} ({g.name})"
        if g.temperature_c is not None and g.temperature_c > t.max_temperature_c:
            problems.append(
                f"{tag}: {g.temperature_c:.0f} C is above the {t.max_temperature_c:.0f} C limit"
            )
        if (g.ecc_volatile_uncorrected or 0) > t.max_ecc_volatile_uncorrected:
            problems.append(
                f"{tag}: {g.ecc_volatile_uncorrected} uncorrected ECC errors since boot"
            )
        if g.retired_pages_pending:
            problems.append(f"{tag}: retired pages pending: reset the GPU before use")
        if g.remapped_rows_failure:
            problems.append(f"{tag}: row remapping failed: the GPU needs service")
        if g.remapped_rows_pending:
            problems.append(f"{tag}: a row remap is pending: reset the GPU before use")
        bad = [r for r in (g.throttle_reasons or []) if r in t.bad_throttle_reasons]
        if bad:
            problems.append(f"{tag}: clocks held down by {', '.join(bad)}")
        if g.memory_used_bytes is not None and g.memory_total_bytes:
            frac = g.memory_used_bytes / g.memory_total_bytes
            if frac > t.max_memory_used_fraction:
                problems.append(
                    f"{tag}: {frac:.0%} of memory already in use (limit {t.max_memory_used_fraction:.0%}): "
                    "another process holds this GPU"
                )
    return problems


@dataclass
class PreflightResult:
    ok: bool
    problems: list[str]
    notes: list[str]
    gpu: GPUReport


def preflight(
    *,
    require_gpus: int = 0,
    ckpt_dir: str | None = None,
    min_free_disk_bytes: int = 0,
    thresholds: HealthThresholds | None = None,
    cuda_smoke_test: bool = True,
    gpu_indices: list[int] | None = None,
    raise_on_failure: bool = True,
) -> PreflightResult:
    """Checks before training: GPU health (when GPUs are required), free disk for checkpoints,
    and a small CUDA matmul checked against the CPU."""
    report = gpu_snapshot()
    notes = []
    if not report.present:
        notes.append(f"GPU health: absent ({report.reason})")
    problems = check_gpus(report, thresholds, require_gpus=require_gpus, gpu_indices=gpu_indices)
    if ckpt_dir is not None:
        d = Path(ckpt_dir)
        probe = d if d.exists() else next((p for p in d.parents if p.exists()), Path("."))
        free = shutil.disk_usage(probe).free
        notes.append(f"disk: {free / 2**30:.1f} GiB free at {probe}")
        if free < min_free_disk_bytes:
            problems.append(
                f"disk: {free / 2**30:.1f} GiB free for checkpoints, need {min_free_disk_bytes / 2**30:.1f} GiB"
            )
    if cuda_smoke_test and require_gpus:
        problems += _cuda_smoke_test()
    result = PreflightResult(not problems, problems, notes, report)
    if problems and raise_on_failure:
        raise PreflightError("pre-flight checks failed: " + "; ".join(problems))
    return result


def _cuda_smoke_test() -> list[str]:
    import torch

    if not torch.cuda.is_available():
        return ["CUDA: torch sees no GPU"]
    try:
        g = torch.Generator().manual_seed(0)
        a, b = torch.randn(256, 256, generator=g), torch.randn(256, 256, generator=g)
        ref = a.double() @ b.double()
        got = (a.cuda() @ b.cuda()).double().cpu()
        err = (got - ref).abs().max().item()
        if not err < 1e-1:  # TF32 may be on: ~1e-2 is normal, garbage is not
            return [f"CUDA: a 256x256 matmul is off by {err:.3g} against the CPU"]
    except RuntimeError as e:
        return [f"CUDA: smoke test failed: {e}"]
    return []


# --- Prometheus ------------------------------------------------------------------------------


class GPUCollector:
    """Reads NVML at every scrape; exports p03_gpu_present=0 and nothing else without a GPU."""

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        report = gpu_snapshot()
        present = GaugeMetricFamily("p03_gpu_present", "1 when NVML reports at least one GPU")
        present.add_metric([], 1.0 if report.present else 0.0)
        yield present
        fields = {
            "utilization_gpu_pct": ("p03_gpu_utilization_percent", "GPU busy time, percent"),
            "memory_used_bytes": ("p03_gpu_memory_used_bytes", "GPU memory in use, bytes"),
            "temperature_c": ("p03_gpu_temperature_celsius", "GPU temperature, Celsius"),
            "power_w": ("p03_gpu_power_watts", "GPU power draw, watts"),
            "sm_clock_mhz": ("p03_gpu_sm_clock_mhz", "SM clock, MHz"),
            "ecc_volatile_uncorrected": (
                "p03_gpu_ecc_uncorrected_errors",
                "uncorrected ECC errors since boot",
            ),
        }
        for attr, (name, doc) in fields.items():
            fam = GaugeMetricFamily(name, doc, labels=["gpu", "name"])
            for g in report.gpus:
                v = getattr(g, attr)
                if v is not None:
                    fam.add_metric([str(g.index), g.name], float(v))
            yield fam
        throttled = GaugeMetricFamily(
            "p03_gpu_throttled",
            "1 when a hardware/thermal clock slowdown is active",
            labels=["gpu", "name"],
        )
        for g in report.gpus:
            if g.throttle_reasons is not None:
                bad = any(r in _BAD_THROTTLE for r in g.throttle_reasons)
                throttled.add_metric([str(g.index), g.name], 1.0 if bad else 0.0)
        yield throttled


class TrainingMetrics:
    """The trainer's metrics, in a registry of their own (several runs in one process do not
    clash), optionally with the NVML collector."""

    def __init__(self, *, gpu: bool = True) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        r = self.registry = CollectorRegistry()
        self.step = Gauge("p03_step", "last completed optimiser step", registry=r)
        self.loss = Gauge(
            "p03_loss", "training loss of the last step (mean over ranks)", registry=r
        )
        self.step_seconds = Histogram(
            "p03_step_seconds",
            "wall time of a training step, seconds",
            registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.tokens_per_second = Gauge(
            "p03_tokens_per_second", "training throughput, tokens/s", registry=r
        )
        self.save_seconds = Gauge(
            "p03_checkpoint_save_seconds",
            "last checkpoint: time until committed, seconds",
            registry=r,
        )
        self.save_blocking_seconds = Gauge(
            "p03_checkpoint_blocking_seconds",
            "last checkpoint: time training was held, seconds",
            registry=r,
        )
        self.save_bytes = Gauge(
            "p03_checkpoint_bytes", "last checkpoint: size on disk, bytes", registry=r
        )
        self.saves = Counter("p03_checkpoints", "checkpoints committed", registry=r)
        self.load_seconds = Gauge(
            "p03_checkpoint_load_seconds", "last resume: verify + load, seconds", registry=r
        )
        self.restarts = Gauge("p03_restarts", "launcher restarts of this run so far", registry=r)
        self.rollbacks = Counter(
            "p03_rollbacks", "rollbacks to a checkpoint after a non-finite loss", registry=r
        )
        self.skipped_steps = Counter(
            "p03_skipped_steps", "steps skipped for a non-finite loss", registry=r
        )
        if gpu:
            r.register(GPUCollector())

    def scrape_text(self) -> str:
        from prometheus_client import generate_latest

        return generate_latest(self.registry).decode()


def check_bind_address(what: str, addr: str) -> None:
    """ValueError naming `what` unless `addr` is an address this host can listen on (bound to
    a free port and released at once), so a typo is refused before a run starts."""
    import socket

    try:
        infos = socket.getaddrinfo(addr, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, sockaddr = infos[0]
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind(sockaddr)
    except OSError as e:
        raise ValueError(
            f"{what}: cannot listen on {addr!r}: {e.strerror or e} (an address of this host, "
            "127.0.0.1 for this machine only, or 0.0.0.0 for every interface)"
        ) from None


class MetricsServer:
    """A Prometheus HTTP endpoint for a registry (port 0: any free port; see `.port`). It has no
    authentication: it binds to the loopback address unless told otherwise."""

    def __init__(self, metrics: TrainingMetrics, port: int = 0, addr: str = "127.0.0.1") -> None:
        from prometheus_client import start_http_server

        if not 0 <= port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {port}")
        if not isinstance(addr, str) or not addr.strip():
            raise ValueError(f"addr must be an address to bind to, got {addr!r}")
        try:
            started = start_http_server(port, addr=addr, registry=metrics.registry)
        except (
            OSError
        ) as e:  # an address that does not resolve or is not this host's, a port in use
            where = f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"
            raise ValueError(
                f"metrics server: cannot listen on {where}: {e.strerror or e} (check the bind "
                "address and port)"
            ) from None
        if started is None:  # prometheus-client older than 0.17: no handle to stop it
            raise RuntimeError(
                "prometheus-client >= 0.17 is needed (start_http_server returns the server)"
            )
        self._server, self._thread = started
        self.port = self._server.server_port
        self.addr = addr

    @property
    def all_interfaces(self) -> bool:
        return self.addr in ("0.0.0.0", "::")

    @property
    def bound(self) -> str:
        """The address and port it listens on, as bound."""
        return f"[{self.addr}]:{self.port}" if ":" in self.addr else f"{self.addr}:{self.port}"

    @property
    def exposure(self) -> str:
        """What the log says beside the address: a warning when every interface is open."""
        return ", every interface, no authentication" if self.all_interfaces else ""

    @property
    def url(self) -> str:
        """A URL that reaches it from this host (loopback when it listens on every interface)."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.addr, self.addr)
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


# --- command line ----------------------------------------------------------------------------


@dataclass
class HealthArgs:
    """GPU health snapshot and pre-flight checks; optionally serve the GPU metrics."""

    json: bool = False
    """print JSON instead of a table"""
    require_gpus: int = 0
    """fail (exit 69) unless this many healthy GPUs are present"""
    ckpt_dir: str = "."
    """where checkpoints would go (free-space check)"""
    min_free_disk_gb: float = 0.0
    max_temperature_c: float = 85.0
    serve_port: int = -1
    """>= 0: serve Prometheus metrics on this port (0: any)"""
    serve_addr: str = "127.0.0.1"
    """bind address of --serve-port; no auth: 0.0.0.0 = everywhere"""
    serve_seconds: float = 60.0

    def validate(self) -> HealthArgs:
        from shared.cli import require_finite, require_nonempty

        require_finite(
            "HealthArgs", self, ("min_free_disk_gb", "max_temperature_c", "serve_seconds")
        )
        if self.require_gpus < 0:
            raise ValueError(f"--require-gpus must be >= 0, got {self.require_gpus}")
        for name in ("min_free_disk_gb", "serve_seconds"):
            if getattr(self, name) < 0:
                raise ValueError(
                    f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}"
                )
        if not self.max_temperature_c > 0:
            raise ValueError(f"--max-temperature-c must be > 0, got {self.max_temperature_c}")
        if not -1 <= self.serve_port <= 65535:
            raise ValueError(
                f"--serve-port must be -1 (off), 0 (any) or a port, got {self.serve_port}"
            )
        require_nonempty("--ckpt-dir", self.ckpt_dir)
        if not self.serve_addr.strip():
            raise ValueError("--serve-addr: expected an address, got an empty string")
        return self


def command(args: HealthArgs) -> int:
    """`health`: the snapshot and pre-flight checks (exit 69 on a failure), then optionally the
    metrics endpoint."""
    import json
    import sys
    import time

    if args.serve_port >= 0:
        check_bind_address("--serve-addr", args.serve_addr)

    from .config import EXIT_PREFLIGHT

    args.validate()
    result = preflight(
        require_gpus=args.require_gpus,
        ckpt_dir=args.ckpt_dir,
        min_free_disk_bytes=int(args.min_free_disk_gb * 2**30),
        thresholds=HealthThresholds(max_temperature_c=args.max_temperature_c),
        raise_on_failure=False,
    )
    if args.json:
        print(
            json.dumps(
                {
                    "ok": result.ok,
                    "problems": result.problems,
                    "notes": result.notes,
                    "gpu": result.gpu.to_dict(),
                },
                indent=2,
            )
        )
    else:
        from rich.console import Console
        from rich.table import Table

        console = Console()
        if result.gpu.present:
            table = Table(title=f"GPU health (driver {result.gpu.driver})")
            for col in (
                "GPU",
                "name",
                "util %",
                "mem used",
                "temp C",
                "power W",
                "SM MHz",
                "throttle",
                "ECC unc.",
                "remap fail",
            ):
                table.add_column(col)
            for g in result.gpu.gpus:
                mem = (
                    "n/a"
                    if g.memory_used_bytes is None
                    else f"{g.memory_used_bytes / 2**30:.1f}/{(g.memory_total_bytes or 0) / 2**30:.0f} GiB"
                )
                table.add_row(
                    str(g.index),
                    g.name,
                    str(g.utilization_gpu_pct),
                    mem,
                    str(g.temperature_c),
                    str(g.power_w),
                    str(g.sm_clock_mhz),
                    ",".join(g.throttle_reasons or []) or "-",
                    str(g.ecc_volatile_uncorrected),
                    str(g.remapped_rows_failure),
                )
            console.print(table)
        for n in result.notes:
            console.print(n)
        for p in result.problems:
            console.print(f"[red]problem:[/red] {p}")
        console.print(
            "[green]pre-flight OK[/green]" if result.ok else "[red]pre-flight FAILED[/red]"
        )
    if args.serve_port >= 0:
        server = MetricsServer(TrainingMetrics(gpu=True), args.serve_port, args.serve_addr)
        print(
            f"serving {server.url} (listening on {server.bound}{server.exposure}) "
            f"for {args.serve_seconds:.0f} s",
            file=sys.stderr,
        )
        time.sleep(args.serve_seconds)
        server.close()
    return 0 if result.ok else EXIT_PREFLIGHT


if __name__ == "__main__":  # `python -m <this module>` runs its command of the package
    import sys

    from project03_capstone_infra.__main__ import main

    sys.exit(main(["health", *sys.argv[1:]]))
