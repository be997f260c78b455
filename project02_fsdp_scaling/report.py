"""Charts, Markdown and the project README, regenerated from the JSON result records.

    python -m project02_fsdp_scaling report     # everything under reports/project02_fsdp_scaling/
    python -m project02_fsdp_scaling report --reports-dir runs/<time> --no-readme

Nothing here measures: every number comes from a JSON record written by `scaling`, `sweep` or
`compare`, which carry their environment (GPU, driver, torch, CUDA, date, commit). A scaling
figure measured over repetitions (`_min`, `_max`, `_reps` beside it, `shared.repeat.flat`) shows
as "median (min–max)"; a record of one run renders as it always did. Charts plot the medians.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from project02_fsdp_scaling import PROJECT
from project02_fsdp_scaling.compare_report import compare_charts, compare_markdown
from project02_fsdp_scaling.precision_report import precision_charts, precision_markdown
from shared.repeat import ranged
from shared.results import (
    REPORTS_DIR,
    atomic_write_text,
    environment_line,
    load_result,
    markdown_table,
    replace_between_markers,
)

_HERE = Path(__file__).resolve().parent
# The project's README; in a standalone fork it is the repository's README, one level up.
README = next(
    (p for p in (_HERE / "README.md", _HERE.parent / "README.md") if p.is_file()),
    _HERE / "README.md",
)


def _pct(x):
    return None if x is None else 100.0 * x


def mfu_all_params(mfu: float | None, preset: str, seq_len: int) -> float | None:
    """The same measurement under the common convention, 6·N with N = every parameter (the
    input embedding table included), instead of this repo's strict matmul-parameter count."""
    if mfu is None:
        return None
    from project02_fsdp_scaling.train import matmul_params
    from shared.model import ModelArgs

    a = ModelArgs.from_preset(preset)
    attn = 6.0 * a.n_layers * a.dim * seq_len  # 12·L·d·S halved (causal)
    return mfu * (6.0 * a.num_params() + attn) / (6.0 * matmul_params(a) + attn)


def _g(fmt: str):
    return lambda v: format(v, fmt)


def _repeated(res: dict) -> int:
    """How many repetitions the record's runs hold (1 for a record of one run per world size)."""
    return (
        max(
            [len(r.get("tokens_per_s_reps") or ()) for r in res["runs"] if r["status"] == "ok"]
            or [1]
        )
        or 1
    )


def _dev(tier: str, n: int) -> str:
    unit = "GPU" if tier == "gpu" else "proc"
    return f"{n} {unit}" + ("s" if n > 1 else "")


# ---- scaling --------------------------------------------------------------------------------
def render_scaling(path: str | Path) -> list[Path]:
    """Charts and <name>.md next to the scaling JSON record."""
    from shared import charts

    path = Path(path)
    rec = load_result(path)
    res, name, out = rec["results"], path.stem, path.parent
    foot = environment_line(rec["environment"])
    ok = [r for r in res["runs"] if r["status"] == "ok"]
    tier = res["tier"]
    files = []
    if ok:
        ws = [r["world_size"] for r in ok]
        tps = [r["tokens_per_s"] for r in ok]
        base = res["baseline"]["tokens_per_s"] if res.get("baseline") else None
        dev = "GPUs" if tier == "gpu" else "CPU processes"
        files.append(
            charts.line_chart(
                out / f"{name}_throughput.png",
                {"measured": (ws, tps)},
                title=f"FSDP2 strong scaling, {res['preset']}, global batch {res['tokens_per_step']:,} tokens",
                xlabel=f"world size ({dev})",
                ylabel="training throughput (tokens/s)",
                ideal=(ws, [base * w for w in ws]) if base else None,
                ideal_label="ideal (N x one-device throughput)",
                footnote=foot,
            )
        )
        if base:
            files.append(
                charts.line_chart(
                    out / f"{name}_efficiency.png",
                    {"measured": (ws, [100 * r["efficiency"] for r in ok])},
                    title="Strong-scaling efficiency (throughput / (N x one-device throughput))",
                    xlabel=f"world size ({dev})",
                    ylabel="efficiency (%)",
                    ideal=(ws, [100.0] * len(ws)),
                    ideal_label="ideal (100%)",
                    ylim=(0, 105),  # from 0: a 5% loss reads as 5%, not as a cliff
                    footnote=foot,
                )
            )
        prof = [r for r in ok if r.get("profile")]
        if prof:
            files.append(
                charts.stacked_bar_chart(
                    out / f"{name}_breakdown.png",
                    [_dev(tier, r["world_size"]) for r in prof],
                    {
                        "compute": [r["profile"]["compute_ms"] for r in prof],
                        "exposed communication": [r["profile"]["exposed_comm_ms"] for r in prof],
                        "other (idle, host)": [r["profile"]["other_ms"] for r in prof],
                    },
                    title="Profiled step on rank 0: compute vs exposed communication",
                    ylabel="time per optimizer step (ms)",
                    footnote=foot,
                )
            )
    lines = (res.get("cost") or {}).get("lines") or []
    if lines:
        files.append(
            charts.grouped_bar_chart(
                out / f"{name}_cost.png",
                [_cost_label(c) for c in lines],
                {
                    "on-demand": [c["usd_per_m_tokens_on_demand"] for c in lines],
                    "spot": [c["usd_per_m_tokens_spot"] for c in lines],
                },
                title=f"Cost per million training tokens, {res['preset']}",
                ylabel="USD per 1M tokens",
                footnote=foot,
            )
        )
    md = out / f"{name}.md"
    atomic_write_text(md, scaling_markdown(rec, name=name))
    return [*files, md]


