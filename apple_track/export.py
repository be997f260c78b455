"""Export the shared transformer to Core ML, LiteRT and MLX; measure; write the report.

    python -m apple_track export                   # tiny preset, every variant (make apple)
    python -m apple_track export --preset 125m --seq-len 128 --train-steps 0
    python -m apple_track export --coreml fp16 int8 --litert fp32 --mlx fp32

One run, one process, so every figure has its baseline from the same run: the PyTorch float32
model (eager, CPU) gives the reference logits and the reference latency. Per variant it records
size on disk, op counts, input/output descriptions, parity against the reference and CPU
latency; then `apple_track.report` writes reports/apple_track/ (JSON, charts, summary) and
regenerates apple_track/README.md. Model files go to --models-dir (default
.build/apple_track/NAME, not committed). All CPU timings are single-threaded:
`torch.utils.benchmark` (which shared.timing uses) pins PyTorch to one thread, so LiteRT runs
with num_threads=1 and MLX's BLAS with OPENBLAS_NUM_THREADS=1, for a like-for-like comparison.
"""

from __future__ import annotations

import math
import os
import platform
import re
import sys
import time
import traceback
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Annotated

import torch
import tyro

from apple_track import PROJECT
from apple_track.model import (
    COREML_VARIANTS,
    LITERT_VARIANTS,
    MLX_VARIANTS,
    TOLERANCES,
    ExportConfig,
    build_export_model,
    parity,
    within_tolerance,
)
from shared.cli import require_nonempty, writable_dir
from shared.results import REPO_ROOT, output_root, save_result
from shared.timing import benchmark

RESULT_NAME = "export"
DEFAULT_OUT = REPO_ROOT / ".build" / "apple_track"


def _log(msg: str) -> None:
    print(f"[apple_track] {msg}", file=sys.stderr, flush=True)


