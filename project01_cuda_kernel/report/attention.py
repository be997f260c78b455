"""FlashAttention's README section and charts, rendered from its JSON records alone (no GPU).

`render_markdown(reports_dir)` reads <reports_dir>/project01_cuda_kernel/attention.json (from
`bench-attention`) and attention_ncu.json (from `profile-attention`) when present, and returns
Markdown: throughput tables against SDPA's backends, the targets with the gaps stated, memory,
Nsight Compute figures and the charts. `render_charts(json_path)` draws the charts of a record:
throughput against sequence length per mode, and memory.

`render_record(record)` renders another `bench-attention` record (`--name`, e.g. attention_hd256:
`--head-dims 256 --providers ours flash cudnn`) as its own section: throughput tables of the
providers it holds, ours / FLASH and ours / cuDNN, the checks and memory; `headline(record)` is
its line for summary.md.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from project01_cuda_kernel import PROJECT
from shared.repeat import ranged, row_ratio, spread_text

from ..attention import HOPPER_HEAD_DIMS
from ..bench.attention import MODES, PROVIDERS, VARIANT_MODE

TARGET_FWD = 0.90  # FlashAttention-2-style forward / SDPA FLASH, head dim 128, seq >= 2k
TARGET_BWD = 0.75
TARGET_HOPPER = 1.30  # Hopper forward / SDPA FLASH, head dim 128, seq >= 2k
VARIANT_LABELS = {
    "ours_fa2": "ours, FA2 (32 rows/warp)",
    "ours_r16": "ours, FA2 (16 rows/warp)",
    "ours_k64": "ours, 64 keys/CTA",
    "ours_fa2bwd": "ours, FA2 bwd (128 keys/CTA)",
}
PROVIDER_LABELS = {
    "ours": "ours (forward: wgmma/TMA on Hopper, else FA2; backward: FA2)",
    "ours_fa2": "ours, FA2 forward (mma.sync, 32 rows/warp)",
    "ours_r16": "ours, FA2 forward variant: 16 rows/warp, Q in registers",
    "ours_k64": "ours, backward variant: 64 keys/CTA (4 warps)",
    "flash": "SDPA FLASH (FlashAttention-2)",
    "cudnn": "SDPA cuDNN",
    "efficient": "SDPA EFFICIENT (xFormers)",
    "math": "SDPA MATH",
    "ours_hbwd": "ours, Hopper backward (wgmma/TMA; forward as ours)",
    "ours_fa2bwd": "ours, FA2 backward (mma.sync, 128 keys/CTA; forward as ours)",
}
# "ours" once "auto" runs the Hopper backward (a record whose ours_backward_kernels say so)
OURS_LABEL_HOPPER_BWD = "ours (forward and backward: wgmma/TMA on Hopper, else FA2)"


PROVIDER_MARKERS = dict(zip(PROVIDERS, ("o", "s", "^", "v", "D", "P", "X", "*", "h", "<")))
PROVIDER_COLORS = {  # one colour per provider in every chart
    "ours": "#1f77b4",
    "ours_fa2": "#ff7f0e",
    "ours_r16": "#17becf",
    "ours_k64": "#17becf",
    "flash": "#2ca02c",
    "cudnn": "#d62728",
    "efficient": "#9467bd",
    "math": "#8c564b",
    "ours_hbwd": "#e377c2",
    "ours_fa2bwd": "#ff7f0e",
}


MODE_VARIANTS = {"fwd": ("ours_fa2", "ours_r16"), "bwd": ("ours_fa2bwd", "ours_k64")}
SDPA_COLUMNS = (
    ("flash", "FLASH"),
    ("cudnn", "cuDNN"),
    ("efficient", "EFFICIENT"),
    ("math", "MATH"),
)


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _measured_at(env: dict) -> str:
    """' (measured <date>, commit <short>)' from a record's environment, or '' without them."""
    date, commit = (env.get("date") or "")[:10], (env.get("git_commit") or "")[:7]
    parts = [f"measured {date}" if date else "", f"commit {commit}" if commit else ""]
    parts = [x for x in parts if x]
    return f" ({', '.join(parts)})" if parts else ""


def _fmt(x: float | None, nd: int = 0) -> str:
    return "n/a" if x is None else f"{x:,.{nd}f}"


def _by_key(rows: list[dict]) -> dict:
    """(head_dim, seq_len, causal, mode, provider) -> the row."""
    return {(r["head_dim"], r["seq_len"], r["causal"], r["mode"], r["provider"]): r for r in rows}


