"""FSDP2 vs DeepSpeed ZeRO-3: the Markdown and charts of a `compare` record, from the JSON alone.

A record holds one pair of runs per precision (`runs`) and the tolerance its loss parity is
judged by (`parity`). Records written before precision pairs existed (one precision, no `runs`)
render exactly as they did then.
"""

from __future__ import annotations

from pathlib import Path

from project02_fsdp_scaling.config import record_precision
from project02_fsdp_scaling.parity import loss_gaps
from shared.results import environment_line, markdown_table

SIDES = (("fsdp", "FSDP2 (torch)"), ("deepspeed", "DeepSpeed ZeRO-3"))
SHORT = {"fsdp": "FSDP2", "deepspeed": "DeepSpeed ZeRO-3"}
# The notes of each precision, by the name a record gives it (older records: the dtype's name).
_BF16_NOTE = (
    "FSDP2 with MixedPrecisionPolicy (bf16 parameters for compute, float32 gradient "
    "reduction, float32 master weights); DeepSpeed with `bf16: enabled` (float32 master weights, "
    "float32 gradient communication)"
)
_FP32_NOTE = "neither path mixed; float32 matmuls with TF32 off (PyTorch's default)"
PRECISION_NOTE = {
    "bf16": _BF16_NOTE,
    "bfloat16": _BF16_NOTE,
    "fp32": _FP32_NOTE,
    "float32": _FP32_NOTE,
}


def _named(run: dict) -> str:
    """A run's precision as its record names it (bf16, or bfloat16 in older records)."""
    return run.get("precision", run.get("param_dtype"))


def compare_markdown(rec: dict, heading: str = "#", name: str | None = None) -> str:
    if "runs" not in rec["results"]:
        return _single_precision_markdown(rec, heading, name)
    res = rec["results"]
    name = name or rec.get("name", "compare")
    h = heading
    runs = res["runs"]
    rows = []
    for run in runs:
        base = (run.get("fsdp") or {}).get("tokens_per_s") if _ok(run, "fsdp") else None
        for key, label in SIDES:
            r = run.get(key)
            if not r:
                continue
            row = {"precision": _named(run), "path": label, "status": r.get("status")}
            if r.get("status") != "ok":
                rows.append({**row, "note": (r.get("note") or "")[:120]})
                continue
            rows.append(
                {
                    **row,
                    "tokens/s": round(r["tokens_per_s"]),
                    "vs FSDP2": r["tokens_per_s"] / base if base else None,
                    "step time (s)": r["step_time_s"],
                    "peak memory (GiB)": r["peak_memory_gib"],
                    "final loss": r["last_loss"],
                }
            )
    timed = res["steps_total"] - res.get("warmup_steps", 0)
    mem_kind = next((run[k]["memory_kind"] for run in runs for k, _ in SIDES if _ok(run, k)), "n/a")
    dtypes = " and ".join(res["precisions"])
    lines = [
        f"{h} FSDP2 vs DeepSpeed ZeRO-3: `{res['preset']}`, world size {res['world_size']}, "
        f"{dtypes}, {res['steps_total']} steps",
        "",
        f"Measured on: {environment_line(rec['environment'])}.",
        "",
        markdown_table(rows),
        "",
        " ".join(
            [
                *[f"{d}: {PRECISION_NOTE[d]}." for d in res["precisions"] if d in PRECISION_NOTE],
                f"Both: global batch {res['global_batch']} x {res['seq_len']} tokens, eager, SDPA, "
                f"the same initial weights and data, AdamW (torch's, DeepSpeed's client "
                f"optimizer), gradient clipping at {res['grad_clip']} set explicitly. Step time: "
                f"median of the {timed} timed steps after {res.get('warmup_steps', 0)} warm-up, "
                f"the slowest rank's; tokens/s = tokens per step / step time. Peak memory: "
                f"{mem_kind} (max over ranks).",
            ]
        ),
        "",
    ]
    lines += _parity_lines(res, h, name)
    notes = [f"{run['note']} ({_named(run)})" for run in runs if run.get("note")]
    lines += [*notes, ""] if notes else []
    if any(_ok(run, k) for run in runs for k, _ in SIDES):
        lines += [f"![loss curves]({name}_loss.png)", ""]
    return "\n".join(lines)


def _parity_lines(res: dict, h: str, name: str) -> list[str]:
    runs = [run for run in res["runs"] if run.get("parity")]
    if not runs:
        return []
    tol = res.get("tolerance") or {}
    rows = []
    for run in runs:
        p = run["parity"]
        within = p.get("within_tolerance")
        rows.append(
            {
                "precision": _named(run),
                "start": _start(run),
                "largest loss difference": p["max_loss_diff"],
                "at step": p["max_loss_diff_step"],
                "/ R": p.get("ratio_to_tolerance"),
                "within R": None if within is None else ("yes" if within else "**NO**"),
                "final weights: largest difference": p["max_param_abs_diff"],
                "relative L2": p["param_rel_l2"],
            }
        )
    out = [f"{h}# Loss parity", "", markdown_table(rows), ""]
    if tol:
        out += [
            f"Tolerance R = {tol['loss_abs']:.3g}: the largest per-step loss difference between "
            "FSDP2 in bfloat16 and FSDP2 in float32 over the same steps, i.e. what rounding every "
            "weight and matmul output to bf16 does to this loss curve. Another order of the same "
            "sums re-rounds only some of those values (the outputs whose float32 sum lies within "
            "the re-ordering's error of a bf16 rounding boundary: about n x 2^-16 of them for "
            "sums of length n), so the bf16 pair is expected at about sqrt(n x 2^-16) x R "
            "(0.2 to 0.3 x R at `1b`), the float32 pair far below R, and a bug in either path "
            "above it (derivation: `project02_fsdp_scaling/parity.py`).",
            "",
            f"![loss difference per step]({name}_parity.png)",
            "",
            "Steps where two losses are equal have no place on the chart's log axis and are left "
            "out of their line.",
            "",
        ]
    else:
        out += [
            "No tolerance: R is FSDP2's own bf16-vs-fp32 gap, which needs both precisions "
            "of FSDP2 in the same run (`--precisions bf16 fp32`).",
            "",
        ]
    return out