def _versions() -> dict:
    import importlib.metadata as md

    out = {}
    for dist in ("torch", "coremltools", "litert-torch", "ai-edge-litert", "mlx", "numpy"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = None
    return out


def _timing(fn) -> dict:
    t = benchmark(fn, device="cpu", rep_ms=300)
    return t.to_dict()


def _entry(runtime: str, variant: str, description: str) -> dict:
    return {
        "runtime": runtime,
        "variant": variant,
        "description": description,
        "tolerance": TOLERANCES[(runtime, variant)],
    }


def _finish(entry: dict) -> dict:
    if entry.get("parity") is not None:
        entry["within_tolerance"] = within_tolerance(
            entry["runtime"], entry["variant"], entry["parity"]
        )
    return entry


def run_coreml(cfg, wrapper, tokens, targets, ref, out_dir: Path) -> list[dict]:
    from apple_track import coreml_export as ce

    entries = []
    t0 = time.perf_counter()
    fp16 = ce.convert_fp16(wrapper, tokens)
    convert_s = time.perf_counter() - t0
    for variant in cfg.coreml:
        e = _entry("coreml", variant, COREML_VARIANTS[variant])
        _log(f"Core ML {variant}: compress, save, inspect")
        t0 = time.perf_counter()
        model = ce.compress(fp16, variant)
        e["convert_s"] = convert_s + (time.perf_counter() - t0)
        path = out_dir / f"coreml_{variant}.mlpackage"
        model.save(str(path))
        counts = ce.op_counts(model)
        e |= {
            "file": path.name,
            "bytes": ce.package_bytes(path),
            "op_counts": counts,
            "n_ops": sum(n for op, n in counts.items() if op != "const"),
            "compressed_weight_ops": counts.get(ce.COMPRESSED_WEIGHT_OPS.get(variant, ""), 0),
            "io": ce.io_description(model),
            "deployment_target": ce.DEPLOYMENT_TARGET,
        }
        logits, info = ce.emulate(wrapper, model, tokens)
        e["weight_rel_err"] = info["weight_rel_err"]
        e["emulated_parity"] = parity(torch.from_numpy(logits), ref, targets)
        prediction_error = None
        if ce.can_predict():
            try:
                out = ce.predict(model, tokens)
            except Exception as err:  # e.g. an OS older than the deployment target
                prediction_error = f"failed: {type(err).__name__}: {err}"
        if ce.can_predict() and prediction_error is None:
            e["parity"] = parity(torch.from_numpy(out), ref, targets)
            e["parity_source"] = "Core ML prediction (macOS, default compute units)"
            e["latency"] = _timing(lambda m=model: ce.predict(m, tokens))
            e["prediction"] = "ran"
            e["device"] = "Core ML, default compute units (CPU, GPU, Neural Engine)"
        else:
            # Stated plainly: no Core ML run here. The emulation stands in for the parity column.
            e["parity"] = e["emulated_parity"]
            e["parity_source"] = (
                "emulated: PyTorch CPU float16 with the weights decompressed from the .mlpackage"
            )
            e["latency"] = None
            e["prediction"] = prediction_error or (
                f"skipped: Core ML predicts only on macOS (this is {platform.system()})"
            )
            e["device"] = None
        entries.append(_finish(e))
    return entries


def run_litert(cfg, wrapper, tokens, targets, ref, out_dir: Path) -> list[dict]:
    from apple_track import litert_export as le

    entries = []
    for variant in cfg.litert:
        e = _entry("litert", variant, LITERT_VARIANTS[variant])
        _log(f"LiteRT {variant}: convert (litert-torch), run (ai-edge-litert, XNNPACK)")
        t0 = time.perf_counter()
        path = le.convert(wrapper, tokens, variant, out_dir / f"litert_{variant}.tflite")
        e["convert_s"] = time.perf_counter() - t0
        desc = le.describe(path)
        e |= {
            "file": path.name,
            "bytes": path.stat().st_size,
            "op_counts": desc["op_counts"],
            "n_ops": sum(desc["op_counts"].values()),
            "constants_by_dtype": desc["constants_by_dtype"],
            "compressed_weight_ops": desc["constants_by_dtype"].get("int8", {}).get("tensors", 0),
            "io": {"inputs": desc["inputs"], "outputs": desc["outputs"]},
        }
        it = le.interpreter(path, threads=1)
        e["parity"] = parity(torch.from_numpy(le.run(it, tokens)), ref, targets)
        e["parity_source"] = "ai-edge-litert interpreter, XNNPACK CPU delegate"
        e["device"] = "CPU, XNNPACK, 1 thread"
        e["latency"] = _timing(lambda it=it: le.run(it, tokens))
        entries.append(_finish(e))
    return entries


def run_mlx(cfg, wrapper, tokens, targets, ref, out_dir: Path) -> list[dict]:
    import mlx.core as mx
    import mlx.nn as nn

    from apple_track.mlx_model import from_torch, to_numpy

    entries = []
    x = mx.array(tokens.numpy())
    for variant in cfg.mlx:
        e = _entry("mlx", variant, MLX_VARIANTS[variant])
        _log(f"MLX {variant}: port the weights, run on {mx.default_device()}")
        t0 = time.perf_counter()
        model = from_torch(wrapper.model, dtype=mx.float16 if variant == "fp16" else mx.float32)
        if variant in ("q8", "q4"):
            nn.quantize(model, group_size=32, bits=int(variant[1:]))
        mx.eval(model.parameters())
        e["convert_s"] = time.perf_counter() - t0
        path = out_dir / f"mlx_{variant}.safetensors"
        model.save_weights(str(path))
        e |= {
            "file": path.name,
            "bytes": path.stat().st_size,
            "device": f"MLX {mx.default_device()}",
            "op_counts": None,
            "n_ops": None,
            "compressed_weight_ops": sum(
                1
                for _, m in model.named_modules()
                if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))
            ),
        }
        e["parity"] = parity(torch.from_numpy(to_numpy(model(x))), ref, targets)
        e["parity_source"] = f"MLX on {mx.default_device()}"
        e["latency"] = _timing(lambda m=model: mx.eval(m(x)))
        entries.append(_finish(e))
    return entries


def _metal_attention_case(mk, causal: bool, B=1, H=16, S=1024, D=64) -> dict:
    import mlx.core as mx

    q, k, v = (mx.random.normal((B, H, S, D)).astype(mx.float16) for _ in range(3))
    mask = "causal" if causal else None

    def ours():
        return mk.attention(q, k, v, causal=causal)

    def mlx_sdpa():
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=D**-0.5, mask=mask)

    err = mx.abs(ours().astype(mx.float32) - mlx_sdpa().astype(mx.float32)).max().item()
    flops = 4 * B * H * S * S * D // (2 if causal else 1)
    t = benchmark(lambda: mx.eval(ours()), device="cpu", rep_ms=300)
    base = benchmark(lambda: mx.eval(mlx_sdpa()), device="cpu", rep_ms=300)
    return {
        "shape": [B, H, S, D],
        "causal": causal,
        "dtype": "float16",
        "max_abs_err": err,
        "median_ms": t.median_ms,
        "tflops": t.tflops(flops),
        "mlx_sdpa_ms": base.median_ms,
        "mlx_sdpa_tflops": base.tflops(flops),
    }


