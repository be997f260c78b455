"""Resumable data loading: a PyTorch DataLoader and an NVIDIA DALI pipeline over the same
deterministic token stream, the position in the data part of the checkpoint.

Why resuming is exact: the stream (`shared.data.SyntheticTokens`) computes the batch of global
step s from (seed, s) alone, so a loader only has to know which step to hand out next. Loaders
prefetch (worker processes, DALI's queue), so the position saved is the number of batches the
*trainer received*, not the number produced: batches still in flight at a checkpoint are produced
again after a resume, and the resumed run sees exactly the batches an uninterrupted run would.

- `ResumableLoader`: a map-style dataset (item i = this rank's batch of step i) under a
  `torch.utils.data.DataLoader` with a sampler that starts at the saved step; worker processes
  build batches in parallel. `state_dict()` / `load_state_dict()` carry the position.
- `DaliLoader`: the same batches from a DALI pipeline. An external source (Python worker
  processes, `parallel=True`) yields the token sequences; DALI operators cut them into inputs and
  shifted targets: CPU operators with `device_id=None` where there is no GPU, GPU operators (after
  a `.gpu()` transfer) with one. Same `state_dict()` contract.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from shared.data import SyntheticTokens

Batch = tuple[torch.Tensor, torch.Tensor]  # (inputs, targets), each (local_batch, seq_len) int64


def dali_available() -> tuple[bool, str]:
    """(True, version) when NVIDIA DALI imports, else (False, why)."""
    try:
        import nvidia.dali as dali
    except ImportError as e:
        return False, f"NVIDIA DALI is not installed ({e}); pip install nvidia-dali-cuda130"
    return True, dali.__version__


def _check_stream(stream) -> None:
    if not isinstance(stream, SyntheticTokens):
        raise TypeError(
            f"stream must be a shared.data.SyntheticTokens, got {type(stream).__name__}"
        )


# --- PyTorch DataLoader ------------------------------------------------------------------------


class StepBatches(Dataset):
    """Item `step` is this rank's (inputs, targets) of that global step."""

    def __init__(self, stream: SyntheticTokens) -> None:
        _check_stream(stream)
        self.stream = stream

    def __len__(self) -> int:  # effectively endless; DataLoader only needs a length to exist
        return 2**62

    def __getitem__(self, step: int) -> Batch:
        return self.stream.batch_at(int(step))


class StepsFrom(Sampler[int]):
    """start, start + 1, ... (stop excluded when given)."""

    def __init__(self, start: int, stop: int | None = None) -> None:
        self.start, self.stop = start, stop

    def __iter__(self) -> Iterator[int]:
        step = self.start
        while self.stop is None or step < self.stop:
            yield step
            step += 1

    def __len__(self) -> int:
        return 2**62 if self.stop is None else max(0, self.stop - self.start)


class ResumableLoader:
    """Batches of `stream` from a DataLoader, resumable at the exact batch.

    Iterating yields (inputs, targets) from the current position on; `state_dict()` records how
    many batches were handed out. `load_state_dict()` (or a new loader on a restored stream)
    continues from there, re-creating the DataLoader so that prefetched batches are not lost."""

    def __init__(
        self,
        stream: SyntheticTokens,
        *,
        num_workers: int = 0,
        prefetch_factor: int = 2,
        pin_memory: bool = False,
        stop_step: int | None = None,
    ) -> None:
        _check_stream(stream)
        if not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers must be an int >= 0, got {num_workers!r}")
        if not isinstance(prefetch_factor, int) or prefetch_factor < 1:
            raise ValueError(f"prefetch_factor must be an int >= 1, got {prefetch_factor!r}")
        self.stream = stream
        self.num_workers, self.prefetch_factor, self.pin_memory = (
            num_workers,
            prefetch_factor,
            pin_memory,
        )
        self.stop_step = stop_step

    @property
    def position(self) -> int:
        """The global step of the next batch to be handed out."""
        return self.stream.step

    def _loader(self) -> DataLoader:
        kw = {}
        if self.num_workers:
            kw = {"prefetch_factor": self.prefetch_factor, "persistent_workers": False}
        return DataLoader(
            StepBatches(self.stream),
            batch_size=None,  # items are whole batches already
            sampler=StepsFrom(self.stream.step, self.stop_step),
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            **kw,
        )

    def __iter__(self) -> Iterator[Batch]:
        for batch in self._loader():
            self.stream.step += 1  # counted when handed out, not when produced
            yield batch

    def state_dict(self) -> dict:
        return self.stream.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.stream.load_state_dict(state)


