"""Speculative decoding's speedup: a draft model and n-gram lookup against the same engine
without speculation, greedy, at batch 1 and 8, for k = 2..8 (one JSON record).

    python -m project04_llm_inference.spec.train_corpus --models-dir runs/spec-models
    python -m project04_llm_inference spec --models-dir runs/spec-models --reports-dir runs/<x>

Models: `<models_dir>/target` and `<models_dir>/draft` from `spec/train_corpus.py`. Prompts come
from the corpus files that training held out, the split recomputed from `train_record.json`
(and refused when its held-out token count differs from the recorded one):
- held-out: `<|endoftext|>` (the separator training put before every file), then the file's
  first `prompt_tokens - 1` tokens; the continuation is new text;
- code-editing: the same file prefix, a separator comment line, then that prefix again cut
  `max_tokens` tokens short, so every token of a faithful copy's continuation is in the prompt
  (the workload n-gram lookup is made for; whether the target copies is its own greedy choice).
Every engine (no speculation, draft with k = each of `ks`, n-gram with k = each of `ngram_ks`)
is built once (start-up and CUDA-graph capture untimed), warmed up, then runs every workload at
every batch size: the prompts `batch` at a time, each group to completion, greedy, exactly
`max_tokens` new tokens each (ignore_eos). A row reports output tok/s, ms per output token of a
request, the speedup over the no-speculation engine on the same workload and batch (measured in
this run), the acceptance counters' increase over the row (acceptance rate: accepted / proposed
drafts; mean accepted length: accepted drafts per verification, the engine's definition, so a
verification emits that plus one token), and the share of requests whose tokens equal the
no-speculation engine's exactly (greedy speculation is lossless; on a GPU in bf16 the verifier's
multi-token forward rounds differently from one-token decodes, so a near-tie may flip a token;
the share is reported, never asserted here). Records go to
`<reports_dir>/project04_llm_inference/spec_decode.json`, by default under `runs/<UTC time>/`.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal

from . import offline

NAME = "spec_decode"
DRAFT_METHODS = ("draft", "draft-fused", "draft-rounds")  # the draft-model engines
WORKLOADS = ("held-out", "code-editing")
SEPARATOR = "\n# ---- the code above again, edited ----\n"
TRAIN_COMMAND = "python -m project04_llm_inference.spec.train_corpus --models-dir {}"


@dataclass
class SpecBenchConfig:
    """Speculative decoding (draft model, n-gram lookup) vs the same engine without it."""

    models_dir: str = "runs/spec-models"
    """folder of target/, draft/ and train_record.json written by spec.train_corpus"""
    reports_dir: str = ""
    """folder of the JSON record (under <reports_dir>/project04_llm_inference/); empty: runs/<UTC time>/"""
    ks: tuple[int, ...] = (2, 4)
    """draft-model speculation with the unfused step (spec_fused_greedy=False: the draft's
    proposal, verification and acceptance apart, three read-backs a step): tokens proposed per
    step, one engine each (method 'draft'); empty: none"""
    fused_ks: tuple[int, ...] = (4,)
    """draft-model speculation with all-greedy steps fused, one round a program
    (EngineArgs.spec_fused_greedy with spec_fused_rounds=1: the draft's catch-up and k - 1
    steps, the verification and the greedy acceptance as one device program, one read-back a
    step): tokens proposed per step, one engine each (method 'draft-fused'); empty: none"""
    rounds_ks: tuple[int, ...] = (2, 3, 4, 5, 6, 7, 8)
    """draft-model speculation as the engine runs it by default: the fused step in rounds
    (EngineArgs.spec_fused_rounds = fused_rounds: that many rounds of draft, verification and
    acceptance per device program and read-back, each formed on the device): tokens proposed
    per round, one engine each (method 'draft-rounds'); empty: none"""
    fused_rounds: int = 4
    """rounds per program of the 'draft-rounds' engines (>= 2; the engine's default is
    config.DEFAULT_FUSED_ROUNDS)"""
    ngram_ks: tuple[int, ...] = (2, 4, 8)
    """n-gram lookup: tokens proposed per step, one engine each; empty: no n-gram rows"""
    batches: tuple[int, ...] = (1, 8)
    """requests run at once; each must divide num_prompts"""
    workloads: tuple[Literal["held-out", "code-editing"], ...] = WORKLOADS
    """held-out: file starts, new text follows; code-editing: the prompt holds the answer"""
    num_prompts: int = 32
    """requests per workload (the first held-out files long enough), the same at every batch"""
    prompt_tokens: int = 256
    """held-out prompt length, tokens (the code-editing prompt is about twice as long)"""
    max_tokens: int = 128
    """new tokens per request, exactly (greedy, ignore_eos)"""
    warmup_tokens: int = 16
    """new tokens per request of the untimed warm-up (each workload, largest batch); 0: none"""
    ngram_min: int = 1
    """shortest suffix n-gram that n-gram lookup matches"""
    ngram_max: int = 4
    """longest suffix n-gram that n-gram lookup matches (tried first)"""
    device: Literal["auto", "cuda", "cpu"] = "auto"
    """'auto': cuda when a GPU is visible (the CPU runs it too, slowly)"""
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    """'auto': bfloat16 on a GPU, float32 on the CPU"""
    gpu_memory_utilization: float = 0.90
    """share of GPU memory each engine may use (built one at a time)"""
    seed: int = 0
    """engine seed (greedy decoding draws nothing)"""
    goal_speedup: float = 2.0
    """batch-1 draft-model speedup on held-out files asked for, x"""
    multi_step: int = 8
    """also time the engine without speculation at this many decode steps per host round trip
    (EngineArgs.num_scheduler_steps), the other way to emit several tokens per sync, for
    reference (its speedup is over the one-step engine too); 0 or 1: skip"""
    repeats: int = 1
    """repetitions of the whole plan, every engine rebuilt each time, the order reversed on every
    other one (none, multi-step, drafts, ..., then back); tok/s, ms/token and speedup (over that
    repetition's own baseline) are medians over them with min-max (shared.repeat); the counts
    and token comparisons are the first repetition's"""

    def __post_init__(self) -> None:
        if not str(self.models_dir).strip():
            raise ValueError("models_dir: expected a path, got an empty string")
        self.ks, self.ngram_ks = tuple(sorted(set(self.ks))), tuple(sorted(set(self.ngram_ks)))
        self.fused_ks = tuple(sorted(set(self.fused_ks)))
        self.rounds_ks = tuple(sorted(set(self.rounds_ks)))
        self.batches = tuple(sorted(set(self.batches)))
        self.workloads = tuple(w for w in WORKLOADS if w in set(self.workloads))
        for name in ("ks", "fused_ks", "rounds_ks", "ngram_ks"):
            if any(not 1 <= k <= 64 for k in getattr(self, name)):
                raise ValueError(f"{name}: expected values in [1, 64], got {getattr(self, name)}")
        if not (self.ks or self.fused_ks or self.rounds_ks or self.ngram_ks):
            raise ValueError("ks, fused_ks, rounds_ks, ngram_ks: all empty, nothing to compare")
        if not 2 <= self.fused_rounds <= 64:
            raise ValueError(f"fused_rounds: expected 2..64, got {self.fused_rounds}")
        if not self.batches or any(b < 1 for b in self.batches):
            raise ValueError(f"batches: expected sizes >= 1, got {self.batches}")
        if not self.workloads:
            raise ValueError(f"workloads: expected some of {WORKLOADS}")
        if self.num_prompts < 1 or any(self.num_prompts % b for b in self.batches):
            raise ValueError(
                f"num_prompts: expected a multiple of every batch size {self.batches}, "
                f"got {self.num_prompts}"
            )
        if self.max_tokens < 1 or self.warmup_tokens < 0:
            raise ValueError("max_tokens must be >= 1 and warmup_tokens >= 0")
        if self.prompt_tokens < 2:
            raise ValueError(f"prompt_tokens: expected >= 2, got {self.prompt_tokens}")
        if "code-editing" in self.workloads and self.prompt_tokens <= self.max_tokens + 1:
            raise ValueError(
                f"prompt_tokens: the code-editing prompt repeats prompt_tokens - 1 - max_tokens "
                f"tokens, so it must exceed max_tokens + 1 = {self.max_tokens + 1}, "
                f"got {self.prompt_tokens}"
            )
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(
                f"ngram_min, ngram_max: expected 1 <= min <= max, got "
                f"{self.ngram_min}, {self.ngram_max}"
            )
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization: expected (0, 1], got {self.gpu_memory_utilization}"
            )
        if not (math.isfinite(self.goal_speedup) and self.goal_speedup > 0):
            raise ValueError(f"goal_speedup: expected a finite number > 0, got {self.goal_speedup}")
        if not 0 <= self.multi_step <= 64:
            raise ValueError(f"multi_step: expected 0..64, got {self.multi_step}")
        if isinstance(self.repeats, bool) or not 1 <= self.repeats <= 50:
            raise ValueError(f"repeats: expected 1..50, got {self.repeats}")


