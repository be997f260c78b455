"""The data loading benchmark's report, from its JSON record alone: `<name>.png` (tokens/s of every
loader against the in-loop stream) and `<name>.md` (the table, the fastest loader and what the
figures mean). `<name>` is the record's `out_name` (default `data`)."""

from __future__ import annotations

from pathlib import Path


def render(record: dict, out_dir: Path) -> list[Path]:
    """The chart and the Markdown of a data record, into `out_dir`."""
    from shared.results import atomic_write_text

    paths = write_charts(record, out_dir)
    paths.append(atomic_write_text(out_dir / f"{_name(record)}.md", render_markdown(record)))
    return paths


def _name(record: dict) -> str:
    return record["config"].get("out_name") or "data"


def write_charts(record: dict, out_dir: Path) -> list[Path]:
    """<name>.png: tokens/s of every loader against the in-loop stream."""
    from shared.charts import bar_chart, footer

    results, c = record["results"], record["config"]
    base = results["runs"]["in-loop stream (baseline)"]
    labels = list(results["runs"])
    foot = footer(
        record["environment"],
        f"{c['preset']}: batch {c['global_batch']} x seq "
        f"{results['seq_len']}; median of {c['repeats']} x {c['batches']} batches",
    )
    return [
        bar_chart(
            out_dir / f"{_name(record)}.png",
            labels,
            [results["runs"][k]["tokens_per_s"] for k in labels],
            title="Data loading throughput: DataLoader and DALI vs the in-loop stream",
            ylabel="tokens/s",
            baseline=base["tokens_per_s"],
            baseline_label="in-loop stream",
            footnote=foot,
        )
    ]


def render_markdown(record: dict) -> str:
    """<name>.md: every loader's batches/s and tokens/s against the in-loop stream."""
    from shared.results import environment_line, markdown_table

    cfg, results, env = record["config"], record["results"], record["environment"]
    base = results["runs"]["in-loop stream (baseline)"]
    fastest = max(results["runs"], key=lambda k: results["runs"][k]["tokens_per_s"])
    rows = [
        {
            "loader": k,
            "batches/s": v["batches_per_s"],
            "tokens/s": v["tokens_per_s"],
            "x baseline": v["speedup_vs_baseline"],
        }
        for k, v in results["runs"].items()
    ]
    md = [
        f"# Data loading throughput ({cfg['preset']} shapes)",
        "",
        f"Measured with: {environment_line(env)}; DALI {results['dali'] or 'absent'}"
        f"{' (' + results['dali_device'] + ' operators)' if results['dali'] else ''}.",
        f"Batch: {cfg['global_batch']} sequences x {results['seq_len']} tokens (vocab "
        f"{results['vocab_size']:,}); median of {cfg['repeats']} repeats of {cfg['batches']} "
        f"batches after {cfg['warmup']} warm-up batches. Baseline: the stream called in the "
        "training loop.",
        "",
        markdown_table(rows),
        "",
        "Every loader's first batch is checked against the stream's own batch 0, and the tests "
        "check that each resumes at the exact batch.",
        "",
        f"Fastest: {fastest} ({results['runs'][fastest]['speedup_vs_baseline']:.2f}x the in-loop "
        f"stream). Building one batch here takes {1e3 / base['batches_per_s']:.1f} ms in the "
        "training process; worker processes (DataLoader or DALI's parallel external source) "
        "add an inter-process copy per batch and pay off only when building a batch costs more "
        "than moving it (tokenising or decoding real data, augmentation), and when there are "
        "idle cores to run them.",
    ]
    if results["dali_skipped_reason"]:
        md += ["", f"DALI not measured: {results['dali_skipped_reason']}."]
    return "\n".join(md) + "\n"
