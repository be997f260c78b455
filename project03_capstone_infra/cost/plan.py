"""The plans a job can run under (on-demand or spot, fp32 or bf16, a fixed or the Young/Daly
checkpoint interval), each evaluated by the model and its Monte Carlo (model.py) from sourced
inputs (inputs.py): expected and P50/P90/P99 wall time and cost, the interval sweep, and the
cost of the checkpoint's save time. `run(cfg)` returns the record's results; `command(cfg)`
writes the record and its report (report/cost.py) and prints the plans.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np

from project03_capstone_infra import PROJECT

from .inputs import (
    load_trace,
    precision_speedups,
    resolve_checkpoint_costs,
    resolve_throughput,
)
from .model import (
    LLAMA3_GPU_FAILURES_PER_HOUR,
    MC_TOLERANCE,
    Sampler,
    expected_hours,
    exponential_sampler,
    optimal_interval,
    simulate_hours,
    trace_sampler,
    young_daly_interval,
)


@dataclass
class CostConfig:
    """Expected cost and wall time of one training job under on-demand and spot pricing."""

    gpu: str = "h200-sxm"
    """a key of shared.hardware.GPUS"""
    n_gpus: int = 8
    """GPUs of the job (billed together, interrupted together)"""
    gpus_per_node: int = 8
    """a spot preemption takes a whole node"""
    preset: str = "1b"
    """model preset, for the throughput estimate"""
    seq_len: int = 0
    """0: the preset's max_seq_len"""
    total_tokens: float = 2e10
    """tokens to train (1b preset: ~18 tokens per parameter)"""
    bf16_tokens_per_s_per_gpu: float = 0.0
    """0: measured from the reports, else from assumed_mfu"""
    assumed_mfu: float = 0.40
    """used only when no throughput is measured or given"""
    assumed_scaling_efficiency: float = 0.95
    """applied when measured on fewer GPUs than n_gpus"""
    bf16_speedup: float = 0.0
    """bf16 / fp32 throughput; 0: measured from the reports, else 2.0"""
    spot_preemptions_per_node_hour: float = 0.1
    """assumed: one preemption per node per 10 h"""
    gpu_failures_per_gpu_hour: float = LLAMA3_GPU_FAILURES_PER_HOUR
    """Llama 3 report rate"""
    trace: str = ""
    """file of the job's interruption inter-arrival hours (JSON list or lines)"""
    save_s: float = 0.0
    """training held per save (s); 0: measured (checkpoint_bench), else 60"""
    save_mode: Literal["async", "sync"] = "async"
    """which measured save, when save_s is 0"""
    restart_s: float = 0.0
    """interruption -> training again (s); 0: measured resume + below"""
    node_replacement_s: float = 300.0
    """assumed: obtain and boot a replacement node (s)"""
    fixed_interval_h: float = 1.0
    """the checkpoint interval of the non-Young/Daly plans"""
    deadline_h: float = 0.0
    """if > 0: probability of missing it, per plan"""
    mc_runs: int = 20_000
    """simulated jobs per plan"""
    seed: int = 0
    """of the Monte Carlo"""
    reports_dir: str = ""
    """default: a new runs/<UTC time>/; reports/ only when named"""
    measurements_dir: str = ""
    """where measured throughput is read from; default: reports_dir"""
    out_name: str = "cost"
    """stem of the report files"""

    def validate(self) -> CostConfig:
        from shared.cli import input_dir, input_file, require_finite, writable_dir
        from shared.hardware import get_gpu
        from shared.model import PRESETS

        get_gpu(self.gpu)  # ValueError naming the known keys
        if self.preset not in PRESETS:
            raise ValueError(
                f"CostConfig.preset: unknown {self.preset!r}; expected one of {sorted(PRESETS)}"
            )
        require_finite(
            "CostConfig",
            self,
            ("total_tokens", "fixed_interval_h", "assumed_mfu", "assumed_scaling_efficiency"),
        )
        if not self.out_name or "/" in self.out_name or self.out_name.startswith("."):
            raise ValueError(
                f"CostConfig.out_name must be a plain file stem, got {self.out_name!r}"
            )
        if self.trace:
            input_file("--trace", self.trace)
        if self.measurements_dir:
            input_dir("--measurements-dir", self.measurements_dir)
        if self.reports_dir:
            writable_dir("--reports-dir", self.reports_dir)
        for name in ("n_gpus", "gpus_per_node", "mc_runs"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"CostConfig.{name} must be a positive int, got {v!r}")
        for name in ("total_tokens", "fixed_interval_h"):
            if not getattr(self, name) > 0:
                raise ValueError(f"CostConfig.{name} must be > 0, got {getattr(self, name)!r}")
        for name in (
            "spot_preemptions_per_node_hour",
            "gpu_failures_per_gpu_hour",
            "restart_s",
            "save_s",
            "node_replacement_s",
            "bf16_tokens_per_s_per_gpu",
            "bf16_speedup",
            "deadline_h",
            "seq_len",
        ):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"CostConfig.{name} must be a finite number >= 0, got {v!r}")
        if self.save_mode not in ("async", "sync"):
            raise ValueError(
                f"CostConfig.save_mode must be 'async' or 'sync', got {self.save_mode!r}"
            )
        if not 0 < self.assumed_mfu <= 1:
            raise ValueError(f"CostConfig.assumed_mfu must be in (0, 1], got {self.assumed_mfu}")
        if not 0 < self.assumed_scaling_efficiency <= 1:
            raise ValueError(
                "CostConfig.assumed_scaling_efficiency must be in (0, 1], "
                f"got {self.assumed_scaling_efficiency}"
            )
        return self

    @property
    def n_nodes(self) -> int:
        return math.ceil(self.n_gpus / self.gpus_per_node)


