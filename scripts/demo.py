"""Run every capstone at the size this machine allows, into a run folder (`make demo`).

    python -m scripts.demo                 # all projects, into runs/<UTC time>/
    python -m scripts.demo --only project02
    python -m scripts.demo --list          # what would run here, and why
    python -m scripts.demo --run-dir runs/mine

Each project's steps are chosen by the hardware: with CUDA GPUs, the kernels, their benchmarks
and the 1b training runs; on a CPU, the same code paths at the `tiny` size over gloo, and the CUDA
sources compiled (when nvcc is present) but not run. A step that cannot run here is reported as
skipped with the reason. The exit status is non-zero when a step that ran failed.

Every step writes under the run folder (`<run>/<project>/`: JSON records, charts, Markdown),
never into `reports/` or a README: those hold the published reference results, and change only
through `make publish RUN=<run>`. Only the projects present in this checkout are planned (a fork
of one project plans that one).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The short name of each project (`--only`, the Makefile's targets) and its package.
PACKAGES = {
    "project01": "project01_cuda_kernel",
    "project02": "project02_fsdp_scaling",
    "project03": "project03_capstone_infra",
    "project04": "project04_llm_inference",
    "apple": "apple_track",
}
PROJECTS = tuple(name for name, pkg in PACKAGES.items() if (ROOT / pkg).is_dir())
RUNS = Path("runs")  # relative to the repository root, ignored by git
# project04's benchmarks, as its Makefile target runs them
P04_BENCHES = (
    "decode-kernel",
    "gemv-kernel",
    "prefill-kernel",
    "latency",
    "throughput",
    "memory",
    "prefix",
)


def new_run_dir(now: datetime.datetime | None = None) -> Path:
    """runs/<UTC time>/, relative to the repository root (the steps run there)."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    return RUNS / now.strftime("%Y%m%dT%H%M%SZ")


@dataclass
class Step:
    project: str
    title: str
    argv: list[str] = field(default_factory=list)
    skip_reason: str | None = None
    module: str | None = None  # the module the step runs; missing => not built yet
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Hardware:
    gpus: int
    gpu_name: str | None
    nvcc: bool
    cuda_torch: bool

    @classmethod
    def detect(cls) -> Hardware:
        import torch

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return cls(
            gpus=n,
            gpu_name=torch.cuda.get_device_name(0) if n else None,
            nvcc=shutil.which("nvcc") is not None or bool(os.environ.get("CUDA_HOME")),
            cuda_torch=torch.version.cuda is not None,
        )

    def describe(self) -> str:
        if self.gpus:
            return f"{self.gpus} x {self.gpu_name}"
        return f"CPU only ({os.cpu_count()} cores), nvcc {'found' if self.nvcc else 'not found'}"


def _py(*args: str) -> list[str]:
    return [sys.executable, *args]


