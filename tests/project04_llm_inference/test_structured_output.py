"""Structured output in the engine: random weights (whatever the model prefers, the grammar's mask
must hold), a byte-level BPE tokenizer trained in the test. Every constrained output parses and
validates, in batches that mix constrained and free requests; free requests get the same tokens
with asynchronous scheduling as with a synchronous engine."""

from __future__ import annotations

import json
import re
import sys

import pytest

pytest.importorskip("tokenizers")
pytest.importorskip("xgrammar", reason="structured output needs the 'structured' extra (xgrammar)")
jsonschema = pytest.importorskip("jsonschema")

from project04_llm_inference import LLM, SamplingParams  # noqa: E402
from project04_llm_inference import StructuredOutputsParams as SO  # noqa: E402

# finite schemas, a regex (under any weights the output ends): the validity bench's
from project04_llm_inference.bench.structured_validity import REGEX, SCHEMAS  # noqa: E402

from .conftest import write_bpe_model_dir  # noqa: E402

EBNF = 'root ::= "(" item ("," item)* ")"\nitem ::= [0-9] | "x"'


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("bpe-tiny")
    write_bpe_model_dir(d)
    return d


@pytest.fixture(scope="module")
def llm(model_dir, one_thread):
    return LLM(model=str(model_dir), load_format="dummy", device="cpu", max_model_len=512)


def _mixed_batch():
    """Constrained requests (each schema greedy and sampled, a regex, an EBNF grammar, a choice)
    interleaved with free ones."""
    params, checks = [], []
    for i, schema in enumerate(SCHEMAS):
        for temp in (0.0, 1.0):
            params.append(
                SamplingParams(
                    max_tokens=200, temperature=temp, seed=i, structured_outputs=SO(json=schema)
                )
            )
            checks.append(("json", schema))
            params.append(SamplingParams(max_tokens=12, temperature=1.0, seed=100 + i))
            checks.append(("free", None))
    params.append(
        SamplingParams(max_tokens=40, temperature=1.0, seed=7, structured_outputs=SO(regex=REGEX))
    )
    checks.append(("regex", REGEX))
    params.append(
        SamplingParams(max_tokens=80, temperature=1.0, seed=8, structured_outputs=SO(grammar=EBNF))
    )
    checks.append(("ebnf", None))
    params.append(
        SamplingParams(
            max_tokens=20, temperature=1.0, seed=9, structured_outputs=SO(choice=["yes", "no"])
        )
    )
    checks.append(("choice", None))
    params.append(SamplingParams(max_tokens=12, temperature=0.0))
    checks.append(("free", None))
    return params, checks


def test_constrained_outputs_parse_and_validate(llm):
    params, checks = _mixed_batch()
    outs = llm.generate(["hello"] * len(params), params)
    for out, (kind, arg) in zip(outs, checks):
        if kind == "free":
            continue
        assert out.finish_reason == "stop", (kind, out.text)  # the grammar ended, then EOS
        if kind == "json":
            jsonschema.validate(json.loads(out.text), arg)
        elif kind == "regex":
            assert re.fullmatch(arg, out.text), out.text
        elif kind == "ebnf":
            assert re.fullmatch(r"\([0-9x](,[0-9x])*\)", out.text), out.text
        else:
            assert out.text in ("yes", "no")


def test_json_object_is_an_object(llm):
    p = [
        SamplingParams(
            max_tokens=300, temperature=1.0, seed=s, structured_outputs=SO(json_object=True)
        )
        for s in range(4)
    ]
    ended = 0
    for out in llm.generate(["{"] * 4, p):
        if out.finish_reason == "stop":  # an unbounded grammar may reach max_tokens
            assert isinstance(json.loads(out.text), dict), out.text
            ended += 1
    assert ended >= 1  # some did end (else this test checks nothing)


def test_async_scheduling_keeps_free_tokens(model_dir, llm):
    """A mixed batch on the default (asynchronous) engine and on a synchronous one: the same
    tokens for every request, free and constrained."""
    params, _ = _mixed_batch()
    prompts = ["hello"] * len(params)
    sync = LLM(
        model=str(model_dir),
        load_format="dummy",
        device="cpu",
        max_model_len=512,
        async_scheduling=False,
    )
    assert llm.engine.args.async_scheduling
    a = llm.generate(prompts, params)
    b = sync.generate(prompts, params)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]


