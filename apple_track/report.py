"""The track's report, from the result record `python -m apple_track export` wrote.

    python -m apple_track report                       # reports/apple_track/export.json
    python -m apple_track report --record path/to/export.json --no-readme

Writes next to the record: `tradeoff.png` (size vs error per variant, and CPU latency against
PyTorch eager, same colours), `summary.md` (the main run's short table), `details.md` (every
table of every recorded run), and regenerates `apple_track/README.md`, the front page whose
results table comes from `apple_track/headlines.py`. Needs only
matplotlib and the shared library, not coremltools, LiteRT or MLX, so the main test tier
checks it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from shared.cli import require_nonempty
from shared.results import (
    REPO_ROOT,
    REPORTS_DIR,
    atomic_write_text,
    environment_line,
    load_result,
    markdown_table,
)

# The track's README; in a standalone fork it is the repository's README, at its root.
README = next(
    (p for p in (REPO_ROOT / "apple_track" / "README.md", REPO_ROOT / "README.md") if p.is_file()),
    REPO_ROOT / "apple_track" / "README.md",
)
MAIN_NAME = "export"  # the record `make apple` writes; other names are extra runs
DEFAULT_RECORD = REPORTS_DIR / "apple_track" / f"{MAIN_NAME}.json"
RUNTIME_LABELS = {"coreml": "Core ML", "litert": "LiteRT", "mlx": "MLX"}
RUNTIME_COLORS = {"coreml": "#4C72B0", "litert": "#DD8452", "mlx": "#55A868"}


def _size(n: int | None) -> str | None:
    """Bytes as a short human figure: KiB below 10 MiB, MiB above."""
    if n is None:
        return None
    return f"{n / 1024:,.0f} KiB" if n < 10 * 2**20 else f"{n / 2**20:,.1f} MiB"


def variant_rows(record: dict) -> list[dict]:
    """One row per variant: the columns of the README's main table."""
    base = record.get("baseline") or {}
    base_ms = (base.get("latency") or {}).get("median_ms")
    base_bytes = base.get("bytes")
    # Tolerances are stated for trained weights; on an untrained model they do not apply.
    trained = bool(record["results"].get("model", {}).get("train_steps"))
    rows = []
    for v in record["results"]["variants"]:
        lat = v.get("latency") or {}
        par = v.get("parity") or {}
        ms = lat.get("median_ms")
        rows.append(
            {
                "runtime": RUNTIME_LABELS.get(v["runtime"], v["runtime"]),
                "variant": v["variant"],
                "size": _size(v.get("bytes")),
                "vs_fp32": (v["bytes"] / base_bytes) if v.get("bytes") and base_bytes else None,
                "ops": v.get("n_ops"),
                "compressed": v.get("compressed_weight_ops"),
                "rel_l2": par.get("rel_l2"),
                "max_abs": par.get("max_abs"),
                "top1": par.get("top1_agree"),
                "loss_delta": par.get("loss_delta"),
                "tol": (v.get("tolerance") or {}).get("rel_l2"),
                "ok": v.get("within_tolerance") if trained else None,
                "source": "emulated"
                if "emulated" in (v.get("parity_source") or "")
                else "measured",
                "latency_ms": ms,
                "speedup": (base_ms / ms) if ms and base_ms else None,
                "device": v.get("device"),
            }
        )
    return rows


_COLUMNS = [
    "runtime",
    "variant",
    "size",
    "vs_fp32",
    "ops",
    "compressed",
    "rel_l2",
    "max_abs",
    "top1",
    "loss_delta",
    "tol",
    "ok",
    "source",
    "latency_ms",
    "speedup",
    "device",
]
_HEADERS = [
    "runtime",
    "variant",
    "size",
    "size / PyTorch fp32",
    "ops",
    "compressed weights",
    "rel. L2 error",
    "max abs error",
    "top-1 agree",
    "loss change (nats)",
    "tolerance (rel. L2)",
    "within",
    "parity",
    "latency (ms)",
    "speed-up vs PyTorch eager (x)",
    "timed on",
]


def variants_table(record: dict) -> str:
    return markdown_table(variant_rows(record), _COLUMNS, headers=_HEADERS)


