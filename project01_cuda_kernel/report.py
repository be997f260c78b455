"""Regenerate the tables of project01_cuda_kernel/README.md from reports/project01_cuda_kernel/*.json.

Each generated block sits between `<!-- name -->` and `<!-- /name -->` markers in the README:

- gemm:ladder    the ladder at 4096^3 and 8192^3: TFLOP/s, % of cuBLAS, GB/s, roofline, error
- gemm:shapes    best float32 and bfloat16 kernel against cuBLAS on every benchmarked shape
- gemm:targets   the issue's targets, met or not, with the measured numbers
- gemm:compile   registers / shared memory / spills of each GEMM kernel (compile.json)
- gemm:profile   Nsight Compute occupancy and throughput (profile_gemm.json)
- attention      the FlashAttention section (attention_report.render_markdown, when present)

    python -m project01_cuda_kernel.report [--reports-dir DIR] [--readme PATH] [--check] [--no-readme]

Image links are written relative to the README wherever it is (in a fork of this project the
README is the repository's own, at its root).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

from shared.cli import main_guard

PROJECT = "project01_cuda_kernel"
_HERE = Path(__file__).resolve().parent
# The project's README; in a standalone fork it is the repository's README, one level up.
README = next((p for p in (_HERE / "README.md", _HERE.parent / "README.md") if p.is_file()),
              _HERE / "README.md")  # fmt: skip
TARGET_PCT = 90.0  # % of cuBLAS, from the issue


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e


def _caption(record: dict) -> str:
    from shared.results import environment_line

    return f"_Measured on {environment_line(record.get('environment', {}))}._"


def _step(kernel: str) -> int:
    parts = kernel.split("_")
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


def _pick(rows: list[dict], **match) -> dict | None:
    for r in rows:
        if all(r.get(k) == v for k, v in match.items()):
            return r
    return None


def render_ladder(gemm: dict) -> str:
    from shared.results import markdown_table

    from .gemm import KERNEL_NOTES

    res = gemm["results"]
    rows, base = res["rows"], res["baseline"]
    table = []
    kernels = sorted({r["kernel"] for r in rows}, key=_step)
    for kernel in kernels:
        dtype = "float32" if kernel.startswith("sgemm_") else "bfloat16"
        entry = {"step": _step(kernel), "kernel": f"`{kernel}`",
                 "what changed": KERNEL_NOTES.get(kernel, "")}  # fmt: skip
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
                entry[f"TFLOP/s {size}³"] = r.get("tflops")
                entry[f"% cuBLAS {size}³"] = r.get("pct_of_cublas")
        r4 = _pick(rows, kernel=kernel, shape="4096x4096x4096", dtype=dtype) or {}
        entry["GB/s 4096³"] = r4.get("gbps")
        entry["% of roof 4096³"] = r4.get("pct_of_roof")
        entry["rel. error 4096³"] = r4.get("rel_err")
        table.append(entry)
    for dtype in ("float32", "bfloat16"):
        b4 = _pick(base, shape="4096x4096x4096", dtype=dtype)
        b8 = _pick(base, shape="8192x8192x8192", dtype=dtype)
        if b4 or b8:
            table.append({
                "step": "", "kernel": f"cuBLAS {dtype}", "what changed": "baseline, same run",
                "TFLOP/s 4096³": (b4 or {}).get("tflops"), "% cuBLAS 4096³": 100.0 if b4 else None,
                "TFLOP/s 8192³": (b8 or {}).get("tflops"), "% cuBLAS 8192³": 100.0 if b8 else None,
                "GB/s 4096³": (b4 or {}).get("gbps"), "% of roof 4096³": (b4 or {}).get("pct_of_roof"),
                "rel. error 4096³": (b4 or {}).get("rel_err"),
            })  # fmt: skip
    note = (
        "float32 steps (1-7) are compared with cuBLAS float32 (TF32 off), tensor-core steps with "
        "cuBLAS bfloat16; '% of roof' is achieved FLOP/s over the roofline's attainable FLOP/s "
        "at the minimum-bytes intensity (datasheet peaks)."
    )
    return "\n".join([markdown_table(table, floatfmt=",.3g"), "", note, "", _caption(gemm)])


def render_shapes(gemm: dict) -> str:
    from shared.results import markdown_table

    res = gemm["results"]
    rows = [r for r in res["rows"] if r.get("correct") and r.get("tflops") is not None]
    table = []
    for b in res["baseline"]:
        cands = [r for r in rows if r["shape"] == b["shape"] and r["dtype"] == b["dtype"]]
        best = max(cands, key=lambda r: r["tflops"], default=None)
        table.append({
            "shape (MxNxK)": b["shape"], "dtype": b["dtype"],
            "cuBLAS TFLOP/s": b["tflops"], "cuBLAS ms": b["median_ms"],
            "best ladder kernel": f"`{best['kernel']}`" if best else "n/a",
            "TFLOP/s": best["tflops"] if best else None,
            "ms": best["median_ms"] if best else None,
            "% cuBLAS": best["pct_of_cublas"] if best else None,
        })  # fmt: skip
    return "\n".join([markdown_table(table, floatfmt=",.3g"), "", _caption(gemm)])


def targets(gemm: dict) -> list[dict]:
    """The issue's targets against the measurements: one dict per target."""
    rows = [r for r in gemm["results"]["rows"] if r.get("correct") and r.get("pct_of_cublas")]
    out = []
    for dtype, size in (("float32", 4096), ("bfloat16", 4096), ("bfloat16", 8192)):
        shape = f"{size}x{size}x{size}"
        cands = [r for r in rows if r["shape"] == shape and r["dtype"] == dtype]
        best = max(cands, key=lambda r: r["pct_of_cublas"], default=None)
        out.append({
            "target": f"best {dtype} kernel >= {TARGET_PCT:.0f}% of cuBLAS at {size}³",
            "best kernel": f"`{best['kernel']}`" if best else "n/a",
            "measured % of cuBLAS": best["pct_of_cublas"] if best else None,
            "met": bool(best and best["pct_of_cublas"] >= TARGET_PCT),
        })  # fmt: skip
    return out