def plan(hw: Hardware, run_dir: Path | str | None = None) -> list[Step]:
    """The steps for this hardware; each writes under `run_dir` (default runs/<UTC time>/),
    relative to the repository root or absolute."""
    out = str(run_dir if run_dir is not None else new_run_dir())
    steps: list[Step] = []
    gpu = hw.gpus > 0
    no_gpu = "needs a CUDA GPU (none visible here)"

    # project01: CUDA kernels
    if gpu:
        steps += [
            Step(
                "project01",
                "GPU tests of the kernels",
                _py("-m", "pytest", "-m", "gpu", "-q", "tests/project01_cuda_kernel"),
                module="project01_cuda_kernel.gemm",
            ),
            Step(
                "project01",
                "benchmark, profile and report",
                _py("-m", "project01_cuda_kernel", "all", "--reports-dir", out, "--no-readme"),
                module="project01_cuda_kernel.bench",
            ),
        ]
    else:
        steps.append(
            Step(
                "project01",
                "compile every CUDA source for sm_90a (no GPU needed)",
                _py("-m", "project01_cuda_kernel", "compile-check", "--reports-dir", out),
                skip_reason=None if hw.nvcc else "nvcc not found (install the CUDA toolkit)",
                module="project01_cuda_kernel.compile_check",
            )
        )
        steps.append(Step("project01", "kernels, benchmarks and ncu profile", skip_reason=no_gpu))

    # project02: FSDP strong scaling (the harness sizes itself: 1b on GPUs, tiny over gloo on CPU)
    argv = _py("-m", "project02_fsdp_scaling", "scaling", "--reports-dir", out)
    if gpu:
        argv += ["--gpus", ",".join(str(n) for n in (1, 2, 4, 8) if n <= hw.gpus)]
    where = f"{hw.gpus} GPU(s)" if gpu else "CPU, 2 gloo processes"
    ds_missing = importlib.util.find_spec("deepspeed") is None
    steps += [
        Step(
            "project02", f"strong scaling ({where})", argv, module="project02_fsdp_scaling.scaling"
        ),
        Step(
            "project02",
            "FSDP2 vs DeepSpeed ZeRO-3, same model and data",
            _py("-m", "project02_fsdp_scaling", "compare", "--reports-dir", out),
            module="project02_fsdp_scaling.compare",
            skip_reason="deepspeed is not installed (pip install -e '.[deepspeed]')"
            if ds_missing
            else (None if hw.gpus != 1 else "needs 2 GPUs (or none: CPU)"),
        ),
        Step(
            "project02",
            "collective bus bandwidth, nccl-tests style"
            + (f" ({hw.gpus} GPUs)" if gpu else " (CPU, 2 gloo processes)"),
            _py("-m", "project02_fsdp_scaling", "collectives", "--reports-dir", out)
            + (["--world-size", str(hw.gpus)] if gpu else []),
            module="project02_fsdp_scaling.collectives",
            skip_reason=None if hw.gpus != 1 else "needs 2 GPUs (or none: CPU)",
        ),
        Step(
            "project02",
            "DDP, FSDP2, TP, pipeline schedules and 2-D layouts side by side",
            _py("-m", "project02_fsdp_scaling", "strategies", "--reports-dir", out),
            module="project02_fsdp_scaling.strategies",
            skip_reason=None if hw.gpus != 1 else "needs 2 GPUs (or none: CPU)",
        ),
        Step(
            "project02",
            "report: charts and Markdown",
            _py("-m", "project02_fsdp_scaling", "report", "--reports-dir", out, "--no-readme"),
            module="project02_fsdp_scaling.report",
        ),
    ]

    # project03: fault tolerance, HPO, cost, data loading
    ray_missing = importlib.util.find_spec("ray") is None
    steps += [
        Step(
            "project03",
            "reference run, then the same run under injected faults",
            _py("-m", "project03_capstone_infra.chaos", "--reports-dir", out),
            module="project03_capstone_infra.chaos",
        ),
        Step(
            "project03",
            "Ray Tune HPO with ASHA vs random search",
            _py("-m", "project03_capstone_infra.tune", "--reports-dir", out),
            module="project03_capstone_infra.tune",
            skip_reason="Ray Tune is not installed (pip install -e '.[ray]')"
            if ray_missing
            else None,
        ),
        Step(
            "project03",
            "cost plan: on-demand vs spot, fp32 vs bf16, checkpoint interval",
            # throughput and checkpoint costs measured on GPUs: read from the published reports
            _py(
                "-m",
                "project03_capstone_infra.cost",
                "--reports-dir",
                out,
                "--measurements-dir",
                "reports",
            ),
            module="project03_capstone_infra.cost",
        ),
        Step(
            "project03",
            "data loading throughput: stream vs DataLoader vs DALI",
            _py("-m", "project03_capstone_infra.data", "--reports-dir", out),
            module="project03_capstone_infra.data",
        ),
    ]
    if gpu:
        steps.append(
            Step(
                "project03",
                "checkpoint blocking time and resume time (1b, one GPU)",
                _py(
                    "-m",
                    "project03_capstone_infra.bench_checkpoint",
                    "--preset",
                    "1b",
                    "--reports-dir",
                    out,
                ),
                module="project03_capstone_infra.bench_checkpoint",
            )
        )

    # project04: real text first (the code model trained at this machine's size, served, a
    # snippet completed through the openai client), then on a GPU the engine's GPU tests and
    # benchmarks (its Makefile target's steps)
    code_model = f"{out}/project04_llm_inference/code-model"
    steps += [
        Step(
            "project04",
            "train the code model on the Python standard library ("
            + ("full size, GPU" if gpu else "tiny, CPU")
            + ")",
            _py("-m", "project04_llm_inference", "train-code-model", "--out-dir", code_model),
            module="project04_llm_inference.code_model",
        ),
        Step(
            "project04",
            "serve it and complete a Python snippet through the openai client",
            _py(
                "-m",
                "project04_llm_inference",
                "code-demo",
                "--model-dir",
                code_model,
                "--reports-dir",
                out,
            ),
            module="project04_llm_inference.code_demo",
            skip_reason=None
            if importlib.util.find_spec("openai") is not None
            else "the openai client is not installed (pip install -e '.[dev]')",
        ),
    ]
    if gpu:
        steps.append(
            Step(
                "project04",
                "GPU tests of the engine and kernels",
                _py("-m", "pytest", "-m", "gpu", "-q", "tests/project04_llm_inference"),
                module="project04_llm_inference.engine",
            )
        )
        steps += [
            Step(
                "project04",
                f"benchmark: {b}",
                _py("-m", "project04_llm_inference", b, "--reports-dir", out),
                module="project04_llm_inference.bench",
            )
            for b in P04_BENCHES
        ]
        steps.append(
            Step(
                "project04",
                "report: tables and charts",
                _py("-m", "project04_llm_inference", "report", "--reports-dir", out),
                module="project04_llm_inference.report",
            )
        )
    else:
        steps.append(
            Step("project04", "engine benchmarks against the baselines", skip_reason=no_gpu)
        )

    # apple_track: its own environment (litert-torch pins its own torch)
    steps.append(
        Step(
            "apple",
            "Core ML / LiteRT export, MLX port, Metal kernels where available (own venv: .venv-apple)",
            [
                "make",
                "--no-print-directory",
                "-f",
                "apple_track/Makefile",
                "report",
                f"REPORT_ARGS=--reports-dir {shlex.quote(out)} --no-readme",
            ],
            module="apple_track.export",
        )
    )
    return [s for s in steps if s.project in PROJECTS]


