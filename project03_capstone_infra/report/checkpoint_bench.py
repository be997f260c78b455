"""The checkpoint benchmark's report, from its JSON record alone (raw timings and the figures
derived from them): `<name>.png` (% of training time each kind of save holds) and `<name>.md`
(the saves, the steady state against the 1% target, the staging-buffer builds, the resume). A
record of several ranks (`checkpoint_bench_ws<N>`) sets its headline figures beside those of the
one-rank record found in the same folder. A record of repeated measurements (`--repeats`: the
`_min`, `_max`, `_reps` fields beside a figure, `shared.repeat.flat`) shows the sync save and the
steady state as "median (min–max)" over the repetitions and its chart one bar for the steady
saves; a record of one repetition renders as it always did."""

from __future__ import annotations

import json
from pathlib import Path

from shared.repeat import ranged

from ..bench_checkpoint import _median, _steady_keys, bench_name


def render(record: dict, out_dir: Path) -> list[Path]:
    """The chart and the Markdown of a checkpoint benchmark record, into `out_dir`."""
    return [*write_charts(record, out_dir), write_markdown(record, out_dir)]


_ORDINAL = {1: "2nd", 2: "3rd"}


def text(x: dict | None, key: str, spec: str, f=None) -> str:
    """Figure `key` of `x` formatted with `spec`: 'median (min–max)' when `x` holds two or more
    repetitions of it; 'n/a' when absent."""
    fmt = lambda v: format(v, spec)  # noqa: E731
    v = ranged(x, key, fmt, f)
    return "n/a" if v is None else v if isinstance(v, str) else fmt(v)


def repetitions(d: dict) -> int:
    """The repetitions of the record's steady state and sync save (1: a record of one)."""
    st, sync = d.get("steady_state") or {}, d.get("sync") or {}
    return max(st.get("repetitions", 1), len(sync.get("held_s_reps") or ()) or 1)


def _rows(res: dict, d: dict) -> list[tuple[str, str, dict]]:
    """(short label, description, derived figures) per measured save, in measuring order."""
    rows = []
    n = repetitions(d)
    if "sync" in d:
        saves = d["sync"].get("saves", 1)
        rows.append(
            ("sync", f"sync, median of {saves} (min–max)" if saves > 1 else "sync", d["sync"])
        )
    if "async_cold" in d:
        rows.append(
            (
                "async 1st",
                "async, 1st of the process (allocates and pins the staging buffers)",
                d["async_cold"],
            )
        )
    for i, k in enumerate(_steady_keys(res), start=1):
        if k in d:
            nth = _ORDINAL.get(i, f"{i + 1}th")
            rep = f", repetition {res[k].get('repetition', 1)}" if n > 1 else ""
            rows.append(
                (f"async {nth}", f"async, {nth} of the process (buffers reused{rep})", d[k])
            )
    if "prestage" in d:
        rows.append(
            (
                "background\nbuild",
                "staging buffers freed, then built again on a "
                "background thread while training runs (trainer start-up)",
                d["prestage"],
            )
        )
    if "async_after_prestage" in d:
        rows.append(
            (
                "async after\nbuild",
                "async, first save after that background build",
                d["async_after_prestage"],
            )
        )
    return rows


def write_charts(record: dict, out_dir: Path) -> list[Path]:
    """<name>.png: % of training time each kind of save holds, from a record."""
    from shared.charts import bar_chart, footer

    res, d = record["results"], record["results"]["derived"]
    env, n = record["environment"], d["ckpt_interval_steps"]
    gib = res["sync"]["bytes"] / 2**30
    labels, pct = [], []
    rows = _rows(res, d)
    st = d.get("steady_state") or {}
    if repetitions(d) > 1 and st:  # the steady saves as one bar: their median
        steady = [r for r in rows if r[0].startswith("async ") and r[0] != "async 1st"]
        rows = [r for r in rows if r not in steady]
        at = next((i for i, r in enumerate(rows) if r[0] not in ("sync", "async 1st")), len(rows))
        label = f"async steady\n(median of {st['repetitions']})"
        rows.insert(at, (label, "", {"held_s": st["median_held_s"], "fraction": st["fraction"]}))
    for label, _, x in rows:
        labels.append(label)
        pct.append(100 * x.get("fraction", x["held_s"] / (d["interval_s"] + x["held_s"])))
    ranks = res.get("world_size", 1)
    foot = footer(
        env,
        f"{record['config']['preset']}, {res['n_params'] / 1e9:.2f} B params, bf16 "
        f"FSDP2, batch {record['config']['global_batch']}x"
        f"{res['tokens_per_step'] // record['config']['global_batch']}"
        + (f", {ranks} ranks" if ranks > 1 else ""),
    )
    if labels and labels[0] == "sync":  # tallest bar last: clear of the legend at the top left
        labels, pct = labels[1:] + labels[:1], pct[1:] + pct[:1]
    chart = bar_chart(
        out_dir / f"{record.get('name', 'checkpoint_bench')}.png",
        labels,
        pct,
        title=f"Training time held by checkpoints ({gib:.1f} GiB, 1 per {n} steps)",
        ylabel="% of training time",
        baseline=1.0,
        baseline_label="target: 1%",
        footnote=foot,
    )
    return [chart]


