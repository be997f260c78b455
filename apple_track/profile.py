"""A steady inference loop over one exported variant: the target for Instruments (xctrace),
powermetrics or perf.

    python -m apple_track profile coreml palettize4 --seconds 20   # macOS
    python -m apple_track profile litert int8 --seconds 20         # Linux or macOS
    python -m apple_track profile mlx q4 --seconds 20
    python -m apple_track profile metal simdgroup --seconds 10     # macOS, Apple silicon

Reads the files `python -m apple_track export` wrote (default .build/apple_track/export, or
.build/apple_track/NAME with --name NAME) and prints the number of inferences and the mean
time per inference when done.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, get_args

import tyro

from apple_track.model import VARIANTS, eval_batch
from shared.cli import fail, require_nonempty
from shared.results import REPO_ROOT, load_result

MODEL_ROOT = REPO_ROOT / ".build" / "apple_track"  # the export's default, one folder per run name
RECORD_ROOT = REPO_ROOT / "reports" / "apple_track"
METAL_TARGETS = ("naive", "threadgroup_tiled", "simdgroup", "attention")
Runtime = Literal["coreml", "litert", "mlx", "metal"]  # the exporters' runtimes, then metal


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


@dataclass
class ProfileConfig:
    """Run one exported variant (or a Metal kernel) in a loop: a steady target for Instruments,
    powermetrics or perf; prints the number of inferences and the time of each."""

    runtime: tyro.conf.Positional[Annotated[Runtime, tyro.conf.arg(metavar="RUNTIME")]]
    """coreml, litert, mlx, or metal (the track's Metal kernels)"""
    variant: tyro.conf.Positional[Annotated[str, tyro.conf.arg(metavar="VARIANT")]]
    """a variant of that runtime (metal: naive, threadgroup_tiled, simdgroup or attention)"""
    seconds: float = 20.0
    """how long the loop runs"""
    name: str = "export"
    """the export run whose files to use (export: the main run)"""
    models_dir: str | None = None
    """the folder of the exported model files (None: .build/apple_track/NAME)"""
    record: str | None = None
    """the export record: the model's shape and seed (None: reports/apple_track/NAME.json)"""

    def __post_init__(self) -> None:
        if self.runtime not in get_args(Runtime):
            raise ValueError(
                f"unknown runtime {self.runtime!r}; expected one of {get_args(Runtime)}"
            )
        allowed = METAL_TARGETS if self.runtime == "metal" else tuple(VARIANTS[self.runtime])
        if self.variant not in allowed:
            raise ValueError(
                f"unsupported {self.runtime} variant {self.variant!r}; expected one of {allowed}"
            )
        if not (math.isfinite(self.seconds) and self.seconds > 0):
            raise ValueError(f"--seconds must be a finite number > 0, got {self.seconds}")
        for flag, path in (("--models-dir", self.models_dir), ("--record", self.record)):
            if path is not None:
                require_nonempty(flag, path)


def run(cfg: ProfileConfig) -> int:
    """The `profile` command: warm up, then infer in a loop for `cfg.seconds`."""
    model_dir = Path(cfg.models_dir) if cfg.models_dir is not None else MODEL_ROOT / cfg.name
    record = Path(cfg.record) if cfg.record is not None else RECORD_ROOT / f"{cfg.name}.json"
    try:
        step = _step_fn(cfg.runtime, cfg.variant, model_dir, record)
        step()  # warm-up (first-call compilation, weight loading); raises where it cannot run
    except ImportError as e:  # the runtime's package is an optional extra
        fail(f"{cfg.runtime}: {e.name or e} is not installed in this environment")
    except RuntimeError as e:  # e.g. Core ML prediction off macOS
        fail(e)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < cfg.seconds:
        step()
        n += 1
    dt = time.perf_counter() - t0
    print(f"{cfg.runtime} {cfg.variant}: {n} inferences in {dt:.1f} s, {dt / n * 1e3:.3f} ms each")
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m apple_track.profile`: the package's `profile` command (one CLI, one --help)."""
    from apple_track.__main__ import main as package_main

    return package_main(["profile", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