def run_metal() -> dict:
    """Metal kernels against MLX's own ops, and their speed, where Metal exists."""
    try:
        import mlx.core as mx

        from apple_track import metal_kernels as mk
    except ImportError as e:
        return {"ran": False, "reason": f"MLX is not installed ({e})"}
    if not mk.metal_available():
        return {
            "ran": False,
            "reason": f"no Metal device ({platform.system()}, MLX on {mx.default_device()}): "
            "the kernels need macOS on Apple silicon; their bodies were checked on the CPU "
            "stand-in by tests/apple_track/test_metal_kernels_on_cpu.py",
        }
    results = {"ran": True, "device": mx.metal.device_info(), "matmul": [], "attention": []}
    M = N = K = 2048
    for dtype in (mx.float32, mx.float16):
        a = mx.random.normal((M, K)).astype(dtype)
        b = mx.random.normal((K, N)).astype(dtype)
        ref = a @ b
        base = benchmark(lambda a=a, b=b: mx.eval(a @ b), device="cpu", rep_ms=300)
        for kernel in mk.MATMUL_KERNELS:
            c = mk.matmul(a, b, kernel=kernel)
            err = mx.abs(c.astype(mx.float32) - ref.astype(mx.float32)).max().item()
            t = benchmark(
                lambda a=a, b=b, k=kernel: mx.eval(mk.matmul(a, b, kernel=k)),
                device="cpu",
                rep_ms=300,
            )
            results["matmul"].append(
                {
                    "kernel": kernel,
                    "dtype": str(dtype),
                    "shape": [M, N, K],
                    "max_abs_err": err,
                    "median_ms": t.median_ms,
                    "tflops": t.tflops(2 * M * N * K),
                    "mlx_matmul_ms": base.median_ms,
                    "mlx_matmul_tflops": base.tflops(2 * M * N * K),
                }
            )
    for causal in (False, True):
        results["attention"].append(_metal_attention_case(mk, causal))
    return results