def _context(record: dict) -> str:
    r, env = record["results"], record["environment"]
    m = r["model"]
    versions = ", ".join(f"{k} {v}" for k, v in r.get("versions", {}).items() if v)
    load = r.get("load_average_1_5_15")
    load_note = (
        f" Load average during the run {load[0]:.1f} (1 min) on {env.get('cpu_count')} cores: "
        "other processes shared the CPU, so compare latencies within this run, not across runs."
        if load and env.get("cpu_count") and load[0] > 0.5 * env["cpu_count"]
        else ""
    )
    trained = (
        f"trained {m['train_steps']} steps on the synthetic stream"
        if m["train_steps"]
        else "untrained (its logits are nearly uniform, so relative error and top-1 agreement "
        "measure noise around a flat distribution and the stated tolerances, set on the "
        "trained tiny model, do not apply; the loss change is the error figure to read here; "
        "sizes and latencies are what this run is for)"
    )
    return (
        f"Model: shared transformer, preset `{m['preset']}` ({m['num_params']:,} parameters), "
        f"{trained}, exported for input "
        f"(batch {m['batch']}, seq {m['seq_len']}) int32 tokens. Parity: logits against "
        f"PyTorch float32 on a held-out batch. Latency: median of repeated single-threaded CPU "
        f"runs (shared.timing, torch.utils.benchmark) in the same process as the PyTorch eager "
        f"baseline. Measured on: {environment_line(env)}; {r['platform']['system']} "
        f"{r['platform']['machine']}. Versions: {versions}.{load_note}"
    )


def chart_name(record: dict) -> str:
    """`tradeoff.png` for the main run (`export`), `<name>_tradeoff.png` for other runs."""
    name = record.get("name", MAIN_NAME)
    return "tradeoff.png" if name == MAIN_NAME else f"{name}_tradeoff.png"


def summary_markdown(record: dict, chart_dir: str = "") -> str:
    """The results section: context, the variant table, baseline, notes on skipped parts."""
    r = record["results"]
    base = record.get("baseline") or {}
    lat = base.get("latency") or {}
    lines = [
        _context(record),
        "",
        f"Baseline: PyTorch float32 eager, {lat.get('median_ms', float('nan')):.3f} ms per "
        f"forward on the CPU, 1 thread (p20-p80 {lat.get('p20_ms', float('nan')):.3f}-"
        f"{lat.get('p80_ms', float('nan')):.3f} ms, n={lat.get('n')}), state dict "
        f"{_size(base.get('bytes'))}, held-out loss {base.get('loss', 0):.4f} nats."
        + (
            f" Timed again at the end of the run: {base['latency_at_end']['median_ms']:.3f} ms "
            "(the gap between the two is the drift of this machine during the run)."
            if base.get("latency_at_end")
            else ""
        ),
        "",
        variants_table(record),
        "",
    ]
    not_run = sorted(
        {
            v["prediction"]
            for v in r["variants"]
            if str(v.get("prediction", "")).startswith(("skip", "failed"))
        }
    )
    for why in not_run:
        lines.append(
            f"- Core ML prediction: {why}. Its parity column is an emulation (the package's own "
            "weights, decompressed, in PyTorch float16 on the CPU); its latency is not measured."
        )
    cfg = record.get("config") or {}
    for runtime, label in RUNTIME_LABELS.items():
        if runtime in cfg and not cfg[runtime]:
            lines.append(f"- {label}: not requested in this run.")
    for runtime, why in sorted(r.get("runtime_failures", {}).items()):
        lines.append(f"- {RUNTIME_LABELS.get(runtime, runtime)}: {why}")
    metal = r.get("metal") or {}
    if not metal.get("ran"):
        lines.append(f"- Metal kernels: not run: {metal.get('reason', 'unknown')}.")
    if chart_dir is not None:
        lines += [
            "",
            f"![size vs error vs latency]({chart_dir}{chart_name(record)})",
        ]
    return "\n".join(lines).rstrip() + "\n"


