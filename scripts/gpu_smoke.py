"""The GPU smoke tier (`make gpu-smoke`): the CUDA extensions built, then the GPU tests marked
`smoke`, in a few minutes on one GPU. Locally and on a CI runner alike.

    python -m scripts.gpu_smoke                   # writes runs/gpu-smoke/
    python -m scripts.gpu_smoke --require-gpu     # CI: no usable GPU is a failure, not a skip
    python -m scripts.gpu_smoke -- -x -k gemm     # what follows -- goes to pytest

1. Every CUDA extension of the projects present is built first, each in a process of its own,
   in parallel (each with its share of the cores), so that the tests load them without
   compiling. A failed build stops the run with the compiler's last lines.
2. `pytest -m "gpu and smoke"` runs the chosen part of the GPU tier: every kernel once on an odd
   shape, one attention forward and backward, a few FSDP and checkpoint/resume steps on one GPU,
   a generation of the inference engine.
3. What was skipped is printed with the reason, the wall time against the 5-minute budget, and
   `junit.xml` and `summary.json` (environment, builds, each test's outcome and time) are
   written to the output folder, which CI uploads.

Exit status: 0 when no build and no test failed, 1 on a failure (or when no test was selected),
2 when --require-gpu is given and no CUDA GPU can run the kernels here. Without a GPU and
without --require-gpu, the builds are skipped with the reason and the tests skip as the GPU
tier's do: the exit status is 0, and summary.json's status says "all skipped".
"""

from __future__ import annotations

import argparse
import ast
import importlib
import os
import shlex
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = Path("runs") / "gpu-smoke"  # relative to the repository root, ignored by git
MARKER = "gpu and smoke"
BUDGET_S = 300.0  # the smoke tier's time budget on one GPU, builds included
OUTPUTS = ("junit.xml", "summary.json")
# The CUDA extensions (module, loader): the loader builds on first use and caches in .build/.
# tests/repo checks that every loader in the projects is listed here.
EXTENSIONS: tuple[tuple[str, str], ...] = (
    ("project01_cuda_kernel.gemm", "_ext"),
    ("project01_cuda_kernel.attention", "_extension"),
    ("project04_llm_inference.kernels.decode", "_ext"),
    ("project04_llm_inference.kernels.prefill", "_ext"),
    ("project04_llm_inference.kernels.rope_cache", "_ext"),
    ("project04_llm_inference.kernels.norm_act", "_ext"),
    ("project04_llm_inference.kernels.gemv", "_ext"),
    ("project04_llm_inference.kernels.spec_rounds", "_ext"),
)
_BUILD = "import importlib, sys; getattr(importlib.import_module(sys.argv[1]), sys.argv[2])()"


@dataclass
class Build:
    module: str
    ok: bool | None  # None: not attempted (the reason in `skipped`)
    seconds: float = 0.0
    skipped: str | None = None
    log: str | None = None  # the build's output file, when it failed


@dataclass
class Outcome:
    test: str  # tests/<package>/test_x.py::test_name[params]
    outcome: str  # passed, failed, error or skipped
    seconds: float
    message: str = ""


def present_extensions(root: Path = ROOT) -> list[tuple[str, str]]:
    """The extensions of the projects in this tree (a fork holds one project)."""
    return [(m, f) for m, f in EXTENSIONS if (root / m.split(".")[0]).is_dir()]


def uses_mark(path: Path, mark: str = "smoke") -> bool:
    """Whether the Python file applies `pytest.mark.<mark>` (read from its code, not its text)."""
    try:
        tree = ast.parse(path.read_text(errors="replace"), filename=str(path))
    except SyntaxError:
        return False
    return any(
        isinstance(node, ast.Attribute)
        and node.attr == mark
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "mark"
        for node in ast.walk(tree)
    )


def smoke_test_dirs(root: Path = ROOT) -> list[str]:
    """The folders of tests/ with a test marked smoke: pytest collects only these, so that the
    import-time skips of the other packages' tests do not crowd the report."""
    tests = root / "tests"
    dirs = sorted(d for d in tests.iterdir() if d.is_dir()) if tests.is_dir() else []
    return [
        d.relative_to(root).as_posix()
        for d in dirs
        if any(uses_mark(f) for f in sorted(d.rglob("test_*.py")))
    ]