def _start(run: dict) -> str:
    if record_precision(run) != "bf16":
        return "same float32 weights"
    if run.get("bf16_rounded_init"):
        return "same: the bf16 image of the initial weights"
    return "FSDP2 float32, DeepSpeed their bf16 image"


def _ok(run: dict, key: str) -> bool:
    return (run.get(key) or {}).get("status") == "ok"


def compare_charts(rec: dict, out_dir: Path, name: str | None = None) -> list[Path]:
    """<name>_loss.png (the loss per step of each side that ran) and, when the parity is judged,
    <name>_parity.png (each pair's loss difference per step against R)."""
    from shared import charts

    res = rec["results"]
    name = name or rec.get("name", "compare")
    foot = charts.footer(rec["environment"])
    if "runs" not in res:  # one precision: the sides' names alone
        pairs, dtypes = [(res, "")], _named(res)
    else:
        pairs = [(run, " " + record_precision(run)) for run in res["runs"]]
        dtypes = " and ".join(res["precisions"])
    series = {
        f"{SHORT[k]}{suffix}": (
            list(range(1, len(run[k]["losses"]) + 1)),
            run[k]["losses"],
        )
        for run, suffix in pairs
        for k, _ in SIDES
        if _ok(run, k)
    }
    if not series:
        return []
    out = [
        charts.line_chart(
            Path(out_dir) / f"{name}_loss.png",
            series,
            title=f"Loss per step, {res['preset']}, world size {res['world_size']}, {dtypes}",
            xlabel="optimizer step",
            ylabel="training loss (nats/token)",
            y_from_zero=False,  # a loss curve: its shape, not its distance from 0
            footnote=foot,
        )
    ]
    tol = res.get("tolerance") if "runs" in res else None
    judged = [run for run in res.get("runs", []) if run.get("parity")]
    if tol and judged:
        by = {record_precision(run): run for run in res["runs"]}
        scale = loss_gaps(by["bf16"]["fsdp"]["losses"], by["fp32"]["fsdp"]["losses"])
        gaps = {
            f"|DeepSpeed - FSDP2| {record_precision(run)}": (
                list(range(1, len(run["parity"]["loss_diffs"]) + 1)),
                # a step with equal losses has no place on a log axis: left out of its line
                [d if d > 0 else float("nan") for d in run["parity"]["loss_diffs"]],
            )
            for run in judged
        }
        gaps["|FSDP2 bf16 - FSDP2 fp32|"] = (
            list(range(1, len(scale) + 1)),
            [d if d > 0 else float("nan") for d in scale],
        )
        out.append(
            charts.line_chart(
                Path(out_dir) / f"{name}_parity.png",
                gaps,
                title=f"Loss difference per step, {res['preset']}, world size {res['world_size']}",
                xlabel="optimizer step",
                ylabel="absolute loss difference (nats/token)",
                logy=True,
                y_from_zero=False,
                hlines=[(tol["loss_abs"], "R: FSDP2 bf16 vs fp32, largest")],
                footnote=foot,
            )
        )
    return out


# ---- records of one precision (before precision pairs) -----------------------------------------
def _single_precision_markdown(rec: dict, heading: str, name: str | None) -> str:
    res = rec["results"]
    name = name or rec.get("name", "compare")
    h = heading
    rows = []
    for key, label in SIDES:
        r = res.get(key)
        if not r:
            continue
        if r.get("status") != "ok":
            rows.append({"path": label, "status": r.get("status"), "note": r.get("note", "")})
            continue
        rows.append(
            {
                "path": label,
                "status": "ok",
                "tokens/s": round(r["tokens_per_s"]),
                "step time (s)": r["step_time_s"],
                "peak memory (GiB)": r["peak_memory_gib"],
                "final loss": r["last_loss"],
            }
        )
    parity = res.get("parity") or {}
    lines = [
        f"{h} FSDP2 vs DeepSpeed ZeRO-3: `{res['preset']}`, world size {res['world_size']}, "
        f"{_named(res)}, {res['steps_total']} steps",
        "",
        f"Measured on: {environment_line(rec['environment'])}.",
        "",
        markdown_table(rows),
        "",
    ]
    if parity:
        lines += [
            f"Loss parity: largest per-step loss difference {parity['max_loss_diff']:.3g}; "
            f"final parameters: largest absolute difference {parity['max_param_abs_diff']:.3g} "
            f"(relative L2 {parity['param_rel_l2']:.3g}). Same model, data, AdamW "
            f"(torch's, as DeepSpeed's client optimizer), gradient clipping at "
            f"{res['grad_clip']} set explicitly in both.",
            "",
        ]
    if res.get("note"):
        lines += [res["note"], ""]
    if any((res.get(k) or {}).get("status") == "ok" for k, _ in SIDES):
        lines += [f"![loss curves]({name}_loss.png)", ""]
    return "\n".join(lines)
