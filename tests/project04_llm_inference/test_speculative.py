"""Speculative decoding is lossless: the engine with n-gram or draft-model speculation produces
exactly the non-speculative engine's greedy tokens, and at temperature > 0 exactly the target's
distribution; rejected drafts leave no trace (block counts, prefix cache, stop conditions).

Greedy: equality is asked for token for token. The speculative engine computes the same float32
logits in a different grouping (a multi-token query instead of single-token decodes), so the
two may differ only by op-order noise (~1e-6, see test_engine_vs_transformers); each test checks
that the reference's top-two logit gap is above TIE = 1e-4 at every generated position, so a
different token can only be a bug.

Sampling: chi-square tests at a critical value for p = 1e-6 (computed below from the chi-square
survival function; with fixed seeds the outcome is deterministic anyway), each with a control
showing that a wrong acceptance rule fails the same test.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from project04_llm_inference import LLM, EngineArgs, SamplingParams
from project04_llm_inference.spec import ngram, rejection, verifier

from .conftest import TINY

TIE = 1e-4
P_VALUE = 1e-6


pytestmark = pytest.mark.usefixtures("one_thread")


# --- chi-square ----------------------------------------------------------------------------------


def chi2_sf(x: float, dof: int) -> float:
    """P(X > x) for X ~ chi-square(dof): 1 - the regularised lower incomplete gamma function
    P(dof/2, x/2), from its power series (absolute error ~1e-15, far below the 1e-6 used)."""
    s, z = dof / 2, x / 2
    if z <= 0:
        return 1.0
    term = total = 1.0 / s
    n = 0
    while term > 1e-17 * total:
        n += 1
        term *= z / (s + n)
        total += term
    lower = math.exp(s * math.log(z) - z - math.lgamma(s)) * total
    return max(0.0, 1.0 - lower)


def chi2_isf(p: float, dof: int) -> float:
    lo, hi = 0.0, 10.0 * dof + 200.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if chi2_sf(mid, dof) > p else (lo, mid)
    return lo


def chi2_test(counts: dict, probs: dict, n: int) -> tuple[float, float]:
    """Pearson's statistic of observed counts against n * probs over the cells of `probs`
    (a dict cell -> probability summing to 1); cells expected below 5 are pooled into one so
    the chi-square approximation holds. Returns (statistic, critical value at P_VALUE)."""
    cells, pooled_e, pooled_o = [], 0.0, 0
    for cell, p in probs.items():
        e, o = n * p, counts.get(cell, 0)
        if e < 5:
            pooled_e, pooled_o = pooled_e + e, pooled_o + o
        else:
            cells.append((o, e))
    unknown = sum(v for c, v in counts.items() if c not in probs)
    assert unknown == 0, f"{unknown} draws outside the support"
    if pooled_e > 0:
        cells.append((pooled_o, pooled_e))
    stat = sum((o - e) ** 2 / e for o, e in cells)
    return stat, chi2_isf(P_VALUE, len(cells) - 1)


def test_chi2_critical_values():
    # tabulated: scipy.stats.chi2.isf(1e-6, dof) for dof 1 and 3 (as in test_sampler)
    assert chi2_isf(1e-6, 1) == pytest.approx(23.928, abs=1e-3)
    assert chi2_isf(1e-6, 3) == pytest.approx(30.665, abs=1e-3)
    # larger dof: the tail at the critical value, integrated from the density (Simpson)
    for dof in (7, 40, 63, 120):
        x0 = chi2_isf(1e-6, dof)
        h, n = 0.01, 40_000
        log_c = -(dof / 2) * math.log(2) - math.lgamma(dof / 2)
        pdf = [
            math.exp(log_c + (dof / 2 - 1) * math.log(x0 + i * h) - (x0 + i * h) / 2)
            for i in range(n + 1)
        ]
        tail = h / 3 * (pdf[0] + pdf[-1] + 4 * sum(pdf[1:-1:2]) + 2 * sum(pdf[2:-1:2]))
        assert tail == pytest.approx(1e-6, rel=1e-6), dof


# --- the acceptance rule alone, on random tables ---------------------------------------------------

V, K, N = 8, 2, 30_000


def _tables(seed: int):
    g = torch.Generator().manual_seed(seed)
    p = (torch.randn(K + 1, V, generator=g) * 1.2).softmax(-1)  # target, positions 1..K+1
    q = (torch.randn(K, V, generator=g) * 1.2).softmax(-1)  # draft, positions 1..K
    return p, q, g


def _run_rule(point_mass: bool, seed: int = 0):
    """N independent verifications against fixed tables (p does not depend on the prefix, so
    the emitted token at position i must follow p_i whatever happened before it)."""
    p, q, g = _tables(seed)
    if point_mass:  # an n-gram proposer: fixed tokens (here p's likeliest, so some pass)
        drafts = p[:K].argmax(-1)[None, :].expand(N, K).clone()
        q_arg = None
    else:
        drafts = torch.stack([torch.multinomial(q[i], N, True, generator=g) for i in range(K)], 1)
        q_arg = q.expand(N, K, V)
    res = rejection.verify(
        torch.zeros(N, K + 1, V),
        p.expand(N, K + 1, V),
        drafts,
        torch.full((N,), K),
        q_arg,
        torch.zeros(N, dtype=torch.bool),
        torch.rand(N, K, generator=g),
        torch.empty(N, V).exponential_(generator=g),
    )
    return p, q, drafts, res


def _position_counts(tokens: list[list[int]], pos: int) -> tuple[dict, int]:
    at = [t[pos] for t in tokens if len(t) > pos]
    return {v: at.count(v) for v in set(at)}, len(at)


@pytest.mark.parametrize("point_mass", [False, True], ids=["draft-q", "one-hot-q"])
def test_rule_emits_exactly_the_target_distribution(point_mass):
    """Token 1 (accepted draft or residual) ~ p_1; token 2, which exists only after an accepted
    first draft, ~ p_2; token 3, the bonus after two accepted drafts, ~ p_3."""
    p, _, _, res = _run_rule(point_mass)
    assert 0 < sum(a == K for a in res.num_accepted) < N  # every path taken
    for pos in range(K + 1):
        counts, n = _position_counts(res.tokens, pos)
        assert n > 1000
        stat, crit = chi2_test(counts, dict(enumerate(p[pos].tolist())), n)
        assert stat < crit, f"position {pos + 1}: chi2 {stat:.1f} >= {crit:.1f}"


def test_wrong_rules_fail_the_same_test():
    """The control: the same draws under rules with a planted bug are rejected by the test."""
    p, q, drafts, res = _run_rule(point_mass=False)
    p1 = dict(enumerate(p[0].tolist()))
    # always accept: the first token is the draft's
    first = drafts[:, 0].tolist()
    stat, crit = chi2_test({v: first.count(v) for v in set(first)}, p1, N)
    assert stat > crit
    # the residual forgotten (resample from p itself after a rejection)
    g = torch.Generator().manual_seed(1)
    accepted = torch.rand(N, generator=g) * q[0][drafts[:, 0]] < p[0][drafts[:, 0]]
    resampled = torch.multinomial(p[0], N, True, generator=g)
    first = torch.where(accepted, drafts[:, 0], resampled).tolist()
    stat, crit = chi2_test({v: first.count(v) for v in set(first)}, p1, N)
    assert stat > crit


def test_greedy_rule_accepts_the_argmax_prefix():
    logits = torch.tensor([[[0.0, 5, 1], [3, 0, 1], [0, 0, 9]]] * 3)  # argmax 1, 0, 2
    drafts = torch.tensor([[1, 0], [1, 2], [2, 0]])
    res = rejection.verify(
        logits,
        logits.softmax(-1),
        drafts,
        torch.tensor([2, 2, 1]),
        None,
        torch.ones(3, dtype=torch.bool),
        torch.zeros(3, 2),
        torch.ones(3, 3),
    )
    assert res.tokens == [[1, 0, 2], [1, 0], [1]] and res.num_accepted == [2, 1, 0]


def test_greedy_fast_path_equals_the_batched_rule():
    """verify_groups' all-greedy path (argmax read back, acceptance on the host) gives what the
    batched rule gives for greedy rows, on random logits and drafts of every length 0..K, with
    drafts built to match the argmax for a random prefix (so every acceptance count occurs)."""
    from types import SimpleNamespace

    from project04_llm_inference.spec.verifier import SpecGroup, _verify_greedy

    g = torch.Generator().manual_seed(0)
    k, v, b = 5, 11, 36
    logits = torch.randn(b * (k + 1), v, generator=g)
    am = logits.argmax(-1).view(b, k + 1)
    groups, drafts, nd = [], torch.zeros(b, k, dtype=torch.long), []
    for i in range(b):
        n = i % (k + 1)  # drafts this sequence proposed
        m = (i // (k + 1)) % (k + 1)  # drafts that match the argmax before the first miss
        d = [int(am[i, j]) if j < m else (int(am[i, j]) + 1) % v for j in range(n)]
        drafts[i, :n] = torch.tensor(d, dtype=torch.long)
        nd.append(n)
        seq = SimpleNamespace(spec_token_ids=d, params=SamplingParams(temperature=0))
        groups.append(SpecGroup(seq, i * (k + 1), None))
    got = _verify_greedy(logits, groups)
    view = logits.view(b, k + 1, v)
    want = rejection.verify(
        view,
        view.softmax(-1),
        drafts,
        torch.tensor(nd),
        None,
        torch.ones(b, dtype=torch.bool),
        torch.zeros(b, k),
        torch.ones(b, v),
    )
    assert got.tokens == want.tokens and got.num_accepted == want.num_accepted
    assert set(got.num_accepted) == set(range(k + 1))  # 0..k accepted all occur


# --- n-gram proposals ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tokens", "k", "lo", "hi", "want"),
    [
        ([1, 2, 3, 4, 1, 2], 3, 1, 3, [3, 4, 1]),  # the 2-gram "1 2" occurred at the start
        ([1, 2, 3, 9, 2, 3], 4, 1, 3, [9, 2, 3, 9]),  # copy runs on into the repeat itself
        ([5, 5, 5, 5], 4, 1, 3, [5, 5, 5, 5]),
        ([1, 2, 7, 1, 3, 7, 1], 2, 1, 2, [3, 7]),  # "7 1": the most recent occurrence wins
        ([1, 2, 3], 4, 1, 3, []),  # nothing repeats
        ([4, 1, 2, 3], 2, 2, 3, []),  # 1-grams not allowed by min 2
        ([7], 4, 1, 3, []),
    ],
)
def test_ngram_proposals(tokens, k, lo, hi, want):
    assert ngram.propose(tokens, k, lo, hi) == want


def _ngram_by_scan(tokens, k, lo, hi):
    """The definition, spelled out: each n from hi down to lo, every earlier window compared."""
    for n in range(min(hi, len(tokens) - 1), lo - 1, -1):
        suffix = tokens[len(tokens) - n :]
        starts = [s for s in range(len(tokens) - n) if tokens[s : s + n] == suffix]
        if starts:
            ext = list(tokens)
            for j in range(k):
                ext.append(ext[starts[-1] + n + j])  # an overlapping copy continues the pattern
            return ext[len(tokens) :]
    return []


def test_ngram_lookup_equals_the_definition_on_random_sequences():
    """The candidate-based lookup against the window-by-window scan, on short sequences over a
    small alphabet (many repeats, overlaps and ties between occurrences)."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(2000):
        length = int(torch.randint(1, 40, (1,), generator=gen))
        alphabet = int(torch.randint(2, 6, (1,), generator=gen))
        tokens = torch.randint(0, alphabet, (length,), generator=gen).tolist()
        k = int(torch.randint(1, 9, (1,), generator=gen))
        lo = int(torch.randint(1, 4, (1,), generator=gen))
        hi = lo + int(torch.randint(0, 4, (1,), generator=gen))
        assert ngram.propose(tokens, k, lo, hi) == _ngram_by_scan(tokens, k, lo, hi), (
            tokens,
            k,
            lo,
            hi,
        )


