"""Build and load project01's CUDA extensions on first use (through `shared.cuda_build`).

Importing the package needs no GPU and no compiler: nothing here runs until a kernel is first
called. When something needed is missing, `CudaUnavailableError` says what in one sentence.

- Target architecture: the current GPU's compute capability, or `TORCH_CUDA_ARCH_LIST` when set.
  On compute capability 9.0 the target is `9.0a`, so Hopper-only instructions (wgmma, setmaxnreg)
  assemble.
- Build directory: `.build/<extension>/` at the repository root (ignored by git), or
  `$P01_BUILD_DIR/<extension>/`; ninja rebuilds only what changed. `P01_VERBOSE_BUILD=1` prints
  the compiler's commands.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

import torch

from shared import cuda_build
from shared.cuda_build import (
    CudaUnavailableError,
    cuda_unavailable_reason,
    require_cuda,
    target_arch_list,
)

__all__ = [
    "CSRC",
    "CudaUnavailableError",
    "build_root",
    "cuda_unavailable_reason",
    "is_hopper",
    "load_extension",
    "require_cuda",
    "target_arch_list",
]

CSRC = Path(__file__).resolve().parent / "csrc"


def build_root() -> Path:
    env = os.environ.get("P01_BUILD_DIR")
    return Path(env) if env else cuda_build.default_build_root()


def is_hopper() -> bool:
    """True on compute capability 9.0, where the wgmma/TMA kernels are offered."""
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


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
    return cuda_build.load_extension(
        name,
        CSRC,
        sources,
        extra_cuda_cflags,
        build_root=build_root(),
        verbose=verbose or bool(os.environ.get("P01_VERBOSE_BUILD")),
    )