def root_summary_markdown(record: dict) -> str:
    """The short version of the main run (summary.md): links are relative to the records'
    folder, where the file lies."""
    r, env = record["results"], record["environment"]
    m = r["model"]
    base_ms = ((record.get("baseline") or {}).get("latency") or {}).get("median_ms")
    n_ok = sum(1 for v in r["variants"] if v.get("within_tolerance"))
    emulated = any("emulated" in (v.get("parity_source") or "") for v in r["variants"])
    head = (
        f"**On-device export** of the shared transformer (`{m['preset']}`, "
        f"{m['num_params']:,} parameters; {environment_line(env)}): {len(r['variants'])} "
        f"variants across Core ML, LiteRT and MLX, {n_ok} within their stated tolerance of "
        f"PyTorch float32"
        + (f"; PyTorch eager {base_ms:.3f} ms per forward on the same CPU" if base_ms else "")
        + (". Core ML errors are emulated off macOS" if emulated else "")
        + ". [Details](details.md)"
    )
    table = markdown_table(
        variant_rows(record),
        ["runtime", "variant", "size", "rel_l2", "ok", "source", "latency_ms", "speedup"],
        headers=[
            "runtime",
            "variant",
            "size",
            "rel. L2 error",
            "within tolerance",
            "parity",
            "latency (ms)",
            "speed-up vs PyTorch eager (x)",
        ],
    )
    return f"{head}\n\n{table}\n\n![size vs error vs latency](tradeoff.png)\n"


def metal_markdown(record: dict) -> str:
    metal = record["results"].get("metal") or {}
    if not metal.get("ran"):
        return f"_Not measured in this run: {metal.get('reason', 'no record')}._\n"
    mm = markdown_table(
        metal["matmul"],
        ["kernel", "dtype", "shape", "max_abs_err", "median_ms", "tflops", "mlx_matmul_tflops"],
        headers=[
            "kernel",
            "dtype",
            "M, N, K",
            "max abs err vs mx.matmul",
            "ms",
            "TFLOP/s",
            "mx.matmul TFLOP/s",
        ],
    )
    att = markdown_table(
        metal["attention"],
        ["shape", "causal", "dtype", "max_abs_err", "median_ms", "tflops", "mlx_sdpa_tflops"],
        headers=[
            "B, H, S, D",
            "causal",
            "dtype",
            "max abs err vs MLX SDPA",
            "ms",
            "TFLOP/s",
            "MLX SDPA TFLOP/s",
        ],
    )
    return f"Device: {metal.get('device')}\n\n{mm}\n\n{att}\n"


def io_markdown(record: dict) -> str:
    rows = []
    for v in record["results"]["variants"]:
        io = v.get("io")
        if not io:
            continue

        def fmt(items):
            return "; ".join(f"`{i['name']}` {i['dtype']} {tuple(i['shape'])}" for i in items)

        rows.append(
            {
                "runtime": RUNTIME_LABELS.get(v["runtime"], v["runtime"]),
                "variant": v["variant"],
                "inputs": fmt(io["inputs"]),
                "outputs": fmt(io["outputs"]),
            }
        )
    return markdown_table(rows, ["runtime", "variant", "inputs", "outputs"]) if rows else "_none_"


def ops_markdown(record: dict) -> str:
    """Op counts of the first variant of each runtime, and what compression adds."""
    out = []
    for runtime in ("coreml", "litert"):
        vs = [v for v in record["results"]["variants"] if v["runtime"] == runtime]
        if not vs or not vs[0].get("op_counts"):
            continue
        first = vs[0]
        ops = ", ".join(f"{op} {n}" for op, n in first["op_counts"].items())
        out.append(f"- {RUNTIME_LABELS[runtime]} `{first['variant']}`: {ops}.")
        for v in vs[1:]:
            diff = {
                op: n - first["op_counts"].get(op, 0)
                for op, n in (v.get("op_counts") or {}).items()
                if n != first["op_counts"].get(op, 0)
            }
            change = ", ".join(f"{op} {d:+d}" for op, d in diff.items()) or "no change"
            out.append(f"  - `{v['variant']}`: {change}.")
    return "\n".join(out) if out else "_none_"


# --- charts ----------------------------------------------------------------------------------


