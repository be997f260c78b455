"""Compile every CUDA source of the projects for sm_90a with nvcc alone (`make cuda-compile`).

    python3 scripts/compile_cuda.py              # every <project>/csrc/**/*.cu
    python3 scripts/compile_cuda.py --strict     # CI: no nvcc, or nothing compiled, is a failure
    python3 scripts/compile_cuda.py --arch 80 project04_llm_inference/csrc/paged_decode.cu
    .venv/bin/python scripts/compile_cuda.py --bindings   # the torch bindings too (needs torch)

No GPU and no torch: this is the compile-only CI job, run in a bare CUDA devel container, and it
uses the standard library only. Each file is compiled on its own with
`nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++17 -O3 -c`, with the project's `csrc/` and
the file's folder on the include path, so a syntax or type error in a kernel fails here before
any GPU time is spent.

Every kernel source compiles without torch: the torch bindings live in `.cpp` files or behind
`#ifdef TORCH_EXTENSION_NAME` (defined only by torch's extension build), so no source is
excluded. A source that includes a torch header outside that guard fails with a note saying so.
Without nvcc the run is skipped with the reason (exit 0), or fails with --strict.

--bindings (`make cuda-compile-bindings`) checks the other half, which only a GPU machine's
extension build saw: the binding translation units (every `*.cpp` under a `csrc/`, and the `.cu`
files there holding `TORCH_EXTENSION_NAME`) are compiled against the installed torch's headers
as torch's extension builder compiles them (g++ for `.cpp`, nvcc for `.cu`; torch's CPU wheel
ships the CUDA headers), the `.cu` kernel sources of the same csrc/ tree are compiled (to PTX
only: their host symbols are what is read), and every launcher a binding calls must be defined
by an object of that tree with the same mangled name, so a declaration that drifted from its
definition fails here, not at import on a GPU. Only that mode needs torch (imported then, by
name); without torch, nvcc, a host compiler or binutils it is skipped with the reason (exit 0),
or fails with --strict (exit 2).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
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
    obj: Path | None = None  # the object file (--bindings reads its symbols)


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
    result = _run(cmd, rel, obj)
    if not result.ok and any(_TORCH_HEADER.search(e) for e in result.errors):
        result.errors.append(TORCH_NOTE)
    return result


def _run(cmd: list[str], rel: str, obj: Path) -> Compiled:
    """Run one compile command; on failure its error lines (at most 20), else its last lines."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = round(time.perf_counter() - t0, 2)
    if proc.returncode == 0:
        return Compiled(rel, True, seconds, obj=obj)
    text = proc.stdout + proc.stderr
    errors = [ln.strip() for ln in text.splitlines() if re.search(r"\berror\b", ln, re.I)]
    errors = errors[:20] or [ln.strip() for ln in text.strip().splitlines()[-5:]]
    name = Path(cmd[0]).name
    return Compiled(rel, False, seconds, errors or [f"{name} exited with {proc.returncode}"])


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


# --- --bindings: the torch bindings against torch's headers, and the launchers they call ---------

