"""Compare the machine code (SASS) of project01's kernels between two git revisions; no GPU.

A change to kernel sources meant to leave code generation alone (a PTX wrapper moved into
csrc/common/, a function split into `__forceinline__` pieces, a rename) is shown unchanged by
this, or else re-measured on a GPU. Each `.cu` under csrc/ is compiled at both revisions for
sm_90a with the device flags of the extension build (torch's defaults included), each kernel's
SASS is read with `cuobjdump -sass` and normalised (instruction addresses and encodings dropped;
branch targets become labels L0, L1, ... in address order, so an inserted instruction shows as one
line, not as every later branch), and the two listings are compared kernel by kernel, beside the
registers, stack frame and spills that `-Xptxas -v` reports.

    python -m project01_cuda_kernel sass-diff --base main                  # main vs working tree
    python -m project01_cuda_kernel sass-diff --base main --head HEAD attention/flash_fwd_hopper_hdim64.cu

Exit code 0 when every kernel's SASS is identical at both revisions, 1 otherwise; the table
says which kernels differ, and the record (sass_diff.json) holds the first differing lines of
each. cuobjdump is found on PATH, beside nvcc, or in Triton's bundled CUDA tools.
"""

from __future__ import annotations

import difflib
import importlib.util
import io
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated

import tyro

from project01_cuda_kernel import PROJECT
from project01_cuda_kernel.compile_check import (
    BASE_FLAGS,
    CSRC,
    DEFAULT_ARCH,
    KernelResources,
    check_arch_and_jobs,
    nvcc_version,
    parse_ptxas,
)

# What torch.utils.cpp_extension adds to every nvcc command of an extension build (its
# COMMON_NVCC_FLAGS); the kernels must be compared as the extension compiles them.
TORCH_NVCC_FLAGS = (
    "-D__CUDA_NO_HALF_OPERATORS__",
    "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-D__CUDA_NO_HALF2_OPERATORS__",
    "--expt-relaxed-constexpr",
)
DIFF_LINES = 40  # differing lines kept per kernel in the record

_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)")
_INSN = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s*(.*?)\s*;")
# Instructions whose last hexadecimal operand is a code address (a branch or a reconvergence
# point), not an immediate.
_BRANCHES = {"BRA", "BRX", "BSSY", "CALL", "JMP", "JMX", "RET", "BREAK", "WARPSYNC"}
_HEX = re.compile(r"0x[0-9a-f]+")
# An anonymous namespace in a mangled name: <length>_GLOBAL__N__<hash of the path>_..., the hash
# differing between two checkouts of the same file.
_ANON = re.compile(r"(\d+)_GLOBAL__N_")


def unanonymise(name: str) -> str:
    """Each anonymous-namespace identifier of a mangled name becomes `11_GLOBAL__N_` (its
    length-prefixed form with the path hash removed), so names compare across checkouts."""
    out, pos = [], 0
    while m := _ANON.search(name, pos):
        n = int(m.group(1))
        out.append(name[pos : m.start()] + "11_GLOBAL__N_")
        pos = m.end(1) + n
    return "".join(out) + name[pos:]


# ---- SASS: parsing and normalising ---------------------------------------------------------------


def _opcode(text: str) -> str:
    """'@!P0 BRA.U 0x2d0' -> 'BRA'."""
    words = text.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def normalise(insns: list[tuple[int, str]]) -> list[str]:
    """(address, instruction) pairs -> instruction lines with branch targets as labels.

    Addresses disappear; a branch target becomes `L<n>` (n counts targets in address order) and
    `L<n>:` is written before the instruction it names, so two listings differing by one
    inserted instruction differ by one line."""
    targets: set[int] = set()
    for _, text in insns:
        if _opcode(text) in _BRANCHES and (hexes := _HEX.findall(text)):
            targets.add(int(hexes[-1], 16))
    label = {addr: f"L{i}" for i, addr in enumerate(sorted(targets))}
    out = []
    for addr, text in insns:
        if addr in label:
            out.append(f"{label[addr]}:")
        if _opcode(text) in _BRANCHES and (hexes := _HEX.findall(text)):
            target = int(hexes[-1], 16)
            if target in label:
                head, _, tail = text.rpartition(hexes[-1])
                text = head + label[target] + tail
        out.append(" ".join(text.split()))
    return out


def parse_sass(text: str) -> dict[str, list[str]]:
    """`cuobjdump -sass` output -> {mangled kernel name: normalised instruction lines}."""
    functions: dict[str, list[tuple[int, str]]] = {}
    current: list[tuple[int, str]] | None = None
    for line in text.splitlines():
        if m := _FUNCTION.match(line):
            current = functions.setdefault(unanonymise(m.group(1)), [])
        elif current is not None and (m := _INSN.match(line)):
            current.append((int(m.group(1), 16), unanonymise(m.group(2))))
    return {name: normalise(insns) for name, insns in functions.items()}