def _cell(row: dict | None) -> str:
    """A throughput cell: TFLOP/s, 'median (min–max)' for a row of two or more repetitions."""
    v = ranged(row, "tflops", _fmt)
    return v if isinstance(v, str) else _fmt(v)


def _ratio_cell(ours: dict | None, base: dict | None) -> str:
    """ours / base: the median of the per-repetition ratios (with its range when repeated)."""
    return spread_text(row_ratio(ours, base, "tflops"), ".2f")


def _throughput_table(
    rows: list[dict], head_dim: int, mode: str, *, present_only: bool = False
) -> str:
    """One mode at one head dim: ours, its variants, the SDPA backends and ours / FLASH.
    `present_only`: only the SDPA backends the record measured, and ours / cuDNN as well when
    cuDNN is one of them (for records of a few providers)."""
    t = _by_key(rows)
    seqs = sorted({r["seq_len"] for r in rows if r["head_dim"] == head_dim})
    variants = [
        name
        for name in MODE_VARIANTS.get(mode, ())
        if any(k[4] == name and k[3] == mode and k[0] == head_dim for k in t)
    ]
    sdpa = [
        (p, n)
        for p, n in SDPA_COLUMNS
        if not present_only or any(k[4] == p and k[3] == mode and k[0] == head_dim for k in t)
    ]
    vs_cudnn = present_only and any(p == "cudnn" for p, _ in sdpa)
    header = ["causal", "seq", "batch x heads", "ours"]
    header += [VARIANT_LABELS[name] for name in variants]
    header += [n for _, n in sdpa] + ["ours / FLASH"] + (["ours / cuDNN"] if vs_cudnn else [])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * 2 + "---:|" * (len(header) - 2)]
    shapes = {(r["seq_len"]): (r["batch"], r["heads"]) for r in rows if r["head_dim"] == head_dim}
    for causal in (False, True):
        for s in seqs:
            ours = t.get((head_dim, s, causal, mode, "ours"))
            if ours is None:
                continue
            flash = t.get((head_dim, s, causal, mode, "flash"))
            b, h = shapes[s]
            cells = ["yes" if causal else "no", f"{s:,}", f"{b} x {h}", _cell(ours)]
            cells += [_cell(t.get((head_dim, s, causal, mode, name))) for name in variants]
            cells += [_cell(t.get((head_dim, s, causal, mode, p))) for p, _ in sdpa]
            cells.append(_ratio_cell(ours, flash))
            if vs_cudnn:
                cells.append(_ratio_cell(ours, t.get((head_dim, s, causal, mode, "cudnn"))))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ratios(t: dict, provider: str, mode: str, base: str = "flash") -> list[tuple]:
    """(provider / base, seq, causal) at head dim 128, seq >= 2k; `t` maps keys to rows, the
    ratio is the median of the per-repetition ratios (the plain ratio for one run)."""
    out = []
    for (d, s, causal, m, p), row in t.items():
        if p == provider and m == mode and d == 128 and s >= 2048:
            r = row_ratio(row, t.get((d, s, causal, m, base)), "tflops")
            if r is not None:
                out.append((r.median, s, causal))
    return out


def _target_line(what: str, ratios: list[tuple], target: float) -> str:
    worst = min(ratios)
    mean = sum(r for r, _, _ in ratios) / len(ratios)
    met = worst[0] >= target
    verdict = "**met**" if met else "**not met**"
    return (
        f"- {what} >= {target:.2f}x SDPA FLASH (head dim 128, seq >= 2k): {verdict}. "
        f"Ours / FLASH ranges {worst[0]:.2f} (seq {worst[1]:,}, "
        f"{'causal' if worst[2] else 'non-causal'}) to {max(ratios)[0]:.2f}, mean {mean:.2f}"
        + ("." if met else f"; the gap to the target is {target - worst[0]:.2f}x FLASH.")
    )


def backward_kernels(res: dict) -> dict[int, str]:
    """Head dim -> the backward "ours" ran ("fa2" or "hopper"), from the record's
    `ours_backward_kernels`; a record without them was measured while "auto" was always the
    FlashAttention-2 backward."""
    recorded = res.get("ours_backward_kernels") or {}
    return {r["head_dim"]: recorded.get(str(r["head_dim"]), "fa2") for r in res.get("rows", [])}


def provider_label(provider: str, res: dict) -> str:
    """A provider's name in charts: PROVIDER_LABELS, with "ours" saying which backward ran."""
    if provider == "ours" and "hopper" in backward_kernels(res).values():
        return OURS_LABEL_HOPPER_BWD
    return PROVIDER_LABELS[provider]


