"""Tensor parallelism over gloo on the CPU: TP=2 gives the greedy tokens of TP=1 in float32,
the shards' collectives are exact where they should be, and bad sizes are refused in one line.

Why tokens and not bits: a row-parallel projection sums two partial products (the all-reduce)
where TP=1 sums one dot product, so logits differ by float32 reordering, ~1e-6 relative; the
tiny model's top-2 logit gaps (initializer_range 0.1, conftest) are far larger, so the greedy
tokens are equal. The logits are compared within 1e-4 absolute: K <= 192 products of O(1)
terms, each reordering error <= K * 2^-24 * max|term| (~1e-5), over two layers and the LM head.
"""

from __future__ import annotations

import os

import pytest
import torch

from project04_llm_inference import LLM, SamplingParams
from project04_llm_inference.config import DUMMY_SHAPES, EngineArgs
from project04_llm_inference.engine.sequence import Sequence
from project04_llm_inference.engine.tp_worker import shutdown
from project04_llm_inference.model.loader import _shard
from project04_llm_inference.model.parallel import (
    TensorParallel,
    check_tensor_parallel,
    shard_config,
)

PROMPTS = [[5, 17, 42, 99, 3], [7, 7, 8], list(range(30, 52))]
PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def _generate(model_dir, tp: int, **engine):
    llm = LLM(
        str(model_dir),
        device="cpu",
        dtype="float32",
        num_gpu_blocks=64,
        tensor_parallel_size=tp,
        **engine,
    )
    try:
        outs = llm.generate(PROMPTS, PARAMS)
        # the logits of one prefill step, straight from the runner (rank 0 holds them whole)
        # (block 0 is free again once generate returns; the prompt fits one block)
        seq = Sequence("logits", PROMPTS[0], SamplingParams(max_tokens=1))
        seq.block_ids = [0]
        logits = llm.engine.runner.run([(seq, len(PROMPTS[0]))]).clone()
        return [o.token_ids for o in outs], logits, llm.engine.runner.model
    finally:
        shutdown(llm.engine.runner.model)


# the feature's one cheap representative in the fast tier (two processes, a few seconds)
def test_tp2_over_gloo_gives_the_greedy_tokens_of_tp1(hf_model_dir):
    tokens1, logits1, _ = _generate(hf_model_dir, 1, async_scheduling=False)
    tokens2, logits2, model2 = _generate(hf_model_dir, 2, async_scheduling=False)
    assert tokens2 == tokens1
    assert logits2.shape == logits1.shape == (1, 256)
    torch.testing.assert_close(logits2, logits1, atol=1e-4, rtol=0)
    # the workers are gone and the process group left
    assert all(not w.is_alive() for w in model2.workers)
    assert not torch.distributed.is_initialized()


@pytest.mark.slow
@pytest.mark.parametrize(
    "engine",
    [
        dict(async_scheduling=True),
        dict(num_scheduler_steps=4),
        dict(enable_chunked_prefill=True, max_num_batched_tokens=8),
        dict(kv_cache_dtype="fp8"),
    ],
    ids=["async", "multi-step", "chunked-prefill", "fp8-kv-cache"],
)
def test_tp2_runs_every_eager_runner_path(hf_model_dir, engine):
    """Asynchronous scheduling (inputs gathered on the device), multi-step decoding and
    chunked prefill reach the model through the same call: TP=2 gives TP=1's tokens. So does
    an FP8 KV cache: each rank's heads are quantized with their own scales, as at TP=1."""
    tokens1, _, _ = _generate(hf_model_dir, 1, **engine)
    tokens2, _, _ = _generate(hf_model_dir, 2, **engine)
    assert tokens2 == tokens1