def _module_exists(name: str | None) -> bool:
    if name is None:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def run(steps: list[Step], dry_run: bool = False) -> list[tuple[Step, str, float]]:
    from rich.console import Console

    console = Console(stderr=True)
    outcomes = []
    for i, step in enumerate(steps, 1):
        head = f"[{i}/{len(steps)}] {step.project}: {step.title}"
        if step.skip_reason is None and not _module_exists(step.module):
            step.skip_reason = f"not built yet ({step.module} does not exist in this checkout)"
        if step.skip_reason:
            console.print(f"[yellow]{head}: skipped: {step.skip_reason}[/]")
            outcomes.append((step, "skipped: " + step.skip_reason, 0.0))
            continue
        console.print(f"[bold]{head}[/]\n  $ {' '.join(step.argv)}")
        if dry_run:
            outcomes.append((step, "would run", 0.0))
            continue
        t0 = time.perf_counter()
        # Prepend the repo: packages the caller put on PYTHONPATH (outside site-packages) stay.
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, "PYTHONPATH": path, **step.env}
        rc = subprocess.call(step.argv, cwd=ROOT, env=env)
        dt = time.perf_counter() - t0
        status = "ok" if rc == 0 else f"FAILED (exit {rc})"
        console.print(f"  -> {status} in {dt:.0f} s")
        outcomes.append((step, status, dt))
    return outcomes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="make demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--only", choices=PROJECTS, action="append", help="run only these projects")
    p.add_argument(
        "--list", action="store_true", help="print the plan for this machine; run nothing"
    )
    p.add_argument(
        "--run-dir", default=None, help="where the run's results go (default runs/<UTC time>/)"
    )
    args = p.parse_args(argv)
    if args.run_dir is not None and not args.run_dir.strip():
        p.error("--run-dir: expected a folder, got an empty path")
    run_dir = Path(args.run_dir) if args.run_dir is not None else new_run_dir()

    hw = Hardware.detect()
    steps = [s for s in plan(hw, run_dir) if not args.only or s.project in args.only]
    print(f"demo on {hw.describe()}; results go to {run_dir}/", file=sys.stderr)
    if not args.list:
        (ROOT / run_dir).mkdir(parents=True, exist_ok=True)
    outcomes = run(steps, dry_run=args.list)

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"make demo on {hw.describe()}")
    for col in ("project", "step", "outcome", "seconds"):
        table.add_column(col)
    for step, status, dt in outcomes:
        table.add_row(step.project, step.title, status, f"{dt:.0f}")
    Console(stderr=True).print(table)
    if not args.list:
        print(
            f"this run's results: {run_dir}/<project>/ (reports/ is unchanged); to publish "
            f"them as the reference results: make publish RUN={run_dir}",
            file=sys.stderr,
        )
    return 1 if any(s.startswith("FAILED") for _, s, _ in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