BINDING_MARK = "TORCH_EXTENSION_NAME"
# the generated header torch's CPU wheel lacks (its CUDA headers include it); a stand-in for it
CUDA_MACROS = "c10/cuda/impl/cuda_cmake_macros.h"
CUDA_MACROS_STUB = "#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n"
PROJECT_SUFFIXES = (".h", ".hh", ".hpp", ".cuh", ".inl", ".cu", ".cpp", ".cc")
# undefined symbols of these namespaces are the libraries' (torch, pybind11, the C++ runtime)
EXTERNAL_NAMESPACES = frozenset(
    {"std", "__gnu_cxx", "__cxxabiv1", "at", "c10", "caffe2", "torch", "pybind11", "ska", "fmt"}
    | {"cuda", "cub", "thrust"}
)
# an unqualified symbol of the C libraries: reserved names (_x, __x), Python's, the CUDA runtime's
# and driver's, pthreads'
_C_EXTERNAL = re.compile(r"^(?:_|Py[A-Z_]|cuda[A-Z]|cu[A-Z]|pthread_)")
# the project's launcher families, named by convention (counted as its own even undeclared)
_LAUNCHER = re.compile(r"^(?:launch|flash)_")
_SPECIAL = re.compile(
    r"^(?:(?:typeinfo(?: name)?|vtable|VTT|construction vtable|guard variable"
    r"|reference temporary #\d+|TLS (?:init|wrapper) function|transaction clone) for "
    r"|(?:non-virtual |virtual |covariant return )?thunk to )+"
)
_COMMENT_OR_STRING = re.compile(
    r"//[^\n]*|/\*.*?\*/|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'", re.S
)
_NAMESPACE = re.compile(r"\bnamespace\s+(\w+(?:\s*::\s*\w+)*)\s*\{")
_TYPE = re.compile(r"\b(?:class|struct|union|enum)\s+(?:class\s+|struct\s+)?([A-Za-z_]\w*)")
# a declaration or definition at the start of a statement: `[template <...>] type... name(`
_DECLARATION = re.compile(
    r"\s*(?:template\s*<[^;{}]*?>\s*)?([A-Za-z_][\w:]*)(?:\s*<[^;{}()]*?>)?"
    r"(?:[\s*&]+[A-Za-z_][\w:]*(?:\s*<[^;{}()]*?>)?)*?[\s*&]+([A-Za-z_]\w*)\s*\("
)
_NOT_A_TYPE = frozenset(
    {"return", "else", "case", "goto", "throw", "new", "delete", "using", "typedef", "sizeof"}
    | {"co_return", "co_yield", "co_await", "if", "while", "for", "switch", "do", "operator"}
)


@dataclass
class Toolchain:
    """What --bindings compiles with: the tools, and the installed torch's build flags."""

    nvcc: str
    cxx: str  # the host compiler torch's extension builder compiles .cpp sources with
    nm: str
    cxxfilt: str
    torch_version: str
    includes: list[str]  # -isystem: torch's, Python's, the CUDA toolkit's
    defines: list[str]
    nvcc_flags: list[str]  # torch's own for every .cu (its COMMON_NVCC_FLAGS)
    needs_stub: bool  # torch lacks CUDA_MACROS: a stand-in goes on the include path


@dataclass
class Missing:
    """An undefined symbol of a binding that no object of its csrc tree defines."""

    name: str  # demangled
    mangled: str
    elsewhere: list[str] = field(default_factory=list)  # same name, other signatures (mangled)


def is_binding(path: Path) -> bool:
    """A torch binding translation unit: a .cpp file, or a .cu file naming TORCH_EXTENSION_NAME."""
    if path.suffix == ".cpp":
        return True
    return path.suffix == ".cu" and BINDING_MARK in path.read_text(errors="replace")


def binding_units(root: Path = ROOT) -> list[Path]:
    """Every torch binding translation unit under a project's csrc/ folder."""
    cpp = [p for p in root.glob("*/csrc/**/*.cpp") if p.is_file()]
    return sorted(cpp + [p for p in sources(root) if is_binding(p)])


def find_cxx() -> str | None:
    """The host compiler: $CXX (as torch's extension builder reads it), else g++, else c++."""
    env = os.environ.get("CXX")
    if env:
        return shutil.which(env)
    return shutil.which("g++") or shutil.which("c++")