# --- the engine ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def other_model_dir(tmp_path_factory):
    """The target's shape and vocabulary, other random weights: a draft that is mostly wrong."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(1)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY)).float().eval()
    d = tmp_path_factory.mktemp("tiny-llama-other")
    model.save_pretrained(d, safe_serialization=True)
    return d


def _llm(model_dir, **kw) -> LLM:
    kw.setdefault("max_model_len", 512)
    return LLM(str(model_dir), device="cpu", dtype="float32", **kw)


def _prompts(n: int, seed: int) -> list[list[int]]:
    """Random prompts, most of them a repeated phrase (so n-gram lookup finds matches)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        phrase = [rng.randrange(3, 256) for _ in range(rng.randint(2, 12))]
        tail = [rng.randrange(3, 256) for _ in range(rng.randint(0, 6))]
        out.append(phrase * (1 if i % 4 == 0 else rng.randint(2, 5)) + tail)
    return out


def _no_leaks(llm: LLM) -> None:
    eng = llm.engine
    live = list(eng.requests.values())
    eng.block_manager.check_no_leaks(live)
    draft_bm = getattr(eng.proposer, "block_manager", None)
    if draft_bm is not None:
        draft_bm.check_no_leaks(eng.proposer.live())
        assert len(eng.proposer.live()) <= len(eng.scheduler.running)