def test_a_rank_holds_its_heads_kv_heads_and_ffn_slice():
    """The cheap check of the split (the fast tier): shard shapes and which rows/columns each
    rank takes; the loader's slices put back together are the whole tensor."""
    from project04_llm_inference.model.llama import LlamaConfig

    cfg = LlamaConfig.from_hf(DUMMY_SHAPES["tiny"])
    local = shard_config(cfg, 2)
    assert (local.num_attention_heads, local.num_key_value_heads) == (2, 1)
    assert local.intermediate_size == 96 and local.vocab_size == cfg.vocab_size
    w = torch.arange(8 * 6, dtype=torch.float32).view(8, 6)
    ranks = [TensorParallel(rank=r, size=2) for r in range(2)]
    q = [_shard("model.layers.0.self_attn.q_proj.weight", w, tp) for tp in ranks]
    o = [_shard("model.layers.0.self_attn.o_proj.weight", w, tp) for tp in ranks]
    norm = _shard("model.layers.0.input_layernorm.weight", w[0], ranks[1])
    assert torch.equal(torch.cat(q, 0), w) and q[0].shape == (4, 6)  # column-parallel: rows
    assert torch.equal(torch.cat(o, 1), w) and o[1].shape == (8, 3)  # row-parallel: columns
    assert torch.equal(norm, w[0])


@pytest.mark.parametrize(
    ("size", "device", "words"),
    [
        (4, "cpu", "larger than the model's 2 KV heads"),
        (3, "cpu", "does not divide the 2 KV heads"),
        (3, "cpu", "does not divide the 4 attention heads"),
    ],
)
def test_bad_tensor_parallel_sizes_are_refused_in_one_line(size, device, words):
    with pytest.raises(ValueError, match=words) as e:
        check_tensor_parallel(DUMMY_SHAPES["tiny"], size, device)
    assert "\n" not in str(e.value)
    assert str(e.value).startswith(f"EngineArgs.tensor_parallel_size {size}:")


def test_an_ffn_that_tp_does_not_divide_is_refused():
    shape = dict(DUMMY_SHAPES["tiny"], intermediate_size=190, num_key_value_heads=4)
    with pytest.raises(ValueError, match="does not divide the FFN width 190"):
        check_tensor_parallel(shape, 4, "cpu")
    check_tensor_parallel(dict(shape, intermediate_size=192), 4, "cpu")  # and this one fits


@pytest.mark.skipif(torch.cuda.device_count() >= 8, reason="needs fewer than 8 GPUs visible")
def test_more_ranks_than_gpus_is_refused_on_cuda():
    shape = dict(DUMMY_SHAPES["tiny"], num_key_value_heads=8, num_attention_heads=8)
    with pytest.raises(ValueError, match=r"CUDA GPU\(s\), one per rank is needed"):
        check_tensor_parallel(shape, 8, "cuda")


@pytest.mark.parametrize("bad", [0, -1, 65, True, 2.0])
def test_engine_args_refuse_a_bad_tensor_parallel_size(bad):
    with pytest.raises(ValueError, match="tensor_parallel_size must be in"):
        EngineArgs(load_format="dummy", dummy_shape="tiny", tensor_parallel_size=bad)


def test_tensor_parallel_with_speculation_is_refused():
    with pytest.raises(ValueError, match="does not combine with speculative"):
        EngineArgs(load_format="dummy", speculative_method="ngram", tensor_parallel_size=2)


@pytest.mark.slow
def test_a_failing_worker_is_reported_and_leaves_no_process(tmp_path):
    """A rank that cannot load (here: the folder has no weights) fails the engine's start in
    one error naming the rank, and every started process is gone afterwards."""
    import json

    (tmp_path / "config.json").write_text(json.dumps(DUMMY_SHAPES["tiny"]))
    before = set(_children())
    with pytest.raises((FileNotFoundError, RuntimeError)):
        LLM(str(tmp_path), device="cpu", num_gpu_blocks=8, tensor_parallel_size=2)
    assert not torch.distributed.is_initialized()
    assert set(_children()) <= before


def _children() -> list[int]:
    """This process's live child processes (Linux /proc)."""
    me, out = os.getpid(), []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me and fields[0] != "Z":
                out.append(int(p))
    return out


_KILLED_ENGINE = """
import os, signal, sys
from project04_llm_inference import LLM
llm = LLM(load_format="dummy", dummy_shape="tiny", device="cpu", num_gpu_blocks=8,
          tensor_parallel_size=2)
print(llm.engine.runner.model.workers[0].pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # no cleanup of any kind runs
"""


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.slow
def test_a_killed_engine_leaves_no_worker_behind():
    """kill -9 of the engine's process: its worker notices its parent is gone and exits."""
    import subprocess
    import sys
    import time

    out = subprocess.run(
        [sys.executable, "-c", _KILLED_ENGINE],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 15  # the worker polls its parent every PARENT_POLL_S
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _gone(pid)
