"""`LLM.generate` leaves nothing behind: a call that raises (a refused prompt after good ones,
an error in a step, Ctrl-C) aborts every request it added, so the next call runs only its own."""

from __future__ import annotations

import pytest

from project04_llm_inference import LLM, SamplingParams

PARAMS = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(one_thread) -> LLM:
    return LLM(load_format="dummy", dummy_shape="tiny", device="cpu", num_gpu_blocks=32)


def _clean(llm: LLM) -> None:
    engine = llm.engine
    assert engine.requests == {} and not engine.has_unfinished()
    engine.block_manager.check_no_leaks([])


def test_a_refused_prompt_after_good_ones_leaves_no_request(llm):
    with pytest.raises(ValueError, match="prompt"):
        llm.generate([[1, 5, 6], [1, 7, 8], [1, 999]], PARAMS)
    _clean(llm)
    (out,) = llm.generate([[1, 5, 6]], PARAMS)  # runs alone: the earlier two are gone
    assert len(out.token_ids) == 3
    _clean(llm)


def test_an_interrupt_mid_generation_aborts_the_call_requests(llm, monkeypatch):
    step = llm.engine.step
    calls = []

    def interrupted():
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return step()

    monkeypatch.setattr(llm.engine, "step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        llm.generate([[1, 5, 6], [1, 7, 8]], SamplingParams(max_tokens=50, ignore_eos=True))
    monkeypatch.undo()
    _clean(llm)


def test_bad_params_types_are_refused_before_anything_runs(llm):
    with pytest.raises(TypeError, match="SamplingParams"):
        llm.generate([[1, 5, 6]], {"max_tokens": 3})
    _clean(llm)