# ---- compiling one side ---------------------------------------------------------------------------


@dataclass
class Listing:
    """One .cu file compiled at one revision."""

    file: str  # relative to csrc/
    ok: bool
    sass: dict[str, list[str]] = field(default_factory=dict)
    resources: dict[str, KernelResources] = field(default_factory=dict)
    error: str = ""


def find_cuobjdump(nvcc: str | None) -> str | None:
    """cuobjdump on PATH, beside nvcc, under $CUDA_HOME, or in Triton's bundled tools."""
    if found := shutil.which("cuobjdump"):
        return found
    dirs = [Path(nvcc).resolve().parent] if nvcc else []
    if home := os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"):
        dirs.append(Path(home) / "bin")
    spec = importlib.util.find_spec("triton")  # located, not imported
    if spec is not None and spec.origin:
        dirs.append(Path(spec.origin).parent / "backends" / "nvidia" / "bin")
    return next((str(d / "cuobjdump") for d in dirs if (d / "cuobjdump").is_file()), None)


def compile_listing(
    csrc: Path, rel: str, nvcc: str, cuobjdump: str, arch: str, workdir: Path
) -> Listing:
    """nvcc -cubin with -Xptxas -v, then cuobjdump -sass: one file's kernels at one revision."""
    path = csrc / rel
    if not path.is_file():
        return Listing(rel, ok=False, error="absent at this revision")
    cubin = workdir / (rel.replace("/", "__") + ".cubin")
    cmd = [
        nvcc,
        *BASE_FLAGS,
        *TORCH_NVCC_FLAGS,
        f"-gencode=arch=compute_{arch},code=sm_{arch}",
        "-Xptxas",
        "-v",
        f"-I{csrc}",
        f"-I{path.parent}",
        "-cubin",
        str(path),
        "-o",
        str(cubin),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        errors = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if "error" in ln]
        return Listing(rel, ok=False, error=(errors or ["nvcc failed"])[0])
    dump = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True)
    if dump.returncode != 0:
        return Listing(rel, ok=False, error=f"cuobjdump failed: {dump.stderr.strip()[:200]}")
    resources = {unanonymise(k.mangled): k for k in parse_ptxas(proc.stdout + proc.stderr)}
    return Listing(rel, ok=True, sass=parse_sass(dump.stdout), resources=resources)


def _git(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True)


def checkout_csrc(rev: str, dest: Path, csrc: Path = CSRC) -> Path:
    """The csrc/ folder as it is at git revision `rev`, written under `dest`; its path there."""
    top = _git("rev-parse", "--show-toplevel", cwd=csrc)
    if top.returncode != 0:
        raise ValueError(f"{csrc} is not inside a git repository, so revisions cannot be read")
    top_dir = Path(top.stdout.decode().strip()).resolve()
    prefix = csrc.resolve().relative_to(top_dir).as_posix()
    tar = _git("archive", "--format=tar", rev, "--", prefix, cwd=top_dir)
    if tar.returncode != 0:
        msg = tar.stderr.decode(errors="replace").strip().splitlines()
        raise ValueError(f"git cannot read {prefix} at {rev!r}: {msg[-1] if msg else 'unknown'}")
    with tarfile.open(fileobj=io.BytesIO(tar.stdout)) as t:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4: refuse links and absolute paths
            t.extractall(dest, filter="data")
        else:  # the archive is git's own, of tracked files under one folder
            t.extractall(dest)
    return dest / prefix


def resolve(rev: str) -> str:
    """The commit a revision names (for the record)."""
    r = _git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", cwd=CSRC)
    if r.returncode != 0:
        raise ValueError(f"--base/--head: {rev!r} is not a git revision of this repository")
    return r.stdout.decode().strip()


# ---- comparing ------------------------------------------------------------------------------------


@dataclass
class KernelDiff:
    file: str
    kernel: str  # demangled
    status: str  # identical | differs | only in base | only in head | not compiled
    insns_base: int = 0
    insns_head: int = 0
    lines_removed: int = 0
    lines_added: int = 0
    base: dict | None = None  # registers, stack and spills at each revision
    head: dict | None = None
    diff: list[str] = field(default_factory=list)

    @property
    def grew(self) -> bool:
        """Registers, stack or spills grew from base to head."""
        if self.base is None or self.head is None:
            return False
        keys = ("registers", "stack_frame_bytes", "spill_store_bytes", "spill_load_bytes")
        return any(self.head[k] > self.base[k] for k in keys)


