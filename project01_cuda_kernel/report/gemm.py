"""The GEMM ladder's tables and charts, rendered from its JSON records alone (no GPU).

- gemm.json (`bench-gemm`): the ladder at 4096^3 and 8192^3 (TFLOP/s, % of cuBLAS, GB/s,
  roofline, error), the best kernel on every shape, the targets met or missed, and the charts
  (ladder, sizes, rooflines);
- compile.json (`compile-check`): registers, shared memory and spills of each GEMM kernel;
- profile_gemm.json (`profile-gemm`): Nsight Compute occupancy and throughput.
"""

from __future__ import annotations

from pathlib import Path

from shared.repeat import ranged

TARGET_PCT = 90.0  # % of cuBLAS, the project's target
LADDER_SIZE = 4096  # the ladder chart's square size
_G = ",.3g"  # the tables' number format, for "median (min–max)" cells


def _shape_label(m: int, n: int, k: int) -> str:
    return f"{m}x{n}x{k}"


def gemm_step(kernel: str) -> int:
    """'sgemm_07_warptiling' -> 7; 0 for anything that is not a ladder kernel."""
    parts = kernel.split("_")
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


def _short_label(r: dict) -> str:
    name = "cuBLAS" if r["kind"] == "cublas" else f"step {gemm_step(r['kernel'])}"
    return f"{name} @{r['m']}"


LADDER_FAMILIES = {  # the ladder chart's bar colours and legend, by dtype
    "float32": "float32 steps (CUDA cores)",
    "bfloat16": "bfloat16 steps (tensor cores)",
    "float8_e4m3fn": "FP8 step (tensor cores, e4m3, bfloat16 out)",
}
FP8 = "float8_e4m3fn"
# The baseline's name in the ladder table, by dtype (cuBLAS unless said).
BASELINE_NAMES = {FP8: "cuBLASLt float8_e4m3fn (torch._scaled_mm)"}


def kernel_dtype(kernel: str) -> str:
    """The dtype a ladder kernel is tabled in: float32 (steps 1-7), bfloat16 (8-9), FP8 (10)."""
    if kernel.startswith("sgemm_"):
        return "float32"
    return FP8 if kernel.startswith("fp8gemm_") else "bfloat16"


def _caption(record: dict) -> str:
    from shared.results import environment_line

    return f"_Measured on {environment_line(record.get('environment', {}))}._"


def _pick(rows: list[dict], **match) -> dict | None:
    for r in rows:
        if all(r.get(k) == v for k, v in match.items()):
            return r
    return None


def render_ladder(gemm: dict) -> str:
    from shared.results import markdown_table

    from .. import fp8_gemm
    from ..gemm import KERNEL_NOTES

    notes = {**KERNEL_NOTES, fp8_gemm.KERNEL: fp8_gemm.KERNEL_NOTE}
    res = gemm["results"]
    rows, base = res["rows"], res["baseline"]
    table = []
    kernels = sorted({r["kernel"] for r in rows}, key=gemm_step)
    for kernel in kernels:
        dtype = kernel_dtype(kernel)
        entry = {
            "step": gemm_step(kernel),
            "kernel": f"`{kernel}`",
            "what changed": notes.get(kernel, ""),
        }
        for size in (4096, 8192):
            shape = f"{size}x{size}x{size}"
            r = _pick(rows, kernel=kernel, shape=shape, dtype=dtype)
            if r is None:
                entry[f"TFLOP/s {size}³"] = None
                entry[f"% cuBLAS {size}³"] = None
            elif not r.get("correct"):
                entry[f"TFLOP/s {size}³"] = "FAILED check"
                entry[f"% cuBLAS {size}³"] = None
            else:
                entry[f"TFLOP/s {size}³"] = ranged(r, "tflops", _G)
                entry[f"% cuBLAS {size}³"] = ranged(r, "pct_of_cublas", _G)
        r4 = _pick(rows, kernel=kernel, shape="4096x4096x4096", dtype=dtype) or {}
        entry["GB/s 4096³"] = ranged(r4, "gbps", _G)
        entry["% of roof 4096³"] = ranged(r4, "pct_of_roof", _G)
        entry["rel. error 4096³"] = r4.get("rel_err")
        table.append(entry)
    for dtype in ("float32", "bfloat16", FP8):
        b4 = _pick(base, shape="4096x4096x4096", dtype=dtype)
        b8 = _pick(base, shape="8192x8192x8192", dtype=dtype)
        if b4 or b8:
            table.append(
                {
                    "step": "",
                    "kernel": BASELINE_NAMES.get(dtype, f"cuBLAS {dtype}"),
                    "what changed": "baseline, same run",
                    "TFLOP/s 4096³": ranged(b4, "tflops", _G),
                    "% cuBLAS 4096³": 100.0 if b4 else None,
                    "TFLOP/s 8192³": ranged(b8, "tflops", _G),
                    "% cuBLAS 8192³": 100.0 if b8 else None,
                    "GB/s 4096³": ranged(b4, "gbps", _G),
                    "% of roof 4096³": ranged(b4, "pct_of_roof", _G),
                    "rel. error 4096³": (b4 or {}).get("rel_err"),
                }
            )
    note = (
        "float32 steps (1-7) are compared with cuBLAS float32 (TF32 off), tensor-core steps with "
        "cuBLAS bfloat16; '% of roof' is achieved FLOP/s over the roofline's attainable FLOP/s "
        "at the minimum-bytes intensity (datasheet peaks)." + _fp8_note(res) + _repeats_note(res)
    )
    return "\n".join([markdown_table(table, floatfmt=",.3g"), "", note, "", _caption(gemm)])