# --- NVIDIA DALI -------------------------------------------------------------------------------


class _BatchSource:
    """DALI external-source callback (picklable for DALI's worker processes): the token
    sequences (seq_len + 1 each) of step start + iteration."""

    def __init__(self, stream: SyntheticTokens, start: int) -> None:
        self.stream, self.start = stream, start

    def __call__(self, batch_info) -> list[np.ndarray]:
        inputs, targets = self.stream.batch_at(self.start + batch_info.iteration)
        seqs = torch.cat([inputs, targets[:, -1:]], dim=1).numpy()  # (local_batch, seq_len + 1)
        return list(seqs)


def build_dali_pipeline(
    stream: SyntheticTokens,
    start_step: int,
    *,
    device: Literal["cpu", "gpu"] = "cpu",
    num_threads: int = 2,
    py_workers: int = 1,
    prefetch: int = 2,
):
    """A DALI pipeline yielding (inputs, targets) of steps start_step, start_step + 1, ...

    device="cpu": no GPU needed (device_id=None), every operator on the CPU.
    device="gpu": sequences are copied to the GPU and sliced there."""
    from nvidia import dali
    from nvidia.dali import fn, pipeline_def

    if device not in ("cpu", "gpu"):
        raise ValueError(f"device must be 'cpu' or 'gpu', got {device!r}")
    if device == "gpu" and not torch.cuda.is_available():
        raise ValueError("device='gpu' needs a CUDA GPU; use device='cpu' (DALI CPU operators)")
    for name, v, lo in (
        ("num_threads", num_threads, 1),
        ("py_workers", py_workers, 0),
        ("prefetch", prefetch, 1),
    ):
        if not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    seq_len = stream.seq_len
    device_id = torch.cuda.current_device() if device == "gpu" else None

    @pipeline_def(
        batch_size=stream.local_batch,
        num_threads=num_threads,
        device_id=device_id,
        prefetch_queue_depth=prefetch,
        py_num_workers=max(py_workers, 1),
        py_start_method="spawn",
    )
    def tokens_pipeline():
        seqs = fn.external_source(
            source=_BatchSource(stream, start_step),
            batch=True,
            batch_info=True,
            parallel=py_workers > 0,
            dtype=dali.types.INT64,
            ndim=1,
        )
        if device == "gpu":
            seqs = seqs.gpu()
        return seqs[0:seq_len], seqs[1 : seq_len + 1]  # inputs, targets (shifted by one)

    pipe = tokens_pipeline()
    pipe.build()
    return pipe


def _to_torch(tl) -> torch.Tensor:
    """A DALI TensorList (CPU or GPU) of equal-shape samples as one torch tensor on its device."""
    if type(tl).__name__.endswith("GPU"):
        from nvidia.dali.plugin.pytorch import feed_ndarray

        dense = tl.as_tensor()
        out = torch.empty(dense.shape(), dtype=torch.int64, device="cuda")
        feed_ndarray(dense, out, cuda_stream=torch.cuda.current_stream())
        return out
    return torch.from_numpy(np.asarray(tl.as_array()))


class DaliLoader:
    """The DALI counterpart of `ResumableLoader`: same batches, same state_dict contract."""

    def __init__(
        self,
        stream: SyntheticTokens,
        *,
        device: Literal["cpu", "gpu"] = "cpu",
        num_threads: int = 2,
        py_workers: int = 1,
        prefetch: int = 2,
        stop_step: int | None = None,
    ) -> None:
        _check_stream(stream)
        ok, why = dali_available()
        if not ok:
            raise RuntimeError(why)
        self.stream, self.stop_step = stream, stop_step
        self.kw = dict(
            device=device, num_threads=num_threads, py_workers=py_workers, prefetch=prefetch
        )
        self._pipe = None

    @property
    def position(self) -> int:
        return self.stream.step

    def __iter__(self) -> Iterator[Batch]:
        # A new pipeline per iteration pass: DALI's prefetch queue is discarded, the source
        # restarts at the position the trainer actually reached.
        self.close()
        self._pipe = build_dali_pipeline(self.stream, self.stream.step, **self.kw)
        while self.stop_step is None or self.stream.step < self.stop_step:
            inputs, targets = self._pipe.run()
            self.stream.step += 1
            yield _to_torch(inputs), _to_torch(targets)

    def close(self) -> None:
        if self._pipe is not None:
            del self._pipe
            self._pipe = None

    def state_dict(self) -> dict:
        return self.stream.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.close()
        self.stream.load_state_dict(state)
