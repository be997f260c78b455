"""`results.md` and charts from the offline benchmark records (JSON alone: no GPU, no rerun).

    python -m project04_llm_inference.report.render runs/<time>

Reads `<reports_dir>/project04_llm_inference/*.json` (or `<reports_dir>/*.json` when the folder
holds the records itself), writes `results.md`, `decode_latency.png` and `throughput.png` beside
them and returns their paths. A record that is missing leaves its section and targets as
"not measured", never as a number. A figure measured over repetitions (its `_min`, `_max` and
`_reps` fields beside it, `shared.repeat.flat`) shows as "median (min–max)"; a record of one
run renders as it always did.
"""

from __future__ import annotations

import sys
from pathlib import Path

from project04_llm_inference import PROJECT
from shared.hardware import get_gpu
from shared.repeat import range_text, ranged
from shared.results import atomic_write_text, environment_line, load_result, markdown_table

RECORDS = (
    "offline_throughput",
    "decode_latency",
    "kv_memory",
    "prefix_caching",
    "decode_attention",
    "gemv_kernel",
    "gemv_kernel_mma",
    "prefill_attention",
    "spec_decode",  # the full plan on the engine's default path (rounds), k = 2..8
    "spec_decode_fused",  # the first full plan: the one-round fused step and the unfused step
    "spec_decode_rounds",  # a later, smaller plan: the fused step in rounds against one round
    "spec_decode_rounds_k4",  # the same at k = 4, batch 1 and 8, both workloads, another host
    "spec_decode_rows",  # rounds (the default) after the verification became decode rows
    "serving",
)
# The decode kernel's target is a share of the H200's device-to-device copy bandwidth (read +
# write), TB/s, from the hardware table.
COPY_TB_S = get_gpu("h200-sxm").copy_bandwidth() / 1e12
SYSTEMS = {
    "engine": "this engine",
    "engine_single_step": "this engine, one step per round trip",
    "vllm": "vLLM",
    "static_cuda_graph": "static CUDA graph",
    "transformers": "transformers generate",
}


def _tidy(v):
    """Numbers for a table: whole units from 100 up (16,034 not 1.6e+04), else 3 significant."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return v
    return float(round(v)) if abs(v) >= 100 else float(f"{v:.3g}")


def _table(rows: list[dict], columns=None, headers=None) -> str:
    rows = [{k: _tidy(v) for k, v in r.items()} for r in rows]
    return markdown_table(rows, columns, headers=headers, floatfmt=",.7g")


def _num(v: float) -> str:
    """A number as _table writes it."""
    return format(_tidy(float(v)), ",.7g")


def _folder(reports_dir: Path) -> Path:
    sub = Path(reports_dir) / PROJECT
    return sub if sub.is_dir() else Path(reports_dir)


def load_records(reports_dir: str | Path) -> dict[str, dict]:
    folder = _folder(Path(reports_dir))
    return {
        n: load_result(folder / f"{n}.json") for n in RECORDS if (folder / f"{n}.json").exists()
    }


def _latency_row(recs: dict, batch: int, context: int) -> dict | None:
    rows = recs.get("decode_latency", {}).get("results", {}).get("rows", [])
    return next((r for r in rows if r["batch"] == batch and r["context"] == context), None)


def _target(text: str, measured, unit: str, ok, span=None) -> dict:
    """ok: a predicate on the measured value (the median); None measured means 'not measured'.
    span: (min, max) over repetitions when the record has them."""
    return {
        "target": text,
        "measured": measured,
        "unit": unit,
        "range": span,
        "met": None if measured is None else bool(ok(measured)),
    }


def _span(r: dict | None, key: str, f=lambda v: v) -> tuple[float, float] | None:
    """(min, max) of f over figure `key`'s repetitions, when the record has two or more."""
    if not r or r.get(f"{key}_min") is None or len(r.get(f"{key}_reps") or ()) < 2:
        return None
    return tuple(sorted((f(r[f"{key}_min"]), f(r[f"{key}_max"]))))


def _best(r: dict | None) -> tuple[float | None, str, str]:
    """The engine's faster configuration at a latency row: (ms per step, which, its field)."""
    if not r:
        return None, "", ""
    got = [
        (r.get("engine_ms"), "one step per round trip", "engine_ms"),
        (
            r.get("engine_multi_ms"),
            f"{r.get('multi_step_k')} steps per round trip",
            "engine_multi_ms",
        ),
    ]
    got = [g for g in got if g[0] is not None]
    if len(got) == 1 and r.get("engine_multi_ms") is None:
        return got[0][0], "", got[0][2]  # a record without multi-step: nothing to choose between
    return min(got) if got else (None, "", "")


def _best_ms(r: dict | None) -> tuple[float | None, str]:
    """The engine's faster configuration at a latency row: (ms per step, which)."""
    ms, how, _ = _best(r)
    return ms, how