# --- models and prompts ------------------------------------------------------------------------


def check_models(models_dir: str) -> tuple[Path, Path, dict]:
    """(target folder, draft folder, train record), or a one-line FileNotFoundError that says
    how to train them."""
    root = Path(models_dir)
    need = ("target/config.json", "target/tokenizer.json", "draft/config.json", "train_record.json")
    missing = [n for n in need if not (root / n).is_file()]
    if missing:
        raise FileNotFoundError(
            f"models_dir: {root} holds no trained target and draft (missing "
            f"{', '.join(missing)}); train them first: {TRAIN_COMMAND.format(root)}"
        )
    return root / "target", root / "draft", json.loads((root / "train_record.json").read_text())


def heldout_files(record: dict, tok) -> tuple[list[Path], Path]:
    """The files training held out (spec.train_corpus.corpus_files on the recorded config),
    checked against the recorded held-out token count; and the corpus root."""
    import sysconfig

    from ..spec.train_corpus import TrainCorpusConfig, corpus_files, encode

    known = {f.name for f in fields(TrainCorpusConfig)}
    cfg = TrainCorpusConfig(**{k: v for k, v in record["config"].items() if k in known})
    _, held = corpus_files(cfg)
    now, then = len(encode(tok, held)), record.get("heldout_tokens")
    if now != then:
        raise ValueError(
            f"models_dir: the held-out files found here make {now:,} tokens, training recorded "
            f"{then}: a different corpus (another Python's standard library?); run the bench "
            "where the models were trained, or retrain them here"
        )
    return held, Path(cfg.corpus_dir or sysconfig.get_paths()["stdlib"])