def measure(
    cfg: ExportConfig, out_dir: Path, reports_dir: Path | None = None, *, name: str = RESULT_NAME
) -> tuple[Path, int]:
    """Export, measure and record every variant of `cfg` (model files into `out_dir`); returns
    (the result file, the number of runtimes that failed)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as torch.utils.benchmark times it; restored on the way out
    try:
        return _run(cfg, out_dir, reports_dir, name)
    finally:
        torch.set_num_threads(threads)


def _run(cfg: ExportConfig, out_dir: Path, reports_dir: Path | None, name: str):
    out_dir.mkdir(parents=True, exist_ok=True)
    _log(
        f"model: preset {cfg.preset}, {cfg.model_args().num_params():,} parameters; "
        f"training {cfg.train_steps} steps on the synthetic stream"
    )
    wrapper, losses = build_export_model(cfg)
    tokens, targets = wrapper.example_input(cfg.seed)
    with torch.no_grad():
        ref = wrapper(tokens)
        ref_loss = torch.nn.functional.cross_entropy(ref.flatten(0, 1), targets.flatten()).item()
    pt_path = out_dir / "pytorch_fp32.pt"
    torch.save(wrapper.model.state_dict(), pt_path)
    with torch.no_grad():
        pt_latency = _timing(lambda: wrapper(tokens))
    baseline = {
        "runtime": "pytorch",
        "variant": "fp32 eager",
        "bytes": pt_path.stat().st_size,
        "latency": pt_latency,
        "loss": ref_loss,
        "note": "PyTorch float32 eager on the CPU, one thread: the reference for every parity "
        "and latency figure",
    }
    _log(f"PyTorch eager: {pt_latency['median_ms']:.3f} ms, loss {ref_loss:.4f}")

    variants, failures = [], {}
    for runtime, fn in (("coreml", run_coreml), ("litert", run_litert), ("mlx", run_mlx)):
        if not getattr(cfg, runtime):
            continue
        try:
            variants += fn(cfg, wrapper, tokens, targets, ref, out_dir)
        except ImportError as e:
            failures[runtime] = f"skipped: {e.name or e} is not installed in this environment"
            _log(f"{runtime}: {failures[runtime]}")
        except Exception as e:  # a failed conversion is reported, and the run exits non-zero
            failures[runtime] = f"FAILED: {type(e).__name__}: {e}"
            _log(f"{runtime}: {failures[runtime]}\n{traceback.format_exc()}")
    metal = run_metal()
    # The baseline again, last: if the machine's load changed during the run, the two differ.
    with torch.no_grad():
        baseline["latency_at_end"] = _timing(lambda: wrapper(tokens))

    results = {
        "model": {
            "preset": cfg.preset,
            "num_params": cfg.model_args().num_params(),
            "batch": cfg.batch,
            "seq_len": cfg.seq_len,
            "train_steps": cfg.train_steps,
            "train_loss_first_last": [losses[0], losses[-1]] if losses else None,
            "eval_loss": ref_loss,
        },
        "versions": _versions(),
        "platform": {
            "system": platform.system(),
            "machine": platform.machine(),
            "processor": platform.processor() or None,
        },
        "threads": 1,
        # Other processes compete for the cores: the load says how quiet the machine was.
        "load_average_1_5_15": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "variants": variants,
        "runtime_failures": failures,
        "metal": metal,
    }
    path = save_result(
        PROJECT,
        name,
        results,
        baseline=baseline,
        config=cfg.to_dict(),
        reports_dir=reports_dir,
    )
    n_failed = sum(1 for v in failures.values() if v.startswith("FAILED"))
    return path, n_failed


def _parse_overrides(items: tuple[str, ...]) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set expects NAME=VALUE, got {item!r}")
        try:
            out[key] = int(value)
        except ValueError:
            try:
                out[key] = float(value)
            except ValueError:
                raise ValueError(f"--set {key}: {value!r} is not a number") from None
        if not math.isfinite(out[key]):
            raise ValueError(f"--set {key}: {value!r} is not a finite number")
    return out


@dataclass(frozen=True)
class ExportCommandConfig(ExportConfig):
    """Export every variant, measure each against PyTorch float32 in the same run, write the
    record and chart under reports/apple_track/ and regenerate the README."""

    overrides: tyro.conf.Suppress[dict] = field(default_factory=dict)
    set: Annotated[
        tuple[str, ...],
        tyro.conf.arg(metavar="[NAME=VALUE ...]", help_behavior_hint="(default: none)"),
    ] = ()
    """override ModelArgs fields of the preset, e.g. --set dim=128 n_layers=4"""
    models_dir: str | None = None
    """where the model files are written (None: .build/apple_track/NAME)"""
    reports_dir: str | None = None
    """the record goes to <reports-dir>/apple_track/NAME.json (None: a new runs/<UTC time>/; reports/ only when named)"""
    name: str = RESULT_NAME
    """result name: export is the main run; other names are extra runs listed in the README"""
    readme: bool = True
    """regenerate apple_track/README.md (--no-readme: the record, chart and summary only)"""

    def __post_init__(self) -> None:
        object.__setattr__(self, "overrides", {**self.overrides, **_parse_overrides(self.set)})
        super().__post_init__()
        for flag, path in (("--models-dir", self.models_dir), ("--reports-dir", self.reports_dir)):
            if path is not None:
                require_nonempty(flag, path)
        stem = re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", self.name)
        if not stem or self.name.endswith(".json"):
            raise ValueError(
                f"--name must be a plain file stem like 'export_125m', got {self.name!r}"
            )

    def export_config(self) -> ExportConfig:
        """What is exported and measured, as the record stores it."""
        return ExportConfig(**{f.name: getattr(self, f.name) for f in fields(ExportConfig)})


def run(cfg: ExportCommandConfig) -> int:
    """The `export` command: 0, or 1 when a runtime failed (the record says which)."""
    models_dir = Path(cfg.models_dir) if cfg.models_dir is not None else DEFAULT_OUT / cfg.name
    reports_dir = output_root(cfg.reports_dir)
    writable_dir("--models-dir", models_dir)  # both before the training and the exports
    writable_dir("--reports-dir", reports_dir / PROJECT)
    # Before MLX loads its BLAS: one thread, like PyTorch under torch.utils.benchmark. Set by
    # the command, not at import, so importing this module changes nothing for its importer.
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "VECLIB_MAXIMUM_THREADS"):
        os.environ.setdefault(var, "1")
    path, n_failed = measure(cfg.export_config(), models_dir, reports_dir, name=cfg.name)
    _log(f"wrote {path}")
    from apple_track import report

    written = report.write_report(path, readme=cfg.readme)
    for w in written:
        _log(f"wrote {w}")
    print(report.console_summary(path))
    return 1 if n_failed else 0


def main(argv: list[str] | None = None) -> int:
    """`python -m apple_track.export`: the package's `export` command (one CLI, one --help)."""
    from apple_track.__main__ import main as package_main

    return package_main(["export", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
