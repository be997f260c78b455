"""Whether the decode-step kernels launch with programmatic dependent launch (csrc/pdl.cuh).

On sm_90 and newer a kernel launched this way may start while the kernel before it still runs:
the GEMV issues its first weight loads, every kernel waits for its inputs before reading them.
`USE_PDL = False` (or the environment variable P04_PDL=0 at import) makes every launch an
ordinary one; the benchmarks measure both. A CUDA graph keeps the launches it was captured with.
"""

from __future__ import annotations

import functools
import os

import torch

USE_PDL = os.environ.get("P04_PDL", "1") != "0"


@functools.cache
def _capable(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) >= (9, 0)


def pdl_enabled(device: torch.device) -> bool:
    """Launch with PDL on this CUDA device: switched on and the GPU is sm_90 or newer."""
    return USE_PDL and _capable(device.index if device.index is not None else 0)
