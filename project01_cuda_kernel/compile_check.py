"""Compile every CUDA source of project01 for sm_90a and read the compiler's resource report.

No GPU is needed: this is what CI runs. For each `.cu` under `csrc/` (GEMM and attention alike):
`nvcc -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -c` into a temporary directory, then the
ptxas report is parsed per kernel: registers, static shared memory (bytes), stack frame, spill
stores and loads (bytes). The check fails on a compile error, and on any spill in a file that
carries the marker comment `// compile-check: no-spill` (the ladder's top kernels).

    python -m project01_cuda_kernel compile-check            # all sources, writes compile.json

Results: <reports-dir>/project01_cuda_kernel/compile.json (with the environment and nvcc
version). nvcc is found as the extension build finds it (`shared.cuda_build.find_nvcc`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated

import tyro

from project01_cuda_kernel import PROJECT
from shared.cuda_build import find_nvcc

CSRC = Path(__file__).resolve().parent / "csrc"
NO_SPILL_MARKER = "compile-check: no-spill"
DEFAULT_ARCH = "90a"
# The same device-code flags the extension build uses (shared.cuda_build), minus torch.
BASE_FLAGS = ("-std=c++17", "-O3", "--use_fast_math", "-lineinfo")

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def check_arch_and_jobs(arch: str, jobs: int | None) -> None:
    """The --arch and --jobs checks every nvcc-driving command shares (one-line errors)."""
    if not re.fullmatch(r"[0-9]+[a-z]?", arch):
        raise ValueError(f"--arch: expected an SM architecture like 90a or 80, got {arch!r}")
    if jobs is not None and jobs < 1:
        raise ValueError(f"--jobs: expected an integer >= 1, got {jobs}")


@dataclass
class KernelResources:
    kernel: str  # demangled when c++filt is available
    mangled: str
    arch: str
    registers: int = 0
    smem_bytes: int = 0  # static shared memory; dynamic shared memory is set at launch
    stack_frame_bytes: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0

    @property
    def spills(self) -> bool:
        return self.spill_store_bytes > 0 or self.spill_load_bytes > 0


@dataclass
class FileResult:
    file: str  # relative to csrc/
    ok: bool
    no_spill: bool
    seconds: float
    kernels: list[KernelResources] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[str]:
        out = [f"{self.file}: compile error: {e}" for e in self.errors]
        if not self.ok and not self.errors:
            out.append(f"{self.file}: nvcc failed")
        if self.no_spill:
            out += [
                f"{self.file}: {k.kernel} spills ({k.spill_store_bytes} B stored, "
                f"{k.spill_load_bytes} B loaded) but the file is marked no-spill"
                for k in self.kernels
                if k.spills
            ]
        return out


def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release (\S+), V(\S+)", out)
    return m.group(2) if m else out.strip().splitlines()[-1] if out.strip() else "unknown"


def demangle(names: list[str]) -> dict[str, str]:
    tool = shutil.which("c++filt") or shutil.which("cu++filt")
    if not tool or not names:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout
    lines = out.splitlines()
    if len(lines) != len(names):
        return {n: n for n in names}
    return {n: _short(d) for n, d in zip(names, lines)}


def _short(demangled: str) -> str:
    """'void (anonymous namespace)::k<true>(float const*, ...)' -> 'k<true>(float const*, ...)'."""
    s = demangled.replace("(anonymous namespace)::", "")
    return s[5:] if s.startswith("void ") else s


def parse_ptxas(text: str) -> list[KernelResources]:
    """Per-kernel figures from `-Xptxas -v` output (several kernels, several archs)."""
    kernels: dict[tuple[str, str], KernelResources] = {}
    current: KernelResources | None = None
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            key = (m.group(1), m.group(2))
            current = kernels.setdefault(key, KernelResources(m.group(1), m.group(1), m.group(2)))
            continue
        if m := _PROPS.search(line):
            # properties lines name the function; bind them to that kernel if known
            match = [k for (name, _), k in kernels.items() if name == m.group(1)]
            current = match[-1] if match else None
            continue
        if current is None:
            continue
        if m := _FRAME.search(line):
            current.stack_frame_bytes = int(m.group(1))
            current.spill_store_bytes = int(m.group(2))
            current.spill_load_bytes = int(m.group(3))
        if m := _USED.search(line):
            current.registers = int(m.group(1))
            if s := _SMEM.search(line):
                current.smem_bytes = int(s.group(1))
    out = list(kernels.values())
    names = demangle([k.mangled for k in out])
    for k in out:
        k.kernel = names[k.mangled]
    return out


def compile_file(path: Path, nvcc: str, arch: str, workdir: Path) -> FileResult:
    rel = path.relative_to(CSRC).as_posix() if path.is_relative_to(CSRC) else path.name
    no_spill = NO_SPILL_MARKER in path.read_text(errors="replace")
    obj = workdir / (rel.replace("/", "__") + ".o")
    cmd = [
        nvcc,
        *BASE_FLAGS,
        f"-gencode=arch=compute_{arch},code=sm_{arch}",
        "-Xptxas",
        "-v",
        f"-I{CSRC}",
        f"-I{path.parent}",
        "-c",
        str(path),
        "-o",
        str(obj),
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    text = proc.stdout + proc.stderr
    errors = [ln.strip() for ln in text.splitlines() if re.search(r"\berror\b", ln)]
    warnings = [
        ln.strip()
        for ln in text.splitlines()
        if re.search(r"warning", ln, re.I) and "ptxas info" not in ln
    ]
    return FileResult(
        file=rel,
        ok=proc.returncode == 0,
        no_spill=no_spill,
        seconds=round(seconds, 2),
        kernels=parse_ptxas(text) if proc.returncode == 0 else [],
        warnings=warnings,
        errors=errors[:20] if proc.returncode != 0 else [],
    )


def sources(root: Path = CSRC) -> list[Path]:
    return sorted(root.rglob("*.cu"))


def run(
    files: list[Path] | None = None,
    *,
    arch: str = DEFAULT_ARCH,
    jobs: int | None = None,
    nvcc: str | None = None,
) -> list[FileResult]:
    """Compile `files` (default: every .cu under csrc/) in parallel; one FileResult each."""
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise FileNotFoundError(
            "nvcc was not found (set CUDA_HOME or put the CUDA toolkit's bin/ on PATH)."
        )
    files = sources() if files is None else [Path(f).resolve() for f in files]
    jobs = jobs or os.cpu_count() or 2
    with tempfile.TemporaryDirectory(prefix="p01-compile-") as tmp, ThreadPoolExecutor(jobs) as ex:
        return list(ex.map(lambda f: compile_file(f, nvcc, arch, Path(tmp)), files))


def to_record(results: list[FileResult]) -> list[dict]:
    rows = []
    for r in results:
        d = asdict(r)
        d["kernels"] = [asdict(k) | {"spills": k.spills} for k in r.kernels]
        rows.append(d)
    return rows


def summary_rows(results: list[FileResult]) -> list[dict]:
    """One row per kernel, for tables."""
    return [
        {
            "file": r.file,
            "kernel": k.kernel.split("(")[0],
            "registers": k.registers,
            "static smem (B)": k.smem_bytes,
            "stack (B)": k.stack_frame_bytes,
            "spill st/ld (B)": f"{k.spill_store_bytes}/{k.spill_load_bytes}",
            "no-spill rule": "yes" if r.no_spill else "",
        }
        for r in results
        for k in r.kernels
    ]


@dataclass
class CompileCheckConfig:
    """Compile every project01 CUDA source for sm_90a with -Xptxas -v (no GPU needed); fail on
    compile errors and on spills in files marked '// compile-check: no-spill'."""

    files: Annotated[tuple[str, ...], tyro.conf.Positional, tyro.conf.arg(metavar="FILE.cu")] = ()
    """.cu files (default: every .cu under csrc/)"""
    arch: str = DEFAULT_ARCH
    """SM architecture, e.g. 90a or 80"""
    jobs: int | None = None
    """parallel nvcc processes (None: one per CPU core)"""
    reports_dir: str | None = None
    """compile.json goes to <reports-dir>/project01_cuda_kernel/ (None: a new
    runs/<UTC time>/; reports/ only when named)"""
    write: bool = True
    """write compile.json (--no-write: print the table only)"""

    def __post_init__(self) -> None:
        check_arch_and_jobs(self.arch, self.jobs)
        if self.reports_dir is not None and not str(self.reports_dir).strip():
            raise ValueError("--reports-dir: expected a folder, got an empty path")


def main(cfg: CompileCheckConfig) -> int:
    """`compile-check`: compile, print the table, write compile.json; exit code 1 on a failure."""
    from shared.cli import input_file, writable_dir
    from shared.results import markdown_table, output_root, save_result

    for f in cfg.files:
        input_file("files", f)
    reports_dir = output_root(cfg.reports_dir)
    if cfg.write:
        writable_dir("--reports-dir", reports_dir / PROJECT)
    nvcc = find_nvcc()
    if nvcc is None:
        print("compile check skipped: nvcc was not found (install the CUDA toolkit).")
        return 0
    t0 = time.perf_counter()
    results = run([Path(f) for f in cfg.files] or None, arch=cfg.arch, jobs=cfg.jobs, nvcc=nvcc)
    failures = [f for r in results for f in r.failures]
    print(markdown_table(summary_rows(results)))
    if cfg.write:
        path = save_result(
            PROJECT,
            "compile",
            to_record(results),
            config={
                "arch": f"sm_{cfg.arch}",
                "nvcc": nvcc_version(nvcc),
                "flags": [*BASE_FLAGS, f"-gencode=arch=compute_{cfg.arch},code=sm_{cfg.arch}"],
                "no_spill_marker": NO_SPILL_MARKER,
            },
            reports_dir=reports_dir,
        )
        print(f"wrote {path}")
    n_kernels = sum(len(r.kernels) for r in results)
    print(
        f"{len(results)} files, {n_kernels} kernels compiled for sm_{cfg.arch} in "
        f"{time.perf_counter() - t0:.1f} s; {len(failures)} failure(s)"
    )
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":  # `python -m <this module>` runs its command of the package
    import sys

    from project01_cuda_kernel.__main__ import main

    sys.exit(main(["compile-check", *sys.argv[1:]]))