def gpu_unavailable_reason(need_compiler: bool) -> str | None:
    """One sentence saying why the GPU tests cannot run here (or the kernels cannot be built,
    when `need_compiler`), or None when they can."""
    import torch

    if torch.version.cuda is None:
        return (
            f"torch {torch.__version__} is a CPU-only build; the GPU tests need a CUDA build of "
            "torch (pip install torch on a machine with an NVIDIA driver)."
        )
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible to torch (torch.cuda.is_available() is False)."
    if need_compiler:
        # A tree with kernels holds shared.cuda_build; it is looked up by name, not imported,
        # so that a fork without kernels carries neither it nor the extension build tools.
        return importlib.import_module("shared.cuda_build").cuda_unavailable_reason()
    return None


def build_extensions(exts: list[tuple[str, str]], out_dir: Path, log=print) -> list[Build]:
    """Build each extension in a process of its own, all at once; torch's ninja gets an equal
    share of the cores in each (MAX_JOBS, unless the caller set it)."""
    if not exts:
        return []
    share = -(-(os.cpu_count() or 2) // len(exts))
    env = dict(os.environ)
    env.setdefault("MAX_JOBS", str(share))

    def one(ext: tuple[str, str]) -> Build:
        module, loader = ext
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-c", _BUILD, module, loader],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        b = Build(module, proc.returncode == 0, round(time.perf_counter() - t0, 1))
        if not b.ok:
            path = out_dir / f"build-{module}.log"
            path.write_text(proc.stdout + proc.stderr)
            b.log = str(path)
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
            log(f"FAIL build {module} ({b.seconds:.0f} s), the last lines of {path}:")
            log("\n".join(f"     {ln}" for ln in tail))
        else:
            log(f"built {module} in {b.seconds:.0f} s")
        return b

    with ThreadPoolExecutor(len(exts)) as ex:
        futures = [ex.submit(one, e) for e in exts]
        done = {id(f): f.result() for f in as_completed(futures)}
    return [done[id(f)] for f in futures]


def read_junit(path: Path) -> list[Outcome]:
    """Each test case of a pytest JUnit XML file, with its outcome and message."""
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        cls, name = case.get("classname", ""), case.get("name", "")
        parts = cls.split(".")
        # classname is module[.Class]: the test file is the longest prefix that exists
        test = f"{cls}::{name}"
        for i in range(len(parts), 0, -1):
            if (ROOT / Path(*parts[:i])).with_suffix(".py").is_file():
                test = "::".join(["/".join(parts[:i]) + ".py", *parts[i:], name])
                break
        outcome, message = "passed", ""
        for tag, label in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            el = case.find(tag)
            if el is not None:
                outcome, message = label, el.get("message", "") or (el.text or "").strip()
                break
        out.append(Outcome(test, outcome, round(float(case.get("time", 0) or 0), 2), message))
    return out


def _reason(message: str) -> str:
    """pytest writes a skip's message as 'path:line: reason' for some skips: the reason alone."""
    head, sep, rest = message.partition(": ")
    return rest if sep and ".py:" in head else message


def skipped_report(outcomes: list[Outcome], per_reason: int = 6) -> list[str]:
    """What was skipped, grouped by reason, with the tests (the first few of each reason)."""
    by_reason: dict[str, list[str]] = defaultdict(list)
    for o in outcomes:
        if o.outcome == "skipped":
            by_reason[_reason(o.message) or "no reason given"].append(o.test)
    lines = []
    for reason, tests in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"  {len(tests)} skipped: {reason}")
        lines += [f"      {t}" for t in tests[:per_reason]]
        if len(tests) > per_reason:
            lines.append(f"      ... and {len(tests) - per_reason} more")
    return lines


def _minutes(s: float) -> str:
    if s < 60:
        return f"{s:.0f} s"
    return f"{int(s // 60)} min" + (f" {s % 60:.0f} s" if round(s % 60) else "")