def _resources(k: KernelResources | None) -> dict | None:
    if k is None:
        return None
    d = asdict(k)
    return {
        key: d[key]
        for key in ("registers", "stack_frame_bytes", "spill_store_bytes", "spill_load_bytes")
    }


def compare(base: Listing, head: Listing) -> list[KernelDiff]:
    """Kernel by kernel, base against head, for one file."""
    if not (base.ok and head.ok):
        why = "; ".join(
            f"{side}: {x.error}" for side, x in (("base", base), ("head", head)) if not x.ok
        )
        return [KernelDiff(base.file, "(file)", "not compiled", diff=[why])]
    names = list(base.sass) + [n for n in head.sass if n not in base.sass]
    pretty = {
        n: (base.resources.get(n) or head.resources.get(n) or KernelResources(n, n, "")).kernel
        for n in names
    }
    out = []
    for n in names:
        a, b = base.sass.get(n), head.sass.get(n)
        d = KernelDiff(
            base.file,
            pretty[n],
            "identical",
            insns_base=len(a or []),
            insns_head=len(b or []),
            base=_resources(base.resources.get(n)),
            head=_resources(head.resources.get(n)),
        )
        if a is None or b is None:
            d.status = "only in head" if a is None else "only in base"
        elif a != b:
            d.status = "differs"
            lines = list(difflib.unified_diff(a, b, "base", "head", n=1, lineterm=""))[2:]
            d.lines_removed = sum(1 for ln in lines if ln.startswith("-"))
            d.lines_added = sum(1 for ln in lines if ln.startswith("+"))
            d.diff = lines[:DIFF_LINES]
        out.append(d)
    return out


def run(
    base: str,
    head: str | None = None,
    files: list[str] | None = None,
    *,
    arch: str = DEFAULT_ARCH,
    jobs: int | None = None,
    nvcc: str | None = None,
    cuobjdump: str | None = None,
    csrc: Path = CSRC,
) -> list[KernelDiff]:
    """Compile `files` (relative to csrc/; default every .cu at either revision) at `base` and at
    `head` (None: the working tree) and compare every kernel."""
    from shared.cuda_build import find_nvcc

    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise FileNotFoundError("nvcc was not found (set CUDA_HOME or put it on PATH)")
    cuobjdump = cuobjdump or find_cuobjdump(nvcc)
    if cuobjdump is None:
        raise FileNotFoundError("cuobjdump was not found (CUDA toolkit or Triton's bundled tools)")
    jobs = jobs or os.cpu_count() or 2
    with tempfile.TemporaryDirectory(prefix="p01-sass-") as tmp:
        root = Path(tmp)
        base_dir = checkout_csrc(base, root / "base", csrc)
        head_dir = csrc if head is None else checkout_csrc(head, root / "head", csrc)
        if files is None:
            files = sorted(
                {p.relative_to(d).as_posix() for d in (base_dir, head_dir) for p in d.rglob("*.cu")}
            )
        (root / "obj_base").mkdir()
        (root / "obj_head").mkdir()
        jobs_list = [(base_dir, f, root / "obj_base") for f in files] + [
            (head_dir, f, root / "obj_head") for f in files
        ]
        with ThreadPoolExecutor(jobs) as ex:
            listings = list(
                ex.map(
                    lambda j: compile_listing(j[0], j[1], nvcc, cuobjdump, arch, j[2]), jobs_list
                )
            )
    n = len(files)
    return [d for a, b in zip(listings[:n], listings[n:]) for d in compare(a, b)]


def summary_rows(diffs: list[KernelDiff]) -> list[dict]:
    def res(r: dict | None, key: str) -> str:
        return "n/a" if r is None else str(r[key])

    def spills(r: dict | None) -> str:
        return "n/a" if r is None else f"{r['spill_store_bytes']}/{r['spill_load_bytes']}"

    rows = []
    for d in diffs:
        status = d.status
        if d.status == "differs":
            status = f"differs (-{d.lines_removed} +{d.lines_added} lines)"
        rows.append(
            {
                "file": d.file,
                "kernel": d.kernel.split("(")[0],
                "SASS": status,
                "instructions": f"{d.insns_base} -> {d.insns_head}",
                "registers": f"{res(d.base, 'registers')} -> {res(d.head, 'registers')}",
                "spill st/ld (B)": f"{spills(d.base)} -> {spills(d.head)}",
            }
        )
    return rows


# ---- command line ---------------------------------------------------------------------------------


