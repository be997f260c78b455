"""`results.md` and charts from the offline benchmark records (JSON alone: no GPU, no rerun).

    python -m project04_llm_inference.report.render runs/<time>

Reads `<reports_dir>/project04_llm_inference/*.json` (or `<reports_dir>/*.json` when the folder
holds the records itself), writes `results.md`, `decode_latency.png` and `throughput.png` beside
them and returns their paths. A record that is missing leaves its section and targets as
"not measured", never as a number.
"""

from __future__ import annotations

import sys
from pathlib import Path

from shared.results import atomic_write_text, environment_line, load_result, markdown_table

PROJECT = "project04_llm_inference"
RECORDS = ("offline_throughput", "decode_latency", "kv_memory", "prefix_caching")
SYSTEMS = {"engine": "this engine", "vllm": "vLLM", "static_cuda_graph": "static CUDA graph",
           "transformers": "transformers generate"}  # fmt: skip


def _tidy(v):
    """Numbers for a table: whole units from 100 up (16,034 not 1.6e+04), else 3 significant."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return v
    return float(round(v)) if abs(v) >= 100 else float(f"{v:.3g}")


def _table(rows: list[dict], columns=None, headers=None) -> str:
    rows = [{k: _tidy(v) for k, v in r.items()} for r in rows]
    return markdown_table(rows, columns, headers=headers, floatfmt=",.7g")


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


def _target(text: str, measured, unit: str, ok) -> dict:
    """ok: a predicate on the measured value; None measured means 'not measured'."""
    return {"target": text, "measured": measured, "unit": unit,
            "met": None if measured is None else bool(ok(measured))}  # fmt: skip


def targets(recs: dict[str, dict]) -> list[dict]:
    """The issue's targets, each with its measured value and met / missed / not measured."""
    out = []
    for ctx in (1024, 8192):
        r = _latency_row(recs, 1, ctx)
        out.append(_target(f"batch-1 decode <= 0.80 ms/token at context {ctx:,}",
                           r and r.get("engine_ms"), "ms/token", lambda v: v <= 0.80))  # fmt: skip
    for b, goal in ((64, 40_000), (256, 65_000)):
        r = _latency_row(recs, b, 1024)
        out.append(_target(f"decode >= {goal // 1000}k tok/s at batch {b}, context 1,024",
                           r and r.get("engine_tok_s"), "tok/s", lambda v, g=goal: v >= g))  # fmt: skip
    eng = recs.get("offline_throughput", {}).get("results", {}).get("engine", {})
    out.append(_target("offline throughput >= 30k output tok/s", eng.get("output_tok_s"),
                       "output tok/s", lambda v: v >= 30_000))  # fmt: skip
    un = recs.get("prefix_caching", {}).get("results", {}).get("unshared", {})
    out.append(_target("prefix caching costs <= 2% when nothing is shared", un.get("overhead_pct"),
                       "% wall time", lambda v: v <= 2.0))  # fmt: skip
    return out


def _status(met) -> str:
    return "not measured" if met is None else ("met" if met else "missed")


def _env_lines(recs: dict) -> list[str]:
    return [f"- `{n}`: {environment_line(r['environment'])}" for n, r in recs.items()]


def _throughput_md(rec: dict) -> str:
    res = rec["results"]
    w = res["workload"]
    rows = []
    for key, label in SYSTEMS.items():
        r = res.get(key) or {"measured": False, "reason": "absent from the record"}
        rows.append({"system": label, "requests": r.get("requests"),
                     "output tok/s": r.get("output_tok_s"), "total tok/s": r.get("total_tok_s"),
                     "wall s": r.get("wall_s"),
                     "engine ÷ this (x)": res.get("ratios", {}).get(f"engine_vs_{key}"),
                     "note": r.get("subsample") or r.get("reason") or ""})  # fmt: skip
    head = (f"{w['requests']:,} requests, prompts {w['prompt_len_min']}-{w['prompt_len_max']} "
            f"tokens, outputs {w['output_len_min']}-{w['output_len_max']} tokens (every request "
            "runs to its length); rates are useful tokens over wall time.")  # fmt: skip
    sc = res.get("static_cuda_graph", {})
    if sc.get("measured"):
        head += (f" Static batching computed {sc['computed_output_tokens']:,} output tokens for "
                 f"{sc['output_tokens']:,} useful ({sc['output_waste_fraction']:.0%} waste).")  # fmt: skip
    return f"## Offline throughput\n\n{head}\n\n{_table(rows)}\n"


def _latency_md(rec: dict) -> str:
    res = rec["results"]
    cols = ["batch", "context", "engine_ms", "engine_tok_s", "static_cuda_graph_ms",
            "static_cuda_graph_tok_s", "floor_ms", "engine_vs_floor", "engine_pure_steps"]  # fmt: skip
    heads = ["batch", "context (tokens)", "engine (ms/step)", "engine (tok/s)",
             "static CUDA graph (ms/step)", "static CUDA graph (tok/s)", "bandwidth floor (ms)",
             "engine / floor", "steps timed"]  # fmt: skip
    floor = (f"Floor: {res['weight_bytes'] / 1e9:.2f} GB of weights ({res['params'] / 1e9:.3f} B "
             f"params, bf16) + batch x context x {res['kv_bytes_per_token']:,} B of KV per step, "
             f"over {res['bandwidth_tb_s']} TB/s.")  # fmt: skip
    table = _table(res["rows"], cols, heads)
    return f"## Decode latency\n\n{floor} {res.get('note', '')}\n\n{table}\n"