def targets(recs: dict[str, dict]) -> list[dict]:
    """The project's targets, each with its measured value and met / missed / not measured. The
    decode targets take the engine's faster configuration (named in the unit column)."""
    out = []
    for ctx in (1024, 8192):
        row = _latency_row(recs, 1, ctx)
        ms, how, key = _best(row)
        out.append(
            _target(
                f"batch-1 decode <= 0.80 ms/token at context {ctx:,}",
                ms,
                f"ms/token{', ' + how if how else ''}",
                lambda v: v <= 0.80,
                _span(row, key),
            )
        )
    for b, goal in ((64, 40_000), (256, 65_000)):
        row = _latency_row(recs, b, 1024)
        ms, how, key = _best(row)
        out.append(
            _target(
                f"decode >= {goal // 1000}k tok/s at batch {b}, context 1,024",
                b / ms * 1e3 if ms else None,
                f"tok/s{', ' + how if how else ''}",
                lambda v, g=goal: v >= g,
                _span(row, key, lambda v, b=b: b / v * 1e3),
            )
        )
    eng = recs.get("offline_throughput", {}).get("results", {}).get("engine", {})
    out.append(
        _target(
            "offline throughput >= 30k output tok/s",
            eng.get("output_tok_s"),
            "output tok/s",
            lambda v: v >= 30_000,
            _span(eng, "output_tok_s"),
        )
    )
    long_rows = [
        r
        for r in recs.get("decode_attention", {}).get("results", {}).get("rows", [])
        if r.get("batch") in (64, 256) and r.get("context", 0) >= 8192 and r.get("ours_gbps")
    ]
    worst_row = min(long_rows, key=lambda r: r["ours_gbps"], default=None)
    worst = worst_row["ours_gbps"] / 1e3 / COPY_TB_S * 100 if worst_row else None
    out.append(
        _target(
            "paged decode kernel >= 80% of the copy bandwidth (batch 64/256, context >= 8k)",
            worst,
            f"% of {COPY_TB_S:.1f} TB/s (worst shape)",
            lambda v: v >= 80,
            _span(worst_row, "ours_gbps", lambda v: v / 1e3 / COPY_TB_S * 100),
        )
    )
    un = recs.get("prefix_caching", {}).get("results", {}).get("unshared", {})
    out.append(
        _target(
            "prefix caching costs <= 2% when nothing is shared",
            un.get("overhead_pct"),
            "% wall time",
            lambda v: v <= 2.0,
            _span(un, "overhead_pct"),
        )
    )
    return out


def _target_rows(tg: list[dict]) -> list[dict]:
    """Targets as table rows: the measured cell is 'median (min–max)' where there is a range."""
    return [
        {**t, "measured": range_text(t["measured"], *t["range"], _num)}
        if t.get("range") and t["measured"] is not None
        else t
        for t in tg
    ]


def _ranges_note(tg: list[dict]) -> str:
    if not any(t.get("range") for t in tg):
        return ""
    return (
        "Measured: the median of repeated runs, their min–max range in parentheses (ours and "
        "its baseline interleaved where the record says so).\n\n"
    )


def _status(met) -> str:
    return "not measured" if met is None else ("met" if met else "missed")


def _env_lines(recs: dict) -> list[str]:
    return [f"- `{n}`: {environment_line(r['environment'])}" for n, r in recs.items()]


def _steps_note(r: dict) -> str:
    k = r.get("num_scheduler_steps")
    return f"{k} decode step{'s' if k != 1 else ''} per host round trip" if k else ""


def _throughput_md(rec: dict) -> str:
    res = rec["results"]
    w = res["workload"]
    rows = []
    for key, label in SYSTEMS.items():
        r = res.get(key) or {"measured": False, "reason": "absent from the record"}
        rows.append(
            {
                "system": label,
                "requests": r.get("requests"),
                "output tok/s": ranged(r, "output_tok_s", _num),
                "total tok/s": ranged(r, "total_tok_s", _num),
                "wall s": ranged(r, "wall_s", _num),
                "engine ÷ this (x)": res.get("ratios", {}).get(f"engine_vs_{key}"),
                "note": r.get("subsample") or r.get("reason") or _steps_note(r),
            }
        )
    head = (
        f"{w['requests']:,} requests, prompts {w['prompt_len_min']}-{w['prompt_len_max']} "
        f"tokens, outputs {w['output_len_min']}-{w['output_len_max']} tokens (every request "
        "runs to its length); rates are useful tokens over wall time."
    )
    sc = res.get("static_cuda_graph", {})
    if sc.get("measured"):
        head += (
            f" Static batching computed {sc['computed_output_tokens']:,} output tokens for "
            f"{sc['output_tokens']:,} useful ({sc['output_waste_fraction']:.0%} waste)."
        )
    return f"## Offline throughput\n\n{head}\n\n{_table(rows)}\n"


def _latency_md(rec: dict) -> str:
    res = rec["results"]
    cols = [
        "batch",
        "context",
        "engine_ms",
        "engine_tok_s",
        "static_cuda_graph_ms",
        "static_cuda_graph_tok_s",
        "floor_ms",
        "engine_vs_floor",
        "engine_pure_steps",
    ]
    heads = [
        "batch",
        "context (tokens)",
        "engine (ms/step)",
        "engine (tok/s)",
        "static CUDA graph (ms/step)",
        "static CUDA graph (tok/s)",
        "bandwidth floor (ms)",
        "engine / floor",
        "steps timed",
    ]
    k = next((r["multi_step_k"] for r in res["rows"] if r.get("multi_step_k")), None)
    if k:
        cols[4:4] = ["engine_multi_ms", "engine_multi_tok_s"]
        heads[4:4] = [f"engine, {k} steps/sync (ms/step)", f"engine, {k} steps/sync (tok/s)"]
        if any(r.get("engine_multi_sync_ms") is not None for r in res["rows"]):
            cols[6:6] = ["engine_multi_sync_ms"]
            heads[6:6] = [f"engine, {k} steps/sync, next run not queued ahead (ms/step)"]
    floor = (
        f"Floor: {res['weight_bytes'] / 1e9:.2f} GB of weights ({res['params'] / 1e9:.3f} B "
        f"params, bf16) + batch x context x {res['kv_bytes_per_token']:,} B of KV per step, "
        f"over {res['bandwidth_tb_s']} TB/s."
    )
    rows = [{**r, **{c: ranged(r, c, _num) for c in cols}} for r in res["rows"]]
    table = _table(rows, cols, heads)
    return f"## Decode latency\n\n{floor} {res.get('note', '')}\n\n{table}\n"


