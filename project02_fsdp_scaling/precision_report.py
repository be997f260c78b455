"""Mixed precision: the Markdown and charts of a `precision` record, from the JSON alone.

A record holds a `parity` phase (loss curves of each recipe against bf16's) and a `throughput`
phase (tokens/s, MFU, memory and cost of each recipe), either of which may be absent. A
throughput phase of repeated runs shows "median (min–max)" in its cells (`shared.repeat.ranged`);
a record of one run per recipe renders as it always did.
"""

from __future__ import annotations

from pathlib import Path

from shared.repeat import ranged
from shared.results import environment_line, markdown_table

RECIPE_NOTE = {
    "bf16": "FSDP2 MixedPrecisionPolicy: bf16 parameters for compute, float32 master weights "
    "and gradient reduction",
    "fp8-tensorwise": "as bf16, every block linear a torchao Float8Linear with one dynamic scale "
    "per tensor (e4m3 operands, e5m2 output gradients), weights all-gathered in float8",
    "fp8-rowwise": "as bf16, every block linear a torchao Float8Linear with one dynamic scale per "
    "row (e4m3 throughout)",
    "fp16": "float16 compute, float32 master weights and gradient reduction, dynamic loss "
    "scaling (torch.amp.GradScaler; a step with an inf/NaN gradient on any shard is skipped "
    "everywhere and the scale halved)",
    "fp32": "no mixed precision",
}


def _pct(x: float | None) -> float | None:
    return None if x is None else 100 * x


def _ok(runs: list[dict]) -> list[dict]:
    return [r for r in runs if r.get("status") == "ok"]


def _g(v: float) -> str:
    return format(v, ".4g")


def _repeated(runs: list[dict]) -> int:
    """The most repetitions a throughput row holds (1 for a record of one run per recipe)."""
    return max([len(r.get("tokens_per_s_reps") or ()) for r in _ok(runs)] or [1]) or 1


def _parity_lines(rec: dict, h: str, name: str) -> list[str]:
    par = rec["results"].get("parity")
    if not par:
        return []
    rows = []
    for r in par["runs"]:
        if r["status"] != "ok":
            rows.append({"precision": r["label"], "status": r["status"]})
            continue
        uf = r.get("fp16_underflow") or {}
        rows.append(
            {
                "precision": r["label"],
                "status": "ok",
                "final loss": r["final_loss"],
                "vs bf16": r.get("final_loss_diff_vs_bf16"),
                "skipped steps": len(r["skipped_steps"]) if r["loss_scaling"] else None,
                "final loss scale": r.get("loss_scale"),
                "grad elements lost without scaling %": _pct(uf.get("underflow_share")),
            }
        )
    n_final = max(1, round(par["steps_total"] * rec["results"]["final_fraction"]))
    out = [
        f"{h}# Loss parity: `{par['preset']}`, {par['steps_total']} steps, global batch "
        f"{par['global_batch']} x {par['seq_len']} tokens",
        "",
        markdown_table(rows, floatfmt=".4g"),
        "",
        f"Final loss: the mean loss of the last {n_final} step{'s' if n_final > 1 else ''} "
        "(nats/token); vs bf16: that "
        "minus bf16's. Every run starts from the same weights and sees the same batches of the "
        "synthetic successor stream (learnable: the loss falls far below ln(vocab)).",
    ]
    underflow = [r for r in _ok(par["runs"]) if r.get("fp16_underflow")]
    if underflow:
        u = underflow[0]["fp16_underflow"]
        out += [
            "",
            "Gradient elements lost without scaling: after the last step, one batch's backward "
            "of the loss as it is and of the loss times the scale (unscaled after); an element "
            "that is zero the first time and not the second underflowed in fp16. Share of the "
            f"non-zero elements with scaling (scale {u['scale']:g}, {u['elements']:,} gradient "
            "elements).",
        ]
    out += ["", f"![loss per step]({name}_loss.png)", ""]
    return out


def _micro(phase: dict) -> str:
    """', micro-batch 16, parameters gathered for the step' (records from before they were kept
    say nothing)."""
    if not phase.get("micro_batch"):
        return ""
    kept = phase.get("reshard_after_forward") is False
    return f", micro-batch {phase['micro_batch']}" + (
        ", parameters gathered for the whole step" if kept else ""
    )


def _fused_note(rec: dict, thr: dict) -> str:
    """', output projection and loss fused' for a --fused-loss run (whose fp16 jobs never
    fuse: said when there are some); '' otherwise."""
    if not (rec.get("config") or {}).get("train", {}).get("fused_loss"):
        return ""
    fp16 = any(r.get("precision") == "fp16" for r in thr["runs"])
    return ", output projection and loss fused" + (" (fp16's unfused)" if fp16 else "")


