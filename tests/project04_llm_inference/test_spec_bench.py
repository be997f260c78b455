"""The speculative-decoding benchmark on the CPU: a tiny target and draft trained by
spec.train_corpus, the bench at tiny sizes (its record's shape, greedy losslessness, the
acceptance counters), its refusals, and the report's table, chart and summary line.

Greedy losslessness is asked for exactly: the speculative engine computes the same float32
logits in another grouping (a multi-token verification instead of one-token decodes), which
moves them by op-order noise (~1e-6, see test_engine_vs_transformers); the test first checks
that the target's top-two logit gap is above TIE = 1e-4 at every generated position, so a
different token can only be a bug. Speed is printed by the bench, never asserted here.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import statistics
from dataclasses import asdict

import pytest
import torch

from project04_llm_inference.bench import spec
from project04_llm_inference.report import render
from shared.repeat import range_text

from .conftest import RECORD_ENV as ENV

TIE = 1e-4
PROJECT = "project04_llm_inference"


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A 2-layer target and a 1-layer draft, 10 steps on a dozen standard-library files (3 held
    out): their greedy picks are far from ties (see the losslessness test's check). The draft
    is distilled from the target (KL weight 0.5), the path the bench records."""
    pytest.importorskip("tokenizers")
    from project04_llm_inference.spec.train_corpus import TrainCorpusConfig, run

    from .conftest import TINY_CORPUS_PAIR

    d = tmp_path_factory.mktemp("spec") / "models"
    run(
        TrainCorpusConfig(
            models_dir=str(d),
            **TINY_CORPUS_PAIR,
            max_steps=10,
            lr=1e-2,
            distill=0.5,
        )
    )
    return d


def _cfg(models_dir, reports_dir="") -> spec.SpecBenchConfig:
    return spec.SpecBenchConfig(
        models_dir=str(models_dir),
        reports_dir=str(reports_dir),
        ks=(2, 3),
        fused_ks=(2,),
        rounds_ks=(2,),
        fused_rounds=2,
        ngram_ks=(2,),
        batches=(1, 2),
        num_prompts=2,
        prompt_tokens=24,
        max_tokens=8,
        warmup_tokens=2,
        multi_step=4,
        device="cpu",
    )


@pytest.fixture(scope="module")
def bench(models, tmp_path_factory):
    reports = tmp_path_factory.mktemp("spec_reports")
    res = spec.run(_cfg(models, reports))
    return res, reports


def _workloads(models):
    from tokenizers import Tokenizer

    target, _, record = spec.check_models(str(models))
    tok = Tokenizer.from_file(str(target / "tokenizer.json"))
    held, root = spec.heldout_files(record, tok)
    return spec.build_workloads(_cfg(models), tok, held, root), tok, held


# --- the record ----------------------------------------------------------------------------------


