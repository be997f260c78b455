"""Per-token work stays bounded: the step log keeps a fixed number of records, running outputs
show logprobs through an O(1) view instead of a copy, and stop strings are searched in the new
text's tail only (the cut is the one a search of the whole text gives)."""

from __future__ import annotations

import random

import pytest

from project04_llm_inference import LLM, SamplingParams
from project04_llm_inference.engine.outputs import PrefixView, StepLog, StepRecord
from project04_llm_inference.engine.sequence import Sequence
from project04_llm_inference.engine.stops import StopChecker


def _rec(i: int) -> StepRecord:
    return StepRecord(prefill_tokens=i, decode_seqs=0, duration_s=0.0)


def test_step_log_is_bounded_and_indexed_by_step_number():
    log = StepLog(maxlen=4)
    for i in range(10):
        log.append(_rec(i))
    assert len(log) == 10 and len(list(log)) == 4  # every step counted, 4 kept
    assert [r.prefill_tokens for r in log[7:]] == [7, 8, 9]
    assert [r.prefill_tokens for r in log[0:]] == [6, 7, 8, 9]  # older ones are gone
    assert [r.prefill_tokens for r in log[5::2]] == [7, 9]
    assert log[-1].prefill_tokens == 9 and log[6].prefill_tokens == 6
    with pytest.raises(IndexError):
        log[5]


def test_prefix_view_does_not_move_when_the_list_grows():
    items = [0.5, 1.5]
    view = PrefixView(items, 2)
    items.extend([2.5, 3.5])
    assert len(view) == 2 and list(view) == [0.5, 1.5] and view[-1] == 1.5
    assert view[-1:] == [1.5] and view == [0.5, 1.5] and view != [0.5, 1.5, 2.5]
    with pytest.raises(IndexError):
        view[2]


def test_running_outputs_carry_a_view_of_the_logprobs_not_a_copy():
    llm = LLM(load_format="dummy", dummy_shape="tiny", device="cpu", max_model_len=128)
    eng = llm.engine
    eng.add_request("a", [5, 6, 7], SamplingParams(max_tokens=12, temperature=0, logprobs=True))
    seen = []
    while eng.has_unfinished():
        seen += eng.step()
    running, final = seen[:-1], seen[-1]
    assert running and all(isinstance(o.logprobs, PrefixView) for o in running)
    assert isinstance(final.logprobs, list) and len(final.logprobs) == 12
    for o in running:  # each view still shows what it showed when its step returned
        assert list(o.logprobs) == final.logprobs[: len(o.logprobs)]
        assert (
            o.new_logprobs
            == final.logprobs[len(o.logprobs) - len(o.new_token_ids) : len(o.logprobs)]
        )


class _CountingTokenizer:
    """Token i decodes to the word "w<i> "; counts the tokens every decode is given."""

    def __init__(self):
        self.tokens_decoded = []

    def decode(self, ids, skip_special_tokens=True):
        self.tokens_decoded.append(len(ids))
        return "".join(f"w{i} " for i in ids)


def _seq(stop: list[str], max_tokens: int = 10_000) -> Sequence:
    return Sequence("r", [1], SamplingParams(max_tokens=max_tokens, stop=stop))


@pytest.mark.parametrize("seed", range(4))
def test_stop_string_cut_equals_a_search_of_the_whole_text(seed):
    rng = random.Random(seed)
    ids = [rng.randrange(3, 40) for _ in range(300)]
    full = "".join(f"w{i} " for i in ids)
    # stop strings taken from the text at random places, spanning token boundaries
    starts = sorted(rng.sample(range(100, len(full) - 12), 3))
    stops = [full[a : a + rng.randrange(2, 12)] for a in starts] + ["absent"]
    want = full[: min(full.find(s) for s in stops if s in full)]
    tok = _CountingTokenizer()
    checker = StopChecker(tok, set(), max_model_len=10_000)
    seq = _seq(stops)
    for t in ids:
        seq.output_token_ids.append(t)
        checker.check(seq)
        if seq.finish_reason is not None:
            break
    assert seq.finish_reason == "stop" and seq.output_text == want


def test_stop_string_work_per_token_is_bounded():
    """5,000 tokens: every decode call sees at most 2 tokens (the last complete one and the new
    one), so the work per token does not grow with the output."""
    tok = _CountingTokenizer()
    checker = StopChecker(tok, set(), max_model_len=100_000)
    seq = _seq(["never here"])
    for i in range(5000):
        seq.output_token_ids.append(3 + i % 30)
        checker.check(seq)
    assert seq.finish_reason is None and max(tok.tokens_decoded) <= 2