def run(out_dir: Path, *, require_gpu: bool = False, pytest_args: list[str] = (), log=print) -> int:
    from shared.results import atomic_write_json, environment

    out_dir = out_dir if out_dir.is_absolute() else ROOT / out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in [*(out_dir / n for n in OUTPUTS), *out_dir.glob("build-*.log")]:
        stale.unlink(missing_ok=True)  # a folder CI uploads holds this run's files only
    t0 = time.perf_counter()
    summary: dict = {"marker": MARKER, "budget_s": BUDGET_S, "environment": environment()}

    def finish(status: str, rc: int) -> int:
        summary["status"], summary["seconds"] = status, round(time.perf_counter() - t0, 1)
        atomic_write_json(out_dir / "summary.json", summary)
        log(f"wrote {out_dir / 'summary.json'}")
        return rc

    exts = present_extensions()
    reason = gpu_unavailable_reason(need_compiler=bool(exts))
    if reason is not None and require_gpu:
        log(f"gpu smoke: cannot run here: {reason}")
        return finish("no GPU", 2)

    if reason is not None:
        log(f"builds skipped: {reason}")
        builds = [Build(m, None, skipped=reason) for m, _ in exts]
    else:
        log(f"building {len(exts)} CUDA extension(s) in parallel (cached in .build/ once built)")
        builds = build_extensions(exts, out_dir, log)
    summary["builds"] = [asdict(b) for b in builds]
    build_s = time.perf_counter() - t0
    if any(b.ok is False for b in builds):
        log("gpu smoke: a build failed; the tests were not run")
        return finish("build failed", 1)

    junit = out_dir / "junit.xml"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        MARKER,
        "-rs",
        "-p",
        "no:cacheprovider",
        f"--junitxml={junit}",
        "-o",
        "junit_family=xunit2",
        *smoke_test_dirs(),
        *pytest_args,
    ]
    log("$ " + shlex.join(["python", *cmd[1:]]))
    t1 = time.perf_counter()
    rc = subprocess.run(cmd, cwd=ROOT).returncode
    test_s = time.perf_counter() - t1
    outcomes = read_junit(junit) if junit.is_file() else []
    summary["tests"] = [asdict(o) for o in outcomes]
    counts = {
        k: sum(o.outcome == k for o in outcomes) for k in ("passed", "failed", "error", "skipped")
    }
    summary["counts"] = counts
    total = time.perf_counter() - t0
    summary["build_seconds"], summary["test_seconds"] = round(build_s, 1), round(test_s, 1)

    if counts["skipped"]:
        log("what was skipped, and why:")
        for line in skipped_report(outcomes):
            log(line)
    ran = counts["passed"] + counts["failed"] + counts["error"]
    verdict = ("met" if total <= BUDGET_S else "missed") if ran else "not measured (no test ran)"
    log(
        f"gpu smoke: {counts['passed']} passed, {counts['failed'] + counts['error']} failed, "
        f"{counts['skipped']} skipped in {_minutes(total)} (builds {_minutes(build_s)}, tests "
        f"{_minutes(test_s)}); the {_minutes(BUDGET_S)} budget: {verdict}"
    )
    if rc == 5 or (rc == 0 and not outcomes):
        log(
            f'gpu smoke: no test selected: nothing here is marked both gpu and smoke (-m "{MARKER}")'
        )
        return finish("no tests", 1)
    failed = counts["failed"] + counts["error"]
    if rc != 0 or failed:
        log(f"gpu smoke: FAILED (pytest's exit status {rc}; junit.xml and summary.json say which)")
        return finish("failed", 1)
    if not counts["passed"]:
        log("gpu smoke: every test skipped (the reasons above); nothing was tested here")
        return finish("all skipped", 0)
    return finish("passed", 0)


def main(argv: list[str] | None = None) -> int:
    from shared.cli import ArgumentParser, nonempty_path, writable_dir

    argv = list(sys.argv[1:] if argv is None else argv)
    own, pytest_args = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    )
    p = ArgumentParser(
        prog="python -m scripts.gpu_smoke",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--out-dir",
        type=nonempty_path,
        default=OUT_DIR,
        help="where junit.xml and summary.json go (default: runs/gpu-smoke)",
    )
    p.add_argument(
        "--require-gpu",
        action="store_true",
        help="fail (exit 2) where no CUDA GPU can run the kernels, instead of skipping",
    )
    args = p.parse_args(own)
    try:
        writable_dir(
            "--out-dir", args.out_dir if args.out_dir.is_absolute() else ROOT / args.out_dir
        )
    except ValueError as e:
        p.error(str(e))
    return run(args.out_dir, require_gpu=args.require_gpu, pytest_args=pytest_args)


if __name__ == "__main__":
    sys.exit(main())