def _target_lines(
    rows: list[dict], forward_kernel: str = "fa2", bwd_kernels: dict | None = None
) -> list[str]:
    """The targets' verdicts from a record's rows; `forward_kernel` is its ours_forward_kernel,
    `bwd_kernels` its `backward_kernels` (head dim -> "fa2" / "hopper"; None: FA2's)."""
    t = _by_key(rows)
    hopper = forward_kernel == "hopper"
    hopper_bwd = "hopper" in (bwd_kernels or {}).values()
    # "ours" runs the Hopper forward on a CC 9.0 GPU: the FlashAttention-2 forward is "ours_fa2";
    # once "auto" runs the Hopper backward too, the FlashAttention-2 backward is "ours_fa2bwd".
    fa2_fwd = "ours_fa2" if hopper else "ours"
    fa2_bwd = "ours_fa2bwd" if hopper_bwd else "ours"
    out = []
    for what, provider, mode, target in (
        ("FlashAttention-2-style forward", fa2_fwd, "fwd", TARGET_FWD),
        (
            "FlashAttention-2-style backward" if hopper_bwd else "Backward",
            fa2_bwd,
            "bwd",
            TARGET_BWD,
        ),
    ):
        ratios = _ratios(t, provider, mode)
        if not ratios:
            out.append(f"- {what}: not measured at head dim 128, seq >= 2k.")
            continue
        out.append(_target_line(what, ratios, target))
    what = "Hopper forward (wgmma + TMA, producer/consumer warpgroups)"
    ratios = _ratios(t, "ours", "fwd") if hopper else []
    if not ratios:
        out.append(f"- {what}: not measured (it runs on compute capability 9.0 only).")
        return out
    out.append(_target_line(what, ratios, TARGET_HOPPER))
    cudnn = _ratios(t, "ours", "fwd", base="cudnn")
    if cudnn:
        out.append(
            f"- Hopper forward vs SDPA cuDNN (the ceiling to chase), same shapes: "
            f"{min(cudnn)[0]:.2f} to {max(cudnn)[0]:.2f}x."
        )
    if hopper_bwd and (bwd_kernels or {}).get(128) == "hopper":
        vs_cudnn = {}
        for (d, s, causal, m, p), row in t.items():
            if p == "ours" and m == "fwd_bwd":
                r = row_ratio(row, t.get((d, s, causal, m, "cudnn")), "tflops")
                if r is not None:
                    vs_cudnn[(d, s, causal, m)] = {"ratio": r.median}
        out += ["- " + line for line in _hbwd_target_lines(vs_cudnn) if line]
    return out


def _skipped_and_memory(res: dict) -> list[str]:
    """The shapes a backend refused, then the memory table, as report lines."""
    parts: list[str] = []
    skipped = res.get("skipped", [])
    if skipped:
        parts += [
            "Not measured (the backend refused the shape): "
            + "; ".join(
                f"{s['provider']} d{s['head_dim']} S{s['seq_len']}"
                f"{' causal' if s['causal'] else ''}"
                for s in skipped
            ),
            "",
        ]
    mem = _memory_table(res.get("memory", []))
    if mem:
        parts += [mem, ""]
    return parts


def _memory_table(memory: list[dict]) -> str:
    if not memory:
        return ""
    d = max(m["head_dim"] for m in memory)
    sel = [m for m in memory if m["head_dim"] == d and not m["causal"]]
    seqs = sorted({m["seq_len"] for m in sel})
    provs = [
        p
        for p in ("ours", "flash", "cudnn", "efficient", "math")
        if any(m["provider"] == p for m in sel)
    ]
    val = {(m["seq_len"], m["provider"]): m["peak_mib"] for m in sel}
    lines = [
        f"Peak extra device memory of one forward+backward, head dim {d}, non-causal (MiB; "
        "inputs excluded, gradients included):",
        "",
        "| seq | " + " | ".join(provs) + " |",
        "|---|" + "---:|" * len(provs),
    ]
    for s in seqs:
        lines.append(f"| {s:,} | " + " | ".join(_fmt(val.get((s, p))) for p in provs) + " |")
    return "\n".join(lines)