def write_charts(record: dict, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = record["results"]["variants"]
    base = record.get("baseline") or {}
    env_note = environment_line(record["environment"])
    written = []

    # Left: size vs error, the trade-off of compression. Right: latency, same colours.
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 5.2), gridspec_kw={"width_ratios": [3, 2]})
    offsets = {"coreml": (6, -11), "litert": (6, 4), "mlx": (-8, 6)}
    sizes = [v["bytes"] for v in variants if v.get("bytes")] + [base.get("bytes") or 0]
    unit, div = ("MiB", 2**20) if max(sizes) > 10 * 2**20 else ("KiB", 1024)
    for v in variants:
        par = v.get("parity") or {}
        if not v.get("bytes") or par.get("rel_l2") is None:
            continue
        err = max(par["rel_l2"], 1e-8)  # float32 runtimes can be exact: keep them on a log axis
        emulated = "emulated" in (v.get("parity_source") or "")
        ax.scatter(
            v["bytes"] / div,
            err,
            s=70,
            color=RUNTIME_COLORS.get(v["runtime"], "0.4"),
            marker="s" if emulated else "o",
            edgecolors="black",
            linewidths=0.5,
            label=RUNTIME_LABELS.get(v["runtime"], v["runtime"])
            + (" (error emulated)" if emulated else ""),
        )
        dx, dy = offsets.get(v["runtime"], (6, 4))
        ax.annotate(
            v["variant"],
            (v["bytes"] / div, err),
            textcoords="offset points",
            xytext=(dx, dy),
            fontsize=7,
            ha="right" if dx < 0 else "left",
        )
    if base.get("bytes"):
        ax.axvline(
            base["bytes"] / div, color="#C44E52", ls="--", lw=1.2, label="PyTorch fp32 state dict"
        )
    handles, labels = ax.get_legend_handles_labels()
    uniq = dict(zip(labels, handles))
    ax.legend(uniq.values(), uniq.keys(), loc="center left", fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"size on disk ({unit}, log)")
    ax.set_ylabel("relative L2 error of logits vs PyTorch fp32 (log)")
    ax.set_title("size vs error", fontsize=10)
    ax.grid(alpha=0.3, which="both")

    timed = [v for v in variants if (v.get("latency") or {}).get("median_ms")]
    names = [f"{RUNTIME_LABELS.get(v['runtime'], v['runtime'])} {v['variant']}" for v in timed]
    ax2.barh(
        range(len(timed)),
        [v["latency"]["median_ms"] for v in timed],
        color=[RUNTIME_COLORS.get(v["runtime"], "0.4") for v in timed],
    )
    ax2.set_yticks(range(len(timed)), names, fontsize=8)
    ax2.invert_yaxis()
    base_ms = (base.get("latency") or {}).get("median_ms")
    if base_ms:
        ax2.axvline(base_ms, color="#C44E52", ls="--", lw=1.2, label="PyTorch fp32 eager")
        ax2.legend(loc="lower right", fontsize=8)
    times = [v["latency"]["median_ms"] for v in timed] + ([base_ms] if base_ms else [])
    log = bool(times) and max(times) / min(times) > 30  # log only where linear would hide bars
    if log:
        ax2.set_xscale("log")
    else:
        ax2.set_xlim(left=0)
    ax2.set_xlabel(
        f"latency per forward, ms (median{', log' if log else ''}; device: see the table)"
    )
    ax2.set_title("latency (variants without a runtime here are absent)", fontsize=10)
    ax2.grid(alpha=0.3, axis="x", which="both")
    m = record["results"]["model"]
    fig.suptitle(
        f"On-device variants of the shared transformer ({m['preset']}, "
        + (f"{m['num_params'] / 1e6:,.1f} M" if m["num_params"] >= 1e6 else f"{m['num_params']:,}")
        + f" parameters, seq {m['seq_len']}"
        f"{'' if m['train_steps'] else ', untrained'}): size vs error vs latency"
    )
    fig.text(0.01, 0.005, env_note, fontsize=6, color="0.35")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    path = out_dir / chart_name(record)
    tmp = path.with_name(".tradeoff.tmp.png")
    fig.savefig(tmp, dpi=130)
    plt.close(fig)
    os.replace(tmp, path)
    written.append(path)

    return written


# --- README ----------------------------------------------------------------------------------