def _fp8_note(res: dict) -> str:
    """A sentence on the FP8 step, for a record that holds it (none otherwise)."""
    if not any(r.get("dtype") == FP8 for r in res["rows"]):
        return ""
    return (
        " The FP8 step (10) takes float8 e4m3 A (M, K) and B (N, K) with per-tensor scales and "
        "writes bfloat16; it is compared with cuBLASLt FP8 through torch._scaled_mm on the same "
        "inputs, and its roofline uses the FP8 peak (1-byte inputs, 2-byte output)."
    )


def _repeats_note(res: dict) -> str:
    """A sentence on the repetitions, for a record of two or more (none for a single run)."""
    n = res.get("repeats") or 1
    if n < 2:
        return ""
    return (
        f" Each figure is the median of {n} repetitions with its range (min–max), cuBLAS and "
        "the ladder alternating; % of cuBLAS is the median of the per-repetition ratios."
    )


def render_shapes(gemm: dict) -> str:
    from shared.results import markdown_table

    res = gemm["results"]
    rows = [r for r in res["rows"] if r.get("correct") and r.get("tflops") is not None]
    table = []
    for b in res["baseline"]:
        cands = [r for r in rows if r["shape"] == b["shape"] and r["dtype"] == b["dtype"]]
        best = max(cands, key=lambda r: r["tflops"], default=None)
        table.append(
            {
                "shape (MxNxK)": b["shape"],
                "dtype": b["dtype"],
                "cuBLAS TFLOP/s": ranged(b, "tflops", _G),
                "cuBLAS ms": ranged(b, "median_ms", _G),
                "best ladder kernel": f"`{best['kernel']}`" if best else "n/a",
                "TFLOP/s": ranged(best, "tflops", _G),
                "ms": ranged(best, "median_ms", _G),
                "% cuBLAS": ranged(best, "pct_of_cublas", _G),
            }
        )
    note = _repeats_note(res).strip()
    return "\n".join(
        [markdown_table(table, floatfmt=",.3g"), "", *([note, ""] if note else []), _caption(gemm)]
    )


TARGETS = (("float32", 4096), ("bfloat16", 4096), ("bfloat16", 8192))


def best_row(gemm: dict, dtype: str, size: int) -> dict | None:
    """The ladder row with the highest % of cuBLAS (its median) at size³ in `dtype`, among the
    kernels that passed their check."""
    shape = f"{size}x{size}x{size}"
    cands = [
        r
        for r in gemm["results"]["rows"]
        if r.get("correct")
        and r.get("pct_of_cublas")
        and r["shape"] == shape
        and r["dtype"] == dtype
    ]
    return max(cands, key=lambda r: r["pct_of_cublas"], default=None)


def targets(gemm: dict) -> list[dict]:
    """The project's targets against the measurements: one dict per target (met or not by the
    median)."""
    out = []
    for dtype, size in TARGETS:
        best = best_row(gemm, dtype, size)
        out.append(
            {
                "target": f"best {dtype} kernel >= {TARGET_PCT:.0f}% of cuBLAS at {size}³",
                "best kernel": f"`{best['kernel']}`" if best else "n/a",
                "measured % of cuBLAS": best["pct_of_cublas"] if best else None,
                "met": bool(best and best["pct_of_cublas"] >= TARGET_PCT),
            }
        )
    return out


