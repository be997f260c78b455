"""A steady inference loop over one exported variant: the target for Instruments (xctrace),
powermetrics or perf.

    python -m apple_track.profile coreml palettize4 --seconds 20   # macOS
    python -m apple_track.profile litert int8 --seconds 20         # Linux or macOS
    python -m apple_track.profile mlx q4 --seconds 20
    python -m apple_track.profile metal simdgroup --seconds 10     # macOS, Apple silicon

Reads the files `python -m apple_track.export` wrote (default .build/apple_track/export, or
.build/apple_track/NAME with --name NAME) and prints the number of inferences and the mean
time per inference when done.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from apple_track.model import VARIANTS, eval_batch
from shared.cli import ArgumentParser, nonempty_path, one_line, positive_float
from shared.results import REPO_ROOT, load_result

MODEL_ROOT = REPO_ROOT / ".build" / "apple_track"  # the export's default, one folder per run name
RECORD_ROOT = REPO_ROOT / "reports" / "apple_track"
METAL_TARGETS = ("naive", "threadgroup_tiled", "simdgroup", "attention")


def _step_fn(runtime: str, variant: str, model_dir: Path, record: Path):
    """A no-argument callable that runs one inference (one kernel launch for metal)."""
    if runtime == "metal":
        import mlx.core as mx

        from apple_track import metal_kernels as mk

        if variant == "attention":
            q, k, v = (mx.random.normal((1, 16, 1024, 64)).astype(mx.float16) for _ in range(3))
            return lambda: mx.eval(mk.attention(q, k, v, causal=True))
        a, b = (mx.random.normal((2048, 2048)).astype(mx.float16) for _ in range(2))
        return lambda: mx.eval(mk.matmul(a, b, kernel=variant))

    from shared.model import ModelArgs

    recorded = load_result(record)
    model, cfg = recorded["results"]["model"], recorded["config"]
    args = ModelArgs(**cfg["model_args"])
    tokens, _ = eval_batch(args.vocab_size, model["batch"], model["seq_len"], cfg.get("seed", 0))
    if runtime == "coreml":
        from apple_track import coreml_export as ce

        mlmodel = ce.load(model_dir / f"coreml_{variant}.mlpackage")
        ce.predict(mlmodel, tokens)  # raises off macOS, saying so
        return lambda: ce.predict(mlmodel, tokens)
    if runtime == "litert":
        from apple_track import litert_export as le

        it = le.interpreter(model_dir / f"litert_{variant}.tflite", threads=1)
        return lambda: le.run(it, tokens)
    import mlx.core as mx
    import mlx.nn as nn

    from apple_track.mlx_model import MLXTransformer

    m = MLXTransformer(args)
    if variant in ("q8", "q4"):
        nn.quantize(m, group_size=32, bits=int(variant[1:]))
    m.load_weights(str(model_dir / f"mlx_{variant}.safetensors"), strict=True)
    x = mx.array(tokens.numpy())
    return lambda: mx.eval(m(x))


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(
        prog="python -m apple_track.profile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("runtime", choices=[*VARIANTS, "metal"])
    p.add_argument("variant", help="a variant of that runtime (metal: a kernel or 'attention')")
    p.add_argument("--seconds", type=positive_float, default=20.0)
    p.add_argument(
        "--name",
        default="export",
        help="the export run whose files to use (default export, the main run)",
    )
    p.add_argument(
        "--model-dir", type=nonempty_path, default=None, help="default .build/apple_track/NAME"
    )
    p.add_argument(
        "--record",
        type=nonempty_path,
        default=None,
        help="the export record, for the model's shape and seed "
        "(default reports/apple_track/NAME.json)",
    )
    args = p.parse_args(argv)
    allowed = METAL_TARGETS if args.runtime == "metal" else tuple(VARIANTS[args.runtime])
    if args.variant not in allowed:
        p.error(f"unsupported {args.runtime} variant {args.variant!r}; expected one of {allowed}")
    if args.seconds <= 0:
        p.error(f"--seconds must be positive, got {args.seconds}")
    model_dir = args.model_dir if args.model_dir is not None else MODEL_ROOT / args.name
    record = args.record if args.record is not None else RECORD_ROOT / f"{args.name}.json"
    try:
        step = _step_fn(args.runtime, args.variant, model_dir, record)
        step()  # warm-up (first-call compilation, weight loading); raises where it cannot run
    except ImportError as e:  # the runtime's package is an optional extra
        print(
            f"error: {args.runtime}: {e.name or e} is not installed in this environment",
            file=sys.stderr,
        )
        return 2
    except (FileNotFoundError, RuntimeError, ValueError) as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < args.seconds:
        step()
        n += 1
    dt = time.perf_counter() - t0
    print(
        f"{args.runtime} {args.variant}: {n} inferences in {dt:.1f} s, {dt / n * 1e3:.3f} ms each"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