def _min_gap(hf_model, prompt: list[int], out: list[int]) -> float:
    """The reference's smallest top-two logit gap over the generated positions."""
    with torch.no_grad():
        logits = hf_model(torch.tensor([prompt + out[:-1]])).logits[0, len(prompt) - 1 :]
    top2 = logits.topk(2, dim=-1).values
    return float((top2[:, 0] - top2[:, 1]).min())


@pytest.fixture(scope="module")
def greedy_reference(hf_model_dir, hf_model):
    prompts = _prompts(16, seed=0)
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    outs = [o.token_ids for o in _llm(hf_model_dir).generate(prompts, params)]
    gaps = [_min_gap(hf_model, p, o) for p, o in zip(prompts, outs)]
    assert min(gaps) > TIE, "a near-tie in the reference: equality could not be asked for"
    return prompts, params, outs


@pytest.mark.parametrize(
    "setup",
    [
        "ngram",
        "draft-same",
        "draft-other",
        "ngram-small-pool",
        "draft-small-pool",
        "draft-same-default-step",
        "draft-other-default-step",
        "draft-small-pool-default-step",
    ],
)
def test_greedy_speculation_is_identical(setup, greedy_reference, hf_model_dir, other_model_dir):
    """16 prompts, 40 tokens each, in one continuous batch; the small-pool variants add
    preemption, chunked prefill (32-token step budget) and prefix-cache hits (a preempted
    sequence finding the blocks it filled while speculating). A draft model's greedy steps run
    fused by default; the "-default-step" variants turn that off (spec_fused_greedy=False)."""
    prompts, params, want = greedy_reference
    kw = dict(num_speculative_tokens=4)
    if setup.endswith("-default-step"):
        setup = setup.removesuffix("-default-step")
        kw["spec_fused_greedy"] = False
    if setup.startswith("ngram"):
        kw |= dict(speculative_method="ngram", ngram_prompt_lookup_max=3)
    else:
        draft = other_model_dir if setup == "draft-other" else hf_model_dir
        kw |= dict(speculative_method="draft", speculative_model=str(draft))
    small = setup.endswith("small-pool")
    if small:
        kw |= dict(num_gpu_blocks=16, max_num_batched_tokens=32, max_num_seqs=8)
    llm = _llm(hf_model_dir, **kw)
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == want
    _no_leaks(llm)
    s = llm.engine.stats()
    assert s["spec_proposed_tokens"] > 0
    fused = llm.engine.fused
    assert (fused is not None) == (setup.startswith("draft") and "spec_fused_greedy" not in kw)
    if fused is not None:
        assert fused.runs > 0
    if small:
        assert s["num_preemptions"] > 0 and s["prefix_cache_hits"] > 0
    if setup == "ngram":
        assert s["spec_accepted_tokens"] > 0  # the repeated phrases are predicted
    if setup == "draft-same":  # the target drafting for itself: every draft is right
        assert s["spec_acceptance_rate"] == 1.0 and s["spec_mean_accepted_len"] > 3
    if setup == "draft-other":
        assert s["spec_acceptance_rate"] < 0.2  # mostly rejected, and still the same output