def test_invalid_schema_names_the_field(llm):
    with pytest.raises(ValueError, match="structured_outputs: does not compile"):
        llm.generate(["hi"], SamplingParams(structured_outputs=SO(json={"type": "foo"})))
    with pytest.raises(ValueError, match="exactly one"):
        SO(regex="a", json={})
    # a dict is taken as the params' fields; anything else is refused
    assert SamplingParams(structured_outputs={"regex": "a"}).structured_outputs == SO(regex="a")
    with pytest.raises(TypeError, match="structured_outputs"):
        SamplingParams(structured_outputs="a")


def test_without_xgrammar_one_line(llm, monkeypatch):
    """Where xgrammar is not installed, asking for structured output says which extra to add."""
    from project04_llm_inference.engine import structured

    monkeypatch.setitem(sys.modules, "xgrammar", None)  # `import xgrammar` now fails
    g = structured.Grammars(llm.engine.tokenizer, llm.engine.vocab_size, {2})
    with pytest.raises(structured.GrammarError, match=r"\[structured\]"):
        g.compile(SO(regex="a"))


def test_speculation_skips_constrained_requests(model_dir, llm):
    """With n-gram speculation on, constrained requests get no drafts and are sampled under
    their grammar beside the speculated free ones: every request's tokens equal those of the
    engine without speculation (free requests greedy: speculation keeps greedy tokens; seeded
    constrained requests draw from their own generators either way)."""
    params, checks = _mixed_batch()
    params = [
        p if kind != "free" else SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
        for p, (kind, _) in zip(params, checks)
    ]
    prompts = ["hello hello hello"] * len(params)
    spec = LLM(
        model=str(model_dir),
        load_format="dummy",
        device="cpu",
        max_model_len=512,
        speculative_method="ngram",
        ngram_prompt_lookup_max=2,
    )
    got = spec.generate(prompts, params)
    ref = llm.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in ref]
    assert spec.engine.counters.spec_proposed > 0  # the free requests were speculated


@pytest.mark.parametrize(
    "extra",
    [
        dict(num_scheduler_steps=4),  # multi-step: a batch holding a constrained request steps once
        dict(num_gpu_blocks=16, block_size=16),  # preemption: the matcher keeps its tokens
    ],
    ids=["multi-step", "preemption"],
)
def test_other_modes_keep_the_grammar(model_dir, llm, extra):
    """Multi-step decoding and preemption (recompute) with constrained requests in the batch:
    every constrained output still validates and equals the plain engine's."""
    params, checks = _mixed_batch()
    params = [
        p if kind != "free" else SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
        for p, (kind, _) in zip(params, checks)
    ]
    prompts = ["hello there"] * len(params)
    other = LLM(model=str(model_dir), load_format="dummy", device="cpu", max_model_len=256, **extra)
    got = other.generate(prompts, params)
    ref = llm.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in ref]
    if "num_gpu_blocks" in extra:
        assert other.engine.scheduler.num_preemptions > 0
    for o, (kind, arg) in zip(got, checks):
        if kind == "json":
            jsonschema.validate(json.loads(o.text), arg)


def test_logprobs_are_the_models(llm):
    """A constrained request's logprobs are those of the model's distribution (before the
    mask), as for any request: its first token's logprob is at most that of the unconstrained
    argmax at the same position (renormalised over the few tokens a regex allows, it would
    mostly be far above). Same prompt, batch of one: the same logits bit for bit."""
    so = SO(regex="[a-z]+")
    kw = dict(max_tokens=1, temperature=0, logprobs=True)
    con = llm.generate(["hi"], SamplingParams(structured_outputs=so, **kw))[0]
    free = llm.generate(["hi"], SamplingParams(**kw))[0]
    assert con.token_ids != free.token_ids  # the mask changed the choice here
    assert con.logprobs[0] < free.logprobs[0]


def test_validity_check_names_each_failure():
    """The validity bench's judge: an output cut by the token budget, text that is not JSON, JSON
    outside its schema, a regex or choice miss each fail with the reason; a valid one passes."""
    from project04_llm_inference.bench.structured_validity import CHOICES, check

    obj = '{"name": "ab", "age": 3, "ok": true}'
    assert check("json", SCHEMAS[0], obj, "stop") is None
    assert "length" in check("json", SCHEMAS[0], obj, "length")
    assert "JSONDecodeError" in check("json", SCHEMAS[0], obj + "</s>", "stop")
    assert "ValidationError" in check("json", SCHEMAS[0], '{"name": "ab", "age": 300}', "stop")
    assert check("regex", REGEX, "abc-123", "stop") is None
    assert check("regex", REGEX, "abc-1", "stop") == "does not match the regex"
    assert check("choice", CHOICES, "perhaps", "stop") == "not one of the choices"