def read_step(r: dict) -> dict:
    """The step-time cell of a world size's row: median [p20, p80] of its timed steps for one
    run; the median (min–max) of the runs' medians for repeated runs."""
    if len(r.get("step_time_s_reps") or ()) < 2:
        return {
            "step time (s), median [p20, p80]": f"{r['step_time_s']:.4g} "
            f"[{r['step_time_p20_s']:.4g}, {r['step_time_p80_s']:.4g}] of {r['timed_steps']}"
        }
    return {
        "step time (s), median (min–max) of the runs' medians": ranged(r, "step_time_s", _g(".4g"))
        + f", {len(r['step_time_s_reps'])} runs of {r['timed_steps']} steps"
    }


def _cost_label(c: dict) -> str:
    return c["config"] + ("" if c["measured"] else "\n(projected)")


def scaling_markdown(rec: dict, *, name: str | None = None, heading: str = "#") -> str:
    res = rec["results"]
    name = name or rec.get("name", "scaling")
    tier = res["tier"]
    h = heading
    out = [
        f"{h} Strong scaling: FSDP2, `{res['preset']}`, global batch {res['global_batch']} x "
        f"{res['seq_len']} = {res['tokens_per_step']:,} tokens ({tier.upper()} tier)",
        "",
        f"Measured on: {environment_line(rec['environment'])}.",
        "",
        f"{h}# Throughput and efficiency",
        "",
    ]
    rows = []
    n_reps = _repeated(res)
    g = _g(",.3g")
    for r in res["runs"]:
        if r["status"] != "ok":
            continue
        step = read_step(r)
        rows.append(
            {
                "world size": r["world_size"],
                "tokens/s": ranged(r, "tokens_per_s", str, round),
                "tokens/s per device": ranged(r, "tokens_per_s_per_device", str, round),
                **step,
                "speed-up": ranged(r, "speedup", g),
                "efficiency (%)": ranged(r, "efficiency", g, _pct),
                "MFU (%)": ranged(r, "mfu", g, _pct),
                "MFU, all-param 6N (%)": ranged(
                    r,
                    "mfu",
                    g,
                    lambda m: _pct(mfu_all_params(m, res["preset"], res["seq_len"])),
                ),
                "peak memory (GiB)": r["peak_memory_gib"],
                "micro-batch x accumulation": f"{r['micro_batch']} x {r['grad_accum_steps']}",
                "compute dtype": r.get("compute_dtype"),
            }
        )
    out.append(markdown_table(rows) if rows else "_No world size completed._")
    ok = [r for r in res["runs"] if r["status"] == "ok"]
    mem_kind = ok[0]["memory_kind"] if ok else ""
    out += [
        "",
        f"Baseline: the one-device run of the same job in the same harness run; efficiency = "
        f"throughput / (N x baseline). Step time is wall time between device synchronisations, "
        f"median of the timed steps after warm-up. Peak memory: {mem_kind} (max over ranks). "
        + (
            f"Each world size ran {n_reps} times, each a separate job, the world sizes "
            "interleaved (order reversed on alternate repetitions): cells show the median "
            "(min–max) over the repetitions, and speed-up and efficiency are the medians of the "
            "per-repetition ratios (repetition i of N devices over repetition i of one); the "
            "profiled steps below ran in the first repetition. "
            if n_reps > 1
            else ""
        )
        + (
            "MFU against the dense bf16 peak of `shared.hardware`."
            if tier == "gpu"
            else "MFU: n/a on CPU (no peak in the GPU table)."
        ),
    ]
    load = res.get("host_load_average_1min") or {}
    if tier == "cpu" and load.get("before") is not None:
        out += [
            "",
            f"Host load average (1 min) {load['before']:.1f} before and {load['after']:.1f} after "
            f"the runs, on {rec['environment'].get('cpu_count')} cores: on a shared machine the "
            "CPU tier's step times spread widely (see "
            + ("the min–max" if n_reps > 1 else "p20/p80")
            + "). It shows the pipeline end to "
            "end; its speed figures are not a performance result.",
        ]
    notes = [f"- {r['note']}" for r in res["runs"] if r["status"] == "skipped"]
    notes += [
        f"- world size {r['world_size']} FAILED (exit {r.get('returncode')}); log tail in the JSON"
        for r in res["runs"]
        if r["status"] == "failed"
    ]
    if notes:
        out += ["", *notes]
    if ok:
        out += ["", f"![throughput]({name}_throughput.png)"]
        if res.get("baseline"):
            out += [f"![efficiency]({name}_efficiency.png)"]
    prof = [r for r in ok if r.get("profile")]
    if prof:
        out += [
            "",
            f"{h}# Where the time goes (torch.profiler, rank 0, per optimizer step)",
            "",
            markdown_table(
                [
                    {
                        "world size": r["world_size"],
                        "step (ms)": p["step_ms"],
                        "compute (ms)": p["compute_ms"],
                        "communication (ms)": p["comm_ms"],
                        "overlapped (ms)": p["overlapped_comm_ms"],
                        "exposed (ms)": p["exposed_comm_ms"],
                        "other (ms)": p["other_ms"],
                        "exposed (% of step)": 100 * p["exposed_comm_fraction"],
                        "collectives (ms: count)": ", ".join(
                            f"{k} {v['ms_per_step']:.3g}: {v['count_per_step']:.0f}"
                            for k, v in p["collectives"].items()
                        ),
                        "trace": f"[{r['trace']}]({r['trace']})" if r.get("trace") else None,
                    }
                    for r in prof
                    for p in [r["profile"]]
                ]
            ),
            "",
            f"Read from {prof[0]['profile']['source']}. Compute and communication are unions of "
            "intervals inside each `ProfilerStep`; exposed = communication while nothing computes; "
            "other = the device idle (launch gaps, host work, synchronisation). The profiled "
            "steps run after the timed ones (profiler overhead stays out of the throughput). A "
            "collective's time includes waiting for the slowest rank to join it. The traces open "
            "in Perfetto (ui.perfetto.dev) or chrome://tracing."
            + (
                " At world size 1 FSDP2 issues no collectives (its all-gather and reduce-scatter "
                "become local copies, counted as compute), so communication is zero there."
                if any(r["world_size"] == 1 and r["profile"]["comm_ms"] == 0 for r in prof)
                else ""
            ),
            "",
            f"![time breakdown]({name}_breakdown.png)",
        ]
    cost = res.get("cost") or {}
    out += ["", f"{h}# Cost per million training tokens", ""]
    if cost.get("lines"):
        out.append(
            markdown_table(
                [
                    {
                        "configuration": c["config"],
                        "measured?": "measured" if c["measured"] else "PROJECTED",
                        "tokens/s": round(c["tokens_per_s"]),
                        "USD/GPU-h on-demand": c["price_on_demand_usd_per_gpu_hour"],
                        "USD/GPU-h spot": c["price_spot_usd_per_gpu_hour"],
                        "USD / 1M tokens on-demand": c["usd_per_m_tokens_on_demand"],
                        "USD / 1M tokens spot": c["usd_per_m_tokens_spot"],
                    }
                    for c in cost["lines"]
                ]
            )
        )
        out += ["", "How each throughput was obtained:", ""]
        out += [f"- {c['config']}: {c['basis']}" for c in cost["lines"]]
        c0 = cost["lines"][0]
        out += [
            "",
            f"Prices: {c0['price_source']}; spot: {c0['spot_price_source']}. "
            "Override them with `SHARED_GPU_PRICES` (see `shared.hardware`).",
            "",
            f"![cost]({name}_cost.png)",
        ]
    else:
        out.append(cost.get("note") or "not computed")
    sweep = res.get("sweep")
    if sweep:
        out += ["", f"{h}# Configuration", ""]
        if sweep.get("best"):
            out.append(
                f"Every world size ran the best one-GPU variant of the sweep "
                f"(`{sweep['file']}`): `{sweep['best']['variant']}`."
            )
        else:
            out.append(f"The one-GPU sweep did not complete ({sweep.get('status')}).")
    return "\n".join(out) + "\n"