def build_workloads(cfg: SpecBenchConfig, tok, files: list[Path], root: Path) -> dict:
    """Per workload: prompts (token ids) and their files, from the first held-out files that
    have at least prompt_tokens - 1 tokens (in path order)."""
    from ..spec.train_corpus import EOS, _read

    eos, body_len = tok.token_to_id(EOS), cfg.prompt_tokens - 1
    bodies, names = [], []
    for f in files:
        ids = tok.encode(_read(f)).ids
        if len(ids) >= body_len:
            bodies.append(ids[:body_len])
            names.append(f.relative_to(root).as_posix() if f.is_relative_to(root) else f.name)
        if len(bodies) == cfg.num_prompts:
            break
    if len(bodies) < cfg.num_prompts:
        raise ValueError(
            f"num_prompts: only {len(bodies)} of {len(files)} held-out files have "
            f">= {body_len} tokens; lower num_prompts or prompt_tokens"
        )
    sep = tok.encode(SEPARATOR).ids
    make = {
        "held-out": lambda a: [eos, *a],
        "code-editing": lambda a: [eos, *a, *sep, *a[: body_len - cfg.max_tokens]],
    }
    out = {}
    for w in cfg.workloads:
        prompts = [make[w](a) for a in bodies]
        lens = [len(p) for p in prompts]
        out[w] = {
            "prompts": prompts,
            "files": names,
            "requests": len(prompts),
            "prompt_len_min": min(lens),
            "prompt_len_max": max(lens),
            "prompt_len_mean": statistics.fmean(lens),
        }
    return out


# --- one engine, one timed run -------------------------------------------------------------------

SPEC_COUNTERS = ("spec_proposed_tokens", "spec_accepted_tokens", "spec_verifications", "steps")
# a row's figures that are medians over repetitions (with _min, _max, _reps); the rest (counts,
# acceptance, token comparisons: the same every repetition) are the first repetition's
REPEATED = ("output_tok_s", "ms_per_token", "wall_s", "speedup", "baseline_output_tok_s")


def engine_plan(cfg: SpecBenchConfig) -> list[tuple[str, int]]:
    """(method, k) of every engine, the one without speculation first (the baseline); k of
    'multi-step' is its decode steps per round trip."""
    multi = [("multi-step", cfg.multi_step)] if cfg.multi_step > 1 else []
    return [
        ("none", 0),
        *multi,
        *(("draft", k) for k in cfg.ks),
        *(("draft-fused", k) for k in cfg.fused_ks),
        *(("draft-rounds", k) for k in cfg.rounds_ks),
        *(("ngram", k) for k in cfg.ngram_ks),
    ]