def render_targets(gemm: dict) -> str:
    from shared.results import markdown_table

    table = targets(gemm)
    for entry, (dtype, size) in zip(table, TARGETS):  # the median with its range, when repeated
        best = best_row(gemm, dtype, size)
        entry["measured % of cuBLAS"] = ranged(best, "pct_of_cublas", ".1f")
    note = _repeats_note(gemm["results"]).strip()
    return "\n".join(
        [markdown_table(table, floatfmt=".1f"), "", *([note, ""] if note else []), _caption(gemm)]
    )


def render_compile(compile_rec: dict) -> str:
    from shared.results import markdown_table

    table = []
    for f in compile_rec["results"]:
        if not f["file"].startswith("gemm/"):
            continue
        for k in f["kernels"]:
            table.append(
                {
                    "file": f["file"],
                    "kernel": f"`{k['kernel'].split('(')[0]}`",
                    "registers": k["registers"],
                    "static smem (B)": k["smem_bytes"],
                    "stack (B)": k["stack_frame_bytes"],
                    "spills st/ld (B)": f"{k['spill_store_bytes']}/{k['spill_load_bytes']}",
                    "no-spill rule": "yes" if f["no_spill"] else "",
                }
            )
    cfg = compile_rec.get("config", {})
    return "\n".join(
        [
            markdown_table(table),
            "",
            f"_nvcc {cfg.get('nvcc', '?')}, {cfg.get('arch', '?')}, flags "
            f"`{' '.join(cfg.get('flags', []))}`; dynamic shared memory (steps 8 and 9) is set at "
            f"launch and not in this static figure. {_caption(compile_rec)[1:]}",
        ]
    )


def render_profile(prof: dict) -> str:
    from shared.results import markdown_table

    size = prof.get("config", {}).get("size", "?")
    return "\n".join(
        [
            markdown_table(profile_rows(prof["results"]), floatfmt=".3g"),
            "",
            f"_Nsight Compute, `--clock-control none`, one launch of each kernel at {size}³ after a "
            f"warm-up. {_caption(prof)[1:]}",
        ]
    )


def short_name(kernel: str) -> str:
    """'void <unnamed>::hgemm_mma_kernel<__nv_bfloat16, true>(const T *, ...)' ->
    'hgemm_mma_kernel<__nv_bfloat16, true>' (the function and template arguments only)."""
    name = (
        kernel.removeprefix("void ")
        .replace("<unnamed>::", "")
        .replace("(anonymous namespace)::", "")
    )
    depth, out = 0, []
    for ch in name:
        if ch == "(" and depth == 0:
            break
        depth += {"<": 1, ">": -1}.get(ch, 0)
        out.append(ch)
    return "".join(out)[:60]


def profile_rows(rows: list[dict]) -> list[dict]:
    """One table row per profiled launch of a profile_gemm.json record."""

    def num(v):
        return v if isinstance(v, float) else None

    def whole(v):
        return int(v) if isinstance(v, float) else None

    return [
        {
            "kernel": r["label"],
            "CUDA kernel": f"`{short_name(r['kernel'])}`",
            "regs": whole(r.get("registers_per_thread")),
            "smem KiB": ((r.get("static_smem_bytes") or 0) + (r.get("dynamic_smem_bytes") or 0))
            / 1024,
            "block": whole(r.get("block_size_threads")),
            "theor. occ. %": num(r.get("theoretical_occupancy_pct")),
            "achieved occ. %": num(r.get("achieved_occupancy_pct")),
            "limited by": r.get("occupancy_limiter"),
            "DRAM %": num(r.get("dram_throughput_pct")),
            "SM %": num(r.get("sm_throughput_pct")),
            "time (us)": whole(r["duration_ns"] / 1e3)
            if isinstance(r.get("duration_ns"), float)
            else None,
        }
        for r in rows
    ]