def cuda_include_dirs(nvcc: str) -> list[str]:
    """The CUDA toolkit's include folders, for the host compiler: nvcc's own (`--dryrun` names
    its TOP, so a wrapper script on the PATH is seen through), else the folder beside its bin/."""
    top = None
    with tempfile.TemporaryDirectory(prefix="nvcc-top-") as tmp:
        try:
            proc = subprocess.run(
                [nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", str(Path(tmp) / "x.o")],
                capture_output=True,
                text=True,
                timeout=60,
            )
            found = re.search(r"^#\$ TOP=(.+)$", proc.stdout + proc.stderr, re.M)
            top = Path(found.group(1).strip()).resolve() if found else None
        except (OSError, subprocess.SubprocessError):
            pass
    top = top or Path(shutil.which(nvcc) or nvcc).resolve().parent.parent
    return [str(d) for d in (top / "include", top / "include" / "cccl") if d.is_dir()]


def torch_toolchain(nvcc: str, cxx: str | None) -> tuple[Toolchain | None, list[str]]:
    """The toolchain for --bindings, or None and why not (one phrase per missing piece)."""
    missing = []
    cxx = cxx or find_cxx()
    if cxx is None or not (Path(cxx).is_file() or shutil.which(cxx)):
        missing.append("no host C++ compiler was found (install g++, or set CXX)")
    nm, cxxfilt = shutil.which("nm"), shutil.which("c++filt")
    if nm is None or cxxfilt is None:
        missing.append("nm and c++filt were not found (install binutils)")
    try:  # by name: the default mode runs where torch is not installed
        torch = importlib.import_module("torch")
        cpp_extension = importlib.import_module("torch.utils.cpp_extension")
    except ImportError as e:
        missing.append(f"torch is not importable by {sys.executable} ({e})")
        return None, missing
    torch_dirs = [str(d) for d in cpp_extension.include_paths()]
    if not any((Path(d) / "c10" / "cuda" / "CUDAStream.h").is_file() for d in torch_dirs):
        missing.append(f"torch {torch.__version__} ships no CUDA headers (c10/cuda)")
    # Python.h, where torch's extension builder looks for it
    python_dir = sysconfig.get_path("include", scheme="posix_prefix")
    if not (Path(python_dir) / "Python.h").is_file():
        missing.append(f"Python's headers are missing (no Python.h in {python_dir}; python3-dev)")
    if missing:
        return None, missing
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    return Toolchain(
        nvcc=nvcc,
        cxx=cxx,
        nm=nm,
        cxxfilt=cxxfilt,
        torch_version=torch.__version__,
        includes=[*torch_dirs, python_dir, *cuda_include_dirs(nvcc)],
        defines=["-DTORCH_API_INCLUDE_EXTENSION_H", f"-D_GLIBCXX_USE_CXX11_ABI={abi}"],
        nvcc_flags=list(getattr(cpp_extension, "COMMON_NVCC_FLAGS", [])),
        needs_stub=not any((Path(d) / CUDA_MACROS).is_file() for d in torch_dirs),
    ), []


def compile_for_torch(
    path: Path, kernel: bool, tc: Toolchain, arch: str, workdir: Path, root: Path = ROOT
) -> Compiled:
    """Compile one source as torch's extension builder would: a .cpp with the host compiler, a
    .cu with nvcc and torch's nvcc flags (for sm_<arch>, or to PTX only when `kernel`: a kernel
    source is compiled for its host symbols, cuda-compile assembles it)."""
    rel = _rel(path, root)
    obj = workdir / (rel.replace("/", "__") + ".o")
    name = re.sub(r"\W", "_", path.stem)
    flags = ["-std=c++17", f"-DTORCH_EXTENSION_NAME={name}", *tc.defines]
    flags += [f"-I{path.parent}", f"-I{_csrc_of(path)}"]
    system = [*tc.includes, *([str(workdir / "stub")] if tc.needs_stub else [])]
    flags += [arg for d in system for arg in ("-isystem", d)]
    if path.suffix == ".cu":
        code = f"compute_{arch}" if kernel else f"sm_{arch}"
        cmd = [tc.nvcc, *flags, *tc.nvcc_flags, "-Xcompiler", "-fPIC"]
        cmd += [f"-gencode=arch=compute_{arch},code={code}"]
    else:
        cmd = [tc.cxx, *flags, "-fPIC"]
    return _run([*cmd, "-c", str(path), "-o", str(obj)], rel, obj)


def parse_nm(text: str, undefined: bool) -> list[str]:
    """Symbol names from `nm -P` output: the undefined ones (type U), or the defined ones."""
    names = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        kind = parts[1]  # U undefined, w/v weak undefined (may stay so), anything else defined
        if kind == "U" if undefined else kind not in ("U", "w", "v"):
            names.append(parts[0])
    return names


def symbols(obj: Path, nm: str, undefined: bool) -> list[str]:
    """The object's undefined symbols, or its defined global ones (raw, mangled names)."""
    which = "--undefined-only" if undefined else "--defined-only"
    opts = [which] if undefined else [which, "--extern-only"]
    proc = subprocess.run([nm, "-P", *opts, str(obj)], capture_output=True, text=True, check=True)
    return parse_nm(proc.stdout, undefined)


def demangle(names: list[str], cxxfilt: str) -> dict[str, str]:
    """Raw symbol name -> its demangled form (one c++filt for them all)."""
    proc = subprocess.run(
        [cxxfilt], input="\n".join(names) + "\n", capture_output=True, text=True, check=True
    )
    out = proc.stdout.splitlines()
    return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}


