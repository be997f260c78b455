"""Build and load a project's CUDA extension on first use, through `torch.utils.cpp_extension`.

Importing this module needs no GPU and no compiler: nothing runs until `load_extension` is
called. When something needed is missing, `CudaUnavailableError` says what in one sentence.

- Target architecture: the current GPU's compute capability, or `TORCH_CUDA_ARCH_LIST` when set.
  On compute capability 9.0 the target is `9.0a`, so Hopper-only instructions (wgmma, setmaxnreg)
  assemble.
- Build directory: `.build/<extension>/` at the repository root (ignored by git), or
  `$CUDA_EXT_BUILD_DIR/<extension>/` (a caller may pass its own `build_root`); ninja rebuilds only
  what changed. `CUDA_EXT_VERBOSE=1` prints the compiler's commands.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent


class CudaUnavailableError(RuntimeError):
    """No CUDA GPU, no nvcc, or a CPU-only build of torch: the kernels cannot run here."""


def find_nvcc() -> str | None:
    """The nvcc that torch's extension builder will use: `$CUDA_HOME/bin/nvcc`, else PATH's."""
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME and (Path(CUDA_HOME) / "bin" / "nvcc").exists():
        return str(Path(CUDA_HOME) / "bin" / "nvcc")
    return shutil.which("nvcc")


def cuda_unavailable_reason() -> str | None:
    """One sentence saying why the CUDA kernels cannot run here, or None when they can."""
    if torch.version.cuda is None:
        return (
            f"torch {torch.__version__} is a CPU-only build; the CUDA kernels need a CUDA build "
            "of torch (pip install torch on a machine with an NVIDIA driver)."
        )
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible to torch (torch.cuda.is_available() is False)."
    if find_nvcc() is None:
        return "nvcc was not found (set CUDA_HOME or put the CUDA toolkit's bin/ on PATH)."
    return None


def require_cuda() -> None:
    """Raise `CudaUnavailableError` with the one-sentence reason when kernels cannot run here."""
    reason = cuda_unavailable_reason()
    if reason is not None:
        raise CudaUnavailableError(reason)


def default_build_root() -> Path:
    env = os.environ.get("CUDA_EXT_BUILD_DIR")
    return Path(env) if env else REPO_ROOT / ".build"


def target_arch_list() -> str:
    """The value given to TORCH_CUDA_ARCH_LIST for this build, e.g. '9.0a' on Hopper."""
    override = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if override:
        return override
    major, minor = torch.cuda.get_device_capability()
    return f"{major}.{minor}a" if (major, minor) == (9, 0) else f"{major}.{minor}"


def load_extension(
    name: str,
    csrc_dir: str | os.PathLike,
    sources: Sequence[str],
    extra_cuda_cflags: Sequence[str] = (),
    *,
    build_root: str | os.PathLike | None = None,
    verbose: bool = False,
) -> ModuleType:
    """Compile (once, cached by ninja) and import the extension `name` from `csrc_dir` sources.

    `sources` are paths relative to `csrc_dir`, which is also on the include path. Raises
    FileNotFoundError for a missing source (checked first, so it shows without a GPU) and
    CudaUnavailableError when the kernels cannot run here. Loaded once per process.
    """
    key = (
        name,
        os.fspath(csrc_dir),
        tuple(sources),
        tuple(extra_cuda_cflags),
        None if build_root is None else os.fspath(build_root),
        verbose,
    )
    module = _LOADED.get(key)
    if module is not None:  # the per-call fast path: ops call this on every launch
        return module
    csrc = Path(csrc_dir).resolve()
    paths = tuple(str(csrc / s) for s in sources)
    missing = [p for p in paths if not Path(p).exists()]
    if missing:
        raise FileNotFoundError(f"extension {name}: missing sources {missing}")
    root = Path(build_root) if build_root is not None else default_build_root()
    module = _load(name, csrc, paths, tuple(extra_cuda_cflags), root, verbose)
    _LOADED[key] = module
    return module


# load_extension's arguments -> the loaded module: resolving paths and checking the sources
# costs far more than a kernel launch, which every eager launch would otherwise pay
_LOADED: dict[tuple, ModuleType] = {}


STALE_LOCK_S = 900  # no single extension here takes 15 minutes to build


def clear_stale_lock(build_dir: Path, max_age_s: float = STALE_LOCK_S) -> bool:
    """Remove torch's build lock when it is older than any build takes.

    `torch.utils.cpp_extension` holds a `lock` file in the build folder while it compiles and
    waits, silently and forever, while one exists. A build killed mid-way (a timeout, Ctrl-C, a
    lost machine) leaves it behind, and every later run then hangs. Returns True if removed."""
    lock = Path(build_dir) / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return False
    if age < max_age_s:
        return False
    print(f"removing a stale build lock ({age / 60:.0f} min old): {lock}", file=sys.stderr)
    lock.unlink(missing_ok=True)
    return True


@functools.cache
def _load(
    name: str,
    csrc: Path,
    paths: tuple[str, ...],
    extra_cuda_cflags: tuple[str, ...],
    root: Path,
    verbose: bool,
) -> ModuleType:
    require_cuda()
    from torch.utils.cpp_extension import load

    os.environ["TORCH_CUDA_ARCH_LIST"] = target_arch_list()
    build_dir = root / name
    build_dir.mkdir(parents=True, exist_ok=True)
    clear_stale_lock(build_dir)
    if not any(build_dir.glob(f"{name}*.so")):
        # the first build takes a minute or more and torch prints nothing meanwhile
        print(f"building CUDA extension {name} (first use; later runs reuse it)", file=sys.stderr)
    return load(
        name=name,
        sources=list(paths),
        build_directory=str(build_dir),
        extra_cflags=["-O3", "-std=c++17"],
        extra_cuda_cflags=[
            "-O3",
            "-std=c++17",
            "--use_fast_math",
            "-lineinfo",
            f"-I{csrc}",
            *extra_cuda_cflags,
        ],
        extra_include_paths=[str(csrc)],
        verbose=verbose or bool(os.environ.get("CUDA_EXT_VERBOSE")),
    )