def _side_by_side(records: list[dict]) -> str:
    """The headline figures of records of different world sizes, one column each."""
    from shared.results import markdown_table

    def col(rec: dict) -> str:
        env, ranks = rec["environment"], rec["results"].get("world_size", 1)
        return (
            f"{ranks} rank{'s' if ranks > 1 else ''} ({str(env.get('date', '?'))[:10]}, "
            f"{str(env.get('git_commit') or '?')[:10]})"
        )

    def fig(rec: dict) -> dict:
        res, d = rec["results"], rec["results"]["derived"]
        ranks, batch = res.get("world_size", 1), rec["config"]["global_batch"]
        r, st = res.get("resume") or {}, d.get("steady_state") or {}

        def held(x: dict | None) -> str:
            return "n/a" if not x else f"{text(x, 'held_s', '.3g')} s ({100 * x['fraction']:.2f}%)"

        def sec(x) -> str:
            return "n/a" if x is None else f"{x:.1f} s"

        commits = [d[k]["write_to_commit_s"] for k in _steady_keys(res) if k in d]
        return {
            "GPU": rec["environment"].get("gpu") or "CPU",
            "global batch (per rank)": f"{batch} ({batch // ranks})",
            "baseline step, tokens/s": f"{1e3 * res['baseline']['median_step_s']:.1f} ms, "
            f"{res['baseline']['tokens_per_s']:,.0f}",
            "checkpoint (per rank)": f"{res['sync']['bytes'] / 2**30:.2f} GiB "
            f"({res['sync']['bytes'] / ranks / 2**30:.2f})",
            "sync save, held": held(d.get("sync")),
            "1st async save of a process, held": held(d.get("async_cold")),
            "steady-state async save, held (median)": "n/a"
            if not st
            else f"{text(st, 'median_held_s', '.3g')} s ({100 * st['fraction']:.2f}%) of "
            f"{st['saves']}",
            "async save, to committed": sec(_median(commits)),
            "resume: launch to first new step": sec(r.get("to_first_new_step_s")),
            "resume: verify + load + reshard": sec(r.get("load_s")),
        }

    figs = [fig(rec) for rec in records]
    rows = [{"": k, **{col(rec): f[k] for rec, f in zip(records, figs)}} for k in figs[0]]
    n = records[0]["results"]["derived"]["ckpt_interval_steps"]
    return (
        markdown_table(rows) + f"\n\nHeld: the training time a save holds (defined below), "
        f"and in brackets its share of the time at one checkpoint per {n} steps. Each column "
        "is its own run, measured on the date and commit it names."
    )