def _memory_md(rec: dict) -> str:
    r = rec["results"]
    rows = [
        {
            "allocation": "paged (measured peak running sequences)",
            "sequences": r["paged_peak_running_seqs"],
        },
        {
            "allocation": f"static, {r['max_model_len']:,} tokens reserved each (computed)",
            "sequences": r["static_max_seqs"],
        },
    ]
    cap = (
        " The peak hit max_num_seqs: the cap, not memory, bound it."
        if r.get("paged_capped_by_max_num_seqs")
        else ""
    )
    return (
        f"## KV memory\n\nBudget: {r['budget_bytes'] / 2**30:.2f} GiB = {r['budget_tokens']:,} "
        f"tokens ({r['num_kv_blocks']} blocks x {r['block_size']}, {r['kv_bytes_per_token']:,} "
        f"B/token). Paged holds {r['paged_vs_static'] or 0:.1f}x the sequences; "
        f"{r.get('num_preemptions')} preemptions.{cap}\n\n{_table(rows)}\n"
    )


def _prefix_md(rec: dict) -> str:
    r = rec["results"]
    rows = [
        {
            "prefix caching": k,
            **{
                n: r["shared"][k].get(n)
                for n in (
                    "prefill_tokens_computed",
                    "prefix_cache_hit_tokens",
                    "output_tok_s",
                    "wall_s",
                )
            },
        }
        for k in ("off", "on")
    ]
    heads = [
        "prefix caching",
        "prefill tokens computed",
        "cache hits (tokens)",
        "output tok/s",
        "wall s",
    ]
    un = r["unshared"]
    runs = f"median of {len(un['off']['wall_s'])} runs each"
    if _span(un, "overhead_pct"):
        runs = (
            f"median of {len(un['overhead_pct_reps'])} paired runs, "
            f"{un['overhead_pct_min']:+.2f}% to {un['overhead_pct_max']:+.2f}%"
        )
    return (
        f"## Prefix caching\n\nShared prefix: {r['shared'].get('prompt_tokens', 0):,} prompt "
        f"tokens; caching on is {r['shared']['speedup']:.2f}x faster in wall time.\n\n"
        f"{_table(rows, list(rows[0]), heads)}\n\nNothing shared: caching on "
        f"costs {un['overhead_pct']:+.2f}% wall time ({runs}; "
        f"target <= {un['target_pct']}%). TTFT: {r.get('ttft_note')}.\n"
    )


def _decode_kernel_md(rec: dict) -> str:
    def us(v):
        return v * 1e3

    def pct(v):
        return v / 43

    rows = [
        {
            "batch": r["batch"],
            "context": r["context"],
            "ours (us)": ranged(r, "ours_ms", _num, us),
            "ours (GB/s)": ranged(r, "ours_gbps", _num),
            f"% of {COPY_TB_S:.1f} TB/s": ranged(r, "ours_gbps", _num, pct),
            "SDPA (us)": ranged(r, "sdpa_ms", _num, us),
            "SDPA (GB/s)": ranged(r, "sdpa_gbps", _num),
            "ours / SDPA speed (x)": ranged(r, "speedup_vs_sdpa", _num),
            "splits": r.get("num_splits"),
        }
        for r in rec["results"]["rows"]
        if "skipped" not in r
    ]
    return (
        "## Paged decode attention kernel\n\nOne query token per sequence over its paged "
        "K/V (block size 16, Llama-3.2-1B attention: 32 query / 8 KV heads of 64, bf16), "
        "one layer. Bytes: every context token's K and V read once, plus q and out. "
        "Baseline: SDPA with `enable_gqa=True` over a contiguous (B, Hkv, S, D) cache of the "
        "same tokens, in the same process. "
        + (
            "Both timed by replaying a CUDA graph of the call (GPU time, as in the engine)."
            if rec.get("config", {}).get("timing") == "cuda_graph"
            else "Both timed one Python call at a time: at small shapes the figure is the "
            "host's launch time, not the kernel's (re-measured with graph replay since)."
        )
        + "\n\n"
        + _table(rows)
        + "\n"
    )