# ---- one-GPU sweep ---------------------------------------------------------------------------
def sweep_markdown(rec: dict, heading: str = "#") -> str:
    res = rec["results"]
    h = heading
    repeats = res.get("repeats", 1)
    rows = []
    for v in res["variants"]:
        if v.get("status") != "ok":
            status = v.get("status", "failed")
            rows.append({"variant": v["variant"], "status": f"{status}: {v.get('error', '')[:80]}"})
            continue
        rows.append(
            {
                "variant": ("**" + v["variant"] + "**")
                if res.get("best") and v["variant"] == res["best"]["variant"]
                else v["variant"],
                "status": "ok" if "failed_pass" not in v else "ok, then failed",
                **({"runs": v.get("runs", 1)} if repeats > 1 else {}),
                "step time (s), median [p20, p80]": f"{v['step_time_s']:.4g} "
                f"[{v['step_time_p20_s']:.4g}, {v['step_time_p80_s']:.4g}]",
                "tokens/s": ranged(v, "tokens_per_s", ",.0f", round),
                "TFLOP/s": ranged(v, "achieved_tflops_per_device", ".4g"),
                "MFU (%)": ranged(v, "mfu", ".2f", _pct),
                "MFU, all-param 6N (%)": _pct(
                    mfu_all_params(v["mfu"], res["preset"], res["seq_len"])
                ),
                "vs eager": v.get("speedup_vs_eager"),
                "peak memory (GiB)": v["peak_memory_gib"],
                "compute dtype": v["compute_dtype"],
                "loss first -> last": f"{v['first_loss']:.3f} -> {v['last_loss']:.3f}",
            }
        )
    best = res.get("best")
    ok = {v["variant"]: v for v in res["variants"] if v.get("status") == "ok"}
    peaks = {  # compute dtype -> the dense peak TFLOP/s its MFU column divides by
        str(v["compute_dtype"]).replace("torch.", ""): v["achieved_tflops_per_device"] / v["mfu"]
        for v in ok.values()
        if v.get("mfu")
    }
    ratios = [
        f"{name} {v['tokens_per_s'] / ok[name + '+fp32']['tokens_per_s']:.2f}x"
        for name, v in ok.items()
        if name + "+fp32" in ok
    ]
    return "\n".join(
        [
            f"{h} One-GPU sweep: `{res['preset']}`, global batch {res['global_batch']} x "
            f"{res['seq_len']} tokens, micro-batch {res['micro_batch']}",
            "",
            f"Measured on: {environment_line(rec['environment'])}.",
            "",
            markdown_table(rows),
            "",
            f"All variants: FSDP2 in a world of one, bf16 parameters (MixedPrecisionPolicy; "
            f"+fp32: float32 parameters and matmuls, TF32 off as PyTorch defaults), fp32 "
            f"gradient reduction, AdamW (fused on GPU), gradient clipping at "
            f"{res.get('grad_clip', 1.0)}; median of {res['steps']} timed steps after "
            f"{res['warmup_steps']} warm-up steps, one process, one model initialisation. "
            + (
                f"Each variant ran in {repeats} passes over the list, its order reversed on "
                "alternate passes: tokens/s, TFLOP/s and MFU show the median (min–max) over the "
                "passes (vs eager: the median of the per-pass ratios), the step-time column the "
                "first pass's steps, peak memory the largest. "
                if repeats > 1
                else ""
            )
            + "Baseline: the eager variant in the same process. "
            + (
                f"MFU = tokens/s x {res['flops_per_token'] / 1e9:.3f} GFLOP/token / the dense "
                "peak of the variant's compute dtype ("
                + ", ".join(f"{d} {p:.1f} TFLOP/s" for d, p in sorted(peaks.items()))
                + ", `shared.hardware`). "
                if peaks and res.get("flops_per_token")
                else "MFU: n/a (no GPU peak for this device). "
            )
            + "FLOPs per token: 6 x matmul parameters (input embedding excluded) + 6·L·d·S "
            "causal attention; the all-param column counts 6 x every parameter instead (the "
            "common convention), for comparison with figures quoted that way.",
            "",
            (
                "bf16 / fp32 throughput, same variant: " + "; ".join(ratios) + ".\n\n"
                if ratios
                else ""
            )
            + (
                f"Best by MFU (bf16 variants): **{best['variant']}**, {100 * best['mfu']:.1f}% "
                f"(target >= 55%; a plain compiled loop measured 53.8% earlier on this GPU)."
                if best and best.get("mfu") is not None
                else f"Best by throughput: **{best['variant']}**."
                if best
                else "No variant completed."
            ),
            "",
        ]
    )