@dataclass
class Plan:
    name: str
    """e.g. "spot, Young/Daly" """
    precision: str
    """"fp32" | "bf16" | a measured one: "fp16", "fp8-tensorwise", "fp8-rowwise" """
    market: str
    """"on-demand" | "spot" """
    price_per_gpu_hour: float
    interval_h: float
    rate_per_h: float
    """interruptions of the whole job per hour"""
    work_h: float
    """failure-free training hours"""

    def label(self) -> str:
        return f"{self.name} {self.precision}"


def build_plans(
    cfg: CostConfig,
    bf16_tps_per_gpu: float,
    speedup: float,
    trace_rate: float | None,
    others: dict[str, float] | None = None,
):
    """Every market x precision x checkpoint-interval plan. speedup: bf16 / fp32 throughput;
    others: throughput of further precisions relative to bf16 (fp16, fp8-*), where measured."""
    from shared.hardware import get_gpu

    spec = get_gpu(cfg.gpu)
    hw_rate = cfg.n_gpus * cfg.gpu_failures_per_gpu_hour
    spot_rate = (
        trace_rate
        if trace_rate is not None
        else (cfg.n_nodes * cfg.spot_preemptions_per_node_hour + hw_rate)
    )
    save_h = cfg.save_s / 3600
    plans = []
    throughput = {"fp32": bf16_tps_per_gpu / speedup, "bf16": bf16_tps_per_gpu}
    throughput |= {p: bf16_tps_per_gpu * r for p, r in (others or {}).items()}
    for precision, tps in throughput.items():
        work_h = cfg.total_tokens / (tps * cfg.n_gpus) / 3600
        for name, market, rate, interval in (
            ("on-demand", "on-demand", hw_rate, cfg.fixed_interval_h),
            ("spot, fixed interval", "spot", spot_rate, cfg.fixed_interval_h),
            ("spot, Young/Daly", "spot", spot_rate, young_daly_interval(save_h, spot_rate)),
        ):
            price = spec.price_on_demand.value if market == "on-demand" else spec.price_spot.value
            plans.append(Plan(name, precision, market, price, min(interval, work_h), rate, work_h))
    return plans