def _gemv_kernel_md(rec: dict, mma: bool = False) -> str:
    kernel = "tensor-core GEMV" if mma else "GEMV kernel"
    rows = [
        {
            "projection": r["name"],
            "tokens": r["tokens"],
            "weight": f"{r['rows']} x {r['k']}",
            "folded in": {"norm": "RMSNorm", "norm_silu": "RMSNorm, silu-and-mul"}.get(
                r["fold"], ""
            ),
            "path": kernel if r.get("uses_gemv_kernel") else "cuBLAS (dispatch)",
            "ours (us)": ranged(r, "ours_us", _num),
            "ours (GB/s)": ranged(r, "ours_gbps", _num),
            "cuBLAS (us)": ranged(r, "cublas_us", _num),
            "cuBLAS (GB/s)": ranged(r, "cublas_gbps", _num),
            "ours / cuBLAS speed (x)": ranged(r, "speedup_vs_cublas", _num),
        }
        for r in rec["results"]["rows"]
    ]
    if mma:
        head = (
            "## Decode-step projections of 3-8 tokens (tensor-core GEMV)\n\nThe same "
            "measurement for three to eight tokens (a speculative verification, a decode batch "
            "of 3-8) with the kernel's tensor-core variant (`mma.sync` m16n8k16, the streamed "
            "weight as the A operand, the staged tokens as B), which the engine runs for "
            f"3..{rec['results'].get('mma_max_tokens')} tokens (`kernels.gemv.MMA_MAX_TOKENS`). "
        )
        return head + _gemv_rest(rec, rows)
    return (
        "## Decode-step projections (GEMV kernel)\n\nEach projection of a Llama-3.2-1B "
        "layer and the LM head for a few tokens, bf16, L2 flushed between runs. Ours: one "
        "launch of `csrc/gemv.cu`, with the RMSNorm (and residual add) in front and "
        "silu-and-mul behind where the engine folds them in. Baseline, same process: cuBLAS "
        "(`F.linear`) with the separate fused add+RMSNorm and silu-and-mul kernels, as the "
        "engine ran them before. Rows whose path is cuBLAS are beyond the kernel's row "
        "limit: there ours is the baseline's path (the engine's dispatch). Bytes: the weight "
        "plus the activations read and written once.\n\n"
        + _table(rows)
        + "\n"
        + _gemv_fp8_md(rec)
        + _gemv_chain_md(rec)
    )


def _gemv_fp8_md(rec: dict) -> str:
    fp8 = rec["results"].get("fp8_rows") or []
    if not fp8:
        return ""
    path = {"gemv": "FP8 GEMV", "scaled_mm": "_scaled_mm", "reference": "reference"}
    rows = [
        {
            "projection": r["name"],
            "tokens": r["tokens"],
            "weight": f"{r['rows']} x {r['k']}",
            "path": path.get(r["path"], r["path"]),
            "ours (us)": ranged(r, "ours_us", _num),
            "ours (GB/s)": ranged(r, "ours_gbps", _num),
            "share of copy bandwidth": r["copy_share"],
            "_scaled_mm path (us)": ranged(r, "scaled_mm_us", _num),
            "ours / _scaled_mm speed (x)": ranged(r, "speedup_vs_scaled_mm", _num),
            "ours / bf16 GEMV speed (x)": r["speedup_vs_bf16"],
        }
        for r in fp8
    ]
    return (
        "\nThe same projections with FP8 weights (e4m3, one float32 scale per row, as "
        "`--quantization fp8` loads them; the LM head stays bf16). Ours: the engine's "
        "dispatch, the GEMV kernel's FP8 variant (bf16 activations, W8A16) at one and two "
        "tokens and `torch._scaled_mm` (W8A8) from three on. Baseline, same process: the "
        "separate norm kernel, `torch._scaled_mm` with per-token activation scales and "
        "silu-and-mul, as FP8 ran before the variant. Bytes: the e4m3 weight, its scales and "
        "the activations; the share is of the copy bandwidth of "
        f"{rec['results'].get('copy_ceiling_gpu', 'the H200')}. The last column: the bf16 "
        "row's time over this one's.\n\n" + _table(rows) + "\n"
    )


def _gemv_rest(rec: dict, rows: list[dict]) -> str:
    return (
        "Baseline, same process: cuBLAS with the separate add+RMSNorm and silu-and-mul "
        "kernels. Bytes: the weight plus the activations read and written once.\n\n"
        + _table(rows)
        + "\n"
        + _gemv_chain_md(rec)
    )


def _gemv_chain_md(rec: dict) -> str:
    chain = rec["results"].get("chain") or []
    if not chain:
        return ""
    rows = [
        {
            "tokens": r["tokens"],
            "layers": r["layers"],
            "weights (GB)": r["bytes"] / 1e9,
            "GEMV + PDL (us)": ranged(r, "gemv_pdl_us", _num),
            "GEMV + PDL (GB/s)": ranged(r, "gemv_pdl_gbps", _num),
            "GEMV, ordinary launches (us)": ranged(r, "gemv_us", _num),
            "cuBLAS path (us)": ranged(r, "cublas_us", _num),
            "PDL speedup (x)": ranged(r, "pdl_speedup", _num),
            "vs cuBLAS path (x)": ranged(r, "pdl_speedup_vs_cublas", _num),
            "PDL output bitwise equal": "yes" if r.get("pdl_bitwise_equal") else "NO",
            **(
                {
                    "FP8 GEMV + PDL (us)": ranged(r, "fp8_gemv_pdl_us", _num),
                    "FP8 vs bf16 GEMV + PDL (x)": ranged(r, "fp8_speedup_vs_bf16", _num),
                }
                if any("fp8_gemv_pdl_us" in c for c in chain)
                else {}
            ),
        }
        for r in chain
    ]
    return (
        "\nThe four projections of every layer back to back, as a decode step runs them (no "
        "attention between them), each variant captured in one CUDA graph and timed by replaying "
        "it: the GEMV kernel with programmatic dependent launch (each kernel starts while the "
        "one before it finishes and issues its first weight loads before waiting for its "
        "inputs; the engine's default on sm_90), the same kernel with ordinary launches, and "
        "the cuBLAS path (cuBLAS with the separate norm and activation kernels)."
        + (
            " FP8: the GEMV kernel's FP8 variant with PDL on the same weights quantized to "
            "e4m3; its ratio is the bf16 GEMV + PDL time over its own."
            if any("fp8_gemv_pdl_us" in c for c in chain)
            else ""
        )
        + "\n\n"
        + _table(rows)
        + "\n"
    )