# ---- README -----------------------------------------------------------------------------------
def _section(out_dir: Path, stem: str, fn, missing: str) -> str:
    path = out_dir / f"{stem}.json"
    if not path.is_file():
        return missing
    return fn(load_result(path), heading="###")


def refresh_readme(out_dir: str | Path | None = None, readme: Path = README) -> Path:
    """Fill the README's generated sections from the JSON records in out_dir."""
    out_dir = Path(out_dir) if out_dir else Path(REPORTS_DIR) / PROJECT
    # links to the records' folder, relative to the README wherever both are
    rel = os.path.relpath(out_dir.resolve(), Path(readme).resolve().parent).replace(os.sep, "/")
    rel += "/"
    text = readme.read_text()

    def fix_links(md: str) -> str:  # image and trace links relative to the README
        import re

        return re.sub(r"\]\((?!http)([^)/]+\.(?:png|json\.gz|json|md))\)", rf"]({rel}\1)", md)

    sections = {
        "gpu-sweep": _section(out_dir, "sweep_gpu", sweep_markdown, "_Not run yet._"),
        "gpu-precision": _section(out_dir, "sweep_gpu_precision", sweep_markdown, "_Not run yet._"),
        "gpu-scaling": _section(
            out_dir,
            "scaling_gpu",
            lambda r, heading: scaling_markdown(r, name="scaling_gpu", heading=heading),
            "_Not run yet._",
        ),
        "cpu-scaling": _section(
            out_dir,
            "scaling_cpu",
            lambda r, heading: scaling_markdown(r, name="scaling_cpu", heading=heading),
            "_Not run yet._",
        ),
        "mixed-precision": "\n".join(
            _section(out_dir, stem, precision_markdown, "")
            for stem in ("precision_gpu", "precision_cpu")
        ).strip()
        or "_Not run yet._",
        "compare": "\n".join(
            _section(out_dir, stem, compare_markdown, "") for stem in ("compare_gpu", "compare_cpu")
        ).strip()
        or "_Not run yet._",
    }
    for marker, content in sections.items():
        if f"<!-- {marker} -->" in text:  # a README shows the blocks it has markers for
            text = replace_between_markers(text, marker, fix_links(content))
    atomic_write_text(readme, text)
    return readme