def make_charts(result: dict, out_dir: Path, footnote: str) -> list[Path]:
    from shared.charts import bar_chart, line_chart, roofline_chart

    rows = [r for r in result["rows"] if r.get("tflops") is not None]
    base = {(r["shape"], r["dtype"]): r for r in result["baseline"]}
    paths = []
    ladder_shape = _shape_label(LADDER_SIZE, LADDER_SIZE, LADDER_SIZE)
    # Ladder: % of cuBLAS in the kernel's own dtype (float32 kernels vs cuBLAS float32, tensor-
    # core kernels vs cuBLAS bfloat16) at 4096^3. The two families are coloured apart: the
    # bfloat16 steps start again below 100% of a much faster cuBLAS, not a regression.
    ladder = [r for r in rows if r["shape"] == ladder_shape and r["dtype"] in LADDER_FAMILIES]
    if ladder:
        labels = [r["kernel"] for r in ladder]
        groups = [LADDER_FAMILIES[r["dtype"]] for r in ladder]
        pct = [r["pct_of_cublas"] for r in ladder]
        paths.append(
            bar_chart(
                out_dir / "gemm_ladder.png",
                labels,
                pct,
                title=f"GEMM ladder at {ladder_shape}: % of cuBLAS in the kernel's own dtype",
                ylabel="% of cuBLAS, same dtype",
                groups=groups,
                bar_labels=[f"{p:.1f}%" for p in pct],
                baseline=100.0,
                baseline_label="cuBLAS in the bar's dtype, same run (100%)",
                footnote=footnote,
            )
        )
        cublas = {
            LADDER_FAMILIES[dt]: (
                base[(ladder_shape, dt)]["tflops"],
                f"{BASELINE_NAMES.get(dt, f'cuBLAS {dt}')}: "
                f"{base[(ladder_shape, dt)]['tflops']:.3g} TFLOP/s",
            )
            for dt in LADDER_FAMILIES
            if (ladder_shape, dt) in base
        }
        paths.append(
            bar_chart(
                out_dir / "gemm_ladder_tflops.png",
                labels,
                [r["tflops"] for r in ladder],
                title=f"GEMM ladder at {ladder_shape}: TFLOP/s (and % of cuBLAS, same dtype)",
                ylabel="TFLOP/s",
                groups=groups,
                bar_labels=[f"{r['tflops']:.3g} ({r['pct_of_cublas']:.0f}%)" for r in ladder],
                group_baselines=cublas,
                footnote=footnote,
            )
        )
    # TFLOP/s against size for the top kernels and cuBLAS.
    squares = sorted({r["m"] for r in result["baseline"] if r["m"] == r["n"] == r["k"]})
    series = {}
    for name, dt in (
        ("sgemm_07_warptiling", "float32"),
        ("hgemm_08_mma_sync", "bfloat16"),
        ("hgemm_09_wgmma_tma", "bfloat16"),
        ("fp8gemm_10_wgmma_tma", FP8),
    ):
        pts = [
            (r["m"], r["tflops"])
            for r in rows
            if r["kernel"] == name and r["dtype"] == dt and r["m"] == r["n"] == r["k"]
        ]
        if pts:
            series[f"{name} ({dt})"] = ([p[0] for p in pts], [p[1] for p in pts])
    for dt in ("float32", "bfloat16", FP8):
        pts = [
            (s, base[(_shape_label(s, s, s), dt)]["tflops"])
            for s in squares
            if (_shape_label(s, s, s), dt) in base
        ]
        if pts:
            label = BASELINE_NAMES.get(dt, f"cuBLAS ({dt})")
            series[label] = ([p[0] for p in pts], [p[1] for p in pts])
    if series:
        paths.append(
            line_chart(
                out_dir / "gemm_sizes.png",
                series,
                title="Square GEMM: TFLOP/s against size (M = N = K)",
                xlabel="M = N = K",
                ylabel="TFLOP/s",
                logx=True,
                logy=True,
                footnote=footnote,
            )
        )
    spec = result.get("gpu_spec")
    if spec:
        bw = spec["bandwidth_gbs"] * 1e9
        for dt, key in (("bfloat16", "bf16"), ("float32", "fp32"), (FP8, "fp8")):
            if key not in spec["peak_tflops"]:
                continue
            chosen = [
                r
                for r in rows + result["baseline"]
                if r["dtype"] == dt
                and r["m"] == r["n"] == r["k"]
                and r.get("intensity")
                and (r["kind"] == "cublas" or gemm_step(r["kernel"]) >= 7)
            ]
            pts = [(f"{r['m']}", r["intensity"], r["tflops"] * 1e12) for r in chosen]
            if pts:
                paths.append(
                    roofline_chart(
                        out_dir / f"gemm_roofline_{key}.png",
                        pts,
                        groups=[_short_label(r).split(" @")[0] for r in chosen],
                        peak_flops=spec["peak_tflops"][key] * 1e12,
                        peak_bandwidth=bw,
                        title=f"Roofline, {dt}, points labelled M = N = K "
                        f"({spec['key']} datasheet peaks)",
                        footnote=footnote,
                    )
                )
    return paths


def render_charts(json_path: str | Path) -> list[Path]:
    """The charts of a gemm.json record, drawn next to it from the record alone (no GPU)."""
    from shared.charts import footer
    from shared.results import load_result

    record = load_result(json_path)
    return make_charts(record["results"], Path(json_path).parent, footer(record["environment"]))