def _prefill_kernel_md(rec: dict) -> str:
    cols = {
        "ours (TFLOP/s)": "ours_tflops",
        "SDPA per sequence (TFLOP/s)": "sdpa_per_seq_tflops",
        "SDPA padded batch (TFLOP/s)": "sdpa_padded_tflops",
        "ours vs per-sequence (x)": "speedup_vs_sdpa_per_seq",
        "ours vs padded (x)": "speedup_vs_sdpa_padded",
    }
    rows = [
        {
            "workload": r["workload"],
            "query tokens": r["q_tokens"],
            **{head: ranged(r, key, _num) for head, key in cols.items()},
        }
        for r in rec["results"]["rows"]
    ]
    return (
        "## Paged prefill attention kernel\n\nChunked prefill over the paged cache, causal "
        "aligned bottom-right, ragged batches packed (no padding); FLOPs counted from the mask. "
        "Baselines: SDPA's FLASH backend per sequence on K/V already gathered to contiguous "
        "tensors, and over one padded batch.\n\n" + _table(rows) + "\n"
    )


def _charts(recs: dict, folder: Path) -> list[Path]:
    from shared import charts

    paths = []
    lat = recs.get("decode_latency")
    if lat:
        rows, series = lat["results"]["rows"], {}
        for ctx in sorted({r["context"] for r in rows}):
            rs = sorted((r for r in rows if r["context"] == ctx), key=lambda r: r["batch"])
            for key, label in (
                ("engine_ms", "engine"),
                ("engine_multi_ms", "engine, multi-step"),
                ("static_cuda_graph_ms", "static CUDA graph"),
                ("floor_ms", "bandwidth floor"),
            ):
                pts = [(r["batch"], r[key]) for r in rs if r.get(key) is not None]
                if pts:
                    series[f"{label}, context {ctx:,}"] = tuple(zip(*pts))
        paths.append(
            charts.line_chart(
                folder / "decode_latency.png",
                series,
                title="Decode step time vs batch size",
                xlabel="batch (sequences)",
                ylabel="ms per decode step",
                logx=True,
                logy=True,
                footnote=environment_line(lat["environment"]),
            )
        )
    dec = recs.get("decode_attention")
    if dec:
        rows, series = [r for r in dec["results"]["rows"] if r.get("ours_gbps")], {}
        for b in sorted({r["batch"] for r in rows}):
            rs = sorted((r for r in rows if r["batch"] == b), key=lambda r: r["context"])
            series[f"ours, batch {b}"] = (
                [r["context"] for r in rs],
                [r["ours_gbps"] / 1e3 for r in rs],
            )
            series[f"SDPA, batch {b}"] = (
                [r["context"] for r in rs],
                [r["sdpa_gbps"] / 1e3 for r in rs],
            )
        series[f"copy bandwidth {COPY_TB_S:.1f} TB/s"] = ([1024, 32768], [COPY_TB_S, COPY_TB_S])
        paths.append(
            charts.line_chart(
                folder / "decode_kernel_bandwidth.png",
                series,
                title="Paged decode attention: achieved HBM bandwidth",
                xlabel="context (tokens)",
                ylabel="TB/s",
                logx=True,
                footnote=environment_line(dec["environment"]),
            )
        )
    thr = recs.get("offline_throughput")
    if thr:
        res = thr["results"]
        got = [
            (label, res[k]["output_tok_s"])
            for k, label in SYSTEMS.items()
            if (res.get(k) or {}).get("measured")
        ]
        if got:
            paths.append(
                charts.bar_chart(
                    folder / "throughput.png",
                    [g[0] for g in got],
                    [g[1] for g in got],
                    title="Offline throughput, same requests",
                    ylabel="output tok/s",
                    baseline=30_000,
                    baseline_label="target 30k tok/s",
                    footnote=environment_line(thr["environment"]),
                )
            )
    return paths