def test_record_structure(bench, models):
    from shared.results import load_result

    res, reports = bench
    rec = load_result(reports / PROJECT / "spec_decode.json")
    assert rec["name"] == "spec_decode" and rec["results"]["rows"] == res["rows"]
    env = rec["environment"]
    assert {"gpu", "torch", "date", "git_commit"} <= set(env) and env["torch"] == torch.__version__
    assert all(isinstance(env["gpu_state"][k], dict) for k in ("start", "end"))
    assert rec["config"]["ks"] == [2, 3] and rec["config"]["batches"] == [1, 2]
    ctx = res["context"]
    assert ctx["device"] == "cpu" and ctx["dtype"] == "float32"
    assert ctx["target"]["num_hidden_layers"] == 2 and ctx["draft"]["num_hidden_layers"] == 1
    assert ctx["heldout_files"] == 3
    # the training record's figures travel into the bench record; only the draft has a teacher
    train = ctx["train"]
    assert "top1_agreement" not in train["target"] and train["draft"]["distill"] == 0.5
    assert 0.0 <= train["draft"]["top1_agreement"] <= 1.0

    rows = res["rows"]
    plan = [
        ("none", 0),
        ("multi-step", 4),
        ("draft", 2),
        ("draft", 3),
        ("draft-fused", 2),
        ("draft-rounds", 2),
        ("ngram", 2),
    ]
    assert [(e["method"], e["k"]) for e in res["engines"]] == plan
    assert len(rows) == len(plan) * 2 * 2  # engines x workloads x batches
    assert {r.get("rounds") for r in rows if r["method"] == "draft-rounds"} == {2}
    for w in spec.WORKLOADS:
        for b in (1, 2):
            mine = [r for r in rows if r["workload"] == w and r["batch"] == b]
            assert sorted((r["method"], r["k"]) for r in mine) == sorted(plan)
            base = next(r for r in mine if r["method"] == "none")
            assert base["speedup"] == 1.0 and rec["baseline"][f"{w}/batch {b}"] == pytest.approx(
                base["output_tok_s"]
            )
            for r in mine:  # the speedup is over this workload and batch's own baseline
                assert r["speedup"] == pytest.approx(r["output_tok_s"] / base["output_tok_s"])
    for r in rows:
        assert r["requests"] == 2 and r["output_tokens"] == 2 * 8  # ignore_eos: exactly max_tokens
        assert math.isfinite(r["speedup"]) and r["speedup"] > 0
        assert r["output_tok_s"] > 0 and r["ms_per_token"] > 0 and r["wall_s"] > 0
        if r["method"] in ("none", "multi-step"):
            assert r["proposed_tokens"] == 0 and r["acceptance_rate"] is None
        else:
            assert r["proposed_tokens"] > 0 and r["verifications"] > 0
            assert 0.0 <= r["acceptance_rate"] <= 1.0
            assert r["acceptance_rate"] == r["accepted_tokens"] / r["proposed_tokens"]
            assert 0.0 <= r["mean_accepted_len"] <= r["k"]
    best = res["best_batch1_draft"]
    top = max(
        (
            r
            for r in rows
            if r["method"] in ("draft", "draft-fused", "draft-rounds")
            and r["batch"] == 1
            and r["workload"] == "held-out"
        ),
        key=lambda r: r["speedup"],
    )
    assert (best["speedup"], best["k"], best["method"]) == (top["speedup"], top["k"], top["method"])
    assert best["met"] == (top["speedup"] >= 2.0)
    multi = next(
        r
        for r in rows
        if r["method"] == "multi-step" and r["batch"] == 1 and r["workload"] == "held-out"
    )
    assert best["vs_multi_step"] == pytest.approx(top["output_tok_s"] / multi["output_tok_s"])


def test_workloads_come_from_the_held_out_files(bench, models):
    from project04_llm_inference.spec.train_corpus import EOS, TrainCorpusConfig, corpus_files

    res, _ = bench
    wls, tok, held = _workloads(models)
    record = json.loads((models / "train_record.json").read_text())
    assert held == corpus_files(TrainCorpusConfig(**record["config"]))[1]  # training's split
    eos, sep = tok.token_to_id(EOS), tok.encode(spec.SEPARATOR).ids
    for plain, edit in zip(wls["held-out"]["prompts"], wls["code-editing"]["prompts"]):
        assert len(plain) == 24 and plain[0] == eos
        body = plain[1:]
        # the file prefix, the separator, then the prefix again cut max_tokens (8) short: a
        # faithful copy's next 8 tokens are body[15:23], all in the prompt
        assert edit == [eos, *body, *sep, *body[: 23 - 8]]
    assert res["workloads"]["held-out"]["files"] == wls["held-out"]["files"]
    assert len(set(wls["held-out"]["files"])) == 2


def test_greedy_speculation_is_lossless(bench, models):
    from shared.hf_export import import_hf

    res, _ = bench
    wls, _, _ = _workloads(models)
    target = import_hf(models / "target").eval()
    with torch.no_grad():  # the target's own greedy path: no near-tie anywhere on it
        for w in wls.values():
            for p in w["prompts"]:
                ids = list(p)
                for j in range(8):
                    logits = target(torch.tensor([ids]))[0, -1]
                    top2 = logits.topk(2).values
                    gap = float(top2[0] - top2[1])
                    assert gap > TIE, f"near-tie ({gap:.2g}) at token {j}: train other models"
                    ids.append(int(logits.argmax()))
    for r in res["rows"]:
        assert r["lossless_share"] == 1.0 and r["matching_token_share"] == 1.0, r
    # not vacuous: drafts were accepted, so emitted tokens came through the verifier
    assert sum(r["accepted_tokens"] for r in res["rows"]) > 0