def build_llm(cfg: SpecBenchConfig, target: Path, draft: Path, method: str, k: int, max_len: int):
    LLM, EngineArgs, _ = offline._engine()
    extra = {}
    if method == "multi-step":
        extra = dict(num_scheduler_steps=k)
    elif method != "none":
        fused = method in ("draft-fused", "draft-rounds")
        extra = dict(speculative_method="draft" if fused else method, num_speculative_tokens=k)
        if method in DRAFT_METHODS:
            extra.update(speculative_model=str(draft), spec_fused_greedy=fused)
            if fused:  # draft-fused: the one-round step (the engine's default is rounds)
                extra.update(spec_fused_rounds=cfg.fused_rounds if method == "draft-rounds" else 1)
        else:
            extra.update(
                ngram_prompt_lookup_min=cfg.ngram_min, ngram_prompt_lookup_max=cfg.ngram_max
            )
    b = max(cfg.batches)
    return LLM(
        EngineArgs(
            model=str(target),
            device=cfg.device,
            dtype=cfg.dtype,
            seed=cfg.seed,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            max_model_len=max_len,
            max_num_seqs=b,
            cuda_graph_max_batch=b,
            enable_prefix_caching=False,
            **extra,
        )
    )


def timed_run(llm, prompts: list[list[int]], batch: int, max_tokens: int) -> dict:
    """The prompts `batch` at a time, each group to completion; wall time of each group (device
    synchronised), the tokens, and the speculation counters' increase."""
    _, _, SamplingParams = offline._engine()
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    before = llm.engine.stats()
    walls, tokens = [], []
    for i in range(0, len(prompts), batch):
        offline._sync()
        t0 = time.perf_counter()
        outs = llm.generate(prompts[i : i + batch], params)
        offline._sync()
        walls.append(time.perf_counter() - t0)
        tokens += [list(o.token_ids) for o in outs]
    after = llm.engine.stats()
    counts = {k: after.get(k, 0) - before.get(k, 0) for k in SPEC_COUNTERS}
    return {"walls": walls, "tokens": tokens, **counts}


def same_tokens(got: list[list[int]], want: list[list[int]]) -> tuple[float, float]:
    """(share of requests whose tokens equal `want`'s exactly, share of `want`'s tokens that
    come before the first difference)."""
    if len(got) != len(want) or not want:
        raise ValueError(f"compare {len(got)} outputs with {len(want)}")
    prefix = 0
    for a, b in zip(got, want):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        prefix += n
    equal = sum(a == b for a, b in zip(got, want))
    return equal / len(want), prefix / max(1, sum(map(len, want)))


def summarise(
    run: dict, *, workload: str, batch: int, method: str, k: int, max_tokens: int, base: dict | None
) -> dict:
    """One row of the record from a timed run and the baseline row (None: this is it)."""
    wall, produced = sum(run["walls"]), sum(map(len, run["tokens"]))
    prop, acc, ver = (run[c] for c in SPEC_COUNTERS[:3])
    row = {
        "workload": workload,
        "batch": batch,
        "method": method,
        "k": k,
        "requests": len(run["tokens"]),
        "output_tokens": produced,
        "wall_s": wall,
        "output_tok_s": produced / wall,
        "ms_per_token": statistics.fmean(run["walls"]) / max_tokens * 1e3,
        "target_steps": run["steps"],
        "proposed_tokens": prop,
        "accepted_tokens": acc,
        "verifications": ver,
        "acceptance_rate": acc / prop if prop else None,
        "mean_accepted_len": acc / ver if ver else None,
    }
    if base is None:
        row.update(
            speedup=1.0,
            baseline_output_tok_s=row["output_tok_s"],
            lossless_share=1.0,
            matching_token_share=1.0,
        )
    else:
        equal, prefix = same_tokens(run["tokens"], base["tokens"])
        row.update(
            speedup=row["output_tok_s"] / base["row"]["output_tok_s"],
            baseline_output_tok_s=base["row"]["output_tok_s"],
            lossless_share=equal,
            matching_token_share=prefix,
        )
    return row


