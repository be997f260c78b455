"""Resumable loading: a loader restored from its state_dict hands out exactly the batches an
uninterrupted one would, with worker prefetching (DataLoader) and DALI's queue in between."""

from __future__ import annotations

import json

import pytest
import torch

from project03_capstone_infra.__main__ import main as package_main
from project03_capstone_infra.data import loaders
from project03_capstone_infra.data.loaders import DaliLoader, ResumableLoader, dali_available
from shared.data import SyntheticTokens

VOCAB, SEQ, BATCH = 256, 64, 8
DALI_OK, DALI_WHY = dali_available()
needs_dali = pytest.mark.skipif(not DALI_OK, reason=DALI_WHY)


def _stream(**kw) -> SyntheticTokens:
    return SyntheticTokens(VOCAB, SEQ, BATCH, seed=3, **kw)


def _same(a, b) -> bool:
    return all(
        torch.equal(x[0].cpu(), y[0].cpu()) and torch.equal(x[1].cpu(), y[1].cpu())
        for x, y in zip(a, b, strict=True)
    )


def _take(it, n):
    return [next(it) for _ in range(n)]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataloader_batches_are_the_stream_batches(num_workers):
    loader = ResumableLoader(_stream(), num_workers=num_workers)
    got = _take(iter(loader), 4)
    ref = _stream()
    assert _same(got, [ref.batch_at(s) for s in range(4)])
    assert got[0][0].shape == (BATCH, SEQ) and got[0][0].dtype == torch.int64
    # targets are the inputs shifted by one token
    assert torch.equal(got[0][0][:, 1:], got[0][1][:, :-1])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataloader_resumes_at_the_exact_batch(num_workers):
    loader = ResumableLoader(_stream(), num_workers=num_workers, prefetch_factor=4)
    it = iter(loader)
    _take(it, 5)  # workers have produced more than 5 by now: the position must still be 5
    state = json.loads(json.dumps(loader.state_dict()))  # as it travels in a checkpoint
    assert state["step"] == 5
    expected = _take(it, 3)  # what the uninterrupted run sees next
    del it
    resumed = ResumableLoader(_stream(), num_workers=num_workers)
    resumed.load_state_dict(state)
    assert resumed.position == 5
    assert _same(_take(iter(resumed), 3), expected)


def test_sharded_loaders_split_the_same_global_batch():
    whole = _take(iter(ResumableLoader(_stream())), 2)
    halves = [_take(iter(ResumableLoader(_stream(rank=r, world_size=2))), 2) for r in (0, 1)]
    for step in range(2):
        assert torch.equal(torch.cat([halves[0][step][0], halves[1][step][0]]), whole[step][0])


def test_state_of_another_run_is_refused():
    loader = ResumableLoader(_stream())
    with pytest.raises(ValueError, match="seed"):
        loader.load_state_dict(
            {"step": 3, "seed": 99, "vocab_size": VOCAB, "seq_len": SEQ, "global_batch": BATCH}
        )


def test_bad_loader_arguments():
    with pytest.raises(TypeError, match="SyntheticTokens"):
        ResumableLoader([1, 2, 3])
    with pytest.raises(ValueError, match="num_workers"):
        ResumableLoader(_stream(), num_workers=-1)
    with pytest.raises(ValueError, match="prefetch_factor"):
        ResumableLoader(_stream(), num_workers=1, prefetch_factor=0)


@needs_dali
@pytest.mark.parametrize(
    "py_workers", [0, pytest.param(1, marks=pytest.mark.slow, id="1-worker-process")]
)
def test_dali_cpu_pipeline_matches_and_resumes(py_workers):
    loader = DaliLoader(_stream(), device="cpu", py_workers=py_workers, prefetch=3)
    it = iter(loader)
    first = _take(it, 4)
    ref = _stream()
    assert _same(first, [ref.batch_at(s) for s in range(4)])
    state = loader.state_dict()
    assert state["step"] == 4  # DALI's prefetch queue is ahead; the position is not
    expected = _take(it, 3)
    del it
    loader.close()
    resumed = DaliLoader(_stream(), device="cpu", py_workers=py_workers)
    resumed.load_state_dict(state)
    got = _take(iter(resumed), 3)
    resumed.close()
    assert _same(got, expected)


@needs_dali
def test_dali_bad_arguments():
    with pytest.raises(ValueError, match="device"):
        loaders.build_dali_pipeline(_stream(), 0, device="tpu")
    with pytest.raises(ValueError, match="num_threads"):
        loaders.build_dali_pipeline(_stream(), 0, num_threads=0)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            loaders.build_dali_pipeline(_stream(), 0, device="gpu")


@pytest.mark.gpu
@needs_dali
def test_dali_gpu_pipeline_matches_the_stream():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    loader = DaliLoader(_stream(), device="gpu", py_workers=1)
    got = _take(iter(loader), 3)
    loader.close()
    assert got[0][0].is_cuda
    ref = _stream()
    assert _same(got, [ref.batch_at(s) for s in range(3)])


def test_throughput_command_writes_its_report(tmp_path):
    rc = package_main(
        [
            "data",
            "--preset",
            "tiny",
            "--batches",
            "4",
            "--warmup",
            "1",
            "--repeats",
            "1",
            "--workers",
            "0,1",
            "--reports-dir",
            str(tmp_path),
        ]
    )
    assert rc == 0
    out = tmp_path / "project03_capstone_infra"
    rec = json.loads((out / "data.json").read_text())
    runs = rec["results"]["runs"]
    assert "in-loop stream (baseline)" in runs and "DataLoader, 1 workers" in runs
    assert all(r["tokens_per_s"] > 0 for r in runs.values())
    assert any(r["kind"] == "dali" for r in runs.values()) == DALI_OK
    assert (out / "data.png").stat().st_size > 10_000
    assert "tokens/s" in (out / "data.md").read_text()