def test_same_tokens_sees_a_planted_difference():
    assert spec.same_tokens([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 5, 6]]) == (1.0, 1.0)
    equal, prefix = spec.same_tokens([[1, 2, 3], [4, 9, 6]], [[1, 2, 3], [4, 5, 6]])
    assert equal == 0.5 and prefix == pytest.approx(4 / 6)  # 3 + 1 tokens before the difference
    with pytest.raises(ValueError):
        spec.same_tokens([[1]], [[1], [2]])


def test_heldout_split_is_checked_against_training(models, tmp_path):
    import shutil

    from tokenizers import Tokenizer

    copy = tmp_path / "models"
    shutil.copytree(models, copy)
    record = json.loads((copy / "train_record.json").read_text())
    record["heldout_tokens"] += 1  # as if trained on another corpus
    tok = Tokenizer.from_file(str(copy / "target" / "tokenizer.json"))
    with pytest.raises(ValueError, match="held-out files"):
        spec.heldout_files(record, tok)


# --- refusals ------------------------------------------------------------------------------------


def test_missing_models_is_one_line_with_the_train_command(tmp_path, capsys):
    from project04_llm_inference.__main__ import main

    missing = tmp_path / "nothing-here"
    with pytest.raises(SystemExit) as e:
        main(["spec", "--models-dir", str(missing), "--reports-dir", str(tmp_path / "r")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: models_dir:")
    assert f"spec.train_corpus --models-dir {missing}" in err[0]
    with pytest.raises(SystemExit) as e:  # the module's own entry point says the same
        spec.main(["--models-dir", str(missing)])
    assert e.value.code == 2 and capsys.readouterr().err.startswith("error: models_dir:")
    assert not (tmp_path / "r").exists()  # refused before any work


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(num_prompts=3), "num_prompts"),
        (dict(batches=(0,)), "batches"),
        (dict(ks=(0, 2)), "ks"),
        (dict(ks=(), fused_ks=(), rounds_ks=(), ngram_ks=()), "ks, fused_ks, rounds_ks"),
        (dict(fused_ks=(2, 65)), "fused_ks"),
        (dict(rounds_ks=(0,)), "rounds_ks"),
        (dict(fused_rounds=1), "fused_rounds"),
        (dict(prompt_tokens=64, max_tokens=64), "prompt_tokens"),
        (dict(ngram_min=3, ngram_max=2), "ngram_min"),
        (dict(goal_speedup=math.inf), "goal_speedup"),
        (dict(models_dir=""), "models_dir"),
        (dict(gpu_memory_utilization=0.0), "gpu_memory"),
    ],
)
def test_bad_config_names_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        spec.SpecBenchConfig(**kw)


