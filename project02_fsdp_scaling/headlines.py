"""The front page's claims: each headline figure, the record it comes from, and its target.

`make readme` renders these into the README's results table (`shared.front_page`). MFU here is
the strict convention (6 x the parameters that take part in matmuls, + causal attention); the
records hold the common one beside it.
"""

from __future__ import annotations

from shared.front_page import Claim, spread_of

SCALING = "scaling_gpu.json"
LEVERS = "sweep_gpu_levers.json"
PRECISION = "precision_gpu_ab_unfused.json"  # 3 interleaved runs each, the latest of its GPU
PRECISION_H100 = "precision_gpu_h100.json"
STRATEGIES_CPU = "parallel_cpu.json"


def _scaling(world_size: int, key: str, scale: float = 1.0):
    def measure(rec: dict) -> float | None:
        run = next(
            (
                r
                for r in rec["results"]["runs"]
                if r["world_size"] == world_size and r.get("status") == "ok"
            ),
            None,
        )
        return None if run is None or run.get(key) is None else run[key] * scale

    return measure


def _variant(rec: dict, name: str) -> dict | None:
    return next((v for v in rec["results"]["variants"] if v["variant"] == name), None)


def _lever(variant: str):
    def measure(rec: dict) -> float | None:
        v = _variant(rec, variant)
        return None if v is None or v.get("mfu") is None else v["mfu"] * 100

    return measure


def _precision(label: str, key: str, scale: float = 1.0):
    def measure(rec: dict) -> float | None:
        runs = rec["results"]["throughput"]["runs"]
        run = next((r for r in runs if r["label"] == label and r.get("status") == "ok"), None)
        return None if run is None or run.get(key) is None else run[key] * scale

    return measure


def _state_over_ddp(name: str, world_size: int):
    """A strategy's training state per rank (its largest rank, measured from its tensors) as a
    fraction of DDP's at the same world size: FSDP2's formula says 1 / N."""

    def measure(rec: dict) -> float | None:
        runs = {(r["name"], r["world_size"]): r for r in rec["results"]["runs"]}
        mine, ddp = runs.get((name, world_size)), runs.get(("ddp", world_size))
        if not mine or not ddp or not ddp.get("state_bytes_measured"):
            return None
        return mine["state_bytes_measured"] / ddp["state_bytes_measured"]

    return measure


CLAIMS = [
    Claim(
        "bf16 MFU, `1b`, one GPU (compile + cuDNN, gathered params)",
        LEVERS,
        _lever("compile+cudnn+noreshard"),
        "% of dense bf16 peak",
        55.0,
        fmt=".1f",
        spread=lambda rec: spread_of(_variant(rec, "compile+cudnn+noreshard"), "mfu", 100),
        root=True,
    ),
    Claim(
        "strong-scaling efficiency, `1b`, 2 GPUs",
        SCALING,
        _scaling(2, "efficiency", 100),
        "% of linear",
        95.0,
        fmt=".1f",
        root=True,
    ),
    Claim(
        "throughput, `1b`, 2 GPUs (global batch 64 x 2048)",
        SCALING,
        _scaling(2, "tokens_per_s"),
        "tokens/s",
        fmt=",.0f",
    ),
    Claim(
        "fp8-tensorwise over bf16, `1b`, one GPU (3 runs)",
        PRECISION,
        _precision("fp8-tensorwise", "speedup_vs_bf16"),
        "x bf16 tokens/s",
        1.25,
        fmt=".3f",
        root=True,
    ),
    Claim(
        "same job on a second GPU model (3 interleaved runs)",
        PRECISION_H100,
        _precision("fp8-tensorwise", "speedup_vs_bf16"),
        "x bf16 tokens/s",
        1.25,
        fmt=".3f",
    ),
    Claim(
        "bf16 MFU on that second GPU model",
        PRECISION_H100,
        _precision("bf16", "mfu", 100),
        "% of dense bf16 peak",
        55.0,
        fmt=".1f",
    ),
    Claim(
        "FSDP2 state per rank over DDP's, 4 ranks (`tiny`; formula 1 / N)",
        STRATEGIES_CPU,
        _state_over_ddp("fsdp", 4),
        "x DDP's bytes per rank",
        0.25,
        higher_is_better=False,
        fmt=".3f",
    ),
]