def render(reports_dir: str | Path) -> list[Path]:
    """Write results.md and the charts next to the records; return the written paths."""
    folder = _folder(Path(reports_dir))
    recs = load_records(reports_dir)
    if not recs:
        raise FileNotFoundError(
            f"no project04 benchmark records ({', '.join(RECORDS)}) in {folder}"
        )
    charts = _charts(recs, folder) + _spec_charts(recs, folder) + _serving_charts(recs, folder)
    tg = [{**t, "status": _status(t["met"])} for t in targets(recs)]
    parts = [
        "# project04: offline inference benchmarks\n",
        "Llama-3.2-1B shape, dummy weights, bf16, greedy. Environment of each record:\n",
        "\n".join(_env_lines(recs)) + "\n",
        "## Targets\n",
        _ranges_note(tg)
        + _table(_target_rows(tg), ["target", "measured", "unit", "status"])
        + "\n",
    ]
    for name, fn in (
        ("offline_throughput", _throughput_md),
        ("decode_latency", _latency_md),
        ("kv_memory", _memory_md),
        ("prefix_caching", _prefix_md),
        ("decode_attention", _decode_kernel_md),
        ("gemv_kernel", _gemv_kernel_md),
        ("prefill_attention", _prefill_kernel_md),
    ):
        parts.append(fn(recs[name]) if name in recs else f"## {name}\n\nnot measured: no record.\n")
        if name == "gemv_kernel" and "gemv_kernel_mma" in recs:
            parts.append(_gemv_kernel_md(recs["gemv_kernel_mma"], mma=True))
    if "spec_decode" in recs:
        parts.append(_spec_md(recs["spec_decode"]))
    parts += [_spec_md(recs[name], title) for name, title in SPEC_EXTRA.items() if name in recs]
    if "serving" in recs:
        parts.append(_serving_md(recs["serving"]))
    parts += [f"![{p.stem}]({p.name})\n" for p in charts]
    md = atomic_write_text(folder / "results.md", "\n".join(parts))
    summary = atomic_write_text(
        folder / "summary.md",
        _summary(recs, tg, folder) + _spec_summary(recs) + _serving_summary(recs),
    )
    return [md, summary, *charts]


def _summary(recs: dict, tg: list[dict], folder: Path) -> str:
    """summary.md: the targets, met or missed, and where the details are."""
    env = next(iter(recs.values()))["environment"]
    return (
        f"**Inference engine, Llama-3.2-1B shape, dummy weights, bf16** ({environment_line(env)}):\n\n"
        + _ranges_note(tg)
        + _table(_target_rows(tg), ["target", "measured", "unit", "status"])
        + "\n\n"
        + "Details, baselines and charts: [results.md](results.md).\n"
    )


# --- speculative decoding (bench/spec.py) ---------------------------------------------------------

SPEC_METHODS = {
    "none": "no speculation",
    "multi-step": "no speculation, multi-step",
    "draft": "draft model",
    "draft-fused": "draft model, fused step",
    "draft-rounds": "draft model, fused step in rounds",
    "ngram": "n-gram lookup",
}
# The workload each method is made for: its line in the chart.
SPEC_HOME = {
    "draft": "held-out",
    "draft-fused": "held-out",
    "draft-rounds": "held-out",
    "ngram": "code-editing",
}