def evaluate(cfg: CostConfig, plan: Plan, sampler: Sampler, *, analytic_exact: bool) -> dict:
    from shared.cost import run_cost

    save_h, restart_h = cfg.save_s / 3600, cfg.restart_s / 3600
    exp_h = expected_hours(plan.work_h, plan.interval_h, save_h, plan.rate_per_h, restart_h)
    sims = simulate_hours(
        plan.work_h, plan.interval_h, save_h, restart_h, sampler, runs=cfg.mc_runs, seed=cfg.seed
    )
    usd_per_h = plan.price_per_gpu_hour * cfg.n_gpus
    ideal = run_cost(
        cfg.total_tokens, cfg.total_tokens / plan.work_h / 3600, plan.price_per_gpu_hour, cfg.n_gpus
    )
    mc_mean = float(sims.mean())
    mc_se = float(sims.std(ddof=1) / math.sqrt(sims.size))
    p50, p90, p99 = (float(x) for x in np.percentile(sims, [50, 90, 99]))
    row = {
        "plan": plan.name,
        "precision": plan.precision,
        "market": plan.market,
        "usd_per_gpu_hour": plan.price_per_gpu_hour,
        "interval_h": plan.interval_h,
        "interruptions_per_h": plan.rate_per_h,
        "work_h": plan.work_h,
        "ideal_usd": ideal["usd"],
        "expected_h": exp_h,
        "expected_usd": exp_h * usd_per_h,
        "overhead_pct": 100 * (exp_h / plan.work_h - 1),
        "mc_mean_h": mc_mean,
        "mc_se_h": mc_se,
        "mc_vs_analytic_pct": 100 * (mc_mean / exp_h - 1),
        "analytic_is_exact": analytic_exact,
        "p50_h": p50,
        "p90_h": p90,
        "p99_h": p99,
        "p90_usd": p90 * usd_per_h,
        "expected_interruptions": plan.rate_per_h * exp_h,
    }
    if cfg.deadline_h > 0:
        row["p_miss_deadline"] = float((sims > cfg.deadline_h).mean())
    return row


def interval_sweep(cfg: CostConfig, plan: Plan, points: int = 40) -> dict:
    """Expected USD against the checkpoint interval for one plan (the Young/Daly chart)."""
    save_h, restart_h = cfg.save_s / 3600, cfg.restart_s / 3600
    yd = young_daly_interval(save_h, plan.rate_per_h)
    grid = np.geomspace(yd / 20, min(yd * 20, plan.work_h), points)
    usd_per_h = plan.price_per_gpu_hour * cfg.n_gpus
    usd = [
        expected_hours(plan.work_h, t, save_h, plan.rate_per_h, restart_h) * usd_per_h for t in grid
    ]
    best = optimal_interval(plan.work_h, save_h, plan.rate_per_h, restart_h)
    return {
        "interval_h": grid.tolist(),
        "expected_usd": usd,
        "young_daly_h": yd,
        "young_daly_usd": expected_hours(plan.work_h, yd, save_h, plan.rate_per_h, restart_h)
        * usd_per_h,
        "optimal_h": best,
        "optimal_usd": expected_hours(plan.work_h, best, save_h, plan.rate_per_h, restart_h)
        * usd_per_h,
    }


SAVE_COST_GRID_S = (5.0, 15.0, 30.0, 60.0, 120.0, 300.0)


def save_cost_sensitivity(cfg: CostConfig, plan: Plan) -> list[dict]:
    """What the checkpoint's blocking time (fast local disk vs slow object storage) costs one
    plan when its interval is re-chosen by Young/Daly for each save time."""
    restart_h = cfg.restart_s / 3600
    usd_per_h = plan.price_per_gpu_hour * cfg.n_gpus
    rows = []
    for save_s in SAVE_COST_GRID_S:
        save_h = save_s / 3600
        tau = min(young_daly_interval(save_h, plan.rate_per_h), plan.work_h)
        hours = expected_hours(plan.work_h, tau, save_h, plan.rate_per_h, restart_h)
        rows.append(
            {
                "save_s": save_s,
                "interval_h": tau,
                "expected_h": hours,
                "overhead_pct": 100 * (hours / plan.work_h - 1),
                "expected_usd": hours * usd_per_h,
            }
        )
    return rows


