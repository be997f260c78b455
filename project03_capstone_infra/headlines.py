"""The front page's claims: each headline figure, the record it comes from, and its target.

`make readme` renders these into the README's results table (`shared.front_page`).
"""

from __future__ import annotations

from shared.front_page import Claim, spread_of


def _state_differences(rec: dict) -> float | None:
    """Tensors of the final model and optimizer state that differ from the uninterrupted run."""
    res = rec["results"]
    return float(len(res["state_differences"])) if "state_differences" in res else None


def _derived(key: str, field: str, scale: float = 1.0):
    def measure(rec: dict) -> float | None:
        v = rec["results"]["derived"].get(key, {}).get(field)
        return None if v is None else v * scale

    return measure


def _resume(rec: dict) -> float | None:
    return (rec["results"].get("resume") or {}).get("to_first_new_step_s")


def _reshard_worst(rec: dict) -> float | None:
    """The largest relative loss difference after a world-size change, over both directions."""
    dirs = rec["results"].get("directions") or []
    diffs = [d["first_after"]["rel_diff"] for d in dirs if d.get("first_after")]
    return max(diffs) if diffs else None


def _determinism_cost(rec: dict) -> float | None:
    v = rec["results"].get("throughput_cost")
    return None if v is None else v * 100


def _tune_saved(rec: dict) -> float | None:
    return rec["results"].get("comparison", {}).get("compute_saved_pct")


CLAIMS = [
    Claim(
        "chaos run, 2 GPUs: 6 faults, final state vs uninterrupted run",
        "chaos_gpu.json",
        _state_differences,
        "tensors differing",
        0.0,
        higher_is_better=False,
        fmt=".0f",
        root=True,
    ),
    Claim(
        "chaos run, 2 CPU processes: same faults",
        "chaos.json",
        _state_differences,
        "tensors differing",
        0.0,
        higher_is_better=False,
        fmt=".0f",
    ),
    Claim(
        "steady-state async checkpoint, `1b`, one every 100 steps",
        "checkpoint_bench.json",
        _derived("steady_state", "fraction", 100),
        "% of training time held",
        1.0,
        higher_is_better=False,
        fmt=".2f",
        spread=lambda rec: spread_of(
            rec["results"]["derived"].get("steady_state"), "fraction", 100
        ),
        root=True,
    ),
    Claim(
        "synchronous checkpoint, same job",
        "checkpoint_bench.json",
        _derived("sync", "fraction", 100),
        "% of training time held",
        fmt=".1f",
        spread=lambda rec: spread_of(rec["results"]["derived"].get("sync"), "fraction", 100),
    ),
    Claim(
        "resume after kill -9 to the first new step",
        "checkpoint_bench.json",
        _resume,
        "s after launch",
        30.0,
        higher_is_better=False,
        fmt=".1f",
    ),
    Claim(
        "resharding 2 -> 1 and 1 -> 2 GPUs: first loss after",
        "reshard.json",
        _reshard_worst,
        "relative difference",
        1.0 / 64,
        higher_is_better=False,
        fmt=".3g",
    ),
    Claim(
        "deterministic mode's cost, `125m`, 2 GPUs",
        "determinism_cost.json",
        _determinism_cost,
        "% fewer tokens/s",
        fmt=".1f",
    ),
    Claim(
        "ASHA vs random search: compute saved at the same best loss",
        "tune.json",
        _tune_saved,
        "% of trial steps",
        fmt=".0f",
    ),
]
