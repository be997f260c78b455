"""Greedy generation of the engine equals `transformers` generate, token for token, in float32
on the CPU: mixed prompt lengths in one batch, preemption forced by a small block pool, prefix-
cache hits, chunked prefill, and all of them at once.

Why exact equality can be asked for: both compute the same float32 function and differ only in
the order of operations, so their logits differ by ~1e-6 (relative rounding of a 2-layer model,
measured here as the teacher-forced check below states). A greedy token can then differ only
where the reference's top two logits are closer than that. Such a near-tie is allowed (and ends
the comparison of that sequence: the continuations legitimately diverge) only below TIE = 1e-4,
100x the op-order noise; anywhere else a different token is a bug.
"""

from __future__ import annotations

import random

import pytest
import torch

from project04_llm_inference import LLM, SamplingParams

TIE = 1e-4  # a top-2 logit gap below this is a tie in float32 (see the module docstring)
LOGIT_ATOL = (
    1e-4  # teacher-forced logits: op-order noise is ~1e-6 at these magnitudes (|logit| < 10)
)


def _prompts(n: int, lo: int, hi: int, seed: int = 0, prefix: list[int] | None = None):
    rng = random.Random(seed)
    return [
        (prefix or []) + [rng.randrange(3, 256) for _ in range(rng.randint(lo, hi))]
        for _ in range(n)
    ]


def _hf_greedy(hf_model, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """The reference's greedy tokens, and its logits at each generated position."""
    import copy

    # No end-of-sequence token, rather than min_new_tokens (which masks EOS out of the argmax):
    # the engine runs with ignore_eos, which keeps EOS a candidate and just does not stop on it.
    gen = copy.deepcopy(hf_model.generation_config)
    gen.eos_token_id = None
    out = hf_model.generate(
        torch.tensor([prompt]),
        generation_config=gen,
        max_new_tokens=n,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=0,
    )
    return out.sequences[0, len(prompt) :].tolist(), torch.cat(out.logits)


def _assert_same_greedy(hf_model, prompts, outputs, n: int) -> int:
    """Returns how many sequences matched to the end (the rest stopped at a legitimate tie)."""
    full = 0
    for prompt, out in zip(prompts, outputs):
        want, logits = _hf_greedy(hf_model, prompt, n)
        assert len(out.token_ids) == n
        for j, (a, b) in enumerate(zip(out.token_ids, want)):
            if a != b:
                top2 = logits[j].topk(2).values
                gap = float(top2[0] - top2[1])
                assert gap < TIE, (
                    f"token {j} of a {len(prompt)}-token prompt: {a} != {b} (gap {gap:.2e})"
                )
                break
        else:
            full += 1
    return full


def _llm(hf_model_dir, **kw) -> LLM:
    return LLM(str(hf_model_dir), device="cpu", dtype="float32", max_model_len=512, **kw)


def test_teacher_forced_logits_match(hf_model_dir, hf_model):
    """The engine's prefill logits over a whole prompt equal the reference's."""
    llm = _llm(hf_model_dir)
    eng = llm.engine
    prompt = _prompts(1, 60, 60, seed=7)[0]
    seq = eng.add_request("x", prompt, SamplingParams(max_tokens=1, temperature=0))
    from project04_llm_inference.engine.scheduler import ScheduledBatch  # noqa: F401

    batch = eng.scheduler.schedule()
    ids, meta, _ = eng.runner.prepare(batch.items)
    with torch.inference_mode():
        hidden = eng.runner.model(ids, meta, eng.runner.kv_caches)
        ours = eng.runner.model.compute_logits(hidden)
        ref = hf_model(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(ours, ref, rtol=0, atol=LOGIT_ATOL)
    eng.abort(seq.request_id)


def test_mixed_batch_matches_transformers(hf_model_dir, hf_model):
    prompts = _prompts(8, 1, 120, seed=1)
    outs = _llm(hf_model_dir).generate(
        prompts, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    )
    assert _assert_same_greedy(hf_model, prompts, outs, 24) >= 6


def test_preemption_by_recompute_matches(hf_model_dir, hf_model):
    # 12 blocks of 16 = 192 tokens for 6 sequences of up to ~100: they cannot all stay resident.
    prompts = _prompts(6, 30, 70, seed=2)
    llm = _llm(hf_model_dir, num_gpu_blocks=12, enable_prefix_caching=False)
    outs = llm.generate(prompts, SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))
    assert llm.engine.stats()["num_preemptions"] > 0
    assert _assert_same_greedy(hf_model, prompts, outs, 32) >= 4
    llm.engine.block_manager.check_no_leaks([])


def test_preempted_sequence_hitting_the_prefix_cache_matches(hf_model_dir, hf_model):
    # With caching on, a recomputed sequence finds its own earlier full blocks (prompt and
    # generated tokens) in the cache: what it then generates must not change.
    prompts = _prompts(6, 30, 70, seed=3)
    llm = _llm(hf_model_dir, num_gpu_blocks=14, enable_prefix_caching=True)
    outs = llm.generate(prompts, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
    stats = llm.engine.stats()
    assert stats["num_preemptions"] > 0 and stats["prefix_cache_hits"] > 0
    assert _assert_same_greedy(hf_model, prompts, outs, 40) >= 4
    llm.engine.block_manager.check_no_leaks([])


def test_shared_prefix_hits_the_cache_and_matches(hf_model_dir, hf_model):
    system = _prompts(1, 64, 64, seed=4)[0]  # 4 full blocks shared by every request
    prompts = _prompts(6, 5, 40, seed=5, prefix=system)
    llm = _llm(hf_model_dir)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    first = llm.generate(prompts[:1], params)
    rest = llm.generate(prompts[1:], params)
    assert first[0].num_cached_tokens == 0
    assert all(o.num_cached_tokens == 64 for o in rest)
    assert _assert_same_greedy(hf_model, prompts, first + rest, 8) >= 5


def test_chunked_prefill_mixed_with_decodes_matches(hf_model_dir, hf_model):
    # A 24-token step budget splits every long prompt over several steps, next to decodes.
    prompts = _prompts(5, 40, 150, seed=6)
    llm = _llm(hf_model_dir, max_num_batched_tokens=24)
    outs = llm.generate(prompts, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    log = llm.engine.step_log
    assert any(r.prefill_tokens and r.decode_seqs for r in log), "no step mixed prefill and decode"
    assert max(r.prefill_tokens + r.decode_seqs for r in log) <= 24
    assert _assert_same_greedy(hf_model, prompts, outs, 16) >= 4


@pytest.mark.slow
def test_everything_at_once_matches(hf_model_dir, hf_model):
    system = _prompts(1, 40, 40, seed=8)[0]
    prompts = _prompts(10, 5, 90, seed=9, prefix=system) + _prompts(6, 1, 60, seed=10)
    llm = _llm(hf_model_dir, num_gpu_blocks=20, max_num_batched_tokens=32, max_num_seqs=6)
    outs = llm.generate(prompts, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
    s = llm.engine.stats()
    assert s["num_preemptions"] > 0 and s["prefix_cache_hits"] > 0
    assert _assert_same_greedy(hf_model, prompts, outs, 20) >= 13
    llm.engine.block_manager.check_no_leaks([])