def _throughput_lines(rec: dict, h: str, name: str) -> list[str]:
    thr = rec["results"].get("throughput")
    if not thr:
        return []
    n_reps = _repeated(thr["runs"])
    rows = []
    for r in thr["runs"]:
        if r["status"] != "ok":
            rows.append({"precision": r["label"], "status": r["status"]})
            continue
        rows.append(
            {
                "precision": r["label"],
                **({"runs": r.get("repeats") or 1} if n_reps > 1 else {}),
                "tokens/s": ranged(r, "tokens_per_s", str, round),
                "vs bf16": ranged(r, "speedup_vs_bf16", _g),
                "MFU % (own peak)": ranged(r, "mfu", _g, _pct),
                "peak": r.get("peak_kind"),
                "MFU % (bf16 peak)": ranged(r, "mfu_bf16_peak", _g, _pct),
                "TFLOP/s per device": ranged(r, "achieved_tflops_per_device", _g),
                "peak memory (GiB)": r["peak_memory_gib"],
                "USD / M tokens on-demand": r.get("usd_per_m_tokens_on_demand"),
                "USD / M tokens spot": r.get("usd_per_m_tokens_spot"),
            }
        )
    ok = _ok(thr["runs"])
    price = next((r["price_source"] for r in ok if r.get("price_source")), None)
    runs_note = (
        f" Each recipe ran up to {n_reps} times (runs), each a separate job, the recipes "
        "interleaved (order reversed on alternate repetitions): cells show the median (min–max) "
        "over the runs; vs bf16 is the median of the per-repetition ratios (repetition i of the "
        "recipe over repetition i of bf16), peak memory the largest of the runs, cost from the "
        "median tokens/s."
        if n_reps > 1
        else ""
    )
    out = [
        f"{h}# Throughput and cost: `{thr['preset']}`, global batch {thr['global_batch']} x "
        f"{thr['seq_len']} tokens{_micro(thr)}, {thr['steps_total']} steps"
        + _fused_note(rec, thr)
        + (f", median of up to {n_reps} runs" if n_reps > 1 else ""),
        "",
        markdown_table(rows, floatfmt=".4g"),
        "",
        "tokens/s: global batch tokens over the median step time of the timed steps (slowest "
        "rank). MFU (own peak): model FLOPs against the dense peak of the precision the block "
        "matmuls run in (fp8 for the fp8 recipes, though attention and the output head stay "
        "bf16); MFU (bf16 peak): against the bf16 peak whatever the recipe, the number to compare "
        "across recipes. Peak memory: "
        f"{ok[0]['memory_kind'] if ok else 'n/a'} (max over ranks)."
        + runs_note
        + (
            f" Prices: {price}." if price else " No cost: it needs a GPU listed in shared.hardware."
        ),
        "",
        f"![tokens per second]({name}_throughput.png)",
        "",
    ]
    return out


def precision_markdown(rec: dict, heading: str = "#", name: str | None = None) -> str:
    res = rec["results"]
    name = name or rec.get("name", "precision")
    h = heading
    recipes = list(
        dict.fromkeys(
            r["precision"] for p in ("parity", "throughput") for r in res.get(p, {}).get("runs", [])
        )
    )
    lines = [
        f"{h} Mixed precision: {', '.join(recipes)}; FSDP2, world size {res['world_size']}",
        "",
        f"Measured on: {environment_line(rec['environment'])}.",
        *(
            f"The {p} phase was measured separately, on: "
            f"{environment_line(res[p]['measured_with']['environment'])}."
            for p in ("parity", "throughput")
            if res.get(p, {}).get("measured_with")
        ),
        "",
        " ".join(f"{p}: {RECIPE_NOTE[p]}." for p in recipes if p in RECIPE_NOTE),
        "",
    ]
    lines += _parity_lines(rec, h, name)
    lines += _throughput_lines(rec, h, name)
    failed = [
        f"{p} {r['label']}: exit {r.get('returncode')}; {(r.get('note') or '').strip()[-300:]}"
        for p in ("parity", "throughput")
        for r in res.get(p, {}).get("runs", [])
        if r["status"] != "ok"
    ]
    failed += [
        f"throughput {r['label']}, repetition {f['repetition']} (the runs before it stand): "
        f"exit {f.get('returncode')}; {(f.get('note') or '').strip()[-300:]}"
        for r in res.get("throughput", {}).get("runs", [])
        if (f := r.get("failed_repetition"))
    ]
    if failed:
        lines += ["Failed:", "", *(f"- {f}" for f in failed), ""]
    return "\n".join(lines)


def precision_charts(rec: dict, out_dir: Path, name: str | None = None) -> list[Path]:
    """<name>_loss.png (each parity run's loss per step) and <name>_throughput.png (tokens/s of
    each throughput run, bf16's as the baseline line)."""
    from shared import charts

    res = rec["results"]
    name = name or rec.get("name", "precision")
    foot = charts.footer(rec["environment"])
    out = []
    par = res.get("parity")
    if par and _ok(par["runs"]):
        series = {
            r["label"]: (list(range(1, len(r["losses"]) + 1)), r["losses"])
            for r in _ok(par["runs"])
        }
        out.append(
            charts.line_chart(
                Path(out_dir) / f"{name}_loss.png",
                series,
                title=f"Loss per step by precision, {par['preset']}, "
                f"world size {res['world_size']}",
                xlabel="optimizer step",
                ylabel="training loss (nats/token, log scale)",
                logy=True,
                footnote=foot,
            )
        )
    thr = res.get("throughput")
    if thr and _ok(thr["runs"]):
        ok = _ok(thr["runs"])
        base = next((r for r in ok if r["precision"] == res["baseline"]), None)
        out.append(
            charts.bar_chart(
                Path(out_dir) / f"{name}_throughput.png",
                [r["label"] for r in ok],
                [r["tokens_per_s"] for r in ok],
                title=f"Training throughput by precision, {thr['preset']}, "
                f"world size {res['world_size']}",
                ylabel="tokens/s",
                baseline=base["tokens_per_s"] if base else None,
                baseline_label=f"{res['baseline']} (baseline)",
                footnote=foot,
            )
        )
    return out