def qualified_name(demangled: str) -> str:
    """The qualified name of a demangled symbol, without signature, template arguments or return
    type: 'cudaError flash::run<bf16, 64>(flash::P const&)' -> 'flash::run'."""
    s = _SPECIAL.sub("", demangled).replace("(anonymous namespace)", "{anonymous}")
    s = re.sub(r"\boperator\b.*", "operator", s, flags=re.S)
    depth = 0
    for i, ch in enumerate(s):  # the signature starts at the first '(' outside template arguments
        if ch == "<":
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
        elif ch == "(" and depth == 0:
            s = s[:i]
            break
    while True:
        shorter = re.sub(r"<[^<>]*>", "", s)
        if shorter == s:
            break
        s = shorter
    return s.strip().rsplit(" ", 1)[-1].lstrip("*&")


def project_names(csrc: Path) -> set[str]:
    """The names the csrc tree declares: its namespaces, types and functions (a declaration or
    definition at the start of a statement; comments, strings and preprocessor lines ignored).
    A function declared `extern "C"` is named twice, the second time as `extern "C" <name>`."""
    names: set[str] = set()
    for path in sorted(csrc.rglob("*")):
        if path.suffix not in PROJECT_SUFFIXES or not path.is_file():
            continue
        text = path.read_text(errors="replace").replace("\\\n", " ")
        text = _COMMENT_OR_STRING.sub(lambda m: "C" if m.group().startswith('"') else " ", text)
        text = re.sub(r"^\s*#.*$", "", text, flags=re.M)
        for spec in _NAMESPACE.findall(text):
            names.update(part.strip() for part in spec.split("::"))
        names.update(_TYPE.findall(text))
        for block in re.findall(r"\bextern\s+C\s*\{([^{}]*)\}", text):  # extern "C" { ... }
            names.update(f'extern "C" {n}' for n in _declared(block, c_linkage=False))
        for statement in re.split(r"[;{}]", text):
            c_linkage = re.match(r"\s*extern\s+C\s", statement) is not None
            for n in _declared(statement, c_linkage):
                names.add(n)
                if c_linkage:
                    names.add(f'extern "C" {n}')
    return names


def _declared(text: str, c_linkage: bool) -> list[str]:
    """The functions declared at the start of the statements in `text`."""
    found = []
    for statement in re.split(r"[;{}]", text):
        if c_linkage:
            statement = re.sub(r"^\s*extern\s+C\s", "", statement)
        match = _DECLARATION.match(statement)
        if match and match.group(1) not in _NOT_A_TYPE and match.group(2) not in _NOT_A_TYPE:
            found.append(match.group(2))
    return found


def is_project_symbol(
    demangled: str, names: set[str], defined: set[str] = frozenset(), c_linkage: bool = False
) -> bool:
    """Whether an undefined symbol is the project's own, so its csrc tree must define it: not the
    libraries' (torch, c10, pybind11, Python, the CUDA runtime, libc, libstdc++), and of a
    namespace, type or function the tree declares (`names`, from `project_names`), of a name the
    tree defines with another signature (`defined`: qualified names), or a launch_*/flash_*
    function. A C-linkage symbol (an unmangled name) counts only when declared `extern "C"`."""
    qualified = qualified_name(demangled)
    parts = [part for part in qualified.split("::") if part]
    # the libraries' namespaces, global operators (new, delete), reserved and C API names
    if not parts or parts[0] in EXTERNAL_NAMESPACES or parts[0] == "operator":
        return False
    if _C_EXTERNAL.match(parts[0]):
        return False
    if c_linkage:
        return f'extern "C" {qualified}' in names or bool(_LAUNCHER.match(qualified))
    if qualified in defined or parts[0] == "{anonymous}":
        return True
    return parts[0] in names or bool(_LAUNCHER.match(parts[-1]))