def _ncu_table(ncu: dict | None) -> str:
    if not ncu:
        return (
            "Nsight Compute figures: not measured yet "
            "(`python -m project01_cuda_kernel profile-attention`)."
        )
    res = ncu["results"]
    shape = res["shape"]
    kernels = res["kernels"]
    names = [n for n, _ in res["metrics"].values()]
    units = dict(res["metrics"].values())
    units.update(kernels[0].get("units", {}))  # what ncu reported, after conversion
    cols = [k["kernel_short"] for k in kernels]
    lines = [
        f"Nsight Compute (`--clock-control none`), bf16, head dim {shape['head_dim']}, seq "
        f"{shape['seq_len']:,}, batch {shape['batch']} x heads {shape['heads']}, "
        f"{'causal' if shape['causal'] else 'non-causal'}"
        f"{_measured_at(ncu.get('environment') or {})}:",
        "",
        "| metric | " + " | ".join(cols) + " |",
        "|---|" + "---:|" * len(cols),
    ]
    for n in names:
        if not any(n in k for k in kernels):
            continue
        stall = n.startswith("stall")  # warps stalled per issue-active cycle: small ratios
        unit = " (warps per issue cycle)" if stall else (f" ({units[n]})" if units[n] else "")
        digits = 2 if stall else 1 if units[n] in ("%", "KiB") else 0
        cells = [_fmt(k.get(n), digits) for k in kernels]
        lines.append(f"| {n}{unit} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _repeats_sentence(n: int) -> str:
    """For a record of two or more repetitions (none for a single run)."""
    if n < 2:
        return ""
    return (
        f"Each shape and mode was timed {n} times, ours and SDPA's backends alternating: cells "
        "show the median (min–max) of the repetitions, and ours / FLASH is the median of the "
        "per-repetition ratios. "
    )


def render_markdown(
    reports_dir: str | os.PathLike, *, image_prefix: str = "../reports/project01_cuda_kernel/"
) -> str:
    """Markdown for the README's attention section; `image_prefix` locates the PNGs from it."""
    folder = Path(reports_dir) / PROJECT
    bench = _load(folder / "attention.json")
    ncu = _load(folder / "attention_ncu.json")
    parts = ["### FlashAttention forward and backward vs SDPA", ""]
    if bench is None:
        parts.append(
            "No attention measurements yet: run `python -m project01_cuda_kernel bench-attention` "
            "on a CUDA GPU."
        )
        return "\n".join(parts) + "\n"
    from shared.results import environment_line

    res = bench["results"]
    rows = res["rows"]
    env = bench.get("environment", {})
    cfg = bench.get("config", {})
    parts += [
        f"Measured on {environment_line(env)}; dtype {cfg.get('dtype', 'bfloat16')}; "
        f"{cfg.get('total_tokens', 16384):,} tokens per batch, hidden {cfg.get('hidden', 2048)}; "
        "medians of `triton.testing.do_bench` (L2 flushed), all providers in the same process. "
        + _repeats_sentence(res.get("repeats") or 1)
        + "TFLOP/s count 4·B·H·S²·D forward (half when causal) and 2.5x that backward, as the "
        "FlashAttention papers do. SDPA columns pin one backend each with `sdpa_kernel`. "
        + (
            "'ours' runs the Hopper forward and the Hopper backward (wgmma + TMA); the "
            "'ours, FA2' columns are the FlashAttention-2-style forward kernels and 'ours, FA2 "
            "bwd' the FlashAttention-2-style backward. "
            if res.get("ours_forward_kernel") == "hopper"
            and "hopper" in backward_kernels(res).values()
            else "'ours' runs the Hopper forward (wgmma + TMA) and the FlashAttention-2-style "
            "backward; the 'ours, FA2' columns are the FlashAttention-2-style forward kernels. "
            if res.get("ours_forward_kernel") == "hopper"
            else "'ours' runs the FlashAttention-2-style forward and backward. "
        )
        + "The 'ours, FA2 (16 rows/warp)' and 'ours, 64 keys/CTA' columns are earlier kernel "
        "variants, still built and tested; csrc/attention/NOTES.md has the version history.",
        "",
        "Targets:",
        "",
        *_target_lines(rows, res.get("ours_forward_kernel", "fa2"), backward_kernels(res)),
        "",
    ]
    for d in sorted({r["head_dim"] for r in rows}, reverse=True):
        for mode, title in (("fwd", "forward"), ("bwd", "backward"), ("fwd_bwd", "fwd+bwd")):
            parts += [f"Head dim {d}, {title}, TFLOP/s:", "", _throughput_table(rows, d, mode), ""]
    checks = res.get("checks", [])
    if checks:
        worst = max(c["max_abs_diff_vs_flash"] for c in checks)
        parts += [
            f"Every benchmarked shape is also checked: the largest difference between our "
            f"output and SDPA FLASH's over all {len(checks)} shapes is {worst:.2e} (max abs, "
            "bf16 outputs). The GPU tests check outputs and gradients against a float32 "
            "reference (error at most 2x SDPA's own).",
            "",
        ]
    parts += _skipped_and_memory(res)
    parts += [_ncu_table(ncu), ""]
    for mode in ("fwd", "bwd", "fwd_bwd"):
        if (folder / f"attention_{mode}.png").exists():
            parts.append(f"![attention {mode}]({image_prefix}attention_{mode}.png)")
    if (folder / "attention_memory.png").exists():
        parts.append(f"![attention memory]({image_prefix}attention_memory.png)")
    return "\n".join(parts).rstrip() + "\n"


MODE_TITLES = (("fwd", "forward"), ("bwd", "backward"), ("fwd_bwd", "fwd+bwd"))


def _ratio_ranges(rows: list[dict], base: str) -> dict[str, tuple[float, float]]:
    """Mode (and "all") -> (lowest, highest) ours / base over every shape of the record, each the
    median of the per-repetition ratios; empty when `base` was not measured."""
    t = _by_key(rows)
    by_mode: dict[str, list[float]] = {}
    for (d, s, causal, m, p), row in t.items():
        if p == "ours":
            r = row_ratio(row, t.get((d, s, causal, m, base)), "tflops")
            if r is not None:
                by_mode.setdefault(m, []).append(r.median)
    out = {m: (min(v), max(v)) for m, v in by_mode.items()}
    if by_mode:
        every = [x for v in by_mode.values() for x in v]
        out["all"] = (min(every), max(every))
    return out


def _ranges_sentence(rows: list[dict], base: str, label: str) -> str | None:
    rr = _ratio_ranges(rows, base)
    if not rr:
        return None
    per_mode = ", ".join(
        f"{title} {rr[m][0]:.2f}–{rr[m][1]:.2f}" for m, title in MODE_TITLES if m in rr
    )
    lo, hi = rr["all"]
    return f"ours / {label} {lo:.2f}–{hi:.2f}x ({per_mode})"


def _dims_text(rows: list[dict]) -> str:
    return ", ".join(str(d) for d in sorted({r["head_dim"] for r in rows}))


def headline(record: dict) -> str:
    """One line for summary.md: where it was measured and ours / FLASH, ours / cuDNN."""
    from shared.results import environment_line

    rows = record["results"]["rows"]
    parts = [
        s
        for s in (
            _ranges_sentence(rows, "flash", "FLASH"),
            _ranges_sentence(rows, "cudnn", "cuDNN"),
        )
        if s
    ]
    dtype = (record.get("config") or {}).get("dtype", "bfloat16")
    return (
        f"**FlashAttention at head dim {_dims_text(rows)} vs SDPA** ({dtype}; "
        f"{environment_line(record.get('environment', {}))}; the tables in "
        "[details.md](details.md)): "
        + (
            "over every shape and mode, medians of the per-repetition ratios, "
            + "; ".join(parts)
            + "."
            if parts
            else "no SDPA baseline measured."
        )
        + _hbwd_headline(record["results"])
    )


def _hbwd_headline(res: dict) -> str:
    """The Hopper backward's part of a record's summary line (empty without ours_hbwd): its
    backward over ours' (the FA2 backward) and its forward + backward over cuDNN, per head dim,
    as ranges of the per-shape medians."""

    def span(key: str, mode: str, d: int) -> str | None:
        v = [r["ratio"] for r in res.get(key, []) if r["mode"] == mode and r["head_dim"] == d]
        return f"{min(v):.2f}–{max(v):.2f}x" if v else None

    dims = sorted({r["head_dim"] for r in res.get("ratios_hbwd_vs_cudnn", [])}, reverse=True)
    texts = []
    fa2 = _hbwd_fa2_key(res)
    for d in dims:
        bwd, fb = span(fa2, "bwd", d), span("ratios_hbwd_vs_cudnn", "fwd_bwd", d)
        got = [
            t for t in (bwd and f"backward {bwd} the FA2 one", fb and f"fwd+bwd {fb} cuDNN's") if t
        ]
        if got:
            texts.append(f"head dim {d}: " + ", ".join(got))
    if not texts:
        return ""
    return " The Hopper backward (`ours_hbwd`): " + "; ".join(texts) + "."


def _hbwd_fa2_key(res: dict) -> str:
    """The record's key of ours_hbwd / the FA2 backward: ratios_hbwd_vs_fa2 (against
    ours_fa2bwd, or ours where "auto" ran FA2's); records made before it have
    ratios_hbwd_vs_ours, when "ours" always ran the FA2 backward."""
    return "ratios_hbwd_vs_fa2" if "ratios_hbwd_vs_fa2" in res else "ratios_hbwd_vs_ours"


def _forward_kernel_text(rows: list[dict], recorded: str, backward: dict | None = None) -> str:
    """What 'ours' ran forward (and backward) at the record's head dims. `recorded` is the
    record's `ours_forward_kernel` (what "auto" resolves to on its GPU); the Hopper forward runs
    only at HOPPER_HEAD_DIMS, so at the others (256) "auto" ran the FlashAttention-2 forward.
    `backward`: `backward_kernels` of the record (None: the FlashAttention-2 backward)."""
    dims = sorted({r["head_dim"] for r in rows})
    hopper = [d for d in dims if recorded == "hopper" and d in HOPPER_HEAD_DIMS]
    other = [d for d in dims if d not in hopper]
    text = []
    if hopper:
        bwd = {backward.get(d, "fa2") for d in hopper} if backward else {"fa2"}
        text.append(
            f"'ours' runs the Hopper forward (wgmma + TMA) at head dim "
            f"{'/'.join(map(str, hopper))} and "
            + (
                "the Hopper backward."
                if bwd == {"hopper"}
                else "the FlashAttention-2-style backward."
                if bwd == {"fa2"}
                else "the Hopper backward where it has an instance, else the FA2 one."
            )
        )
    if other:
        text.append(
            f"{'At head dim ' + '/'.join(map(str, other)) + ' ' if hopper else ''}"
            "'ours' runs the FlashAttention-2-style forward and backward"
            + (
                f" (the Hopper forward has no head-dim-{'/'.join(map(str, other))} instance, "
                'so `kernel="auto"` runs the FlashAttention-2 forward on this GPU too).'
                if recorded == "hopper"
                else "."
            )
        )
    return " ".join(text)


def render_record(record: dict) -> str:
    """Markdown for a `bench-attention` record other than attention.json (its own section):
    throughput tables per head dim and mode with the SDPA backends it measured, ours / FLASH and
    ours / cuDNN per shape and their ranges, the output checks and memory."""
    from shared.results import environment_line

    res = record["results"]
    rows = res["rows"]
    env = record.get("environment", {})
    cfg = record.get("config", {})
    name = record.get("name") or cfg.get("name") or "attention"
    dims = sorted({r["head_dim"] for r in rows})
    heads = sorted({(r["head_dim"], r["heads"]) for r in rows})
    shape = ", ".join(f"{h} heads of {d}" for d, h in heads)
    parts = [
        f"### Head dim {_dims_text(rows)} vs SDPA (`{name}.json`)",
        "",
        f"Measured on {environment_line(env)}; dtype {cfg.get('dtype', 'bfloat16')}; "
        f"{cfg.get('total_tokens', 16384):,} tokens per batch, hidden {cfg.get('hidden', 2048)} "
        f"({shape}); medians of `triton.testing.do_bench` (L2 flushed), all providers in the "
        "same process. "
        + _repeats_sentence(res.get("repeats") or 1)
        + "TFLOP/s count 4·B·H·S²·D forward (half when causal) and 2.5x that backward. "
        + _forward_kernel_text(rows, res.get("ours_forward_kernel", "fa2"), backward_kernels(res)),
        "",
    ]
    ranges = [
        s
        for s in (
            _ranges_sentence(rows, "flash", "FLASH"),
            _ranges_sentence(rows, "cudnn", "cuDNN"),
        )
        if s
    ]
    if ranges:
        parts += [
            "Over every shape and mode (medians of the per-repetition ratios): "
            + "; ".join(ranges)
            + ".",
            "",
        ]
    for d in sorted(dims, reverse=True):
        for mode, title in MODE_TITLES:
            if not any(r["head_dim"] == d and r["mode"] == mode for r in rows):
                continue
            parts += [
                f"Head dim {d}, {title}, TFLOP/s:",
                "",
                _throughput_table(rows, d, mode, present_only=True),
                "",
            ]
    checks = [c for c in res.get("checks", []) if "max_abs_diff_vs_flash" in c]
    if checks:
        worst = max(c["max_abs_diff_vs_flash"] for c in checks)
        parts += [
            f"Output check at every benchmarked shape: the largest difference from SDPA FLASH's "
            f"output over all {len(checks)} shapes is {worst:.2e} (max abs, bf16 outputs).",
            "",
        ]
    parts += _hbwd_lines(res)
    parts += _skipped_and_memory(res)
    return "\n".join(parts).rstrip() + "\n"


def _hbwd_lines(res: dict) -> list[str]:
    """The Hopper backward's table (a record with ours_hbwd): per shape and mode (backward,
    forward + backward), the median ratio and its min-max range over the repetitions against
    the FA2 backward, cuDNN and FLASH, then its largest gradient differences from the FA2
    backward's."""
    keys = ("head_dim", "seq_len", "causal", "mode")
    sources = {
        "fa2": _hbwd_fa2_key(res),
        "cudnn": "ratios_hbwd_vs_cudnn",
        "flash": "ratios_hbwd_vs_flash",
    }
    by = {
        base: {tuple(r[k] for k in keys): r for r in res.get(key, [])}
        for base, key in sources.items()
    }
    shapes = [k for k in by["cudnn"] if k[3] in ("bwd", "fwd_bwd")]
    if not shapes:
        return []

    def cell(r: dict | None) -> str:
        if r is None:
            return "n/a"
        return f"{r['ratio']:.2f} ({r['ratio_min']:.2f}-{r['ratio_max']:.2f})"

    lines = [
        'Hopper backward (`ours_hbwd`: forward as ours, backward `bwd_kernel="hopper"`), ratios '
        "of its TFLOP/s, median (min-max) over the repetitions:",
        "",
        "| D | S | causal | mode | hbwd TFLOP/s | hbwd / FA2 bwd | hbwd / cuDNN | hbwd / FLASH |",
        "| ---: | ---: | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for k in sorted(shapes, key=lambda k: (k[0], k[2], k[1], k[3])):
        d, sl, causal, mode = k
        lines.append(
            f"| {d} | {sl} | {'yes' if causal else 'no'} | {mode} | "
            f"{_fmt(by['cudnn'][k].get('ours'))} | {cell(by['fa2'].get(k))} | "
            f"{cell(by['cudnn'][k])} | {cell(by['flash'].get(k))} |"
        )
    lines.append("")
    lines += _hbwd_target_lines(by["cudnn"])
    # the FA2 backward's gradients: keys ..._vs_fa2, or ..._vs_ours in records made while
    # "ours" always ran it
    suffix = next(
        (
            x
            for x in ("fa2", "ours")
            for c in res.get("checks", [])
            if f"hbwd_dq_max_abs_diff_vs_{x}" in c
        ),
        None,
    )
    grads = [c for c in res.get("checks", []) if f"hbwd_dq_max_abs_diff_vs_{suffix}" in c]
    if grads:
        worst = {
            g: max(
                c[f"hbwd_{g}_max_abs_diff_vs_{suffix}"] / max(c[f"{g}_max_abs"], 1e-30)
                for c in grads
            )
            for g in ("dq", "dk", "dv")
        }
        lines += [
            "Gradients against the FA2 backward's at every benchmarked shape: largest "
            "difference over the largest magnitude, "
            + ", ".join(f"{g} {v:.1e}" for g, v in worst.items())
            + f" ({len(grads)} shapes).",
            "",
        ]
    return lines


# The Hopper backward's target: forward + backward >= 0.85x SDPA cuDNN at head dim 128, seq >= 4k.
HBWD_TARGET = 0.85


def _hbwd_target_lines(vs_cudnn: dict) -> list[str]:
    """The verdict on HBWD_TARGET from the fwd_bwd rows at head dim 128, seq >= 4,096 (the
    median of the per-repetition ratios, shape by shape); nothing when the record has none."""
    rows = sorted(
        (k, r["ratio"])
        for k, r in vs_cudnn.items()
        if k[0] == 128 and k[1] >= 4096 and k[3] == "fwd_bwd"
    )
    if not rows:
        return []
    met = [k for k, v in rows if v >= HBWD_TARGET]
    low = min(v for _, v in rows)
    high = max(v for _, v in rows)
    verdict = (
        "**met**"
        if len(met) == len(rows)
        else f"**met at {len(met)} of {len(rows)} shapes**"
        if met
        else "**not met**"
    )
    return [
        f"Target: forward + backward with the Hopper backward >= {HBWD_TARGET:.2f}x SDPA cuDNN "
        f"(head dim 128, seq >= 4,096, causal and not): {verdict}; the {len(rows)} shapes "
        f"measured range {low:.2f}-{high:.2f}x (medians of the per-repetition ratios).",
        "",
    ]


def hardware_peak(env: dict, dtype: str = "bfloat16") -> tuple[float, str] | None:
    """(TFLOP/s, label) of the dense peak of the record's GPU in `dtype` (shared.hardware's
    datasheet table); None when the GPU is not in the table."""
    from shared.hardware import dtype_key, match_gpu_name

    spec = match_gpu_name(env.get("gpu") or "")
    key = dtype_key(dtype)
    if spec is None or key not in spec.peak_tflops:
        return None
    peak = spec.peak_tflops[key].value
    return peak, f"dense {key} peak of {spec.name} (datasheet): {peak:.0f} TFLOP/s"


def make_charts(
    result: dict, out_dir: Path, env_line: str, peak: tuple[float, str] | None = None
) -> list[Path]:
    """One PNG per mode: TFLOP/s vs sequence length, a 2x2 grid of panels (rows: head dim,
    columns: non-causal / causal), the GPU's dense peak (`peak`: TFLOP/s, label) drawn across."""
    from shared.charts import _finish, hline, integer_xticks, plt, save_figure

    rows = result["rows"]
    dims = sorted({r["head_dim"] for r in rows})
    causals = sorted({r["causal"] for r in rows})
    paths = []
    for mode in MODES:
        fig, axes = plt.subplots(
            len(dims),
            len(causals),
            squeeze=False,
            sharey=True,
            figsize=(5.2 * len(causals), 3.3 * len(dims) + 1.3),
        )
        top = peak[0] if peak else 0.0
        for (i, d), (j, causal) in ((a, b) for a in enumerate(dims) for b in enumerate(causals)):
            ax = axes[i][j]
            seqs = []
            for provider in PROVIDERS:
                pts = sorted(
                    (r["seq_len"], r["tflops"])
                    for r in rows
                    if r["provider"] == provider
                    and r["mode"] == mode
                    and r["head_dim"] == d
                    and r["causal"] == causal
                )
                if pts:
                    xs, ys = zip(*pts)
                    seqs += xs
                    top = max(top, *ys)
                    ax.plot(
                        xs,
                        ys,
                        marker=PROVIDER_MARKERS[provider],
                        lw=2.2 if provider == "ours" else 1.2,
                        ms=5,
                        color=PROVIDER_COLORS[provider],
                        label=provider_label(provider, result),
                        ls="--" if provider in VARIANT_MODE else "-",
                        zorder=3 if provider == "ours" else 2,
                    )
            if peak:
                hline(ax, peak[0], peak[1], color="0.2", ls=":", text=(i, j) == (0, 0))
            ax.set_xscale("log", base=2)
            integer_xticks(ax, seqs, log=True)
            ax.set_title(f"head dim {d}, {'causal' if causal else 'non-causal'}", fontsize=10)
            if i == len(dims) - 1:
                ax.set_xlabel("sequence length (tokens; batch x seq = 16k)")
            if j == 0:
                ax.set_ylabel(f"{mode.replace('_', '+')} TFLOP/s")
            ax.grid(alpha=0.3)
        axes[0][0].set_ylim(0, top * 1.08 if top else 1.0)  # shared: every panel from 0
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.suptitle(f"Attention {mode.replace('_', '+')} throughput, bf16, hidden 2048")
        fig.legend(
            handles, labels, loc="lower center", bbox_to_anchor=(0.5, 0.035), ncol=2, fontsize=8
        )
        _finish(fig, env_line)
        legend_h = (0.2 * math.ceil(len(labels) / 2) + 0.35) / fig.get_figheight()
        fig.tight_layout(rect=(0, legend_h + 0.03, 1, 1))
        paths.append(save_figure(fig, out_dir / f"attention_{mode}.png"))
    mem = [
        m
        for m in result["memory"]
        if m["head_dim"] == max(r["head_dim"] for r in rows) and not m["causal"]
    ]
    if mem:
        fig, ax = plt.subplots(figsize=(6.8, 4.4))
        for provider in PROVIDERS:
            pts = sorted((m["seq_len"], m["peak_mib"]) for m in mem if m["provider"] == provider)
            if pts:
                xs, ys = zip(*pts)
                ax.plot(
                    xs,
                    ys,
                    marker=PROVIDER_MARKERS[provider],
                    color=PROVIDER_COLORS[provider],
                    label=provider_label(provider, result),
                    ms=8 if provider == "ours" else 5,
                    lw=2.5 if provider == "ours" else 1.5,
                )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        integer_xticks(ax, [m["seq_len"] for m in mem], log=True)
        ax.set_xlabel("sequence length (tokens; batch x seq = 16k)")
        ax.set_ylabel("peak extra memory, fwd+bwd (MiB)")
        ax.set_title(f"Attention memory, head dim {mem[0]['head_dim']}, non-causal, bf16")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        paths.append(save_figure(_finish(fig, env_line), out_dir / "attention_memory.png"))
    return paths


def render_charts(json_path: str | Path) -> list[Path]:
    """The charts of an attention.json record, drawn next to it from the record alone (no
    GPU)."""
    from shared.results import environment_line, load_result

    record = load_result(json_path)
    env = record["environment"]
    dtype = (record.get("config") or {}).get("dtype", "bfloat16")
    return make_charts(
        record["results"],
        Path(json_path).parent,
        environment_line(env),
        peak=hardware_peak(env, dtype),
    )