def _details_parts(record: dict | None, chart_dir: str, others) -> dict[str, str]:
    if record is None:
        parts = {"results": "_No results recorded yet: run `make apple`._\n"}
        parts |= dict.fromkeys(("metal", "ops", "io"), "_No results recorded yet._")
    else:
        parts = {
            "results": summary_markdown(record, chart_dir),
            "metal": metal_markdown(record),
            "ops": ops_markdown(record),
            "io": io_markdown(record),
        }
    more = []
    for other in others:
        m = other["results"]["model"]
        more += [
            f"### Run `{other['name']}`: preset `{m['preset']}`, seq {m['seq_len']}",
            "",
            summary_markdown(other, chart_dir),
        ]
    parts["other_runs"] = "\n".join(more) if more else "_None recorded._\n"
    return parts


def render_details(record: dict | None, others: list[dict] = ()) -> str:
    """`details.md` beside the records: every table of the main run and the other runs
    (runs saved under other names, e.g. a larger preset), charts linked from the same folder."""
    return DETAILS_TEMPLATE.format(**_details_parts(record, "", others)).rstrip() + "\n"


def render_readme(
    record: dict | None, chart_dir: str, others: list[dict] = (), folder: Path | None = None
) -> str:
    """The front page: `chart_dir` is the records' folder as seen from the README; `folder`,
    that folder on disk, from whose records the results table is generated
    (`apple_track.headlines`, as `make readme` does). `others` is kept for the callers that
    pass it: their tables are in details.md."""
    if record is None or folder is None:
        results = "_No results recorded yet: run `make apple` (writes reports/apple_track/)._"
    else:
        from apple_track.headlines import CLAIMS
        from shared import front_page

        results = front_page.render(CLAIMS, Path(folder), chart_dir)
    notes = "NOTES.md" if chart_dir.startswith("../") else "apple_track/NOTES.md"
    chart = f"{chart_dir}{chart_name(record)}" if record else f"{chart_dir}tradeoff.png"
    text = README_TEMPLATE.format(results=results, chart=chart, chart_dir=chart_dir, notes=notes)
    return text.rstrip() + "\n"


def _records(out_dir: Path) -> tuple[dict | None, list[dict]]:
    """The main run's record and the other runs' records in a reports folder."""
    main, others = None, []
    for path in sorted(out_dir.glob("*.json")):
        try:
            rec = load_result(path)
        except ValueError:
            continue  # not a result record
        if rec.get("project") != "apple_track" or "variants" not in rec.get("results", {}):
            continue
        if rec.get("name") == MAIN_NAME:
            main = rec
        else:
            others.append(rec)
    return main, others


def write_report(record_path: str | os.PathLike, *, readme: bool | Path = True) -> list[Path]:
    """Chart for this record; for the main run also summary.md; then the README from every
    record in the folder."""
    record_path = Path(record_path)
    record = load_result(record_path)
    out_dir = record_path.parent
    written = write_charts(record, out_dir)
    if record.get("name", MAIN_NAME) == MAIN_NAME:
        summary = out_dir / "summary.md"
        atomic_write_text(summary, root_summary_markdown(record))
        written.append(summary)
    if readme:
        target = README if readme is True else Path(readme)
        rel = os.path.relpath(out_dir, target.parent).replace(os.sep, "/") + "/"
        main, others = _records(out_dir)
        atomic_write_text(target, render_readme(main, rel, others, out_dir))
        written.append(target)
        details = out_dir / "details.md"
        atomic_write_text(details, render_details(main, others))
        written.append(details)
    return written


def console_summary(record_path: str | os.PathLike) -> str:
    record = load_result(record_path)
    lines = ["runtime  variant          size     rel_l2  within  latency_ms"]
    for r in variant_rows(record):
        ok = {True: "yes", False: "NO", None: "n/a"}[r["ok"]]
        lat = f"{r['latency_ms']:.3f}" if r["latency_ms"] else "n/a"
        rel = f"{r['rel_l2']:.2e}" if r["rel_l2"] is not None else "n/a"
        lines.append(
            f"{r['runtime']:<8} {r['variant']:<10} {r['size'] or 'n/a':>10}  {rel:>9}"
            f"  {ok:>6}  {lat:>10}  ({r['source']})"
        )
    return "\n".join(lines)