def best_draft(rows: list[dict], goal: float) -> dict:
    """The best draft-model speedup at batch 1 on held-out files, against the goal; and its
    speed over multi-step decoding's (without speculation) where that was timed."""
    here = [r for r in rows if r["batch"] == 1 and r["workload"] == "held-out"]
    cands = [r for r in here if r["method"] in DRAFT_METHODS]
    if not cands:
        return {
            "goal": goal,
            "speedup": None,
            "k": None,
            "method": None,
            "met": None,
            "vs_multi_step": None,
        }
    r = max(cands, key=lambda r: r["speedup"])
    multi = next((m for m in here if m["method"] == "multi-step"), None)
    return {
        "goal": goal,
        "speedup": r["speedup"],
        "k": r["k"],
        "method": r["method"],
        "met": r["speedup"] >= goal,
        "vs_multi_step": r["output_tok_s"] / multi["output_tok_s"] if multi else None,
    }


def _line(row: dict) -> str:
    acc, mal = row["acceptance_rate"], row["mean_accepted_len"]
    return (
        f"{row['workload']:>12} batch {row['batch']:>3} {row['method']:>11} k={row['k']}: "
        f"{row['output_tok_s']:,.1f} tok/s, {row['ms_per_token']:.2f} ms/token, "
        f"{row['speedup']:.2f}x, acceptance {'n/a' if acc is None else f'{acc:.2f}'}, "
        f"accepted len {'n/a' if mal is None else f'{mal:.2f}'}, "
        f"same tokens {round(row['lossless_share'] * row['requests'])}/{row['requests']}"
    )


# --- the run -------------------------------------------------------------------------------------


def _model_shape(folder: Path) -> dict:
    c = json.loads((folder / "config.json").read_text())
    keys = (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
        "vocab_size",
        "max_position_embeddings",
    )
    return {k: c.get(k) for k in keys}