@pytest.mark.parametrize("pad_batch", [False, True], ids=["tokens", "tokens-and-batch"])
@pytest.mark.parametrize("setup", ["ngram", "draft-same", "draft-other", "draft-small-pool"])
def test_padded_multi_token_steps_give_the_same_tokens(
    setup, pad_batch, greedy_reference, hf_model_dir, other_model_dir
):
    """Verification and the draft's catch-up padded to a fixed number of tokens per sequence
    (what the GPU replays as CUDA graphs), run eagerly on the CPU: padding tokens write no
    cache slot and no real row sees them, so the output is the plain greedy output (float32:
    the reference's smallest top-two gap exceeds TIE, checked by the fixture). With pad_batch
    the batch is also padded to the graph sizes with padding sequences, as graph replay does."""
    prompts, params, want = greedy_reference
    kw = dict(num_speculative_tokens=4)
    if setup == "ngram":
        kw |= dict(speculative_method="ngram", ngram_prompt_lookup_max=3)
    else:
        draft = other_model_dir if setup == "draft-other" else hf_model_dir
        # the default step's padded verification and catch-up (the fused step pads its own)
        kw |= dict(
            speculative_method="draft", speculative_model=str(draft), spec_fused_greedy=False
        )
    if setup.endswith("small-pool"):
        kw |= dict(num_gpu_blocks=16, max_num_batched_tokens=32, max_num_seqs=8)
    llm = _llm(hf_model_dir, **kw)
    eng = llm.engine
    runners = [eng.runner] + ([eng.proposer.runner] if setup.startswith("draft") else [])
    calls = []
    for r, q in zip(runners, (5, 2)):
        r.enable_multi_token(q, 16, capture=False, pad_batch=pad_batch)  # all 16 prompts
        run_mt = r._run_multi_token

        def counted(items, _run=run_mt, _r=r):
            calls.append((_r, len(items)))
            return _run(items)

        r._run_multi_token = counted
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == want
    _no_leaks(llm)
    # the padded path ran for the target; for the draft when a whole run was accepted (its
    # catch-up is then 2 tokens: the last draft and the bonus token; else 1, a plain decode)
    assert any(c[0] is eng.runner for c in calls), "no padded verification ran"
    if setup in ("draft-same", "draft-small-pool"):
        assert any(c[0] is runners[1] for c in calls), "no padded draft catch-up ran"
    assert max(n for _, n in calls) <= 16
    if pad_batch and setup in ("ngram", "draft-small-pool"):
        # requests finish at different steps (n-gram), or the pool admits 8 at a time, so some
        # step ran fewer sequences than its padded width (with a draft of the target's quality
        # all 16 run to the end together: every width is exact)
        assert any(n not in (1, 2, 4, 8, 16) for _, n in calls)


def test_padded_steps_build_no_tensors_from_lists(greedy_reference, hf_model_dir):
    """A padded multi-token step (verification, a draft's catch-up) ships its logits rows with
    its plan: no `torch.tensor` from a list (a pinned allocation per step on a GPU) on that
    path."""
    prompts, params, want = greedy_reference
    llm = _llm(
        hf_model_dir,
        speculative_method="draft",
        speculative_model=str(hf_model_dir),
        num_speculative_tokens=3,
        spec_fused_greedy=False,  # the default step's padded path
    )
    eng = llm.engine
    runners = (eng.runner, eng.proposer.runner)
    inside, ran = [], []
    for r, q in zip(runners, (4, 2)):
        r.enable_multi_token(q, 8, capture=False, pad_batch=True)
        run_mt, tensor = r._run_multi_token, r._tensor

        def counted(items, _run=run_mt, _r=r):
            inside.append(True)
            ran.append(_r)
            try:
                return _run(items)
            finally:
                inside.pop()

        def no_lists(data, dtype, _tensor=tensor):
            assert not inside, "a tensor built from a list on the padded multi-token path"
            return _tensor(data, dtype)

        r._run_multi_token, r._tensor = counted, no_lists
    assert [o.token_ids for o in llm.generate(prompts[:4], params)] == want[:4]
    assert all(r in ran for r in runners)  # verification and a 2-token draft catch-up ran