@dataclass
class SassDiffConfig:
    """Compile project01's CUDA sources at two git revisions for sm_90a and compare each kernel's
    SASS (cuobjdump -sass, addresses normalised) and its registers and spills; no GPU needed.
    Exit code 1 when any kernel's SASS differs."""

    files: Annotated[tuple[str, ...], tyro.conf.Positional, tyro.conf.arg(metavar="FILE.cu")] = ()
    """.cu files relative to csrc/, e.g. attention/flash_bwd_hopper_hdim64.cu (default: all)"""
    base: str = "HEAD"
    """the git revision compared against (a branch, a tag, a commit)"""
    head: str | None = None
    """the git revision compared (None: the working tree, uncommitted changes included)"""
    arch: str = DEFAULT_ARCH
    """SM architecture, e.g. 90a or 80"""
    jobs: int | None = None
    """parallel nvcc processes (None: one per CPU core)"""
    reports_dir: str | None = None
    """sass_diff.json goes to <reports-dir>/project01_cuda_kernel/ (None: a new runs/<UTC time>/)"""
    write: bool = True
    """write sass_diff.json (--no-write: print the table only)"""

    def __post_init__(self) -> None:
        check_arch_and_jobs(self.arch, self.jobs)
        for name, rev in (("--base", self.base), ("--head", self.head)):
            if rev is not None and (not rev.strip() or rev.startswith("-")):
                raise ValueError(f"{name}: expected a git revision, got {rev!r}")
        for f in self.files:
            if not f.endswith(".cu") or Path(f).is_absolute() or ".." in Path(f).parts:
                raise ValueError(f"files: expected a .cu path relative to csrc/, got {f!r}")
        if self.reports_dir is not None and not str(self.reports_dir).strip():
            raise ValueError("--reports-dir: expected a folder, got an empty path")


def main(cfg: SassDiffConfig) -> int:
    """`sass-diff`: compile at both revisions, print the table, write sass_diff.json."""
    from shared.cli import writable_dir
    from shared.cuda_build import find_nvcc
    from shared.results import markdown_table, output_root, save_result

    reports_dir = output_root(cfg.reports_dir)
    if cfg.write:  # checked first: it needs no git history (a fork's fresh copy has none)
        writable_dir("--reports-dir", reports_dir / PROJECT)
    base_commit = resolve(cfg.base)
    head_commit = resolve(cfg.head) if cfg.head is not None else None
    nvcc = find_nvcc()
    if nvcc is None:
        print("sass-diff skipped: nvcc was not found (install the CUDA toolkit).")
        return 0
    cuobjdump = find_cuobjdump(nvcc)
    if cuobjdump is None:
        print("sass-diff skipped: cuobjdump was not found (CUDA toolkit or Triton's tools).")
        return 0
    t0 = time.perf_counter()
    diffs = run(
        cfg.base,
        cfg.head,
        list(cfg.files) or None,
        arch=cfg.arch,
        jobs=cfg.jobs,
        nvcc=nvcc,
        cuobjdump=cuobjdump,
    )
    print(markdown_table(summary_rows(diffs)))
    if cfg.write:
        path = save_result(
            PROJECT,
            "sass_diff",
            [asdict(d) | {"registers_or_spills_grew": d.grew} for d in diffs],
            config={
                "base": cfg.base,
                "base_commit": base_commit,
                "head": cfg.head or "working tree",
                "head_commit": head_commit,
                "arch": f"sm_{cfg.arch}",
                "nvcc": nvcc_version(nvcc),
                "cuobjdump": cuobjdump,
                "flags": [
                    *BASE_FLAGS,
                    *TORCH_NVCC_FLAGS,
                    f"-gencode=arch=compute_{cfg.arch},code=sm_{cfg.arch}",
                ],
            },
            reports_dir=reports_dir,
        )
        print(f"wrote {path}")
    changed = [d for d in diffs if d.status != "identical"]
    grew = [d for d in diffs if d.grew]
    print(
        f"{len(diffs)} kernels compared ({cfg.base} vs {cfg.head or 'the working tree'}, "
        f"sm_{cfg.arch}) in {time.perf_counter() - t0:.1f} s: {len(diffs) - len(changed)} "
        f"identical, {len(changed)} not; registers or spills grew in {len(grew)}"
    )
    for d in changed:
        print(f"DIFF {d.file}: {d.kernel.split('(')[0]}: {d.status}")
    return 1 if changed else 0


if __name__ == "__main__":  # `python -m <this module>` runs its command of the package
    import sys

    from project01_cuda_kernel.__main__ import main as package_main

    sys.exit(package_main(["sass-diff", *sys.argv[1:]]))