def missing_symbols(
    undefined: list[str], defined: list[str], demangled: dict[str, str], names: set[str]
) -> list[Missing]:
    """The project symbols among a binding's `undefined` that are not among the tree's `defined`
    (raw names compared: a signature that differs is a different symbol). `demangled` maps raw
    names to readable ones; each miss lists the tree's definitions of the same name."""
    have = set(defined)
    by_name: dict[str, list[str]] = {}
    for sym in defined:
        by_name.setdefault(qualified_name(demangled.get(sym, sym)), []).append(sym)
    missing = []
    for sym in undefined:
        readable = demangled.get(sym, sym)
        c_linkage = not sym.startswith("_Z")
        if sym in have or not is_project_symbol(readable, names, set(by_name), c_linkage):
            continue
        missing.append(Missing(readable, sym, sorted(by_name.get(qualified_name(readable), []))))
    return missing


def check_bindings(
    units: list[Path],
    tc: Toolchain,
    *,
    arch: str = DEFAULT_ARCH,
    jobs: int | None = None,
    root: Path = ROOT,
) -> list[Compiled]:
    """Compile `units` and the .cu kernel sources of their csrc trees; then check each binding's
    undefined project symbols against the tree's objects. One Compiled per file, by path."""
    unit_set = set(units)
    trees = sorted({_csrc_of(u) for u in units})
    kernels = [k for t in trees for k in sorted(t.rglob("*.cu")) if k not in unit_set]
    jobs = jobs or os.cpu_count() or 2
    tasks = [(u, False) for u in units] + [(k, True) for k in kernels]  # the slow ones first
    with tempfile.TemporaryDirectory(prefix="compile-bindings-") as tmp:
        workdir = Path(tmp)
        if tc.needs_stub:
            stub = workdir / "stub" / CUDA_MACROS
            stub.parent.mkdir(parents=True)
            stub.write_text(CUDA_MACROS_STUB)
        with ThreadPoolExecutor(jobs) as ex:
            done = ex.map(lambda t: compile_for_torch(*t, tc, arch, workdir, root), tasks)
            results = dict(zip([path for path, _ in tasks], done))
        for tree in trees:
            _check_tree(tree, [u for u in units if _csrc_of(u) == tree], results, tc, root)
    return [results[path] for path in sorted(results)]


