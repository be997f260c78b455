"""What an experiment found, from Tune's results: one record per trial (config, loss curve, how
it ended), the best configuration, and ASHA against random search at the same compute.

`compare` runs on trial records alone (the tests feed it made-up ones): the compute each search
used (trial-steps), the best losses, the expected best of k random full trials at ASHA's budget,
the chance that they include a configuration as good as ASHA's best, and a determinism check
(the same configuration gives the same losses in both experiments).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import TYPE_CHECKING

from .trial import METRIC, TIME_ATTR

if TYPE_CHECKING:
    from .experiment import TuneRunConfig


def trial_records(result_grid, max_steps: int) -> list[dict]:
    """One record per trial: its config, loss curve (step -> loss, last value per step) and how it
    ended: completed, stopped by the scheduler (and at which step), or errored."""
    records = []
    for result in result_grid:
        df = result.metrics_dataframe
        curve: dict[int, float] = {}
        rows = 0
        if df is not None and len(df) and TIME_ATTR in df:
            for step, loss in zip(df[TIME_ATTR], df[METRIC]):
                if step == step and loss == loss:  # not NaN
                    curve[int(step)] = float(loss)
                    rows += 1
        last = max(curve) if curve else 0
        cfg = result.config or {}
        # each attempt (first run, Tune retry, run after a driver restore) is a new process
        attempts = int(df["pid"].nunique()) if df is not None and "pid" in df else 1
        # seconds from trial start to its first report (actor, imports, model, first step), and
        # the median seconds per later step
        times = list(df["time_total_s"]) if df is not None and "time_total_s" in df else []
        per_iter = (
            list(df["time_this_iter_s"])[1:] if df is not None and "time_this_iter_s" in df else []
        )
        status = "error" if result.error else ("completed" if last >= max_steps else "stopped")
        records.append(
            {
                "trial_id": (result.metrics or {}).get("trial_id") or Path(result.path).name,
                "path_name": Path(result.path).name,
                "lr": cfg.get("lr"),
                "weight_decay": cfg.get("weight_decay"),
                "warmup_frac": cfg.get("warmup_frac"),
                "status": status,
                "stopped_at_step": last if status == "stopped" else None,
                "last_step": last,
                "final_loss": curve.get(last),
                "steps_run": rows,  # reported steps, redone ones after a retry included
                "attempts": attempts,
                "error": str(result.error)[:300] if result.error else None,
                "first_report_s": float(times[0]) if times else None,
                "trial_s": float(times[-1]) if times else None,
                "median_step_s": float(statistics.median(per_iter)) if per_iter else None,
                "curve": {str(k): v for k, v in sorted(curve.items())},
            }
        )
    records.sort(key=lambda r: (r["lr"] or 0, r["weight_decay"] or 0))
    return records


def expected_best_of_k(losses: list[float], k: int) -> float:
    """E[min of k draws without replacement] from `losses`: random search with k full trials."""
    n = len(losses)
    if not 1 <= k <= n:
        raise ValueError(f"k must be in 1..{n}, got {k}")
    s = sorted(losses)
    total = math.comb(n, k)
    return sum(s[i] * math.comb(n - i - 1, k - 1) for i in range(n - k + 1)) / total


def compare(asha: list[dict], fifo: list[dict], max_steps: int) -> dict:
    """ASHA against random search (the same configurations, every trial run to the end)."""
    asha_steps = sum(len(r["curve"]) for r in asha)
    fifo_done = [r for r in fifo if r["status"] == "completed"]
    fifo_steps = sum(len(r["curve"]) for r in fifo)
    asha_best = min((r["final_loss"] for r in asha if r["status"] == "completed"), default=None)
    fifo_losses = [r["final_loss"] for r in fifo_done]
    out = {
        "asha_trial_steps": asha_steps,
        "random_trial_steps": fifo_steps,
        "compute_saved_pct": 100 * (1 - asha_steps / fifo_steps) if fifo_steps else None,
        "asha_best_loss": asha_best,
        "random_best_loss": min(fifo_losses) if fifo_losses else None,
    }
    if fifo_losses and asha_best is not None:
        k_budget = max(1, min(len(fifo_losses), asha_steps // max_steps))
        out["random_trials_at_asha_budget"] = k_budget
        out["random_expected_best_at_asha_budget"] = expected_best_of_k(fifo_losses, k_budget)
        # chance that k random full trials include a configuration as good as ASHA's best
        n = len(fifo_losses)
        m = sum(1 for v in fifo_losses if v <= asha_best + 1e-9)

        def p_match(k: int) -> float:
            return 1 - math.comb(n - m, k) / math.comb(n, k)

        out["random_p_match_at_asha_budget"] = p_match(k_budget)
        for q in (50, 90):
            k = next((k for k in range(1, n + 1) if p_match(k) >= q / 100), n)
            out[f"random_trials_for_p{q}_match"] = k
            out[f"random_steps_for_p{q}_match"] = k * max_steps
    # the same config, the same steps, the same numbers: determinism check across experiments
    by_cfg = {(round(r["lr"], 12), round(r["weight_decay"], 12)): r for r in fifo}
    diffs = []
    for r in asha:
        twin = by_cfg.get((round(r["lr"], 12), round(r["weight_decay"], 12)))
        if twin:
            diffs += [
                abs(v - twin["curve"][s]) for s, v in r["curve"].items() if s in twin["curve"]
            ]
    out["same_config_max_loss_diff"] = max(diffs) if diffs else None
    out["configs_matched"] = len(
        {k for k in by_cfg} & {(round(r["lr"], 12), round(r["weight_decay"], 12)) for r in asha}
    )
    return out


def _median(values) -> float | None:
    vals = [v for v in values if v is not None]
    return float(statistics.median(vals)) if vals else None


def summarise(cfg: TuneRunConfig, grid, wall_s: float) -> dict:
    import ray

    trials = trial_records(grid, cfg.max_steps)
    done = [t for t in trials if t["status"] == "completed"] or [
        t for t in trials if t["final_loss"] is not None
    ]
    best = min(done, key=lambda t: t["final_loss"]) if done else None
    return {
        "ray_version": ray.__version__,
        "wall_s": wall_s,
        "best": best,
        "trials": trials,
        "stopped_by_asha": [
            {
                "lr": t["lr"],
                "weight_decay": t["weight_decay"],
                "stopped_at_step": t["stopped_at_step"],
                "loss_at_stop": t["final_loss"],
            }
            for t in trials
            if t["status"] == "stopped"
        ],
        "errored": [t for t in trials if t["status"] == "error"],
        "median_first_report_s": _median(t["first_report_s"] for t in trials),
        "median_step_s": _median(t["median_step_s"] for t in trials),
        "experiment": f"{cfg.storage_path.rstrip('/')}/{cfg.name}",  # as given, not resolved
    }