@pytest.mark.parametrize("rounds", [1, 3])
@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("setup", ["draft-same", "draft-other", "draft-small-pool"])
def test_fused_greedy_steps_are_identical(
    setup, k, rounds, greedy_reference, hf_model_dir, other_model_dir
):
    """`spec_fused_greedy`: the draft's catch-up and steps, verification and acceptance as one
    device program (run eagerly here, padded to the graph widths as on a GPU) give the plain
    greedy tokens; steps it cannot take (a prompt's prefill, the draft's first catch-up, a
    queue, preemption) run the default way, and rejected drafts leak no block. With
    `spec_fused_rounds` the program runs several rounds, each formed on the device from the
    last one's acceptance: the same tokens."""
    prompts, params, want = greedy_reference
    draft = other_model_dir if setup == "draft-other" else hf_model_dir
    kw = dict(
        speculative_method="draft",
        speculative_model=str(draft),
        num_speculative_tokens=k,
        spec_fused_greedy=True,
        spec_fused_rounds=rounds,
    )
    if setup.endswith("small-pool"):
        kw |= dict(num_gpu_blocks=16, max_num_batched_tokens=32, max_num_seqs=8)
    llm = _llm(hf_model_dir, **kw)
    eng = llm.engine
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == want
    _no_leaks(llm)
    s = eng.stats()
    assert eng.fused.runs > 0 and s["spec_proposed_tokens"] > 0
    assert set(eng.fused.slabs) <= {1, 2, 4, 8, 16}
    if rounds > 1:  # programs of rounds ran, and only those widths
        assert eng.fused.round_runs > 0 and set(eng.fused.round_slabs) <= {1, 2, 4, 8, 16}
    else:
        assert eng.fused.round_runs == 0 and not eng.fused.round_slabs
    if setup == "draft-same":  # the target drafting for itself: every draft is right
        assert s["spec_acceptance_rate"] == 1.0
    if setup == "draft-other":
        assert s["spec_acceptance_rate"] < 0.3
    if setup.endswith("small-pool"):
        assert s["num_preemptions"] > 0


def test_fused_greedy_steps_match_the_default_drafts_one_at_a_time(hf_model_dir, other_model_dir):
    """One request, stepped: the fused engine emits the default engine's tokens at every step
    (same drafts accepted), and a sampled request in the batch sends the step the default way."""
    prompt = _prompts(1, seed=5)[0]
    params = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    runs = {}
    for fused in (False, True):
        llm = _llm(
            hf_model_dir,
            speculative_method="draft",
            speculative_model=str(other_model_dir),
            num_speculative_tokens=3,
            spec_fused_greedy=fused,
            spec_fused_rounds=1 if fused else None,  # the one-round step, step for step
        )
        eng = llm.engine
        eng.add_request("a", prompt, params)
        steps = []
        while eng.has_unfinished():
            steps += [tuple(o.new_token_ids) for o in eng.step()]
        runs[fused] = steps
        _no_leaks(llm)
    assert runs[True] == runs[False]
    assert eng.fused.runs >= len(runs[True]) - 3  # all but the prefill and first rounds
    sampled = SamplingParams(max_tokens=10, temperature=1.0, seed=3)
    before = eng.fused.runs
    eng.add_request("b", prompt, params)
    eng.add_request("c", prompt, sampled)
    while "c" in eng.requests:  # the sampled request runs: every step the default way
        eng.step()
    assert eng.fused.runs == before
    while eng.has_unfinished():  # then the greedy one alone: fused again
        eng.step()
    assert eng.fused.runs > before
    _no_leaks(llm)


def test_fused_rounds_default_to_rounds_with_the_fused_step_only(hf_model_dir):
    """spec_fused_rounds unset: DEFAULT_FUSED_ROUNDS with the fused draft step, 1 where there
    is no fused step (no speculation, n-gram, spec_fused_greedy=False); a value given wins."""
    from project04_llm_inference.config import DEFAULT_FUSED_ROUNDS

    m = str(hf_model_dir)
    draft = dict(speculative_method="draft", speculative_model=m)
    assert DEFAULT_FUSED_ROUNDS > 1
    assert EngineArgs(model=m, **draft).fused_rounds == DEFAULT_FUSED_ROUNDS
    assert EngineArgs(model=m, **draft, spec_fused_rounds=1).fused_rounds == 1
    assert EngineArgs(model=m, **draft, spec_fused_rounds=7).fused_rounds == 7
    assert EngineArgs(model=m, **draft, spec_fused_greedy=False).fused_rounds == 1
    assert EngineArgs(model=m, speculative_method="ngram").fused_rounds == 1
    assert EngineArgs(model=m).fused_rounds == 1
    llm = _llm(hf_model_dir, **draft)
    assert llm.engine.fused.rounds == DEFAULT_FUSED_ROUNDS


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(spec_fused_rounds=0), r"spec_fused_rounds must be in \[1, 64\]"),
        (dict(speculative_method="ngram", spec_fused_rounds=2), "needs the fused step"),
        (dict(speculative_method="draft", spec_fused_greedy=False, spec_fused_rounds=2), "fused"),
        (dict(spec_fused_rounds=65), r"spec_fused_rounds must be in \[1, 64\]"),
        (dict(spec_fused_rounds=True), r"spec_fused_rounds must be in \[1, 64\]"),
    ],
)
def test_fused_rounds_need_the_fused_step(kw, match, hf_model_dir):
    if kw.get("speculative_method") == "draft":
        kw = kw | dict(speculative_model=str(hf_model_dir))
    with pytest.raises(ValueError, match=match):
        EngineArgs(model=str(hf_model_dir), **kw)


def test_fused_greedy_needs_a_draft_model():
    with pytest.raises(ValueError, match="spec_fused_greedy"):
        EngineArgs(
            load_format="dummy",
            dummy_shape="tiny",
            speculative_method="ngram",
            spec_fused_greedy=True,
        )


