"""The engine's request API on the CPU path with the tiny dummy model: abort in every state and
under a random stress of add/step/abort over a small pool (no block ever leaks), per-request
streams, max_tokens / stop_token_ids / EOS / ignore_eos, stop strings with a real `tokenizers`
tokenizer, and input validation that names the offending field.

Token-level expectations are taken from a reference run of the same engine on the same prompt
alone (greedy), so they are exact: the same float32 computation, op for op, gives the same
tokens; no tolerance is involved.
"""

from __future__ import annotations

import json
import math
import random

import pytest

from project04_llm_inference import LLM, EngineArgs, SamplingParams
from project04_llm_inference.config import DUMMY_SHAPES
from project04_llm_inference.engine.sequence import Status

PROMPT = [17, 42, 99, 3, 250, 7, 61]


pytestmark = pytest.mark.usefixtures("one_thread")


def _tiny(**kw) -> LLM:
    kw.setdefault("max_model_len", 256)
    return LLM(load_format="dummy", dummy_shape="tiny", device="cpu", **kw)


def _vocab() -> dict[str, int]:
    words = ["<unk>", "<s>", "</s>"] + [f"t{i:03d}" for i in range(3, 256)]
    return {w: i for i, w in enumerate(words)}


def _write_model_dir(path, eos=2, tokenizer=True):
    """A model folder for `load_format="dummy"`: the tiny shape's config.json (same dummy
    weights as dummy_shape="tiny": they depend only on the shapes and the seed) and optionally a
    WordLevel tokenizer whose words are "t003".."t255" (fixed width: no word is inside another,
    so a word as a stop string matches exactly where that token was decoded)."""
    path.mkdir(parents=True, exist_ok=True)
    cfg = dict(DUMMY_SHAPES["tiny"], model_type="llama", eos_token_id=eos)
    (path / "config.json").write_text(json.dumps(cfg))
    if tokenizer:
        from tokenizers import Tokenizer, models, pre_tokenizers

        tok = Tokenizer(models.WordLevel(_vocab(), unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tok.add_special_tokens(["<unk>", "<s>", "</s>"])
        tok.save(str(path / "tokenizer.json"))
    return path


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    pytest.importorskip("tokenizers")
    return _write_model_dir(tmp_path_factory.mktemp("tiny-tok"))


def _run(llm: LLM, prompt, params: SamplingParams):
    """Run one request to the end; returns (final output, every output it got)."""
    eng = llm.engine
    eng.add_request("x", prompt, params)
    outs = []
    while eng.has_unfinished():
        outs += eng.step()
    eng.block_manager.check_no_leaks([])
    return outs[-1], outs


def _greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0, **kw)


def _first_new(tokens: list[int], lo: int = 0) -> int:
    """Index of the first token (from lo) that does not occur before it."""
    return next(j for j in range(lo, len(tokens)) if tokens[j] not in tokens[:j])


def _assert_all_free(eng) -> None:
    eng.block_manager.check_no_leaks([])
    assert eng.block_manager.num_free_blocks == eng.block_manager.num_blocks
    assert not eng.has_unfinished() and not eng.requests


# --- abort ---------------------------------------------------------------------------------------


def test_abort_while_waiting():
    eng = _tiny(num_gpu_blocks=16).engine
    seq = eng.add_request("w", PROMPT)
    assert eng.abort("w")
    assert seq.status is Status.FINISHED and seq.finish_reason == "abort"
    assert eng.step() == []
    _assert_all_free(eng)


def test_abort_mid_chunked_prefill():
    eng = _tiny(num_gpu_blocks=16, max_num_batched_tokens=16).engine
    seq = eng.add_request("long", list(range(3, 103)))  # 100 tokens: 7 steps of 16
    assert eng.step() == []  # a chunk computed, nothing sampled yet
    assert 0 < seq.num_computed_tokens < 100 and seq.block_ids
    assert eng.abort("long")
    assert seq.block_ids == []
    _assert_all_free(eng)
    assert eng.stats()["aborted"] == 1


def test_abort_while_decoding_leaves_the_others_running():
    eng = _tiny(num_gpu_blocks=16).engine
    a = eng.add_request("a", PROMPT, _greedy(30, ignore_eos=True))
    eng.add_request("b", PROMPT[:3], _greedy(5, ignore_eos=True))
    for _ in range(3):
        eng.step()
    # three steps queued for it; the last one's token is still in flight (async scheduling)
    assert len(a.output_token_ids) + a.num_pending == 3
    assert eng.abort("a")
    seen = []
    while eng.has_unfinished():
        seen += eng.step()
    assert {o.request_id for o in seen} == {"b"}, "an aborted request gets no more output"
    assert seen[-1].finished and len(seen[-1].token_ids) == 5
    _assert_all_free(eng)


def test_abort_unknown_or_finished_request_is_false():
    eng = _tiny(num_gpu_blocks=16).engine
    assert not eng.abort("nope")
    eng.add_request("x", PROMPT, _greedy(1))
    while eng.has_unfinished():
        eng.step()
    assert not eng.abort("x")  # finished already
    eng.add_request("x", PROMPT, _greedy(1))  # the id is free again once finished
    assert eng.abort("x") and not eng.abort("x")
    _assert_all_free(eng)


def test_random_add_step_abort_never_leaks():
    """A seeded random interleaving of add / step / abort over a pool too small for the load
    (preemptions), with chunked prefill, shared prefixes (prefix-cache hits) and mixed sampling
    parameters. After every operation the blocks' reference counts equal what the live
    requests hold; every finished stream equals its final tokens; at the end all is free."""
    rng = random.Random(0)
    llm = _tiny(num_gpu_blocks=10, max_num_batched_tokens=32, max_num_seqs=4)
    eng = llm.engine
    prefixes = [[rng.randrange(3, 256) for _ in range(rng.randint(16, 40))] for _ in range(3)]
    streams: dict[str, list[int]] = {}
    max_tokens: dict[str, int] = {}
    gone: set[str] = set()
    abort_states = {"waiting": 0, "prefill": 0, "decode": 0}
    finished = 0
    for i in range(300):
        op = rng.random()
        if op < 0.25:
            rid = f"r{i}"
            prompt = rng.choice(prefixes + [[]]) + [
                rng.randrange(3, 256) for _ in range(rng.randint(1, 50))
            ]
            p = SamplingParams(
                max_tokens=rng.randint(1, 40),
                temperature=rng.choice([0.0, 1.0]),
                seed=rng.choice([None, rng.randrange(1000)]),
                stop_token_ids=rng.choice([[], [rng.randrange(3, 256)]]),
                ignore_eos=rng.random() < 0.5,
                logprobs=rng.random() < 0.5,
            )
            eng.add_request(rid, prompt, p)
            streams[rid], max_tokens[rid] = [], p.max_tokens
        elif op < 0.85:
            for out in eng.step():
                assert out.request_id not in gone
                streams[out.request_id] += out.new_token_ids
                assert len(out.new_token_ids) == 1
                assert streams[out.request_id] == out.token_ids
                if out.logprobs is not None:
                    assert len(out.logprobs) == len(out.token_ids)
                if out.finished:
                    finished += 1
                    gone.add(out.request_id)
                    assert out.finish_reason in ("stop", "length")
                    assert len(out.token_ids) <= max_tokens[out.request_id]
        elif eng.requests:
            rid = rng.choice(sorted(eng.requests))
            seq = eng.requests[rid]
            if seq.status is Status.WAITING:
                abort_states["waiting"] += 1
            elif seq.num_computed_tokens < len(seq.prompt_token_ids):
                abort_states["prefill"] += 1
            else:
                abort_states["decode"] += 1
            assert eng.abort(rid)
            assert seq.block_ids == [] and seq.is_finished
            gone.add(rid)
        eng.block_manager.check_no_leaks(list(eng.requests.values()))
    assert finished > 10 and all(abort_states.values()), abort_states
    assert eng.stats()["num_preemptions"] > 0 and eng.stats()["prefix_cache_hits"] > 0
    for rid in list(eng.requests):
        assert eng.abort(rid)
    _assert_all_free(eng)


# --- streams and stopping ------------------------------------------------------------------------


def test_streams_concatenate_to_the_final_tokens():
    eng = _tiny(num_gpu_blocks=32, max_num_batched_tokens=16).engine
    lengths = {"a": 9, "b": 1, "c": 20}
    for rid, n in lengths.items():
        eng.add_request(
            rid, PROMPT * (1 + len(rid) * 3), SamplingParams(max_tokens=n, ignore_eos=True)
        )
    eng.add_request("lp", PROMPT, _greedy(6, ignore_eos=True, logprobs=True))
    streams: dict[str, list[int]] = {}
    final = {}
    while eng.has_unfinished():
        for out in eng.step():
            streams.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.finished:
                final[out.request_id] = out
    for rid, n in lengths.items():
        assert streams[rid] == final[rid].token_ids and len(streams[rid]) == n
        assert final[rid].finish_reason == "length" and final[rid].logprobs is None
    assert len(final["lp"].logprobs) == 6 and all(lp <= 0 for lp in final["lp"].logprobs)
    _assert_all_free(eng)


def test_max_tokens_and_max_model_len():
    out, outs = _run(_tiny(num_gpu_blocks=32), PROMPT, _greedy(7, ignore_eos=True))
    assert len(out.token_ids) == 7 and out.finish_reason == "length" and len(outs) == 7
    # a 250-token prompt with max_model_len 256 stops at 256 tokens, whatever max_tokens says
    out, _ = _run(_tiny(num_gpu_blocks=32), list(range(3, 253)), _greedy(100, ignore_eos=True))
    assert len(out.token_ids) == 6 and out.finish_reason == "length"


def test_stop_token_ids_keep_the_stop_token():
    ref, _ = _run(_tiny(num_gpu_blocks=16), PROMPT, _greedy(12, ignore_eos=True))
    j = _first_new(ref.token_ids, 1)
    stop = ref.token_ids[j]
    out, _ = _run(
        _tiny(num_gpu_blocks=16), PROMPT, _greedy(12, ignore_eos=True, stop_token_ids=[stop])
    )
    assert out.token_ids == ref.token_ids[: j + 1] and out.finish_reason == "stop"


def test_eos_stops_unless_ignore_eos(tmp_path):
    # the reference: ignore_eos, so the default EOS (2) cannot cut it short
    ref, _ = _run(_tiny(num_gpu_blocks=16), PROMPT, _greedy(12, ignore_eos=True))
    j = _first_new(ref.token_ids, 1)
    for eos in (ref.token_ids[j], [255, ref.token_ids[j]]):  # an int or a list in config.json
        d = _write_model_dir(tmp_path / f"eos-{isinstance(eos, list)}", eos=eos, tokenizer=False)
        llm = LLM(str(d), load_format="dummy", device="cpu", max_model_len=256)
        out, _ = _run(llm, PROMPT, _greedy(12))
        assert out.token_ids == ref.token_ids[: j + 1] and out.finish_reason == "stop"
        out, _ = _run(llm, PROMPT, _greedy(12, ignore_eos=True))
        assert out.token_ids == ref.token_ids and out.finish_reason == "length"


def _tok_llm(tok_dir) -> LLM:
    return LLM(str(tok_dir), load_format="dummy", device="cpu", max_model_len=256)


def test_text_prompt_is_tokenized(tok_dir):
    llm = _tok_llm(tok_dir)
    [out] = llm.generate("t017 t042 t099", _greedy(4, ignore_eos=True))
    assert out.prompt_token_ids == [17, 42, 99]
    words = {i: w for w, i in _vocab().items()}
    assert out.text == " ".join(words[t] for t in out.token_ids if t > 2)


def _expected_stop(llm: LLM, tokens: list[int], stops: list[str]):
    """Where a stop-string run must end: the first prefix of the reference tokens whose text
    contains a stop string, and that text cut before the earliest match."""
    tok = llm.engine.tokenizer
    for k in range(1, len(tokens) + 1):
        text = tok.decode(tokens[:k])
        hits = [text.find(s) for s in stops if s in text]
        if hits:
            return tokens[:k], text[: min(hits)]
    raise AssertionError("no stop string occurs in the reference output")


def test_stop_strings_cut_the_text_before_the_match(tok_dir):
    params = _greedy(12, ignore_eos=True)
    ref, _ = _run(_tok_llm(tok_dir), PROMPT, params)
    toks = ref.token_ids
    words = {i: w for w, i in _vocab().items()}
    j = next(k for k in range(2, len(toks)) if toks[k] > 2 and toks[k] not in toks[:k])
    cases = [
        [words[toks[j]]],  # a whole word, mid-output
        [words[toks[j]][2:] + " t"],  # spans the boundary after token j
        [words[toks[j]], words[toks[j]][:3]],  # two matches: the earliest wins
    ]
    if toks[0] > 2:
        cases.append([words[toks[0]]])  # matches at the very start: the text is empty
    for stops in cases:
        llm = _tok_llm(tok_dir)
        want_tokens, want_text = _expected_stop(llm, toks, stops)
        out, _ = _run(llm, PROMPT, _greedy(12, ignore_eos=True, stop=stops))
        assert out.finish_reason == "stop", stops
        assert out.token_ids == want_tokens, stops
        assert out.text == want_text, stops
        assert not any(s in out.text for s in stops)
    # no match: the whole text
    out, _ = _run(_tok_llm(tok_dir), PROMPT, _greedy(12, ignore_eos=True, stop=["zzz"]))
    assert out.finish_reason == "length" and out.text == ref.text and out.text


# --- bad inputs ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def eng():
    return _tiny(num_gpu_blocks=8).engine


@pytest.mark.parametrize(
    ("prompt", "field"),
    [
        ([], "prompt"),
        ([5, 256], "prompt"),  # the tiny vocabulary is 256
        ([5, -1], "prompt"),
        ([5, 7.0], "prompt"),
        ([5] * 256, "max_model_len"),  # 256 tokens leave no room
        ("some text", "tokenizer"),
    ],
)
def test_bad_prompt_is_refused(eng, prompt, field):
    with pytest.raises(ValueError, match=field):
        eng.add_request("bad", prompt)
    assert "bad" not in eng.requests and not eng.scheduler.waiting


def test_duplicate_request_id_and_stop_strings_without_tokenizer(eng):
    eng.add_request("dup", PROMPT)
    with pytest.raises(ValueError, match="request_id"):
        eng.add_request("dup", PROMPT)
    with pytest.raises(ValueError, match="stop"):
        eng.add_request("s", PROMPT, SamplingParams(stop=["x"]))
    assert list(eng.requests) == ["dup"]
    assert eng.abort("dup")
    _assert_all_free(eng)


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        (dict(temperature=math.nan), "temperature"),
        (dict(temperature=-0.5), "temperature"),
        (dict(temperature=math.inf), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-1), "top_k"),
        (dict(min_p=1.5), "min_p"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(stop_token_ids=[-3]), "stop_token_ids"),
        (dict(stop=[""]), "stop"),
    ],
)
def test_bad_sampling_params(kw, field):
    with pytest.raises(ValueError, match=f"SamplingParams.{field}"):
        SamplingParams(**kw)


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        (dict(block_size=24), "block_size"),
        (dict(block_size=0), "block_size"),
        (dict(max_model_len=0), "max_model_len"),
        (dict(max_num_seqs=0), "max_num_seqs"),
        (dict(max_num_batched_tokens=0), "max_num_batched_tokens"),
        (dict(num_gpu_blocks=0), "num_gpu_blocks"),
        (dict(gpu_memory_utilization=0.0), "gpu_memory_utilization"),
        (dict(cpu_kv_cache_gib=math.nan), "cpu_kv_cache_gib"),
        (dict(dummy_shape="nope"), "dummy_shape"),
        (
            dict(enable_chunked_prefill=False, max_num_batched_tokens=64, max_model_len=256),
            "max_num_batched_tokens",
        ),
    ],
)
def test_bad_engine_args(kw, field):
    kw = dict(load_format="dummy", dummy_shape="tiny", device="cpu") | kw
    with pytest.raises(ValueError, match=f"EngineArgs.{field}"):
        EngineArgs(**kw)


def test_engine_args_need_a_model_or_dummy():
    with pytest.raises(ValueError, match="EngineArgs.model"):
        EngineArgs()