def _memory_md(rec: dict) -> str:
    r = rec["results"]
    rows = [{"allocation": "paged (measured peak running sequences)",
             "sequences": r["paged_peak_running_seqs"]},
            {"allocation": f"static, {r['max_model_len']:,} tokens reserved each (computed)",
             "sequences": r["static_max_seqs"]}]  # fmt: skip
    cap = " The peak hit max_num_seqs: the cap, not memory, bound it." if r.get(
        "paged_capped_by_max_num_seqs") else ""  # fmt: skip
    return (f"## KV memory\n\nBudget: {r['budget_bytes'] / 2**30:.2f} GiB = {r['budget_tokens']:,} "
            f"tokens ({r['num_kv_blocks']} blocks x {r['block_size']}, {r['kv_bytes_per_token']:,} "
            f"B/token). Paged holds {r['paged_vs_static'] or 0:.1f}x the sequences; "
            f"{r.get('num_preemptions')} preemptions.{cap}\n\n{_table(rows)}\n")  # fmt: skip


def _prefix_md(rec: dict) -> str:
    r = rec["results"]
    rows = [{"prefix caching": k, **{n: r["shared"][k].get(n) for n in (
        "prefill_tokens_computed", "prefix_cache_hit_tokens", "output_tok_s", "wall_s")}}
        for k in ("off", "on")]  # fmt: skip
    heads = ["prefix caching", "prefill tokens computed", "cache hits (tokens)", "output tok/s",
             "wall s"]  # fmt: skip
    un = r["unshared"]
    return (f"## Prefix caching\n\nShared prefix: {r['shared'].get('prompt_tokens', 0):,} prompt "
            f"tokens; caching on is {r['shared']['speedup']:.2f}x faster in wall time.\n\n"
            f"{_table(rows, list(rows[0]), heads)}\n\nNothing shared: caching on "
            f"costs {un['overhead_pct']:+.2f}% wall time (median of {len(un['off']['wall_s'])} "
            f"runs each; target <= {un['target_pct']}%). TTFT: {r.get('ttft_note')}.\n")  # fmt: skip


def _charts(recs: dict, folder: Path) -> list[Path]:
    from shared import charts

    paths = []
    lat = recs.get("decode_latency")
    if lat:
        rows, series = lat["results"]["rows"], {}
        for ctx in sorted({r["context"] for r in rows}):
            rs = sorted((r for r in rows if r["context"] == ctx), key=lambda r: r["batch"])
            for key, label in (("engine_ms", "engine"), ("static_cuda_graph_ms", "static CUDA graph"),
                               ("floor_ms", "bandwidth floor")):  # fmt: skip
                pts = [(r["batch"], r[key]) for r in rs if r.get(key) is not None]
                if pts:
                    series[f"{label}, context {ctx:,}"] = tuple(zip(*pts))
        paths.append(charts.line_chart(folder / "decode_latency.png", series,
                     title="Decode step time vs batch size", xlabel="batch (sequences)",
                     ylabel="ms per decode step", logx=True, logy=True,
                     footnote=environment_line(lat["environment"])))  # fmt: skip
    thr = recs.get("offline_throughput")
    if thr:
        res = thr["results"]
        got = [(label, res[k]["output_tok_s"]) for k, label in SYSTEMS.items()
               if (res.get(k) or {}).get("measured")]  # fmt: skip
        if got:
            paths.append(charts.bar_chart(folder / "throughput.png", [g[0] for g in got],
                         [g[1] for g in got], title="Offline throughput, same requests",
                         ylabel="output tok/s", baseline=30_000, baseline_label="target 30k tok/s",
                         footnote=environment_line(thr["environment"])))  # fmt: skip
    return paths


def render(reports_dir: str | Path) -> list[Path]:
    """Write results.md and the charts next to the records; return the written paths."""
    folder = _folder(Path(reports_dir))
    recs = load_records(reports_dir)
    if not recs:
        raise FileNotFoundError(
            f"no project04 benchmark records ({', '.join(RECORDS)}) in {folder}"
        )
    charts = _charts(recs, folder)
    tg = [{**t, "status": _status(t["met"])} for t in targets(recs)]
    parts = ["# project04: offline inference benchmarks\n",
             "Llama-3.2-1B shape, dummy weights, bf16, greedy. Environment of each record:\n",
             "\n".join(_env_lines(recs)) + "\n", "## Targets\n",
             _table(tg, ["target", "measured", "unit", "status"]) + "\n"]  # fmt: skip
    for name, fn in (("offline_throughput", _throughput_md), ("decode_latency", _latency_md),
                     ("kv_memory", _memory_md), ("prefix_caching", _prefix_md)):  # fmt: skip
        parts.append(fn(recs[name]) if name in recs else f"## {name}\n\nnot measured: no record.\n")
    parts += [f"![{p.stem}]({p.name})\n" for p in charts]
    md = atomic_write_text(folder / "results.md", "\n".join(parts))
    return [md, *charts]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m project04_llm_inference.report.render <reports_dir>")
    for p in render(sys.argv[1]):
        print(p)