@dataclass
class ReportConfig:
    """Rewrite the chart, summary and README from a recorded JSON (no exporter needed)."""

    record: str | None = None
    """the export record; the chart goes next to it (None: reports/apple_track/export.json)"""
    readme: bool = True
    """regenerate apple_track/README.md from every record in the record's folder"""

    def __post_init__(self) -> None:
        if self.record is not None:
            require_nonempty("--record", self.record)


def run(cfg: ReportConfig) -> int:
    """The `report` command."""
    written = write_report(cfg.record or DEFAULT_RECORD, readme=cfg.readme)
    print("\n".join(f"wrote {w}" for w in written))
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m apple_track.report`: the package's `report` command (one CLI, one --help)."""
    from apple_track.__main__ import main as package_main

    return package_main(["report", *(sys.argv[1:] if argv is None else argv)])


README_TEMPLATE = """\
# apple_track: the on-device path

The shared transformer (`shared.model`, the model every project trains) exported to the
runtimes that ship on phones and laptops: Core ML (float16, palettized and int8), LiteRT (float32
and int8), an MLX port, and Metal kernels that mirror project01's CUDA ones. Every variant is
measured against the PyTorch float32 model in the same run: size, op counts, parity, CPU latency.

![size vs error vs latency per variant]({chart})

This file is generated by `make apple` (`apple_track/report.py`): edit the template there.

## Quick start

```bash
make apple                                  # from the repo root: the whole track and this page
make -f apple_track/Makefile setup          # just create .venv-apple (once; several GB)
make -f apple_track/Makefile test           # the track's tests with every runtime installed
make -f apple_track/Makefile report REPORT_ARGS="--preset 125m --seq-len 128 --train-steps 0"
.venv-apple/bin/python -m apple_track export --help
```

`litert-torch` pins its own torch release and pulls jax, so the track lives in its own virtual
environment, `.venv-apple`; the main `.venv` stays untouched. Model files land in
`.build/apple_track/<run name>/` (not committed).

## Results

<!-- results:apple_track -->
{results}
<!-- /results:apple_track -->

Every variant's size, error, latency, inputs, outputs and op counts, and the Metal kernels'
checks: [details.md]({chart_dir}details.md). Off macOS, Core ML errors are emulated (the
package's weights run in PyTorch) and have no latency. Why each choice was made, the
profiling recipes for Instruments, and the limitations: [NOTES.md]({notes}).

## How it works

| path | what |
| --- | --- |
| `export.py` | the `export` command: trains briefly, exports every variant, measures each against PyTorch, writes one record |
| `model.py` | the fixed-shape wrapper (int32 tokens), the tolerances per variant |
| `coreml_export.py`, `litert_export.py` | conversion and compression for Core ML and LiteRT |
| `mlx_model.py` | the MLX port, loading the PyTorch weights by name |
| `metal/`, `metal_kernels.py` | Metal kernel bodies (matmul ladder, flash attention) and their launchers through MLX |
| `profile.py` | a steady loop over one variant, for Instruments |
| `report.py` | this page, `details.md`, `summary.md` and the chart, from the record alone |
| `headlines.py` | the claims in the results table: record, figure, target |

## Read more

- [NOTES.md]({notes}): design choices, profiling on device, limitations.
- [details.md]({chart_dir}details.md): the full tables of every recorded run.
"""

DETAILS_TEMPLATE = """\
# apple_track: every recorded run

Generated by `python -m apple_track report` from the records in this folder; the track's
README is the front page, with the headline claims.

## Main run

{results}

Reading the table: *size / PyTorch fp32* compares with the float32 state dict; *compressed
weights* counts the weight tensors stored compressed (Core ML `constexpr_*` ops, LiteRT int8
constants, MLX quantized layers); *parity* says whether the error was measured on the runtime
itself or emulated (Core ML off macOS); *within* checks the stated tolerance
(`apple_track.model.TOLERANCES`, relative L2 error and top-1 agreement).

## Other recorded runs

Written by `make -f apple_track/Makefile report REPORT_ARGS="--name NAME ..."`.

{other_runs}

## Inputs and outputs (main run)

{io}

## Op counts (main run)

{ops}

## Metal kernels (main run)

{metal}
"""

if __name__ == "__main__":
    sys.exit(main())