def _round(x: float | None) -> int | None:
    return None if x is None else round(x)


def summary_markdown(out_dir: Path) -> str:
    """The scaling records' tables in short (reports/<project>/summary.md), links relative to
    that folder."""
    from shared.results import environment_line, markdown_table

    parts = []
    for stem, what in (("scaling_gpu", "GPUs"), ("scaling_cpu", "CPU processes over gloo")):
        path = out_dir / f"{stem}.json"
        if not path.is_file():
            continue
        rec = load_result(path)
        res = rec["results"]
        g = _g(",.4g")
        rows = [
            {
                "world size": r["world_size"],
                "tokens/s": ranged(r, "tokens_per_s", str, _round),
                "tokens/s per device": ranged(r, "tokens_per_s_per_device", str, _round),
                "MFU %": ranged(r, "mfu", g, _pct),
                "efficiency %": ranged(r, "efficiency", g, _pct),
                "peak GiB": r.get("peak_memory_gib"),
            }
            for r in res["runs"]
            if r.get("status") == "ok"
        ]
        n_reps = _repeated(res)
        parts += [
            f"**Strong scaling, {res['preset']} on {what}** (global batch {res['global_batch']} x "
            f"{res['seq_len']} tokens; {environment_line(rec['environment'])}"
            + (f"; median (min–max) of {n_reps} runs" if n_reps > 1 else "")
            + "):",
            "",
            markdown_table(rows, floatfmt=",.4g"),
            "",
        ]
        lines = res.get("cost", {}).get("lines", [])
        if lines and stem == "scaling_gpu":
            cost_rows = [
                {
                    "configuration": c["config"],
                    "basis": "measured" if c["measured"] else "PROJECTED",
                    "USD / M tokens on-demand": c["usd_per_m_tokens_on_demand"],
                    "USD / M tokens spot": c["usd_per_m_tokens_spot"],
                }
                for c in lines
            ]
            parts += [markdown_table(cost_rows, floatfmt=".4f"), ""]
    if not parts:
        return "_No measurements yet: run `make project02`._\n"
    parts.append(
        "Details: the Markdown beside each record in this folder, e.g. [scaling_gpu.md](scaling_gpu.md)."
    )
    return "\n".join(parts) + "\n"