@pytest.mark.parametrize(
    "method, flag, on",
    [
        ("draft", None, True),  # the default: on with a draft model
        ("draft", True, True),
        ("draft", False, False),
        ("ngram", None, False),  # nothing to fuse without a draft model
        ("ngram", False, False),
        ("none", None, False),
    ],
)
def test_fused_greedy_is_on_by_default_with_a_draft_model(method, flag, on, hf_model_dir):
    kw = dict(speculative_model=str(hf_model_dir)) if method == "draft" else {}
    args = EngineArgs(
        model=str(hf_model_dir), speculative_method=method, spec_fused_greedy=flag, **kw
    )
    assert args.fused_greedy is on


@pytest.mark.parametrize("rounds", [1, 3])
def test_stops_inside_an_accepted_run_cut_exactly(rounds, greedy_reference, hf_model_dir):
    """The target drafting for itself accepts every draft, so tokens arrive 5 at a time: a stop
    token, max_tokens and EOS in the middle of such a run end the output exactly there."""
    prompts, _, want = greedy_reference
    # token 0 comes from the prefill, then 5 a step (4 drafts + 1): tokens 1-5, 6-10, ...; a
    # stop token must be new (not earlier in the output) and neither first nor last of its step
    prompt, ref, j = next(
        (p, r, i)
        for p, r in zip(prompts, want)
        for i in range(6, len(r))
        if r[i] not in r[:i] and i % 5 in (2, 3, 4)
    )

    def run(params, **kw):
        llm = _llm(
            hf_model_dir,
            speculative_method="draft",
            speculative_model=str(hf_model_dir),
            spec_fused_rounds=rounds,  # 3: 15 tokens a step, the stop inside one of them
            **kw,
        )
        eng = llm.engine
        eng.add_request("x", prompt, params)
        outs = []
        while eng.has_unfinished():
            outs += eng.step()
            _no_leaks(llm)
        assert [t for o in outs for t in o.new_token_ids] == outs[-1].token_ids
        assert max(len(o.new_token_ids) for o in outs) > 1, "no multi-token step"
        run.round_runs = eng.fused.round_runs
        return outs[-1], outs

    out, outs = run(SamplingParams(max_tokens=40, temperature=0, stop_token_ids=[ref[j]]))
    assert out.token_ids == ref[: j + 1] and out.finish_reason == "stop"
    assert len(outs[-1].new_token_ids) > 1  # the stop came inside a multi-token step
    assert (run.round_runs > 0) == (rounds > 1)  # and inside a program of rounds
    out, _ = run(SamplingParams(max_tokens=j + 1, temperature=0, ignore_eos=True))
    assert out.token_ids == ref[: j + 1] and out.finish_reason == "length"
    out, _ = run(SamplingParams(max_tokens=40, temperature=0, logprobs=True, ignore_eos=True))
    assert out.token_ids == ref and len(out.logprobs) == 40
    # max_model_len cuts a run too
    limit = len(prompt) + j + 1
    out, _ = run(SamplingParams(max_tokens=40, temperature=0, ignore_eos=True), max_model_len=limit)
    assert out.token_ids == ref[: j + 1] and out.finish_reason == "length"


def test_random_add_step_abort_never_leaks_with_speculation(hf_model_dir, other_model_dir):
    """Random add / step / abort over a small pool (preemptions, prefix hits) with both
    proposers and mixed sampling; after every operation both pools' reference counts equal
    what the live requests hold, and every cached block holds accepted tokens only (its
    registered tokens are its sequence's tokens, within the computed length)."""
    legs = (("ngram", None, 1), ("draft", other_model_dir, 1), ("draft", other_model_dir, 3))
    for method, draft, rounds in legs:
        rng = random.Random(0)
        llm = _llm(
            hf_model_dir,
            speculative_method=method,
            speculative_model=draft and str(draft),
            spec_fused_rounds=rounds,
            num_gpu_blocks=10,
            max_num_batched_tokens=40,
            max_num_seqs=5,
        )
        eng, bm = llm.engine, llm.engine.block_manager
        register = bm.register_computed

        def checked_register(seq, register=register, bm=bm):
            assert seq.num_computed_tokens <= seq.num_tokens, "drafts counted as computed"
            register(seq)
            for i in range(seq.num_hashed_blocks):
                b = seq.block_ids[i]
                chunk = tuple(seq.all_token_ids[i * bm.block_size : (i + 1) * bm.block_size])
                assert bm.block_tokens[b] in (None, chunk)

        bm.register_computed = checked_register
        phrases = [[rng.randrange(3, 256) for _ in range(rng.randint(2, 6))] for _ in range(4)]
        for i in range(150):
            op = rng.random()
            if op < 0.25:
                prompt = rng.choice(phrases) * rng.randint(2, 8) + [rng.randrange(3, 256)]
                eng.add_request(
                    f"r{i}",
                    prompt,
                    SamplingParams(
                        max_tokens=rng.randint(1, 30),
                        temperature=rng.choice([0.0, 1.0]),
                        seed=rng.choice([None, 7]),
                        ignore_eos=True,
                    ),
                )
            elif op < 0.85:
                for out in eng.step():
                    assert len(out.token_ids) <= 30
            elif eng.requests:
                assert eng.abort(rng.choice(sorted(eng.requests)))
            _no_leaks(llm)
        assert eng.stats()["spec_proposed_tokens"] > 0 and eng.stats()["num_preemptions"] > 0
        for rid in list(eng.requests):
            eng.abort(rid)
        _no_leaks(llm)
        assert bm.num_free_blocks == bm.num_blocks
        if method == "draft":
            assert eng.proposer.block_manager.num_free_blocks == bm.num_blocks


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_seeded_sampling_is_reproducible_alone_or_in_a_batch(method, hf_model_dir, other_model_dir):
    kw = dict(speculative_method=method)
    if method == "draft":
        kw["speculative_model"] = str(hf_model_dir)
    prompt = [17, 42, 99, 17, 42, 99, 17, 42]
    p = SamplingParams(max_tokens=24, temperature=1.0, seed=1234, ignore_eos=True)

    def tokens(crowd: bool, params=p) -> list[int]:
        llm = _llm(hf_model_dir, **kw)
        prompts, ps = [prompt], [params]
        if crowd:
            prompts = [[5, 6, 7] * 9, prompt, [9] * 40]
            ps = [
                SamplingParams(max_tokens=20, ignore_eos=True),
                params,
                SamplingParams(max_tokens=12, temperature=0, ignore_eos=True),
            ]
        outs = llm.generate(prompts, ps)
        if params is p:
            assert llm.engine.stats()["spec_proposed_tokens"] > 0
        return outs[prompts.index(prompt)].token_ids

    alone = tokens(False)
    assert tokens(True) == alone
    other = tokens(
        False, SamplingParams(max_tokens=24, temperature=1.0, seed=4321, ignore_eos=True)
    )
    assert other != alone and len(set(alone)) > 1