def run(cfg: SpecBenchConfig) -> dict:
    from tokenizers import Tokenizer

    from shared.cli import writable_dir
    from shared.progress import progress
    from shared.repeat import merge_runs, repetition_order

    from .baselines import free_cuda

    target, draft, record = check_models(cfg.models_dir)
    if cfg.reports_dir:
        writable_dir("reports_dir", cfg.reports_dir)
    start = offline._gpu_state()  # clocks, temperature and power before the engines run
    tok = Tokenizer.from_file(str(target / "tokenizer.json"))
    held, root = heldout_files(record, tok)
    wls = build_workloads(cfg, tok, held, root)
    max_len = max(w["prompt_len_max"] for w in wls.values()) + cfg.max_tokens
    # positions past the last token
    ahead = max((*cfg.ks, *cfg.fused_ks, *cfg.ngram_ks, cfg.multi_step)) + 1
    if cfg.rounds_ks:  # a program of rounds runs only with room for all of them
        ahead = max(ahead, cfg.fused_rounds * (max(cfg.rounds_ks) + 1))
    max_len += ahead
    limit = _model_shape(target)["max_position_embeddings"] or max_len
    if max_len > limit:
        raise ValueError(
            f"prompt_tokens, max_tokens: sequences reach {max_len} positions, the target takes "
            f"{limit}"
        )
    plan = engine_plan(cfg)
    engines: list[dict] = []
    ctx: dict = {}
    # every repetition's rows, keyed (workload, batch, method, k), in the plan's order
    reps: list[dict[tuple, dict]] = []
    total = len(plan) * len(wls) * len(cfg.batches) * cfg.repeats
    with progress(total, "spec bench", unit="run", every=1) as bar:
        for r in range(cfg.repeats):
            runs: dict[tuple, dict] = {}
            for method, k in repetition_order(plan, r):
                t0 = time.perf_counter()
                llm = build_llm(cfg, target, draft, method, k, max_len)
                build_s = time.perf_counter() - t0
                ctx = {
                    "device": str(llm.engine.device),
                    "dtype": str(llm.engine.dtype).removeprefix("torch."),
                }
                if cfg.warmup_tokens:
                    for w in wls.values():
                        b = max(cfg.batches)
                        timed_run(llm, w["prompts"][:b], b, cfg.warmup_tokens)
                if r == 0:
                    stats = llm.engine.stats()
                    engines.append(
                        {
                            "method": method,
                            "k": k,
                            "build_s": build_s,
                            "cuda_graph_sizes": stats.get("cuda_graph_sizes"),
                            "num_kv_blocks": stats.get("num_kv_blocks"),
                        }
                    )
                for wname, w in wls.items():
                    for b in cfg.batches:
                        runs[(wname, b, method, k)] = timed_run(
                            llm, w["prompts"], b, cfg.max_tokens
                        )
                        bar.advance(status=f"{method} k={k} (repetition {r + 1})")
                del llm
                free_cuda()
            rows_r = {}
            for method, k in plan:  # the baseline first: every row's speedup is over it
                for wname in wls:
                    for b in cfg.batches:
                        base = runs[(wname, b, "none", 0)]
                        rows_r[(wname, b, method, k)] = summarise(
                            runs[(wname, b, method, k)],
                            workload=wname,
                            batch=b,
                            method=method,
                            k=k,
                            max_tokens=cfg.max_tokens,
                            base=None
                            if method == "none"
                            else {"tokens": base["tokens"], "row": rows_r[(wname, b, "none", 0)]},
                        )
                        if method == "draft-rounds":
                            rows_r[(wname, b, method, k)]["rounds"] = cfg.fused_rounds
            reps.append(rows_r)
            for row in rows_r.values():
                bar.log(_line(row) + (f" (repetition {r + 1})" if cfg.repeats > 1 else ""))
    rows = [merge_runs([rr[key] for rr in reps], REPEATED) for key in reps[0]]
    bases = {(r["workload"], r["batch"]): r for r in rows if r["method"] == "none"}
    res = {
        "context": {
            **ctx,
            "target": _model_shape(target),
            "draft": _model_shape(draft),
            "train": {
                n: {
                    f: m.get(f)
                    for f in ("params", "train_loss", "heldout_loss", "distill", "top1_agreement")
                    if f in m
                }
                for n, m in record.get("models", {}).items()
            },
            "train_steps": record["config"].get("max_steps"),
            "vocab_size": record.get("vocab_size"),
            "heldout_files": len(held),
            "corpus": record["config"].get("corpus_dir") or "the standard library's .py files",
            "separator": SEPARATOR,
            "max_model_len": max_len,
        },
        "workloads": {n: {k: v for k, v in w.items() if k != "prompts"} for n, w in wls.items()},
        "engines": engines,
        "rows": rows,
        "repeats": cfg.repeats,
        "best_batch1_draft": best_draft(rows, cfg.goal_speedup),
        "note": "speedup: output tok/s over the engine without speculation on the same workload "
        "and batch, same run; multi-step: that engine at k decode steps per host round trip, "
        "for reference; mean_accepted_len: accepted drafts per verification (each also "
        "emits one token of the target's); lossless_share: requests whose tokens equal the "
        "engine without speculation's exactly; with repeats > 1, output_tok_s, ms_per_token, "
        "wall_s and speedup (each repetition's over its own baseline) are medians, with _min, "
        "_max and _reps",
    }
    offline._save(
        cfg,
        NAME,
        res,
        baseline={f"{w}/batch {b}": v["output_tok_s"] for (w, b), v in bases.items()},
        gpu_state_start=start,
    )
    offline._table(
        "speculative decoding (output tok/s; speedup over no speculation, same workload and batch)",
        rows,
        [
            ("workload", "workload"),
            ("batch", "batch"),
            ("method", "method"),
            ("k", "k"),
            ("output_tok_s", "tok/s"),
            ("ms_per_token", "ms/token"),
            ("speedup", "speedup"),
            ("acceptance_rate", "acceptance"),
            ("mean_accepted_len", "accepted len"),
            ("lossless_share", "same tokens"),
        ],
    )
    best = res["best_batch1_draft"]
    if best["speedup"] is not None:
        vs = best["vs_multi_step"]
        print(
            f"best batch-1 draft speedup on held-out files: {best['speedup']:.2f}x at "
            f"k={best['k']}, {best['method']} (goal >= {best['goal']}x: {'met' if best['met'] else 'missed'})"
            + (f"; {vs:.2f}x multi-step decoding's speed" if vs else "")
        )
    return res


def main(argv: list[str] | None = None) -> dict:
    from shared.cli import main_guard, parse_dataclass

    @main_guard
    def _main() -> dict:
        cfg = parse_dataclass(SpecBenchConfig, argv, prog=f"python -m {offline.PROJECT}.bench.spec")
        return run(cfg)

    return _main()


if __name__ == "__main__":
    main()
