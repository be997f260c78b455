"""Every table and chart of project01, rendered from its JSON records alone (no GPU needed).

The sections, each under its heading in `details.md` beside the records (and between
`<!-- name -->` and `<!-- /name -->` markers in any README that carries them):

- gemm:ladder    the ladder at 4096^3 and 8192^3: TFLOP/s, % of cuBLAS, GB/s, roofline, error
- gemm:shapes    best float32 and bfloat16 kernel against cuBLAS on every benchmarked shape
- gemm:targets   the project's targets, met or not, with the measured numbers
- gemm:compile   registers / shared memory / spills of each GEMM kernel (compile.json)
- gemm:profile   Nsight Compute occupancy and throughput (profile_gemm.json)
- attention      the FlashAttention section (report.attention.render_markdown)
- attention:hd256  head dim 256 against SDPA FLASH and cuDNN (attention_hd256.json,
                 report.attention.render_record)

`gemm.py` and `attention.py` here render each side; this module puts details.md, summary.md
and the charts together (the README's results table comes from `headlines.py`, `make readme`). A figure recorded over two or more
repetitions shows as "median (min–max)" (`shared.repeat.ranged`); a record of one run renders as
it always did.

    python -m project01_cuda_kernel report [--reports-dir DIR] [--check] [--no-readme]

Image links are written relative to the README wherever it is (in a fork of this project the
README is the repository's own, at its root).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from project01_cuda_kernel import PROJECT

from . import attention, gemm

_HERE = Path(__file__).resolve().parent.parent  # the package's folder
# The project's README; in a standalone fork it is the repository's README, one level up.
README = next(
    (p for p in (_HERE / "README.md", _HERE.parent / "README.md") if p.is_file()),
    _HERE / "README.md",
)


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e


# Further bench-attention records, each with its own README block: marker -> (record name, the
# bench-attention arguments that wrote it).
ATTENTION_RECORDS = {
    "attention:hd256": (
        "attention_hd256",
        "--head-dims 256 --seq-lens 1024 4096 16384 --providers ours flash cudnn --repeats 3 "
        "--no-charts --name attention_hd256",
    ),
    "attention:hbwd": (
        "attention_hbwd",
        "--providers ours ours_hbwd ours_fa2bwd flash cudnn --head-dims 64 128 "
        "--seq-lens 4096 8192 16384 "
        "--repeats 5 --name attention_hbwd",
    ),
}


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
    gemm_rec = _load(folder / "gemm.json")
    if gemm_rec is not None:
        out["gemm:ladder"] = gemm.render_ladder(gemm_rec)
        out["gemm:shapes"] = gemm.render_shapes(gemm_rec)
        out["gemm:targets"] = gemm.render_targets(gemm_rec)
    else:
        cmd = "python -m project01_cuda_kernel bench-gemm"
        for m in ("gemm:ladder", "gemm:shapes", "gemm:targets"):
            out[m] = missing.format(what="GEMM measurements", cmd=cmd)
    comp = _load(folder / "compile.json")
    out["gemm:compile"] = (
        gemm.render_compile(comp)
        if comp is not None
        else "_No compile report yet: run `python -m project01_cuda_kernel compile-check`._"
    )
    prof = _load(folder / "profile_gemm.json")
    out["gemm:profile"] = (
        gemm.render_profile(prof)
        if prof is not None
        else missing.format(what="profile", cmd="python -m project01_cuda_kernel profile-gemm")
    )
    if image_prefix is None:
        out["attention"] = attention.render_markdown(reports_dir)
    else:
        out["attention"] = attention.render_markdown(reports_dir, image_prefix=image_prefix)
    for marker, (name, args) in ATTENTION_RECORDS.items():
        rec = _load(folder / f"{name}.json")
        out[marker] = (
            attention.render_record(rec)
            if rec is not None
            else missing.format(
                what=f"`{name}.json`", cmd=f"python -m project01_cuda_kernel bench-attention {args}"
            )
        )
    return out


def render_summary(reports_dir: Path) -> str:
    """The headline figures for the repository README (reports/<project>/summary.md)."""
    folder = reports_dir / PROJECT
    parts = []
    gemm_rec = _load(folder / "gemm.json")
    if gemm_rec is not None:
        parts += [
            "**Matmul ladder vs cuBLAS** (same process; the full ladder and shapes in "
            "[details.md](details.md)):",
            "",
            gemm.render_targets(gemm_rec),
            "",
        ]
    bench = _load(folder / "attention.json")
    if bench is not None:
        from shared.results import environment_line

        parts += [
            "**FlashAttention vs SDPA's FLASH backend** (bf16; "
            f"{environment_line(bench.get('environment', {}))}):",
            "",
            *attention._target_lines(
                bench["results"]["rows"],
                bench["results"].get("ours_forward_kernel", "fa2"),
                attention.backward_kernels(bench["results"]),
            ),
            "",
        ]
    for name, _ in ATTENTION_RECORDS.values():
        rec = _load(folder / f"{name}.json")
        if rec is not None:
            parts += [attention.headline(rec), ""]
    if not parts:
        return "_No measurements yet: run `make project01` on a CUDA GPU._\n"
    return "\n".join(parts)


def render_charts(reports_dir: Path) -> list[Path]:
    """Every chart again from the JSON records present (gemm.json, attention.json): no GPU."""
    folder = Path(reports_dir) / PROJECT
    paths: list[Path] = []
    if (folder / "gemm.json").is_file():
        paths += gemm.render_charts(folder / "gemm.json")
    if (folder / "attention.json").is_file():
        paths += attention.render_charts(folder / "attention.json")
    return paths


# details.md: every section, in reading order, under its heading.
DETAILS = (
    ("Matmul targets", "gemm:targets"),
    ("The ladder at 4096³ and 8192³", "gemm:ladder"),
    ("Every shape: best ladder kernel against cuBLAS", "gemm:shapes"),
    ("Nsight Compute: occupancy, its limiter, throughput", "gemm:profile"),
    ("Compiler resources (no GPU: `compile-check`)", "gemm:compile"),
    ("FlashAttention forward and backward vs SDPA", "attention"),
    ("Head dim 256 vs SDPA (`attention_hd256.json`)", "attention:hd256"),
    ("Head dim 64, 128 vs SDPA (`attention_hbwd.json`)", "attention:hbwd"),
)


def render_details(reports_dir: Path) -> str:
    """details.md beside the records: every table of the project, charts linked from the same
    folder (the README shows the headline claims only)."""
    sections = render_all(reports_dir, image_prefix="")
    parts = [
        "# project01: every table",
        "",
        "Generated by `python -m project01_cuda_kernel report` from the records in this folder.",
    ]
    for title, marker in DETAILS:
        parts += ["", f"## {title}", "", sections[marker].strip()]
    return "\n".join(parts) + "\n"


def update_readme(readme: Path, sections: dict[str, str]) -> str:
    from shared.results import replace_between_markers

    text = readme.read_text()
    for marker, content in sections.items():
        if f"<!-- {marker} -->" in text:
            text = replace_between_markers(text, marker, content)
    return text


@dataclass
class ReportConfig:
    """Regenerate summary.md, details.md (every table) and every chart of project01 from the
    JSON records alone; the README's results table is `make readme`'s."""

    reports_dir: str | None = None
    """records are read from <reports-dir>/project01_cuda_kernel/ (None: the repository's
    reports/)"""
    readme: bool = True
    """refresh the README's generated blocks (--no-readme: the records' folder only)"""
    readme_file: str | None = None
    """the README to refresh (None: the project's own)"""
    check: bool = False
    """exit 1 if the README is not up to date (writes nothing)"""

    def __post_init__(self) -> None:
        for name in ("reports_dir", "readme_file"):
            value = getattr(self, name)
            if value is not None and not str(value).strip():
                raise ValueError(f"--{name.replace('_', '-')}: expected a path, got an empty one")


def main(cfg: ReportConfig) -> int:
    """`report`: the charts and summary.md under <reports-dir>/project01_cuda_kernel/ and the
    README's blocks (or, with --check, whether the README is up to date)."""
    from shared.cli import input_file, writable_dir
    from shared.results import REPORTS_DIR, atomic_write_text

    reports_dir = writable_dir("--reports-dir", cfg.reports_dir or REPORTS_DIR)
    readme = Path(cfg.readme_file) if cfg.readme_file is not None else README
    if cfg.readme or cfg.check:
        input_file("--readme-file", readme)
    summary = reports_dir / PROJECT / "summary.md"
    if not cfg.check:  # the charts, redrawn from the same records
        print(f"wrote {len(render_charts(reports_dir))} charts under {reports_dir / PROJECT}")
    details = reports_dir / PROJECT / "details.md"
    if not cfg.check:
        atomic_write_text(details, render_details(reports_dir))
    if not cfg.readme and not cfg.check:
        atomic_write_text(summary, render_summary(reports_dir))
        print(f"wrote {summary} and {details}")
        return 0
    prefix = image_prefix_for(readme, reports_dir)
    new = update_readme(readme, render_all(reports_dir, prefix))
    if cfg.check:
        stale = new != readme.read_text()
        print(f"{readme.name} is {'out of date' if stale else 'up to date'}")
        return 1 if stale else 0
    atomic_write_text(readme, new)
    atomic_write_text(summary, render_summary(reports_dir))
    print(f"wrote {readme} and {summary}")
    return 0