# --- the engine's distribution at temperature > 0 ------------------------------------------------

V8 = dict(
    TINY,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    vocab_size=8,
    max_position_embeddings=64,
    initializer_range=0.3,
    bos_token_id=0,
    eos_token_id=1,
)
PROMPT8 = list(range(8)) * 2  # every token occurs: n-gram lookup always proposes
REQUESTS = 3000


@pytest.fixture(scope="module")
def vocab8(tmp_path_factory):
    """Target and draft with an 8-token vocabulary (different random weights), and the
    target's exact distributions of tokens 1..3 (transformers, float32)."""
    transformers = pytest.importorskip("transformers")
    dirs, models = [], []
    for seed in (0, 1):
        torch.manual_seed(seed)
        m = transformers.LlamaForCausalLM(transformers.LlamaConfig(**V8)).float().eval()
        d = tmp_path_factory.mktemp(f"vocab8-{seed}")
        m.save_pretrained(d, safe_serialization=True)
        dirs.append(d)
        models.append(m)
    return dirs[0], dirs[1], models[0]


def _joint(model, params: SamplingParams) -> dict[tuple[int, ...], float]:
    """P(t1, t2, t3) of the target under params' temperature and top-k (all prefixes at once)."""
    from project04_llm_inference.engine.sampler import request_probs

    def probs(prefixes):
        with torch.no_grad():
            logits = model(torch.tensor([PROMPT8 + list(x) for x in prefixes])).logits[:, -1]
        return request_probs(logits.float(), [params] * len(prefixes))

    p1 = probs([()])[0]
    pairs = [(a,) for a in range(8)]
    p2 = probs(pairs)
    triples = [(a, b) for a in range(8) for b in range(8)]
    p3 = probs(triples)
    return {
        (a, b, c): float(p1[a] * p2[a, b] * p3[a * 8 + b, c])
        for a in range(8)
        for b in range(8)
        for c in range(8)
    }


@pytest.mark.parametrize(
    ("method", "temperature", "top_k"),
    [("ngram", 1.0, 0), ("draft", 1.0, 0), ("draft", 0.8, 5)],
)
def test_sampled_tokens_follow_the_target_distribution(vocab8, method, temperature, top_k):
    """3,000 requests of one prompt, 3 tokens each, k = 2 drafts: token 1 comes from the
    prefill, tokens 2 and 3 from verification (token 3 in the same step when token 2 was an
    accepted draft). The joint of the three against the target's exact joint (512 cells,
    those expected below 5 pooled), at p = 1e-6."""
    target, draft, model = vocab8
    kw = dict(speculative_method=method, num_speculative_tokens=2)
    if method == "draft":
        kw["speculative_model"] = str(draft)
    params = SamplingParams(max_tokens=4, temperature=temperature, top_k=top_k, ignore_eos=True)
    llm = LLM(str(target), device="cpu", dtype="float32", max_model_len=64, max_num_seqs=4096, **kw)
    outs = llm.generate([PROMPT8] * REQUESTS, params)
    s = llm.engine.stats()
    assert s["spec_verifications"] >= REQUESTS and 0 < s["spec_acceptance_rate"] < 1
    counts: dict[tuple[int, ...], int] = {}
    for o in outs:
        key = tuple(o.token_ids[:3])
        counts[key] = counts.get(key, 0) + 1
    stat, crit = chi2_test(counts, _joint(model, params), REQUESTS)
    assert stat < crit, f"chi2 {stat:.1f} >= {crit:.1f}"


def test_engine_with_an_always_accept_rule_fails_the_same_test(vocab8, monkeypatch):
    """The control at the engine level: uniforms of 0 accept every draft the target gives any
    probability; the joint is then visibly the draft's, not the target's."""
    target, draft, model = vocab8
    monkeypatch.setattr(verifier, "draw_uniforms", lambda n, width, *a, **k: torch.zeros(n, width))
    params = SamplingParams(max_tokens=4, temperature=1.0, ignore_eos=True)
    llm = LLM(
        str(target),
        device="cpu",
        dtype="float32",
        max_model_len=64,
        max_num_seqs=4096,
        speculative_method="draft",
        speculative_model=str(draft),
        num_speculative_tokens=2,
    )
    outs = llm.generate([PROMPT8] * REQUESTS, params)
    counts: dict[tuple[int, ...], int] = {}
    for o in outs:
        key = tuple(o.token_ids[:3])
        counts[key] = counts.get(key, 0) + 1
    stat, crit = chi2_test(counts, _joint(model, params), REQUESTS)
    assert stat > crit