def _spec_context(res: dict) -> str:
    from shared.progress import human_count

    c, t, d = res["context"], res["context"]["target"], res["context"]["draft"]

    def shape(m: dict, name: str) -> str:
        p = c.get("train", {}).get(name, {}).get("params")
        size = f"{human_count(p)} params, " if p else ""
        n = m["num_hidden_layers"]
        return (
            f"{size}{n} layer{'s' * (n != 1)}, dim {m['hidden_size']}, "
            f"{m['num_attention_heads']}/{m['num_key_value_heads']} heads"
        )

    def span(v: dict) -> str:
        lo, hi = v["prompt_len_min"], v["prompt_len_max"]
        return f"{lo}" if lo == hi else f"{lo}-{hi}"

    dr = c.get("train", {}).get("draft", {})
    agree = ""
    if "top1_agreement" in dr:  # records from before it was measured say nothing
        how = (
            f" (distilled from the target, KL weight {dr['distill']:g})"
            if dr.get("distill")
            else ""
        )
        agree = (
            f" The draft's{how} top-1 agreement with the target on held-out windows: "
            f"{dr['top1_agreement']:.3f}."
        )
    w = res["workloads"]
    lens = "; ".join(f"{n}: {v['requests']} prompts of {span(v)} tokens" for n, v in w.items())
    new = next((r["output_tokens"] // r["requests"] for r in res["rows"] if r["requests"]), 0)
    return (
        f"Target ({shape(t, 'target')}) and draft ({shape(d, 'draft')}) trained on "
        f"{c.get('corpus')} ({c.get('vocab_size')}-token BPE); prompts from the "
        f"{c.get('heldout_files')} files training held out ({lens}); greedy, {new} new tokens "
        f"per request; {c.get('dtype')} on {c.get('device')}. Speedup: output tok/s over the "
        "same engine without speculation on the same workload and batch, measured in the same "
        "run. Acceptance: accepted / proposed drafts; accepted length: accepted drafts per "
        "verification (each verification also emits one token of the target's). Same "
        "tokens: requests whose tokens equal the engine without speculation's exactly. "
        "Multi-step (for reference): the engine without speculation running k decode steps "
        "per host round trip."
        + (
            " Fused step (EngineArgs.spec_fused_greedy): the draft's catch-up and k - 1 steps, "
            "the verification and the greedy acceptance as one device program (a CUDA graph) "
            "with one read-back a step."
            if any(r["method"] in ("draft-fused", "draft-rounds") for r in res["rows"])
            else ""
        )
        + (
            f" In rounds (EngineArgs.spec_fused_rounds = {rounds}): {rounds} such rounds per "
            "program and read-back, each round's inputs formed on the device from the last "
            "one's acceptance."
            if (rounds := _spec_rounds(res))
            else ""
        )
        + agree
    )


def _spec_rounds(res: dict) -> int | None:
    """Rounds per program of the record's 'draft-rounds' rows (None: it has none)."""
    rows = [r for r in res["rows"] if r["method"] == "draft-rounds"]
    return rows[0].get("rounds") if rows else None


def _spec_how(best: dict) -> str:
    """', fused step' when the best draft row is the fused path (older records name no method)."""
    return {
        "draft-fused": ", fused step",
        "draft-rounds": ", fused step in rounds",
    }.get(best.get("method"), "")


SPEC_ROUNDS_TITLE = "Speculative decoding: the fused step in rounds"
# the later, smaller plans beside the full one (spec_decode), each in a section of its own
SPEC_EXTRA = {
    "spec_decode_fused": "Speculative decoding: the first full plan (one-round fused and unfused steps)",
    "spec_decode_rounds": SPEC_ROUNDS_TITLE,
    "spec_decode_rounds_k4": f"{SPEC_ROUNDS_TITLE} at k = 4, batch 1 and 8, both workloads",
    "spec_decode_rows": (
        f"{SPEC_ROUNDS_TITLE} (the engine's default), the verification as decode rows and the "
        "acceptance one kernel"
    ),
}


def _spec_md(rec: dict, title: str = "Speculative decoding") -> str:
    res = rec["results"]
    order = {w: i for i, w in enumerate(res["workloads"])}
    meth = list(SPEC_METHODS)
    rs = sorted(
        res["rows"],
        key=lambda r: (
            order.get(r["workload"], len(order)),
            r["batch"],
            meth.index(r["method"]) if r["method"] in meth else 9,
            r["k"],
        ),
    )
    rows = [
        {
            "workload": r["workload"],
            "batch": r["batch"],
            "method": SPEC_METHODS.get(r["method"], r["method"]),
            "k": r["k"] or "",
            "output tok/s": ranged(r, "output_tok_s", _num),
            "ms/token": ranged(r, "ms_per_token", _num),
            "speedup (x)": ranged(r, "speedup", _num),
            "acceptance": r["acceptance_rate"],
            "accepted length": r["mean_accepted_len"],
            "same tokens": f"{round(r['lossless_share'] * r['requests'])}/{r['requests']}",
        }
        for r in rs
    ]
    best = res.get("best_batch1_draft", {})
    line = ""
    if best.get("speedup") is not None:
        line = (
            f"\n\nBest batch-1 draft-model speedup on held-out files: {best['speedup']:.2f}x "
            f"at k = {best['k']}{_spec_how(best)} (goal >= {best['goal']}x: "
            f"{_status(best['met'])})."
        )
    return f"## {title}\n\n{_spec_context(res)}{line}\n\n{_table(rows)}\n"


def _spec_charts(recs: dict, folder: Path) -> list[Path]:
    """Speedup against k, one line per method and batch on the workload the method is for."""
    rec = recs.get("spec_decode")
    if not rec:
        return []
    from shared import charts

    res, series = rec["results"], {}
    goal = res.get("best_batch1_draft", {}).get("goal", 2.0)
    for method, workload in SPEC_HOME.items():
        rs = [r for r in res["rows"] if r["method"] == method and r["workload"] == workload]
        for b in sorted({r["batch"] for r in rs}):
            pts = sorted((r["k"], r["speedup"]) for r in rs if r["batch"] == b)
            series[f"{SPEC_METHODS[method]}, batch {b} ({workload})"] = tuple(zip(*pts))
    if not series:
        return []
    c = res["context"]
    context = (
        f"greedy, {c.get('dtype')}, target {c['target']['num_hidden_layers']} layers dim "
        f"{c['target']['hidden_size']}, draft {c['draft']['num_hidden_layers']} layers dim "
        f"{c['draft']['hidden_size']}"
    )
    return [
        charts.line_chart(
            folder / "spec_decode.png",
            series,
            title="Speculative decoding: speedup over no speculation",
            xlabel="k (tokens proposed per step)",
            ylabel="speedup (x)",
            hlines=[(1.0, "no speculation (1.0x)"), (goal, f"goal {goal}x (batch 1, draft)")],
            footnote=charts.footer(rec["environment"], context),
        )
    ]


def _spec_summary(recs: dict) -> str:
    """The summary's speculative-decoding lines, one per record (the full plan, then the smaller
    plans of SPEC_EXTRA): the best batch-1 draft speedup against its goal, its divisor's rate and
    host, and what n-gram lookup gives on the code-editing workload."""
    return "".join(
        _spec_summary_one(recs[name], label)
        for name, label in (("spec_decode", "Speculative decoding"), *SPEC_EXTRA.items())
        if recs.get(name)
    )


def _spec_summary_one(rec: dict, label: str) -> str:
    res = rec["results"]
    best = res.get("best_batch1_draft", {})
    text = f"\n**{label}**"
    text += f" ({res['context'].get('dtype')}, {environment_line(rec['environment'])}): "
    if best.get("speedup") is None:
        text += f"batch-1 draft-model speedup on held-out files not measured (goal >= {best.get('goal')}x)."
    else:
        row = next(
            (
                r
                for r in res["rows"]
                if (r["method"], r["k"], r["batch"], r["workload"])
                == (best["method"], best["k"], 1, "held-out")
            ),
            {},
        )
        reps = len(row.get("speedup_reps") or ())
        spread = (
            f" (median of {reps}, {row['speedup_min']:.2f}-{row['speedup_max']:.2f})"
            if reps > 1 and "speedup_min" in row
            else ""
        )
        text += (
            f"best batch-1 draft-model speedup on held-out files {best['speedup']:.2f}x"
            f"{spread} at k = {best['k']}{_spec_how(best)}, goal >= {best['goal']}x: "
            f"**{_status(best['met'])}**."
        )
        if best.get("vs_multi_step"):
            text += (
                f" That is {best['vs_multi_step']:.2f}x the speed of multi-step decoding "
                "without speculation."
            )
        base = [
            r
            for r in res["rows"]
            if (r["method"], r["batch"], r["workload"]) == ("none", 1, "held-out")
        ]
        if base:  # the divisor, host-bound at batch 1: it differs from machine to machine
            text += (
                f" The engine without speculation ran {_num(base[0]['output_tok_s'])} tok/s "
                "at batch 1 in that run"
            )
            cpu = rec["environment"].get("cpu_model")
            text += f" (host CPU: {cpu})." if cpu else "."
    ng = [r for r in res["rows"] if r["method"] == "ngram" and r["workload"] == "code-editing"]
    tops = [
        max((r for r in ng if r["batch"] == b), key=lambda r: r["speedup"])
        for b in sorted({r["batch"] for r in ng})
    ]
    if tops:
        text += " N-gram lookup on the code-editing workload (the prompt holds the answer): "
        text += ", ".join(f"{r['speedup']:.2f}x at batch {r['batch']} (k = {r['k']})" for r in tops)
        text += "."
    return text + "\n"


# --- serving (bench/serving.py) ---------------------------------------------------------------


def _slo_text(slo: dict) -> str:
    parts = [
        f"TTFT <= {slo['ttft_ms']:g} ms" if slo.get("ttft_ms") else "",
        f"TPOT <= {slo['tpot_ms']:g} ms" if slo.get("tpot_ms") else "",
        f"E2E <= {slo['e2e_ms']:g} ms" if slo.get("e2e_ms") else "",
    ]
    text = ", ".join(x for x in parts if x)
    return f"{text} for {slo.get('attainment', 1.0):.0%} of requests"


def _serving_md(rec: dict) -> str:
    res = rec["results"]
    rows = []
    for r in res["runs"]:
        errs = "; ".join(f"{e['count']} x {e['error'][:90]}" for e in r.get("errors") or [])
        rows.append(
            {
                "offered (req/s)": r["request_rate"],
                "achieved (req/s)": r.get("request_throughput"),
                "output tok/s": r.get("output_tok_s"),
                "TTFT p50 (ms)": (r.get("ttft") or {}).get("p50_ms"),
                "TTFT p99 (ms)": (r.get("ttft") or {}).get("p99_ms"),
                "TPOT p50 (ms)": (r.get("tpot") or {}).get("p50_ms"),
                "TPOT p99 (ms)": (r.get("tpot") or {}).get("p99_ms"),
                "ITL p99 (ms)": (r.get("itl") or {}).get("p99_ms"),
                "completed": r.get("completed"),
                "failed": r.get("failed"),
                "SLO": "met" if r.get("slo_met") else "missed",
                "errors": errs,
            }
        )
    w, best, off = res["workload"], res.get("max_rate_meeting_slo") or {}, res.get("offline") or {}
    head = (
        f"An OpenAI-compatible server (`python -m {PROJECT} serve`, the engine's defaults) "
        f"loaded over HTTP with streaming, {w.get('num_requests', w.get('requests'))} requests "
        f"per offered rate (Poisson arrivals; inf: all at once), the throughput workload's "
        f"lengths. SLO: {_slo_text(res['slo'])}. Highest offered rate meeting it: "
        + (f"**{best['request_rate']} req/s**." if best.get("request_rate") else "**none**.")
    )
    if off.get("serving_vs_offline") is not None:
        diffs = ", ".join(
            f"{k} {v['serving']} vs {v['offline']}"
            for k, v in (off.get("workload_differences") or {}).items()
        )
        head += (
            f" At the all-at-once rate the server delivered {off['serving_output_tok_s']:,.0f} "
            f"output tok/s, {off['serving_vs_offline']:.3f}x the offline engine in the same "
            f"configuration ({off['offline_output_tok_s']:,.0f} tok/s): HTTP and streaming "
            f"cost {off['overhead_pct']:.1f}%"
            + (f" (workloads differ: {diffs})." if diffs else ".")
        )
    return f"## Serving\n\n{head}\n\n{_table(rows)}\n"


def _serving_charts(recs: dict, folder: Path) -> list[Path]:
    rec = recs.get("serving")
    if not rec:
        return []
    from project04_llm_inference.bench.serving_chart import serving_chart

    return [
        serving_chart(
            rec["results"], folder / "serving.png", footnote=environment_line(rec["environment"])
        )
    ]


def _serving_summary(recs: dict) -> str:
    rec = recs.get("serving")
    if not rec:
        return ""
    res = rec["results"]
    best, off = res.get("max_rate_meeting_slo") or {}, res.get("offline") or {}
    text = (
        f"\n**Serving** over HTTP with streaming ({environment_line(rec['environment'])}): "
        f"highest offered rate meeting the SLO ({_slo_text(res['slo'])}): "
        + (f"{best['request_rate']} req/s" if best.get("request_rate") else "none")
    )
    if off.get("overhead_pct") is not None:
        text += (
            f"; all at once, {off['serving_output_tok_s']:,.0f} output tok/s, HTTP and "
            f"streaming overhead {off['overhead_pct']:.1f}% of the offline engine's rate"
        )
    return text + ".\n"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m project04_llm_inference.report.render <reports_dir>")
    for p in render(sys.argv[1]):
        print(p)