def _check_tree(
    tree: Path, units: list[Path], results: dict[Path, Compiled], tc: Toolchain, root: Path
) -> None:
    """Check the symbols of one csrc tree's bindings (in place: a miss fails its binding)."""
    objects = {p: r for p, r in results.items() if _csrc_of(p) == tree}
    broken = [r.file for p, r in objects.items() if not r.ok and p.suffix == ".cu"]  # definers
    checked = [u for u in units if results[u].ok]
    if not checked:
        return
    if broken:
        for u in checked:
            results[u].errors.append(f"symbols not checked: {', '.join(broken)} did not compile")
        return
    defined = {p: symbols(r.obj, tc.nm, undefined=False) for p, r in objects.items() if r.ok}
    undefined = {u: symbols(results[u].obj, tc.nm, undefined=True) for u in checked}
    every = sorted({s for syms in [*defined.values(), *undefined.values()] for s in syms})
    readable = demangle(every, tc.cxxfilt)
    where = {s: results[p].file for p, syms in defined.items() for s in syms}
    names = project_names(tree)
    all_defined = sorted({s for syms in defined.values() for s in syms})
    for u in checked:
        for miss in missing_symbols(undefined[u], all_defined, readable, names):
            results[u].ok = False
            results[u].errors.append(
                f"{miss.name}: called here, defined by no source of {_rel(tree, root)}"
            )
            for other in miss.elsewhere:
                results[u].errors.append(f"  {where[other]} defines {readable[other]}")


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
        "files",
        nargs="*",
        type=Path,
        help=".cu files (default: every <project>/csrc/**/*.cu); with --bindings, binding units "
        "(default: every one under a <project>/csrc/)",
    )
    p.add_argument(
        "--bindings",
        action="store_true",
        help="compile the torch bindings against the installed torch's headers, with the kernel "
        "sources of their csrc/ trees, and check that each launcher they call is defined",
    )
    p.add_argument(
        "--cxx",
        default=None,
        help="--bindings: the host compiler for .cpp bindings (default: $CXX, g++, c++)",
    )
    p.add_argument(
        "--arch", type=_arch, default=DEFAULT_ARCH, help="SM architecture (default: 90a)"
    )
    p.add_argument(
        "--jobs",
        type=_positive_int,
        default=None,
        help="parallel compiler processes (default: one a core)",
    )
    p.add_argument(
        "--nvcc",
        default=None,
        help="the nvcc to use (default: CUDA_HOME's, the PATH's, /usr/local/cuda's)",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="fail when a tool (nvcc; with --bindings torch, g++, binutils too) is missing or "
        "there is nothing to compile (CI)",
    )
    args = p.parse_args(argv)
    missing = [str(f) for f in args.files if not f.is_file()]
    if missing:
        p.error(f"argument files: no such file: {', '.join(missing)}")
    if args.bindings:
        not_bindings = [str(f) for f in args.files if not is_binding(f)]
        if not_bindings:
            p.error(
                f"argument files: not a binding unit (a .cpp, or a .cu naming {BINDING_MARK}): "
                + ", ".join(not_bindings)
            )

    nvcc = args.nvcc or find_nvcc()
    if nvcc is None or not (Path(nvcc).is_file() or shutil.which(nvcc)):
        print(
            f"{'binding check' if args.bindings else 'cuda compile'} skipped: nvcc was not found "
            "(install the CUDA toolkit, or set CUDA_HOME to it)."
        )
        return 2 if args.strict else 0
    if args.bindings:
        return _main_bindings(args, nvcc)
    files = [f.resolve() for f in args.files] or sources()
    if not files:
        print("cuda compile: no CUDA sources here (none under <project>/csrc/).")
        return 2 if args.strict else 0

    t0 = time.perf_counter()
    results = compile_all(files, nvcc, arch=args.arch, jobs=args.jobs)
    return _report(
        results,
        f"{len(results)} CUDA source(s) compiled for sm_{args.arch} in "
        f"{time.perf_counter() - t0:.1f} s",
    )


def _report(results: list[Compiled], summary: str) -> int:
    """A line per file (errors indented below it), the summary with the failure count; the
    exit status."""
    for r in results:
        print(f"{'ok  ' if r.ok else 'FAIL'} {r.file} ({r.seconds:.1f} s)")
        for e in r.errors:
            print(f"     {e}")
    failed = [r for r in results if not r.ok]
    print(f"{summary}; {len(failed)} failed")
    return 1 if failed else 0


def _main_bindings(args: argparse.Namespace, nvcc: str) -> int:
    tc, why = torch_toolchain(nvcc, args.cxx)
    if tc is None:
        print(f"binding check skipped: {'; '.join(why)}.")
        return 2 if args.strict else 0
    units = [f.resolve() for f in args.files] or binding_units()
    if not units:
        print("binding check: no torch bindings here (none under <project>/csrc/).")
        return 2 if args.strict else 0

    t0 = time.perf_counter()
    results = check_bindings(units, tc, arch=args.arch, jobs=args.jobs)
    return _report(
        results,
        f"{len(units)} binding unit(s) and {len(results) - len(units)} kernel source(s) compiled "
        f"against torch {tc.torch_version} for sm_{args.arch}, their symbols checked, in "
        f"{time.perf_counter() - t0:.1f} s",
    )


if __name__ == "__main__":
    sys.exit(main())