def render_targets(gemm: dict) -> str:
    from shared.results import markdown_table

    return "\n".join([markdown_table(targets(gemm), floatfmt=".1f"), "", _caption(gemm)])


def render_compile(compile_rec: dict) -> str:
    from shared.results import markdown_table

    table = []
    for f in compile_rec["results"]:
        if not f["file"].startswith("gemm/"):
            continue
        for k in f["kernels"]:
            table.append({
                "file": f["file"], "kernel": f"`{k['kernel'].split('(')[0]}`",
                "registers": k["registers"], "static smem (B)": k["smem_bytes"],
                "stack (B)": k["stack_frame_bytes"],
                "spills st/ld (B)": f"{k['spill_store_bytes']}/{k['spill_load_bytes']}",
                "no-spill rule": "yes" if f["no_spill"] else "",
            })  # fmt: skip
    cfg = compile_rec.get("config", {})
    return "\n".join([
        markdown_table(table),
        "",
        f"_nvcc {cfg.get('nvcc', '?')}, {cfg.get('arch', '?')}, flags "
        f"`{' '.join(cfg.get('flags', []))}`; dynamic shared memory (steps 8 and 9) is set at "
        f"launch and not in this static figure. {_caption(compile_rec)[1:]}",
    ])  # fmt: skip


def render_profile(prof: dict) -> str:
    from shared.results import markdown_table

    from .profile_gemm import summary_rows

    size = prof.get("config", {}).get("size", "?")
    return "\n".join([
        markdown_table(summary_rows(prof["results"]), floatfmt=".3g"),
        "",
        f"_Nsight Compute, `--clock-control none`, one launch of each kernel at {size}³ after a "
        f"warm-up. {_caption(prof)[1:]}",
    ])  # fmt: skip


def render_attention(reports_dir: Path, image_prefix: str | None = None) -> str:
    try:
        mod = importlib.import_module(f"{__package__}.attention_report")
    except ModuleNotFoundError:
        return "The attention report module is not in this checkout yet."
    if image_prefix is None:
        return mod.render_markdown(reports_dir)
    return mod.render_markdown(reports_dir, image_prefix=image_prefix)


def image_prefix_for(readme: Path, reports_dir: Path) -> str:
    """The charts' folder as a link relative to the README's folder."""
    rel = os.path.relpath(Path(reports_dir).resolve() / PROJECT, Path(readme).resolve().parent)
    return rel.replace(os.sep, "/") + "/"


