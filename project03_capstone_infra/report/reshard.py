"""The resharding demonstration's report, from its JSON record alone: reshard.png (the loss
curves across the change of world size, and the relative difference after it)."""

from __future__ import annotations

from pathlib import Path


def render(record: dict, out_dir: Path) -> list[Path]:
    """reshard.png of a reshard record, into `out_dir` (the demonstration has no Markdown of
    its own: summary.md holds its line)."""
    return write_charts(record, out_dir)


def write_charts(record: dict, out_dir: Path) -> list[Path]:
    """reshard.png from the record alone: the loss curves across the change (left) and the
    relative difference from the reference after it (right, log scale)."""
    from shared.charts import _finish, footer, plt, save_figure, series_style

    res, c = record["results"], record["config"]
    n = res["switch_after"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4))
    for i, d in enumerate(res["directions"]):
        a, b = d["from_world"], d["to_world"]
        ref = {int(k): v for k, v in d["reference_curve"].items()}
        got = {int(k): v for k, v in d["curve"].items()}
        style = series_style(i)
        left.plot(
            sorted(ref),
            [ref[s] for s in sorted(ref)],
            color=style["color"],
            lw=2.5,
            alpha=0.45,
            label=f"{a} rank(s), uninterrupted",
        )
        left.plot(
            sorted(got),
            [got[s] for s in sorted(got)],
            ls="--",
            ms=3,
            lw=1.2,
            label=f"{a} -> {b} after step {n}",
            **style,
        )
        after = sorted(s for s in got if s > n and s in ref)
        rel = [max(abs(got[s] - ref[s]) / abs(ref[s]), 1e-12) for s in after]
        right.plot(after, rel, ms=4, label=f"{a} -> {b}", **style)
    for ax in (left, right):
        ax.axvline(n + 0.5, color="0.3", ls=":", lw=1)
        ax.grid(alpha=0.3)
        ax.set_xlabel("optimizer step")
    left.set_ylabel("training loss (nats)")
    left.set_title(f"Loss across the change of world size (after step {n})", fontsize=10)
    left.legend(fontsize=8)
    right.set_yscale("log")
    right.set_ylabel("|loss - uninterrupted| / loss")
    tol = res["directions"][0]["first_after"]["tolerance"] if res["directions"] else None
    if tol:
        right.axhline(tol, color="#C44E52", ls="--", lw=1, label=f"first-step tolerance {tol:.1e}")
    right.set_title(
        f"After the change (steps 1-{n}: bitwise equal; an equal loss is drawn at 1e-12)",
        fontsize=10,
    )
    right.legend(fontsize=8)
    mode = ", deterministic mode" if res.get("deterministic") else ""
    foot = footer(
        record["environment"],
        f"{c['preset']}, {res['dtype']}, {res['backend']}{mode}, global batch {c['global_batch']}",
    )
    return [save_figure(_finish(fig, foot), out_dir / "reshard.png")]