def run(cfg: CostConfig) -> dict:
    """Evaluate every plan; returns the result record's `results` (also used by the tests)."""
    from shared.hardware import get_gpu

    cfg.validate()
    spec = get_gpu(cfg.gpu)
    # measured inputs: --measurements-dir, else --reports-dir, else the published reports/
    measured = Path(cfg.measurements_dir or cfg.reports_dir or _reports_dir())
    tput, ratio = resolve_throughput(cfg, measured)
    others = precision_speedups(cfg, measured)
    save, restart = resolve_checkpoint_costs(cfg, measured)
    cfg = replace(cfg, save_s=save.value, restart_s=restart.value)
    if cfg.trace:
        gaps = load_trace(cfg.trace)
        trace_rate = 1.0 / float(gaps.mean())
        spot_sampler = trace_sampler(gaps)
    else:
        gaps, trace_rate = None, None
    plans = build_plans(
        cfg, tput.value, ratio.value, trace_rate, {p: s.value for p, s in others.items()}
    )
    rows = []
    for plan in plans:
        if plan.market == "spot" and gaps is not None:
            sampler, exact = spot_sampler, False
        else:
            sampler, exact = exponential_sampler(plan.rate_per_h), True
        rows.append(evaluate(cfg, plan, sampler, analytic_exact=exact))
    cheapest = min(rows, key=lambda r: r["expected_usd"])
    on_demand_bf16 = next(
        r for r in rows if r["market"] == "on-demand" and r["precision"] == "bf16"
    )
    yd_plan = next(p for p in plans if p.name == "spot, Young/Daly" and p.precision == "bf16")
    return {
        "gpu": spec.key,
        "gpu_name": spec.name,
        "prices": {
            "on_demand": asdict(spec.price_on_demand),
            "spot": asdict(spec.price_spot),
        },
        "n_gpus": cfg.n_gpus,
        "n_nodes": cfg.n_nodes,
        "total_tokens": cfg.total_tokens,
        "bf16_tokens_per_s_per_gpu": tput.to_dict(),
        "bf16_speedup": ratio.to_dict(),
        "precision_speedups_vs_bf16": {p: s.to_dict() for p, s in others.items()},
        "interruptions": {
            "spot_source": f"trace {cfg.trace} ({len(gaps)} gaps, mean {1 / trace_rate:.3g} h)"
            if gaps is not None
            else f"assumed: {cfg.spot_preemptions_per_node_hour:g} preemptions per node-hour",
            "gpu_failure_source": "Llama 3 report: 419 interruptions / (16,384 GPUs x 54 days)"
            if cfg.gpu_failures_per_gpu_hour == LLAMA3_GPU_FAILURES_PER_HOUR
            else "given on the command line",
        },
        "save_s": cfg.save_s,
        "restart_s": cfg.restart_s,
        "save_source": save.to_dict(),
        "restart_source": restart.to_dict(),
        "mc_tolerance_rel": MC_TOLERANCE,
        "plans": rows,
        "cheapest": cheapest,
        "savings_vs_on_demand_bf16_pct": 100
        * (1 - cheapest["expected_usd"] / on_demand_bf16["expected_usd"]),
        "interval_sweep_spot_bf16": interval_sweep(cfg, yd_plan),
        "save_cost_sensitivity_spot_bf16": save_cost_sensitivity(cfg, yd_plan),
    }


def _reports_dir() -> Path:
    from shared.results import REPORTS_DIR

    return Path(REPORTS_DIR)


def write_report(cfg: CostConfig, results: dict, reports_dir: Path) -> list[Path]:
    """The record (JSON, with the environment) and its report: charts and Markdown."""
    from shared.results import load_result, save_result

    from ..report import cost as report

    rows = results["plans"]
    baseline = next(r for r in rows if r["market"] == "on-demand" and r["precision"] == "bf16")
    path = save_result(
        PROJECT,
        cfg.out_name,
        results,
        baseline=baseline,
        config=asdict(cfg),
        reports_dir=reports_dir,
    )
    return [path, *report.render(load_result(path), reports_dir / PROJECT)]


def command(cfg: CostConfig) -> int:
    """`cost`: every plan, the record and its report, and the plans as a table."""
    from rich.console import Console
    from rich.table import Table

    from shared.results import output_root

    cfg.validate()
    console = Console()
    with console.status("model + Monte Carlo over every plan"):
        results = run(cfg)
    paths = write_report(cfg, results, output_root(cfg.reports_dir))
    table = Table(title=f"{cfg.n_gpus}x {cfg.gpu}, {cfg.total_tokens:.3g} tokens")
    for col in ("plan", "prec", "ckpt (h)", "E(h)", "E(USD)", "P90 h", "MC vs model"):
        table.add_column(col, justify="right" if col not in ("plan", "prec") else "left")
    for r in results["plans"]:
        table.add_row(
            r["plan"],
            r["precision"],
            f"{r['interval_h']:.2f}",
            f"{r['expected_h']:.2f}",
            f"{r['expected_usd']:,.0f}",
            f"{r['p90_h']:.2f}",
            f"{r['mc_vs_analytic_pct']:+.2f}%",
        )
    console.print(table)
    c = results["cheapest"]
    console.print(
        f"cheapest: {c['plan']} {c['precision']}: ${c['expected_usd']:,.0f}, "
        f"{c['expected_h']:.2f} h expected, P90 {c['p90_h']:.2f} h"
    )
    for p in paths:
        console.print(f"wrote {p}")
    return 0