# --- configuration -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        (dict(speculative_method="beam"), "speculative_method"),
        (dict(speculative_method="ngram", num_speculative_tokens=0), "num_speculative_tokens"),
        (dict(speculative_method="draft"), "speculative_model"),
        (dict(speculative_method="ngram", speculative_model="x"), "speculative_model"),
        (dict(ngram_prompt_lookup_min=0), "ngram_prompt_lookup_min"),
        (dict(ngram_prompt_lookup_min=3, ngram_prompt_lookup_max=2), "ngram_prompt_lookup_max"),
    ],
)
def test_bad_speculative_args(kw, field):
    kw = dict(load_format="dummy", dummy_shape="tiny", device="cpu") | kw
    with pytest.raises(ValueError, match=f"EngineArgs.{field}"):
        EngineArgs(**kw)


def test_draft_with_another_vocabulary_is_refused(vocab8, hf_model_dir):
    with pytest.raises(ValueError, match="speculative_model.*vocabulary"):
        _llm(hf_model_dir, speculative_method="draft", speculative_model=str(vocab8[1]))


# --- a trained target and draft ------------------------------------------------------------------


def test_train_corpus_smoke_and_serve(tmp_path):
    """A few optimizer steps on a dozen standard-library files, both models exported with the
    tokenizer; the engine serves the target with the draft, and greedy text is unchanged."""
    pytest.importorskip("tokenizers")
    from project04_llm_inference.spec.train_corpus import TrainCorpusConfig, run

    from .conftest import TINY_CORPUS_PAIR

    cfg = TrainCorpusConfig(
        models_dir=str(tmp_path / "models"),
        **TINY_CORPUS_PAIR,
        max_steps=3,
    )
    record = run(cfg)
    assert set(record["models"]) == {"target", "draft"}
    assert all(math.isfinite(m["heldout_loss"]) for m in record["models"].values())
    target, draft = (tmp_path / "models" / n for n in ("target", "draft"))
    assert (target / "tokenizer.json").is_file() and (draft / "config.json").is_file()
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    kw = dict(device="cpu", dtype="float32", max_model_len=128)
    plain = LLM(str(target), **kw).generate("def main():\n", params)[0]
    spec = LLM(str(target), speculative_method="draft", speculative_model=str(draft), **kw)
    out = spec.generate("def main():\n", params)[0]
    # a model 3 steps from its random init has flat logits: the two runs may part only at a
    # near-tie (top-two gap < TIE) of the model's own logits, found with shared's import
    from shared.hf_export import import_hf

    ids = plain.prompt_token_ids + plain.token_ids
    with torch.no_grad():
        logits = import_hf(target)(torch.tensor([ids[:-1]]))[0, len(plain.prompt_token_ids) - 1 :]
    for j, (a, b) in enumerate(zip(out.token_ids, plain.token_ids)):
        if a != b:
            top2 = logits[j].topk(2).values
            assert float(top2[0] - top2[1]) < TIE, f"token {j}: {a} != {b}"
            break
    else:
        assert out.text == plain.text
    assert spec.engine.stats()["spec_proposed_tokens"] > 0


def test_distill_loss_is_cross_entropy_and_kl_weighted():
    """weight 0: the cross-entropy exactly; weight 1: KL(teacher || student), zero when the
    student is the teacher; in between the weighted sum; the teacher gets no gradient."""
    from project04_llm_inference.spec.train_corpus import distill_loss

    g = torch.Generator().manual_seed(0)
    student = torch.randn(6, 11, generator=g, dtype=torch.float64, requires_grad=True)
    teacher = torch.randn(6, 11, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 11, (6,), generator=g)
    ce = torch.nn.functional.cross_entropy(student, y)
    p_t, logp_s = teacher.softmax(-1), student.log_softmax(-1)
    kl = (p_t * (p_t.log() - logp_s)).sum(-1).mean()  # per token, averaged over tokens
    assert distill_loss(student, teacher, y, 0.0).item() == ce.item()
    # float64: the two KL formulas agree to a few units of roundoff of the O(1) values
    torch.testing.assert_close(distill_loss(student, teacher, y, 1.0), kl, rtol=1e-12, atol=1e-12)
    mixed = distill_loss(student, teacher, y, 0.25)
    torch.testing.assert_close(mixed, 0.75 * ce + 0.25 * kl, rtol=1e-12, atol=1e-12)
    assert distill_loss(teacher, teacher, y, 1.0).abs().item() < 1e-12
    mixed.backward()
    assert teacher.grad is None and student.grad is not None


def test_train_corpus_bad_config():
    from project04_llm_inference.spec.train_corpus import TrainCorpusConfig

    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="distill must be in"):
            TrainCorpusConfig(distill=bad)

    with pytest.raises(ValueError, match="vocab_size"):
        TrainCorpusConfig(vocab_size=100)
    with pytest.raises(ValueError, match="max_seq_len"):
        TrainCorpusConfig(seq_len=512, max_seq_len=256)