def test_repeats_give_medians_over_rebuilt_engines(models, tmp_path, monkeypatch):
    """--repeats 2: every engine built twice (the order reversed the second time), each row's
    tok/s, ms/token and speedup the median of its repetitions, the speedup of each repetition
    over that repetition's own baseline; the report shows the range."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = dataclasses.replace(
        _cfg(models, tmp_path),
        ks=(2,),
        fused_ks=(),
        rounds_ks=(),
        ngram_ks=(),
        multi_step=0,
        batches=(1,),
        workloads=("held-out",),
        warmup_tokens=0,
        repeats=2,
    )
    built = []
    orig = spec.build_llm
    monkeypatch.setattr(
        spec, "build_llm", lambda c, t, d, m, k, n: built.append((m, k)) or orig(c, t, d, m, k, n)
    )
    res = spec.run(cfg)
    assert built == [("none", 0), ("draft", 2), ("draft", 2), ("none", 0)]
    assert res["repeats"] == 2 and len(res["rows"]) == 2
    base, draft = res["rows"]
    assert base["method"] == "none" and base["speedup_reps"] == [1.0, 1.0]
    for r in (base, draft):
        for f in ("output_tok_s", "ms_per_token", "speedup"):
            reps = r[f"{f}_reps"]
            assert len(reps) == 2 and r[f] == pytest.approx(statistics.median(reps))
            assert r[f"{f}_min"] == min(reps) and r[f"{f}_max"] == max(reps)
    per_rep = [a / b for a, b in zip(draft["output_tok_s_reps"], base["output_tok_s_reps"])]
    assert draft["speedup_reps"] == pytest.approx(per_rep)
    assert draft["proposed_tokens"] > 0 and draft["lossless_share"] == 1.0  # float32: lossless
    md = render(tmp_path)[0].read_text()
    module = importlib.import_module("project04_llm_inference.report.render")
    cell = range_text(draft["speedup"], draft["speedup_min"], draft["speedup_max"], module._num)
    assert f"| {cell} |" in md


def test_repeats_must_be_positive():
    with pytest.raises(ValueError, match="repeats"):
        spec.SpecBenchConfig(repeats=0)


def test_held_out_only_allows_short_prompts():
    cfg = spec.SpecBenchConfig(prompt_tokens=64, max_tokens=64, workloads=("held-out",))
    assert cfg.workloads == ("held-out",) and asdict(cfg)["prompt_tokens"] == 64


# --- the report ----------------------------------------------------------------------------------


def _row(workload, batch, method, k, tok_s, base, acc=None, same=1.0):
    prop = 100 * k if method in ("draft", "draft-fused", "ngram") else 0
    return {
        "workload": workload,
        "batch": batch,
        "method": method,
        "k": k,
        "requests": 32,
        "output_tokens": 4096,
        "wall_s": 4096 / tok_s,
        "output_tok_s": tok_s,
        "ms_per_token": 1e3 * batch / tok_s,
        "speedup": tok_s / base,
        "baseline_output_tok_s": base,
        "proposed_tokens": prop,
        "accepted_tokens": round(prop * (acc or 0)),
        "verifications": 100 if prop else 0,
        "acceptance_rate": acc,
        "mean_accepted_len": k * acc if acc is not None else None,
        "lossless_share": same,
        "matching_token_share": same,
        "target_steps": 1000,
    }


def _spec_record(
    folder,
    *,
    draft_b1: float,
    draft_train: dict | None = None,
    fused_b1: float | None = None,
    rounds_b1: float | None = None,
) -> None:
    """A hand-written spec_decode record: batch-1 draft at k=4 reaches `draft_b1` x (and the
    fused step at k=4 `fused_b1` x, the fused step in 4 rounds at k=4 `rounds_b1` x, when
    given)."""
    from shared.results import save_result

    rows = []
    for w, base1, base8 in (("held-out", 500.0, 3000.0), ("code-editing", 480.0, 2900.0)):
        rows += [
            _row(w, 1, "none", 0, base1, base1),
            _row(w, 8, "none", 0, base8, base8),
            _row(w, 1, "multi-step", 8, base1 * 1.5, base1),
        ]
        for k in (2, 4):
            s = draft_b1 if k == 4 else 1.2
            rows += [
                _row(w, 1, "draft", k, base1 * s, base1, 0.7),
                _row(w, 8, "draft", k, base8 * 1.1, base8, 0.7, same=31 / 32),
            ]
        if fused_b1 is not None:
            rows += [
                _row(w, 1, "draft-fused", 4, base1 * fused_b1, base1, 0.7),
                _row(w, 8, "draft-fused", 4, base8 * 1.2, base8, 0.7),
            ]
        if rounds_b1 is not None:
            rows += [
                _row(w, 1, "draft-rounds", 4, base1 * rounds_b1, base1, 0.7) | {"rounds": 4},
                _row(w, 8, "draft-rounds", 4, base8 * 1.3, base8, 0.7) | {"rounds": 4},
            ]
        rows += [
            _row(w, 1, "ngram", 4, base1 * (2.6 if w == "code-editing" else 0.9), base1, 0.5),
            _row(w, 8, "ngram", 4, base8 * 1.3, base8, 0.5),
        ]
    shape = {
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
        "intermediate_size": 2048,
        "vocab_size": 8192,
        "max_position_embeddings": 2048,
    }
    wl = {
        "requests": 32,
        "files": ["a.py"],
        "prompt_len_min": 256,
        "prompt_len_max": 256,
        "prompt_len_mean": 256.0,
    }
    res = {
        "context": {
            "device": "cuda:0",
            "dtype": "bfloat16",
            "target": shape,
            "draft": {**shape, "hidden_size": 256, "num_hidden_layers": 2},
            "train": {
                "target": {"params": 95_000_000},
                "draft": {"params": 4_700_000, **(draft_train or {})},
            },
            "vocab_size": 8192,
            "heldout_files": 90,
            "corpus": "the stdlib",
        },
        "workloads": {
            "held-out": wl,
            "code-editing": {**wl, "prompt_len_min": 390, "prompt_len_max": 390},
        },
        "engines": [],
        "rows": rows,
        "best_batch1_draft": spec.best_draft(rows, 2.0),
    }
    save_result(PROJECT, "spec_decode", res, reports_dir=folder, env=ENV)


def test_report_states_the_drafts_agreement_and_distillation(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _spec_record(tmp_path / "a", draft_b1=1.0, draft_train={"distill": 0.5, "top1_agreement": 0.61})
    _spec_record(tmp_path / "b", draft_b1=1.0, draft_train={"top1_agreement": 0.4})
    _spec_record(tmp_path / "c", draft_b1=1.0)  # a record from before agreement was measured
    md = {k: render(tmp_path / k)[0].read_text() for k in "abc"}
    assert (
        "The draft's (distilled from the target, KL weight 0.5) top-1 agreement with the "
        "target on held-out windows: 0.610."
    ) in md["a"]
    assert "The draft's top-1 agreement with the target on held-out windows: 0.400." in md["b"]
    assert "agreement" not in md["c"]


@pytest.mark.parametrize("draft_b1", [2.4, 1.6])
def test_report_renders_the_spec_record(tmp_path, draft_b1, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the report needs no GPU
    _spec_record(tmp_path, draft_b1=draft_b1)
    paths = render(tmp_path)  # the only record: the other sections say "not measured"
    assert [p.name for p in paths] == ["results.md", "summary.md", "spec_decode.png"]
    assert paths[2].stat().st_size > 0
    md = paths[0].read_text()
    assert "## Speculative decoding" in md and "![spec_decode](spec_decode.png)" in md
    head = (
        "| workload | batch | method | k | output tok/s | ms/token | speedup (x) | acceptance "
        "| accepted length | same tokens |"
    )
    assert head in md
    assert "| held-out | 1 | no speculation |  | 500 | 2 | 1 | n/a | n/a | 32/32 |" in md
    assert "| held-out | 1 | no speculation, multi-step | 8 | 750 | 1.33 | 1.5 |" in md
    assert f"| held-out | 1 | draft model | 4 | {500 * draft_b1:,.0f} |" in md
    assert "| held-out | 8 | draft model | 2 | 3,300 | 2.42 | 1.1 | 0.7 | 1.4 | 31/32 |" in md
    assert "95.0 M params, 12 layers, dim 768" in md and "bfloat16" in md
    status = "met" if draft_b1 >= 2.0 else "missed"
    assert (
        f"Best batch-1 draft-model speedup on held-out files: {draft_b1:.2f}x at k = 4 "
        f"(goal >= 2.0x: {status})"
    ) in md
    summary = paths[1].read_text()
    assert (
        f"best batch-1 draft-model speedup on held-out files {draft_b1:.2f}x at k = 4, "
        f"goal >= 2.0x: **{status}**"
    ) in summary
    ngram = (
        "N-gram lookup on the code-editing workload (the prompt holds the answer): 2.60x at "
        "batch 1 (k = 4), 1.30x at batch 8 (k = 4)."
    )
    assert ngram in summary
    assert f"That is {draft_b1 / 1.5:.2f}x the speed of multi-step decoding" in summary
    assert "NVIDIA H200" in summary


def test_report_names_the_fused_step_when_it_is_the_best(tmp_path, monkeypatch):
    import importlib

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _spec_record(tmp_path, draft_b1=1.2, fused_b1=1.5)
    rec = json.loads((tmp_path / PROJECT / "spec_decode.json").read_text())
    best = rec["results"]["best_batch1_draft"]
    assert (best["method"], best["k"], best["met"]) == ("draft-fused", 4, False)
    assert best["speedup"] == pytest.approx(1.5)
    md, summary = (p.read_text() for p in render(tmp_path)[:2])
    assert "| held-out | 1 | draft model, fused step | 4 | 750 |" in md
    assert "Fused step (EngineArgs.spec_fused_greedy)" in md
    assert "1.50x at k = 4, fused step (goal >= 2.0x: missed)" in md
    assert "1.50x at k = 4, fused step, goal >= 2.0x: **missed**" in summary
    from shared import charts

    module = importlib.import_module("project04_llm_inference.report.render")
    seen = {}
    monkeypatch.setattr(charts, "line_chart", lambda path, series, **kw: seen.update(series))
    module._spec_charts({"spec_decode": rec}, tmp_path)
    assert seen["draft model, fused step, batch 1 (held-out)"] == ((4,), (pytest.approx(1.5),))


def test_report_names_the_rounds_when_they_are_the_best(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _spec_record(tmp_path, draft_b1=1.2, fused_b1=1.5, rounds_b1=2.1)
    rec = json.loads((tmp_path / PROJECT / "spec_decode.json").read_text())
    best = rec["results"]["best_batch1_draft"]
    assert (best["method"], best["k"], best["met"]) == ("draft-rounds", 4, True)
    md, summary = (p.read_text() for p in render(tmp_path)[:2])
    assert "| held-out | 1 | draft model, fused step in rounds | 4 | 1,050 |" in md
    assert "In rounds (EngineArgs.spec_fused_rounds = 4): 4 such rounds" in md
    assert "2.10x at k = 4, fused step in rounds (goal >= 2.0x: met)" in md
    assert "2.10x at k = 4, fused step in rounds, goal >= 2.0x: **met**" in summary


def test_records_without_a_fused_step_say_nothing_of_it(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _spec_record(tmp_path, draft_b1=1.2)
    md = render(tmp_path)[0].read_text()
    assert "fused" not in md


def test_spec_chart_lines(tmp_path, monkeypatch):
    import importlib

    from shared import charts

    module = importlib.import_module("project04_llm_inference.report.render")
    _spec_record(tmp_path, draft_b1=2.4)
    recs = {"spec_decode": json.loads((tmp_path / PROJECT / "spec_decode.json").read_text())}
    seen = {}
    orig = charts.line_chart

    def spy(path, series, **kw):
        seen.update(series=series, **kw)
        return orig(path, series, **kw)

    monkeypatch.setattr(charts, "line_chart", spy)
    assert module._spec_charts(recs, tmp_path) == [tmp_path / "spec_decode.png"]
    assert list(seen["series"]) == [
        "draft model, batch 1 (held-out)",
        "draft model, batch 8 (held-out)",
        "n-gram lookup, batch 1 (code-editing)",
        "n-gram lookup, batch 8 (code-editing)",
    ]
    assert seen["series"]["draft model, batch 1 (held-out)"] == ((2, 4), (1.2, pytest.approx(2.4)))
    assert [v for v, _ in seen["hlines"]] == [1.0, 2.0]  # no speculation, and the goal
    assert "NVIDIA H200" in seen["footnote"]


def test_report_of_a_recorded_bench_run(bench):
    _, reports = bench
    paths = render(reports)
    assert "## Speculative decoding" in paths[0].read_text()
    assert "**Speculative decoding** (float32" in paths[1].read_text()


def test_profile_step_takes_a_model_folder_and_speculation():
    """bench.profile_step profiles dummy weights of a shape, or a model folder, optionally with
    speculation (a draft sharing the folder's vocabulary): its engine arguments validate."""
    from project04_llm_inference import EngineArgs
    from project04_llm_inference.bench.profile_step import ProfileConfig, engine_kwargs

    plain = engine_kwargs(ProfileConfig(batch=4, context=100))
    assert plain["load_format"] == "dummy" and "speculative_method" not in plain
    assert plain["max_model_len"] == 356 and plain["max_num_seqs"] == 4
    EngineArgs(**plain)
    spec = engine_kwargs(
        ProfileConfig(
            batch=1,
            model="runs/spec-models/target",
            speculative_method="draft",
            speculative_model="runs/spec-models/draft",
            num_speculative_tokens=2,
        )
    )
    assert spec["model"] == "runs/spec-models/target" and "load_format" not in spec
    assert (spec["speculative_method"], spec["num_speculative_tokens"]) == ("draft", 2)
    assert spec["speculative_model"] == "runs/spec-models/draft"


def test_a_rounds_record_beside_the_full_plan_gets_its_own_section_and_line(tmp_path, monkeypatch):
    # spec_decode_rounds.json: a later, smaller plan (the committed one: batch 1, held-out only)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _spec_record(tmp_path, draft_b1=1.2, fused_b1=1.5)
    folder = tmp_path / PROJECT
    full = json.loads((folder / "spec_decode.json").read_text())
    sub = tmp_path / "rounds"
    _spec_record(sub, draft_b1=1.2, fused_b1=1.5, rounds_b1=1.7)
    rounds = json.loads((sub / PROJECT / "spec_decode.json").read_text())
    (folder / "spec_decode_rounds.json").write_text(json.dumps(rounds))
    md, summary = (p.read_text() for p in render(tmp_path)[:2])
    assert md.count("## Speculative decoding") == 2
    assert "## Speculative decoding: the fused step in rounds" in md
    best_full = full["results"]["best_batch1_draft"]["speedup"]
    assert f"{best_full:.2f}x at k = 4, fused step, goal" in summary
    assert "**Speculative decoding: the fused step in rounds**" in summary
    assert "1.70x at k = 4, fused step in rounds, goal >= 2.0x: **missed**" in summary
    # each line names its divisor (no speculation at batch 1, held-out) and the host it ran on
    cpu = rounds["environment"].get("cpu_model")
    tail = f" (host CPU: {cpu})." if cpu else "."
    assert f"The engine without speculation ran 500 tok/s at batch 1 in that run{tail}" in summary


def test_repeated_best_speedup_shows_its_spread_and_the_rows_record_its_section(
    tmp_path, monkeypatch
):
    """A record of repetitions: the summary line gives the best batch-1 speedup's median with
    its range; spec_decode_rows.json (rounds after the verification became decode rows) gets
    its own section and line."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _spec_record(tmp_path, draft_b1=1.2, fused_b1=1.5)
    sub = tmp_path / "rows"
    _spec_record(sub, draft_b1=1.2, fused_b1=1.5, rounds_b1=2.1)
    rec = json.loads((sub / PROJECT / "spec_decode.json").read_text())
    res = rec["results"]
    best = res["best_batch1_draft"]
    row = next(
        r
        for r in res["rows"]
        if (r["method"], r["k"], r["batch"], r["workload"])
        == (best["method"], best["k"], 1, "held-out")
    )
    row.update(speedup_reps=[1.9, 2.1, 2.3], speedup_min=1.9, speedup_max=2.3)
    (tmp_path / PROJECT / "spec_decode_rows.json").write_text(json.dumps(rec))
    md, summary = (p.read_text() for p in render(tmp_path)[:2])
    assert "## Speculative decoding: the fused step in rounds (the engine's default)" in md
    assert "2.10x (median of 3, 1.90-2.30) at k = 4, fused step in rounds" in summary
    assert "goal >= 2.0x: **met**" in summary