def write_markdown(record: dict, out_dir: Path) -> Path:
    """<name>.md from a record (raw + derived); a record of several ranks also sets its headline
    figures beside those of the one-rank record in `out_dir`, if any."""
    from shared.results import atomic_write_text, environment_line, markdown_table

    res, d = record["results"], record["results"]["derived"]
    env, n = record["environment"], d["ckpt_interval_steps"]
    name, ranks = record.get("name", "checkpoint_bench"), res.get("world_size", 1)
    gib = res["sync"]["bytes"] / 2**30
    pct_col = f"% of time at 1 per {n} steps"
    rows = []
    g = lambda v: format(v, ".3g")  # noqa: E731  the table's number format
    for label, desc, x in _rows(res, d):
        frac = x.get("fraction", x["held_s"] / (d["interval_s"] + x["held_s"]))
        rows.append(
            {
                "save": desc,
                "held (s)": ranged(x, "held_s", g),
                pct_col: ranged(x, "fraction", g, lambda v: 100 * v)
                if "fraction" in x
                else 100 * frac,
                "1st step excess (s)": x.get("first_step_excess_s", float("nan")),
                "later steps excess (s)": x.get("later_steps_excess_s", float("nan")),
                "to committed (s)": x.get("write_to_commit_s", float("nan"))
                if label != "sync"
                else ranged(x, "held_s", g),
            }
        )
    r = res.get("resume") or {}
    lines = []
    st = d.get("steady_state")
    if st:
        verdict = (
            "met"
            if st["met"]
            else f"not met ({100 * st['fraction']:.2f}%, {st['fraction'] / 0.01:.1f}x the target)"
        )
        reps = st.get("repetitions", 1)
        lines.append(
            f"Steady state (async saves with the staging buffers already built, {st['saves']} "
            + (
                f"saves): median {st['median_held_s']:.3f} s held (max {st['max_held_s']:.3f} s) = "
                if reps < 2
                else f"saves in {reps} repetitions): median over the repetitions "
                f"{text(st, 'median_held_s', '.3f')} s held (each repetition's figure: the "
                f"median of its saves; the largest single save {st['max_held_s']:.3f} s) = "
            )
            + f"{100 * st['fraction']:.2f}% of the time at one checkpoint per {n} steps; target "
            f"< 1%: **{verdict}**. Net of step-time noise (steps below the median offsetting "
            f"those above): median {st.get('median_net_held_s', float('nan')):.3f} s."
        )
    else:
        lines.append(
            "The steady-state async save (buffers already built) was not measured in "
            "this run: see the project README for the command."
        )
    builds = [(k, res[k]["build"]) for k in ("async_cold",) if k in res and res[k].get("build")]
    if "prestage" in res and res["prestage"].get("build"):
        builds.append(("prestage", res["prestage"]["build"]))
    for k, b in builds:
        where = "inside the 1st async save" if k == "async_cold" else "in the background"
        lines.append(
            f"Staging buffers built {where}: {b['bytes'] / 2**30:.2f} GiB for {b['tensors']} "
            f"tensors ({b['pinned_bytes'] / 2**30:.2f} GiB page-locked) in {b['seconds']:.2f} s, "
            f"of which cudaHostRegister {b['register_s']:.2f} s."
        )
    compared = []
    one = out_dir / f"{bench_name(1)}.json"
    if ranks > 1 and one.is_file():
        base = json.loads(one.read_text())
        if base.get("results", {}).get("world_size", 1) == 1 and "derived" in base["results"]:
            compared = [f"One rank against {ranks}:", "", _side_by_side([base, record]), ""]
    where = f", {ranks} ranks" if ranks > 1 else ""
    md = "\n".join(
        [
            f"### Checkpoint cost and resume time ({env.get('gpu') or 'CPU'}, {record['config']['preset']}{where})",
            "",
            *compared,
            f"Checkpoint: {gib:.2f} GiB (fp32 weights + AdamW moments, {res['n_params'] / 1e9:.2f} B "
            f"parameters) on {res.get('checkpoint_fs', '?')}. Baseline step "
            f"{res['baseline']['median_step_s'] * 1e3:.1f} ms median ({res['baseline']['tokens_per_s']:,.0f} tok/s), "
            f"measured in the same process. Stager: {record['config'].get('stager', 'dcp (fresh per save)')}.",
            "",
            markdown_table(rows, floatfmt=".3g"),
            "",
            *[x + "\n" for x in lines],
            f"Resume (a new {'torchrun job' if ranks > 1 else 'process'}, `--resume auto`): first new step {r.get('to_first_new_step_s') or float('nan'):.1f} s "
            f"after launch, of which checksum verification {r.get('verify_s') or float('nan'):.1f} s and "
            f"verify + load + reshard {r.get('load_s') or float('nan'):.1f} s (target < 30 s).",
            "",
            d["method"]
            + ". Excess: a step's time over the baseline median; the later steps' excess "
            "is the interference of the background write (and hashing) with training.",
            "",
            f"Measured: {environment_line(env)}.",
        ]
    )
    return atomic_write_text(out_dir / f"{name}.md", md + "\n")
