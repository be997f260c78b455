"""Compile every CUDA source of the projects for sm_90a with nvcc alone (`make cuda-compile`).

    python3 scripts/compile_cuda.py              # every <project>/csrc/**/*.cu
    python3 scripts/compile_cuda.py --strict     # CI: no nvcc, or nothing compiled, is a failure
    python3 scripts/compile_cuda.py --arch 80 project04_llm_inference/csrc/paged_decode.cu

No GPU and no torch: this is the compile-only CI job, run in a bare CUDA devel container, and it
uses the standard library only. Each file is compiled on its own with
`nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++17 -O3 -c`, with the project's `csrc/` and
the file's folder on the include path, so a syntax or type error in a kernel fails here before
any GPU time is spent.

Every kernel source compiles without torch: the torch bindings live in `.cpp` files or behind
`#ifdef TORCH_EXTENSION_NAME` (defined only by torch's extension build), so no source is
excluded. A source that includes a torch header outside that guard fails with a note saying so.
Without nvcc the run is skipped with the reason (exit 0), or fails with --strict.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ARCH = "90a"
FLAGS = ("-std=c++17", "-O3")
# nvcc's message for a header it cannot find, naming one of torch's include trees
_TORCH_HEADER = re.compile(r"(torch|c10|ATen)/[\w/.]+\.h\b.*(No such file|cannot open)", re.I)
TORCH_NOTE = (
    "kernel sources must compile without torch: put the torch binding in a .cpp file or under "
    "#ifdef TORCH_EXTENSION_NAME"
)


@dataclass
class Compiled:
    file: str  # relative to the repository root where it lies inside it
    ok: bool
    seconds: float
    errors: list[str] = field(default_factory=list)


def find_nvcc() -> str | None:
    """nvcc from CUDA_HOME / CUDA_PATH, the PATH, or /usr/local/cuda (the toolkit's default): the
    order torch's extension builder finds the toolkit in (`torch.utils.cpp_extension.CUDA_HOME`,
    which `shared.cuda_build.find_nvcc` reads), written here without torch, which this job has
    not."""
    for env in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(env)
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return str(Path(root) / "bin" / "nvcc")
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.is_file() else None


def sources(root: Path = ROOT) -> list[Path]:
    """Every .cu file under a project's csrc/ folder (the projects present in this tree)."""
    return sorted(p for p in root.glob("*/csrc/**/*.cu") if p.is_file())


def _csrc_of(path: Path) -> Path:
    """The csrc/ folder a source lies in (its own folder when there is none)."""
    for parent in path.parents:
        if parent.name == "csrc":
            return parent
    return path.parent


def _rel(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)


def compile_one(path: Path, nvcc: str, arch: str, workdir: Path, root: Path = ROOT) -> Compiled:
    rel = _rel(path, root)
    obj = workdir / (rel.replace("/", "__") + ".o")
    cmd = [
        nvcc,
        *FLAGS,
        f"-gencode=arch=compute_{arch},code=sm_{arch}",
        f"-I{_csrc_of(path)}",
        f"-I{path.parent}",
        "-c",
        str(path),
        "-o",
        str(obj),
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = round(time.perf_counter() - t0, 2)
    if proc.returncode == 0:
        return Compiled(rel, True, seconds)
    text = proc.stdout + proc.stderr
    errors = [ln.strip() for ln in text.splitlines() if re.search(r"\berror\b", ln, re.I)]
    errors = errors[:20] or [ln.strip() for ln in text.strip().splitlines()[-5:]]
    if _TORCH_HEADER.search(text):
        errors.append(TORCH_NOTE)
    return Compiled(rel, False, seconds, errors or [f"nvcc exited with {proc.returncode}"])


def compile_all(
    files: list[Path],
    nvcc: str,
    *,
    arch: str = DEFAULT_ARCH,
    jobs: int | None = None,
    root: Path = ROOT,
) -> list[Compiled]:
    """Compile `files` in parallel (`jobs` nvcc processes); one Compiled each, in order."""
    jobs = jobs or os.cpu_count() or 2
    with tempfile.TemporaryDirectory(prefix="compile-cuda-") as tmp, ThreadPoolExecutor(jobs) as ex:
        return list(ex.map(lambda f: compile_one(f, nvcc, arch, Path(tmp), root), files))


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _arch(text: str) -> str:
    if not re.fullmatch(r"[0-9]+[a-z]?", text):
        raise argparse.ArgumentTypeError(
            f"expected an SM architecture like 90a or 80, got {text!r}"
        )
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="compile_cuda.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "files", nargs="*", type=Path, help=".cu files (default: every <project>/csrc/**/*.cu)"
    )
    p.add_argument(
        "--arch", type=_arch, default=DEFAULT_ARCH, help="SM architecture (default: 90a)"
    )
    p.add_argument(
        "--jobs",
        type=_positive_int,
        default=None,
        help="parallel nvcc processes (default: one a core)",
    )
    p.add_argument(
        "--nvcc",
        default=None,
        help="the nvcc to use (default: CUDA_HOME's, the PATH's, /usr/local/cuda's)",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="fail when nvcc is missing or there is nothing to compile (CI)",
    )
    args = p.parse_args(argv)
    missing = [str(f) for f in args.files if not f.is_file()]
    if missing:
        p.error(f"argument files: no such file: {', '.join(missing)}")

    nvcc = args.nvcc or find_nvcc()
    if nvcc is None or not (Path(nvcc).is_file() or shutil.which(nvcc)):
        print(
            "cuda compile skipped: nvcc was not found (install the CUDA toolkit, or set "
            "CUDA_HOME to it)."
        )
        return 2 if args.strict else 0
    files = [f.resolve() for f in args.files] or sources()
    if not files:
        print("cuda compile: no CUDA sources here (none under <project>/csrc/).")
        return 2 if args.strict else 0

    t0 = time.perf_counter()
    results = compile_all(files, nvcc, arch=args.arch, jobs=args.jobs)
    for r in results:
        print(f"{'ok  ' if r.ok else 'FAIL'} {r.file} ({r.seconds:.1f} s)")
        for e in r.errors:
            print(f"     {e}")
    failed = [r for r in results if not r.ok]
    print(
        f"{len(results)} CUDA source(s) compiled for sm_{args.arch} in "
        f"{time.perf_counter() - t0:.1f} s; {len(failed)} failed"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