def render_all(out_dir: Path) -> None:
    """Every chart and Markdown file of the records in out_dir: scaling_* (not the per-world-size
    records beside them), sweep_*, compare_*, precision_*, collectives_* and parallel_*."""
    import re

    for path in sorted(out_dir.glob("scaling_*.json")):
        if not re.search(r"_ws\d+(_rep\d+)?$", path.stem):
            render_scaling(path)
    kinds = (("sweep", sweep_markdown), ("compare", compare_markdown))
    for kind, fn in (*kinds, ("precision", precision_markdown)):
        for path in sorted(out_dir.glob(f"{kind}_*.json")):
            rec = load_result(path)
            atomic_write_text(path.with_suffix(".md"), fn(rec))
            if kind == "compare":
                compare_charts(rec, out_dir, path.stem)
            if kind == "precision":
                precision_charts(rec, out_dir, path.stem)
    from project02_fsdp_scaling import collectives_report, strategies_report

    for kind, module in (("collectives", collectives_report), ("parallel", strategies_report)):
        for path in sorted(out_dir.glob(f"{kind}_*.json")):
            module.render(load_result(path), out_dir, path.stem)


@dataclass
class ReportConfig:
    """Re-render charts, Markdown and the project README from the JSON records."""

    reports_dir: str | None = None
    """records are read from <reports-dir>/project02_fsdp_scaling/ (None: the repository's
    reports/)"""
    readme: bool = True
    """refresh the project README's generated sections (--no-readme: the folder only)"""
    readme_file: str | None = None
    """the README to refresh (None: the project's own)"""


def run(cfg: ReportConfig) -> Path:
    """`report`: every chart and Markdown file of the folder, its summary.md and (unless
    --no-readme) the README. Returns the folder."""
    from shared.cli import input_dir, input_file

    readme = input_file("--readme-file", cfg.readme_file) if cfg.readme_file is not None else README
    root = input_dir("--reports-dir", cfg.reports_dir) if cfg.reports_dir is not None else None
    out_dir = input_dir("--reports-dir", (root or Path(REPORTS_DIR)) / PROJECT)
    render_all(out_dir)
    atomic_write_text(out_dir / "summary.md", summary_markdown(out_dir))
    if cfg.readme:
        print(f"wrote {refresh_readme(out_dir, readme)}")
    return out_dir


if __name__ == "__main__":  # `python -m <this module>` runs its command of the package
    import sys

    from project02_fsdp_scaling.__main__ import main

    sys.exit(main(["report", *sys.argv[1:]]))