def render_all(reports_dir: Path, image_prefix: str | None = None) -> dict[str, str]:
    """Marker name -> Markdown, for every section whose JSON exists; chart links start with
    `image_prefix` (default: as seen from project01_cuda_kernel/README.md)."""
    folder = reports_dir / PROJECT
    out: dict[str, str] = {}
    missing = "_No {what} yet: run `{cmd}` on a CUDA GPU._"
    gemm = _load(folder / "gemm.json")
    if gemm is not None:
        out["gemm:ladder"] = render_ladder(gemm)
        out["gemm:shapes"] = render_shapes(gemm)
        out["gemm:targets"] = render_targets(gemm)
    else:
        cmd = "python -m project01_cuda_kernel.bench gemm"
        for m in ("gemm:ladder", "gemm:shapes", "gemm:targets"):
            out[m] = missing.format(what="GEMM measurements", cmd=cmd)
    comp = _load(folder / "compile.json")
    out["gemm:compile"] = (
        render_compile(comp)
        if comp is not None
        else "_No compile report yet: run `python -m project01_cuda_kernel.compile_check`._"
    )
    prof = _load(folder / "profile_gemm.json")
    out["gemm:profile"] = (
        render_profile(prof)
        if prof is not None
        else missing.format(what="profile", cmd="python -m project01_cuda_kernel.profile gemm")
    )
    out["attention"] = render_attention(reports_dir, image_prefix)
    return out


def render_summary(reports_dir: Path) -> str:
    """The headline figures for the repository README (reports/<project>/summary.md)."""
    folder = reports_dir / PROJECT
    parts = []
    gemm = _load(folder / "gemm.json")
    if gemm is not None:
        parts += ["**Matmul ladder vs cuBLAS** (same process; the full ladder and shapes in "
                  "[project01_cuda_kernel/README.md](project01_cuda_kernel/README.md)):", "",
                  render_targets(gemm), ""]  # fmt: skip
    bench = _load(folder / "attention.json")
    if bench is not None:
        try:
            mod = importlib.import_module(f"{__package__}.attention_report")
        except ModuleNotFoundError:
            mod = None
        if mod is not None:
            from shared.results import environment_line

            parts += ["**FlashAttention vs SDPA's FLASH backend** (bf16; "
                      f"{environment_line(bench.get('environment', {}))}):", "",
                      *mod._target_lines(bench["results"]["rows"],
                                         bench["results"].get("ours_forward_kernel", "fa2")),
                      ""]  # fmt: skip
    if not parts:
        return "_No measurements yet: run `make project01` on a CUDA GPU._\n"
    return "\n".join(parts)


def render_charts(reports_dir: Path) -> list[Path]:
    """Every chart again from the JSON records present (gemm.json, attention.json): no GPU."""
    folder = Path(reports_dir) / PROJECT
    paths: list[Path] = []
    if (folder / "gemm.json").is_file():
        from .bench_gemm import redraw_charts

        paths += redraw_charts(folder / "gemm.json")
    if (folder / "attention.json").is_file():
        from .bench_attention import redraw_charts as redraw_attention

        paths += redraw_attention(folder / "attention.json")
    return paths


def update_readme(readme: Path, sections: dict[str, str]) -> str:
    from shared.results import replace_between_markers

    text = readme.read_text()
    for marker, content in sections.items():
        if f"<!-- {marker} -->" in text:
            text = replace_between_markers(text, marker, content)
    return text


@main_guard
def main(argv: list[str] | None = None) -> int:
    from shared.cli import ArgumentParser, input_file, nonempty_path, writable_dir

    p = ArgumentParser(
        prog="python -m project01_cuda_kernel.report",
        description="Regenerate project01_cuda_kernel/README.md's tables from the JSON results.",
    )
    p.add_argument("--reports-dir", type=nonempty_path, default=None,
                   help="default: the repo's reports/")  # fmt: skip
    p.add_argument("--readme", type=nonempty_path, default=README)
    p.add_argument("--check", action="store_true",
                   help="exit 1 if the README is not up to date (writes nothing)")  # fmt: skip
    p.add_argument("--no-readme", action="store_true",
                   help="write <reports-dir>/project01_cuda_kernel/summary.md only")  # fmt: skip
    args = p.parse_args(argv)
    from shared.results import REPORTS_DIR, atomic_write_text

    reports_dir = writable_dir("--reports-dir", args.reports_dir or REPORTS_DIR)
    if not args.no_readme or args.check:
        input_file("--readme", args.readme)
    summary = reports_dir / PROJECT / "summary.md"
    if not args.check:  # the charts, redrawn from the same records
        print(f"wrote {len(render_charts(reports_dir))} charts under {reports_dir / PROJECT}")
    if args.no_readme and not args.check:
        atomic_write_text(summary, render_summary(reports_dir))
        print(f"wrote {summary}")
        return 0
    prefix = image_prefix_for(args.readme, reports_dir)
    new = update_readme(args.readme, render_all(reports_dir, prefix))
    if args.check:
        stale = new != args.readme.read_text()
        print(f"{args.readme.name} is {'out of date' if stale else 'up to date'}")
        return 1 if stale else 0
    atomic_write_text(args.readme, new)
    atomic_write_text(summary, render_summary(reports_dir))
    print(f"wrote {args.readme} and {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
