"""Build and load the CUDA extensions on first use, through `torch.utils.cpp_extension`.

Importing the package needs no GPU and no compiler: nothing here runs until a kernel is first
called. When something needed is missing, `CudaUnavailableError` says what in one sentence.

- Target architecture: the current GPU's compute capability, or `TORCH_CUDA_ARCH_LIST` when set.
  On compute capability 9.0 the target is `9.0a`, so Hopper-only instructions (wgmma, setmaxnreg)
  assemble.
- Build directory: `.build/<extension>/` at the repository root (ignored by git), or
  `$P01_BUILD_DIR/<extension>/`; ninja rebuilds only what changed.
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path
from types import ModuleType

import torch

CSRC = Path(__file__).resolve().parent / "csrc"


class CudaUnavailableError(RuntimeError):
    """No CUDA GPU, no nvcc, or a CPU-only build of torch: the kernels cannot run here."""


def cuda_unavailable_reason() -> str | None:
    """One sentence saying why the CUDA kernels cannot run here, or None when they can."""
    if torch.version.cuda is None:
        return (
            f"torch {torch.__version__} is a CPU-only build; the CUDA kernels need a CUDA build "
            "of torch (pip install torch on a machine with an NVIDIA driver)."
        )
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible to torch (torch.cuda.is_available() is False)."
    if _nvcc() is None:
        return "nvcc was not found (set CUDA_HOME or put the CUDA toolkit's bin/ on PATH)."
    return None


def require_cuda() -> None:
    reason = cuda_unavailable_reason()
    if reason is not None:
        raise CudaUnavailableError(reason)


def _nvcc() -> str | None:
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME and (Path(CUDA_HOME) / "bin" / "nvcc").exists():
        return str(Path(CUDA_HOME) / "bin" / "nvcc")
    return shutil.which("nvcc")


def build_root() -> Path:
    env = os.environ.get("P01_BUILD_DIR")
    return Path(env) if env else Path(__file__).resolve().parent.parent / ".build"


def target_arch_list() -> str:
    """The value given to TORCH_CUDA_ARCH_LIST for this build, e.g. '9.0a' on an H100/H200."""
    override = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if override:
        return override
    major, minor = torch.cuda.get_device_capability()
    return f"{major}.{minor}a" if (major, minor) == (9, 0) else f"{major}.{minor}"


def is_hopper() -> bool:
    """True on compute capability 9.0, where the wgmma/TMA kernels are offered."""
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@functools.cache
def load_extension(
    name: str,
    sources: tuple[str, ...],
    extra_cuda_cflags: tuple[str, ...] = (),
    verbose: bool = False,
) -> ModuleType:
    """Compile (once, cached by ninja) and import the extension `name` from `csrc/` sources.

    `sources` are paths relative to `csrc/`. Raises CudaUnavailableError when the kernels cannot
    run here.
    """
    require_cuda()
    from torch.utils.cpp_extension import load

    os.environ["TORCH_CUDA_ARCH_LIST"] = target_arch_list()
    build_dir = build_root() / name
    build_dir.mkdir(parents=True, exist_ok=True)
    paths = [str(CSRC / s) for s in sources]
    missing = [p for p in paths if not Path(p).exists()]
    if missing:
        raise FileNotFoundError(f"extension {name}: missing sources {missing}")
    return load(
        name=name,
        sources=paths,
        build_directory=str(build_dir),
        extra_cflags=["-O3", "-std=c++17"],
        extra_cuda_cflags=[
            "-O3",
            "-std=c++17",
            "--use_fast_math",
            "-lineinfo",
            f"-I{CSRC}",
            *extra_cuda_cflags,
        ],
        extra_include_paths=[str(CSRC)],
        verbose=verbose or bool(os.environ.get("P01_VERBOSE_BUILD")),
    )
