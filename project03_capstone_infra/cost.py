"""What a training job costs on on-demand vs spot GPUs, in fp32 vs bf16, with the checkpoint
interval chosen by the Young/Daly formula; an analytic model checked by Monte Carlo.

    python -m project03_capstone_infra.cost --gpu h200-sxm --n-gpus 8 --total-tokens 2e10

The model (Daly 2006, exponential failures). The job needs W hours of useful work (tokens /
throughput). It saves a checkpoint after every tau hours of work, each save holding training for
C hours. Interruptions (spot preemptions of any of the job's nodes, plus hardware failures of any
of its GPUs) arrive as a Poisson process of rate lambda = 1/M per hour. After an interruption
the job needs R hours (new node, start-up, checkpoint load) before it trains again, and it
redoes the work since the last checkpoint. A segment of s = tau + C hours then takes, in
expectation,

    E(s) = M * exp(R / M) * (exp(s / M) - 1)

hours of wall time (an interruption during the restart also counts), and the job takes the sum
over its segments. The checkpoint interval that minimises it is close to Young's
tau = sqrt(2 * C * M); a numerical search of the formula's optimum is shown beside it.
Cost = wall hours x GPUs x price per GPU-hour: the whole allocation is billed during restarts and
lost work (the nodes that survived sit idle but paid for).

The Monte Carlo simulates the same process run by run (exponential inter-arrival times, or
inter-arrival times resampled from a trace) and gives the spread the mean hides: P50/P90/P99
completion time and cost. For exponential arrivals its mean must agree with the analytic E
within the stated tolerance (the tests check it); for a trace it is the better estimate.

Inputs come from the shared price table (`shared.hardware`), the project's measured throughput
and bf16/fp32 speed ratio where the reports hold one (else labelled defaults), and the
checkpoint save and resume times from the project's checkpoint benchmark where the reports hold
it (else labelled defaults); every input's source goes into the report.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np

from shared.cli import main_guard

PROJECT = "project03_capstone_infra"

# Hardware interruptions per GPU-hour: Llama 3 pre-training saw 419 unexpected interruptions in
# 54 days on 16,384 H100s ("The Llama 3 Herd of Models", Meta, 2024, section 3.3.4).
LLAMA3_GPU_FAILURES_PER_HOUR = 419 / (16_384 * 54 * 24)

# Relative tolerance of the Monte Carlo mean against the analytic expectation (exponential
# arrivals). The tests also require agreement within 4 standard errors of the mean.
MC_TOLERANCE = 0.02

Sampler = Callable[[np.random.Generator, int], np.ndarray]


# --- the analytic model ------------------------------------------------------------------------


def _check_nonneg(**values: float) -> None:
    for name, v in values.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            raise TypeError(f"{name} must be a finite number, got {v!r}")
        if v < 0:
            raise ValueError(f"{name} must be >= 0, got {v}")


def segment_lengths(work_h: float, interval_h: float, save_h: float) -> np.ndarray:
    """Wall hours of each failure-free segment: floor(W / tau) of tau + C, then the rest + C.
    The last segment's save is the final checkpoint of the run."""
    _check_nonneg(work_h=work_h, interval_h=interval_h, save_h=save_h)
    if work_h <= 0:
        raise ValueError(f"work_h must be > 0, got {work_h}")
    if interval_h <= 0:
        raise ValueError(f"interval_h must be > 0, got {interval_h}")
    n_full = int(work_h // interval_h)
    if n_full > 10_000_000:
        raise ValueError(
            f"{n_full:,} checkpoints for {work_h:g} h of work every {interval_h:g} h: "
            "choose a longer checkpoint interval"
        )
    rest = work_h - n_full * interval_h
    segs = [interval_h + save_h] * n_full
    if rest > 1e-12 * work_h or not segs:
        segs.append(rest + save_h)
    return np.asarray(segs, dtype=float)


def expected_segment_hours(seg_h: np.ndarray | float, rate_per_h: float, restart_h: float):
    """E[wall hours] to finish a segment of seg_h failure-free hours: exact for Poisson
    interruptions of rate_per_h with a restart of restart_h after each (Daly 2006)."""
    _check_nonneg(rate_per_h=rate_per_h, restart_h=restart_h)
    seg_h = np.asarray(seg_h, dtype=float)
    if rate_per_h == 0:
        return seg_h
    # M e^{R/M} (e^{s/M} - 1), with expm1 for accuracy when s << M
    return np.exp(rate_per_h * restart_h) * np.expm1(rate_per_h * seg_h) / rate_per_h


def expected_hours(
    work_h: float, interval_h: float, save_h: float, rate_per_h: float, restart_h: float
) -> float:
    """Expected wall hours of the whole job (sum over its segments)."""
    segs = segment_lengths(work_h, interval_h, save_h)
    return float(expected_segment_hours(segs, rate_per_h, restart_h).sum())


def young_daly_interval(save_h: float, rate_per_h: float) -> float:
    """Young's first-order optimum tau = sqrt(2 C M), M = 1 / rate (hours of work between saves)."""
    _check_nonneg(save_h=save_h, rate_per_h=rate_per_h)
    if rate_per_h == 0:
        return math.inf
    if save_h == 0:
        raise ValueError("save_h must be > 0 for a Young/Daly interval (free saves: save always)")
    return math.sqrt(2.0 * save_h / rate_per_h)


def optimal_interval(
    work_h: float, save_h: float, rate_per_h: float, restart_h: float, *, points: int = 400
) -> float:
    """The interval minimising `expected_hours`: a log-spaced search, then a finer one around
    the best point. The expectation is not smooth in the interval (the last segment is partial,
    so the number of saves jumps), so Young/Daly's own interval is a candidate too."""
    if rate_per_h == 0:
        return work_h
    guess = min(young_daly_interval(save_h, rate_per_h), work_h)

    def hours(t: float) -> float:
        return expected_hours(work_h, t, save_h, rate_per_h, restart_h)

    best, best_h = guess, hours(guess)
    lo, hi = guess / 30, min(guess * 30, work_h)
    for _ in range(2):
        grid = np.geomspace(lo, max(hi, lo * 1.0001), points)
        costs = [hours(t) for t in grid]
        i = int(np.argmin(costs))
        if costs[i] < best_h:
            best, best_h = float(grid[i]), costs[i]
        lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, points - 1)]
    return best


# --- the Monte Carlo ---------------------------------------------------------------------------


def exponential_sampler(rate_per_h: float) -> Sampler:
    _check_nonneg(rate_per_h=rate_per_h)

    def draw(rng: np.random.Generator, n: int) -> np.ndarray:
        if rate_per_h == 0:
            return np.full(n, np.inf)
        return rng.exponential(1.0 / rate_per_h, n)

    return draw


def trace_sampler(inter_arrival_h: np.ndarray) -> Sampler:
    """Inter-arrival times resampled (with replacement) from an observed trace."""
    gaps = np.asarray(inter_arrival_h, dtype=float)
    if gaps.ndim != 1 or gaps.size < 2:
        raise ValueError("a preemption trace needs at least 2 inter-arrival times")
    if not np.all(np.isfinite(gaps)) or np.any(gaps <= 0):
        raise ValueError("preemption trace inter-arrival times must be finite and > 0 hours")

    def draw(rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.choice(gaps, size=n, replace=True)

    return draw


def simulate_hours(
    work_h: float,
    interval_h: float,
    save_h: float,
    restart_h: float,
    sampler: Sampler,
    *,
    runs: int,
    seed: int = 0,
) -> np.ndarray:
    """Wall hours of `runs` simulated jobs. Each node lives for a drawn time; a segment that
    ends before the node dies is kept; otherwise the time until the interruption is lost, a
    replacement is started (R hours, itself interruptible) and the segment is redone."""
    if not isinstance(runs, int) or runs < 1:
        raise ValueError(f"runs must be a positive int, got {runs!r}")
    _check_nonneg(restart_h=restart_h)
    segs = segment_lengths(work_h, interval_h, save_h)
    rng = np.random.default_rng(seed)
    wall = np.zeros(runs)
    life = sampler(rng, runs)  # hours the current allocation has left before an interruption
    for s in segs:
        pending = np.arange(runs)
        while pending.size:
            done = life[pending] >= s
            ok = pending[done]
            wall[ok] += s
            life[ok] -= s
            failed = pending[~done]
            wall[failed] += life[failed]
            # restart until one replacement survives its own start-up
            need = failed
            while need.size:
                fresh = sampler(rng, need.size)
                up = fresh >= restart_h
                wall[need[up]] += restart_h
                life[need[up]] = fresh[up] - restart_h
                wall[need[~up]] += fresh[~up]
                need = need[~up]
            pending = failed
    return wall


# --- inputs: throughput and speed ratio ------------------------------------------------------


@dataclass(frozen=True)
class Sourced:
    """A number with where it came from: a report file, or 'assumed: <why>'."""

    value: float
    source: str
    measured: bool

    def to_dict(self) -> dict:
        return asdict(self)


# Keys that say what a throughput row measured, as the project02/project03 records name them
# (in increasing priority when one dict holds several: the compute dtype wins).
_CONTEXT_KEYS = {
    "preset": "preset",
    "seq_len": "seq_len",
    "n_gpus": "world_size",
    "world_size": "world_size",
    "param_dtype": "dtype",
    "dtype": "dtype",
    "compute_dtype": "dtype",
    "variant": "variant",
}


def _context(obj: dict, ctx: dict) -> dict:
    here = dict(ctx)
    for key, norm in _CONTEXT_KEYS.items():
        v = obj.get(key)
        if isinstance(v, (str, int, float)) and not isinstance(v, bool):
            here[norm] = v
    return here


def _config_context(config) -> dict:
    """Context keys anywhere in a record's config (nested dataclass dumps)."""
    ctx: dict = {}
    if isinstance(config, dict):
        ctx = _context(config, ctx)
        for v in config.values():
            if isinstance(v, dict):
                ctx.update(_config_context(v))
    return ctx


def _throughput_rows(obj, ctx: dict, out: list[dict]) -> None:
    """Every dict holding a numeric tokens_per_s, with preset/dtype/world size inherited from
    the record's config and the enclosing dicts (result records nest rows in lists)."""
    if isinstance(obj, dict):
        here = _context(obj, ctx)
        tps = obj.get("tokens_per_s")
        numeric = isinstance(tps, (int, float)) and not isinstance(tps, bool) and tps > 0
        # projections (e.g. a cost table's "measured": false rows) are not measurements
        if numeric and obj.get("status", "ok") == "ok" and obj.get("measured", True) is not False:
            out.append({**here, "tokens_per_s": float(tps)})
        for v in obj.values():
            if isinstance(v, (dict, list)):
                _throughput_rows(v, here, out)
    elif isinstance(obj, list):
        for v in obj:
            _throughput_rows(v, ctx, out)


def _dtype_key(d) -> str | None:
    d = str(d).lower().replace("torch.", "")
    return {"bfloat16": "bf16", "bf16": "bf16", "float32": "fp32", "fp32": "fp32"}.get(d)


def measured_throughput(reports_dir: Path, gpu_key: str, preset: str) -> list[dict]:
    """Throughput rows of `preset` measured on `gpu_key` in the project02/project03 reports:
    each {file, dtype, world_size, tokens_per_s_per_gpu}."""
    from shared.hardware import match_gpu_name

    rows: list[dict] = []
    for project in ("project02_fsdp_scaling", PROJECT):
        folder = Path(reports_dir) / project
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.json")):
            try:
                record = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            if not isinstance(record, dict) or "environment" not in record:
                continue
            gpu_name = (record.get("environment") or {}).get("gpu")
            spec = match_gpu_name(gpu_name) if gpu_name else None
            if spec is None or spec.key != gpu_key:
                continue
            found: list[dict] = []
            _throughput_rows(record.get("results"), _config_context(record.get("config")), found)
            for r in found:
                world = r.get("world_size")
                dtype = _dtype_key(r.get("dtype"))
                if r.get("preset") != preset or dtype is None or not world:
                    continue
                rows.append(
                    {
                        "file": f"reports/{project}/{path.name}",
                        "dtype": dtype,
                        "world_size": int(world),
                        "tokens_per_s_per_gpu": r["tokens_per_s"] / int(world),
                        "variant": r.get("variant"),
                    }
                )
    return rows


def resolve_throughput(cfg: CostConfig, reports_dir: Path) -> tuple[Sourced, Sourced]:
    """(bf16 tokens/s per GPU, bf16/fp32 speed ratio), measured when the reports hold them."""
    from shared.flops import transformer_train_flops_per_token
    from shared.hardware import get_gpu
    from shared.model import ModelArgs

    spec = get_gpu(cfg.gpu)
    rows = measured_throughput(reports_dir, spec.key, cfg.preset)
    bf16 = [r for r in rows if r["dtype"] == "bf16"]
    if cfg.bf16_tokens_per_s_per_gpu > 0:
        tput = Sourced(cfg.bf16_tokens_per_s_per_gpu, "given on the command line", True)
    elif bf16:
        best = max(bf16, key=lambda r: (r["world_size"], r["tokens_per_s_per_gpu"]))
        value, note = best["tokens_per_s_per_gpu"], ""
        if best["world_size"] < cfg.n_gpus:
            value *= cfg.assumed_scaling_efficiency
            note = (
                f"; x {cfg.assumed_scaling_efficiency:.0%} assumed scaling efficiency from "
                f"{best['world_size']} to {cfg.n_gpus} GPUs"
            )
        tput = Sourced(
            value,
            f"{best['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU measured in "
            f"{best['file']} (world size {best['world_size']}){note}",
            True,
        )
    else:
        args = ModelArgs.from_preset(cfg.preset)
        seq = cfg.seq_len or args.max_seq_len
        flops_tok = transformer_train_flops_per_token(
            args.num_params(), args.n_layers, args.dim, seq
        )
        value = cfg.assumed_mfu * spec.peak_flops("bf16") / flops_tok
        tput = Sourced(
            value,
            f"assumed: {cfg.assumed_mfu:.0%} MFU of the {spec.key} bf16 datasheet peak, "
            f"{flops_tok / 1e9:.2f} GFLOP/token ({cfg.preset}, seq {seq}); no measurement "
            "of this preset on this GPU in the reports",
            False,
        )
    if cfg.bf16_speedup > 0:
        ratio = Sourced(cfg.bf16_speedup, "given on the command line", True)
    else:
        pairs = bf16_fp32_pairs(rows)
        if pairs:
            b, f = pairs[0]
            what = f"variant {b['variant']} vs {f['variant']}, " if b.get("variant") else ""
            ratio = Sourced(
                b["tokens_per_s_per_gpu"] / f["tokens_per_s_per_gpu"],
                f"{b['file']} vs {f['file']} ({what}world size {b['world_size']}; fp32 = "
                "float32 parameters and matmuls, TF32 off as PyTorch defaults)",
                True,
            )
        else:
            ratio = Sourced(
                DEFAULT_BF16_SPEEDUP,
                "assumed default, not measured: no fp32 and bf16 runs of this preset on this "
                "GPU in the reports yet (pass --bf16-speedup with a measured figure)",
                False,
            )
    return tput, ratio


DEFAULT_BF16_SPEEDUP = 2.0


def _without_fp32(variant) -> str | None:
    if not variant:
        return None
    return "+".join(p for p in str(variant).split("+") if p != "fp32")


def bf16_fp32_pairs(rows: list[dict]) -> list[tuple[dict, dict]]:
    """(bf16 row, fp32 row) pairs measured at the same world size, best first. Rows named by a
    sweep variant pair only with the same variant but for its +fp32 (so that nothing but the
    precision differs); the largest world size, then the fastest bf16 row, comes first."""
    pairs = []
    for b in rows:
        if b["dtype"] != "bf16":
            continue
        for f in rows:
            if f["dtype"] != "fp32" or f["world_size"] != b["world_size"]:
                continue
            vb, vf = _without_fp32(b.get("variant")), _without_fp32(f.get("variant"))
            if (vb or vf) and vb != vf:
                continue
            pairs.append((b, f))
    pairs.sort(key=lambda p: (p[0]["world_size"], p[0]["tokens_per_s_per_gpu"]), reverse=True)
    return pairs


DEFAULT_SAVE_S = 60.0
DEFAULT_RESTART_S = 600.0


def resolve_checkpoint_costs(cfg: CostConfig, reports_dir: Path) -> tuple[Sourced, Sourced]:
    """(seconds a save holds training, seconds from an interruption to training again), from
    the project's checkpoint benchmark of this preset on this GPU when the reports hold one."""
    from shared.hardware import get_gpu, match_gpu_name

    spec = get_gpu(cfg.gpu)
    bench = None
    for path in sorted((Path(reports_dir) / PROJECT).glob("checkpoint_bench*.json")):
        try:
            record = json.loads(path.read_text())
            gpu = match_gpu_name(record["environment"]["gpu"] or "")
            res = record["results"]
            if gpu is None or gpu.key != spec.key or record["config"].get("preset") != cfg.preset:
                continue
            derived = res["derived"]
            warm = (derived.get("async_warm") or {}).get("held_s")
            held = {
                "async": warm if warm is not None else derived["async_cold"]["held_s"],
                "async_kind": "steady-state async save"
                if warm is not None
                else "async save with a freshly pinned staging buffer (the trainer's default)",
                "sync": res["sync"]["blocking_s"],
            }
            bench = (f"reports/{PROJECT}/{path.name}", held, res["resume"]["to_first_new_step_s"])
        except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError):
            continue
    if cfg.save_s > 0:
        save = Sourced(cfg.save_s, "given on the command line", True)
    elif bench:
        what = bench[1]["async_kind"] if cfg.save_mode == "async" else "sync save"
        save = Sourced(
            float(bench[1][cfg.save_mode]),
            f"measured, {what}, {bench[0]}; on one GPU: with {cfg.n_gpus} ranks each "
            "writes a smaller shard",
            True,
        )
    else:
        save = Sourced(
            DEFAULT_SAVE_S,
            "assumed: no checkpoint benchmark of this preset on this GPU in the reports",
            False,
        )
    if cfg.restart_s > 0:
        restart = Sourced(cfg.restart_s, "given on the command line", True)
    elif bench:
        restart = Sourced(
            float(bench[2]) + cfg.node_replacement_s,
            f"{bench[2]:.1f} s measured from relaunch to the first new step "
            f"({bench[0]}) + {cfg.node_replacement_s:g} s assumed to obtain and "
            "boot a replacement node",
            False,
        )
    else:
        restart = Sourced(
            DEFAULT_RESTART_S, "assumed: replacement node, start-up and checkpoint load", False
        )
    return save, restart


# --- the plans ---------------------------------------------------------------------------------


@dataclass
class CostConfig:
    """Expected cost and wall time of one training job under on-demand and spot pricing."""

    gpu: str = "h200-sxm"  # a key of shared.hardware.GPUS
    n_gpus: int = 8  # GPUs of the job (billed together, interrupted together)
    gpus_per_node: int = 8  # a spot preemption takes a whole node
    preset: str = "1b"  # model preset, for the throughput estimate
    seq_len: int = 0  # 0: the preset's max_seq_len
    total_tokens: float = 2e10  # tokens to train (1b preset: ~18 tokens per parameter)
    bf16_tokens_per_s_per_gpu: float = 0.0  # 0: measured from the reports, else from assumed_mfu
    assumed_mfu: float = 0.40  # used only when no throughput is measured or given
    assumed_scaling_efficiency: float = 0.95  # applied when measured on fewer GPUs than n_gpus
    bf16_speedup: float = 0.0  # bf16 / fp32 throughput; 0: measured from the reports, else 2.0
    spot_preemptions_per_node_hour: float = 0.1  # assumed: one preemption per node per 10 h
    gpu_failures_per_gpu_hour: float = LLAMA3_GPU_FAILURES_PER_HOUR  # Llama 3 report rate
    trace: str = ""  # file of the job's interruption inter-arrival hours (JSON list or lines)
    save_s: float = 0.0  # training held per save (s); 0: measured (checkpoint_bench), else 60
    save_mode: Literal["async", "sync"] = "async"  # which measured save, when save_s is 0
    restart_s: float = 0.0  # interruption -> training again (s); 0: measured resume + below
    node_replacement_s: float = 300.0  # assumed: obtain and boot a replacement node (s)
    fixed_interval_h: float = 1.0  # the checkpoint interval of the non-Young/Daly plans
    deadline_h: float = 0.0  # if > 0: probability of missing it, per plan
    mc_runs: int = 20_000  # simulated jobs per plan
    seed: int = 0  # of the Monte Carlo
    reports_dir: str = ""  # default: the repo's reports/
    measurements_dir: str = ""  # where measured throughput is read from; default: reports_dir
    out_name: str = "cost"  # stem of the report files

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


def load_trace(path: str | Path) -> np.ndarray:
    """Inter-arrival hours from a JSON list or a text file with one number per line."""
    text = Path(path).read_text()
    try:
        values = json.loads(text)
    except json.JSONDecodeError:
        values = [float(x) for x in text.split() if x.strip() and not x.startswith("#")]
    if not isinstance(values, list):
        raise ValueError(f"{path}: expected a JSON list of inter-arrival hours")
    gaps = np.asarray(values, dtype=float)
    trace_sampler(gaps)  # validates
    return gaps


@dataclass
class Plan:
    name: str  # e.g. "spot, Young/Daly"
    precision: str  # "fp32" | "bf16"
    market: str  # "on-demand" | "spot"
    price_per_gpu_hour: float
    interval_h: float
    rate_per_h: float  # interruptions of the whole job per hour
    work_h: float  # failure-free training hours

    def label(self) -> str:
        return f"{self.name} {self.precision}"


def build_plans(cfg: CostConfig, bf16_tps_per_gpu: float, speedup: float, trace_rate: float | None):
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
    for precision, tps in (("fp32", bf16_tps_per_gpu / speedup), ("bf16", bf16_tps_per_gpu)):
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
    reports_dir = Path(cfg.reports_dir) if cfg.reports_dir else _reports_dir()
    measured = Path(cfg.measurements_dir) if cfg.measurements_dir else reports_dir
    tput, ratio = resolve_throughput(cfg, measured)
    save, restart = resolve_checkpoint_costs(cfg, measured)
    cfg = replace(cfg, save_s=save.value, restart_s=restart.value)
    if cfg.trace:
        gaps = load_trace(cfg.trace)
        trace_rate = 1.0 / float(gaps.mean())
        spot_sampler = trace_sampler(gaps)
    else:
        gaps, trace_rate = None, None
    plans = build_plans(cfg, tput.value, ratio.value, trace_rate)
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


# --- report ------------------------------------------------------------------------------------


def _fmt_h(h: float) -> str:
    return f"{h:.2f} h" if h < 100 else f"{h:,.0f} h"


def write_report(cfg: CostConfig, results: dict, reports_dir: Path) -> list[Path]:
    from shared.results import atomic_write_text, environment, load_result, save_result

    env = environment()
    out = reports_dir / PROJECT
    name = cfg.out_name
    rows = results["plans"]
    baseline = next(r for r in rows if r["market"] == "on-demand" and r["precision"] == "bf16")
    paths = [
        save_result(
            PROJECT,
            name,
            results,
            baseline=baseline,
            config=asdict(cfg),
            reports_dir=reports_dir,
            env=env,
        )
    ]
    paths += write_charts(load_result(paths[0]), out)
    paths.append(atomic_write_text(out / f"{name}.md", render_markdown(cfg, results, env)))
    return paths


def _sources(results: dict) -> list[str]:
    """The result records the plan's inputs were read from (measured throughput, bf16/fp32
    ratio, checkpoint save and restart times), in order, each once."""
    import re

    found = []
    for key in ("bf16_tokens_per_s_per_gpu", "bf16_speedup", "save_source", "restart_source"):
        found += re.findall(r"reports/[\w./-]+\.json", (results.get(key) or {}).get("source", ""))
    return list(dict.fromkeys(found))


def chart_footer(record: dict, context: str | None = None) -> str:
    """What the cost figures are about: a projection for the planned GPUs from the records it
    read, never the machine that ran the model."""
    from shared.charts import projection_footer

    res = record["results"]
    if context is None:
        mc = (record.get("config") or {}).get("mc_runs")
        context = "model + Monte Carlo" + (f" ({mc:,} runs)" if mc else "")
    return projection_footer(
        f"{res['n_gpus']}x {res['gpu']}, {res['total_tokens']:.3g} tokens",
        _sources(res) or ["datasheet peaks and assumed MFU"],
        context=context,
        date=(record.get("environment") or {}).get("date"),
    )


def write_charts(record: dict, out_dir: Path) -> list[Path]:
    """<name>.png (cost per plan) and <name>_interval.png (Young/Daly) from a cost record."""
    from shared.charts import grouped_bar_chart, line_chart

    results = record["results"]
    name = (record.get("config") or {}).get("out_name") or record.get("name", "cost")
    rows = results["plans"]
    baseline = next(r for r in rows if r["market"] == "on-demand" and r["precision"] == "bf16")
    groups = list(dict.fromkeys(r["plan"] for r in rows))
    series = {
        f"{p} {what}": [
            next(r[key] for r in rows if r["plan"] == g and r["precision"] == p) for g in groups
        ]
        for what, key in (("expected", "expected_usd"), ("P90", "p90_usd"))
        for p in ("fp32", "bf16")
    }
    foot = chart_footer(record)
    paths = [
        grouped_bar_chart(
            out_dir / f"{name}.png",
            groups,
            series,
            title=f"Training job cost: on-demand vs spot, fp32 vs bf16 ({results['gpu']})",
            ylabel="USD per job",
            baseline=baseline["expected_usd"],
            baseline_label="on-demand bf16 (expected)",
            footnote=foot,
        )
    ]
    sweep = results["interval_sweep_spot_bf16"]
    paths.append(
        line_chart(
            out_dir / f"{name}_interval.png",
            {
                "expected cost (model)": (sweep["interval_h"], sweep["expected_usd"]),
                "Young/Daly sqrt(2CM)": ([sweep["young_daly_h"]], [sweep["young_daly_usd"]]),
                "numerical optimum": ([sweep["optimal_h"]], [sweep["optimal_usd"]]),
            },
            title="Spot bf16: expected cost vs checkpoint interval",
            xlabel="checkpoint interval (hours of work, log)",
            ylabel="expected USD per job",
            logx=True,
            y_from_zero=False,  # the curve's minimum is the point: not from 0
            footnote=chart_footer(
                record,
                f"analytic model; save {results['save_s']:.3g} s, "
                f"restart {results['restart_s']:.3g} s",
            ),
        )
    )
    return paths


def render_markdown(cfg: CostConfig, results: dict, env: dict) -> str:
    from shared.results import environment_line, markdown_table

    rows = results["plans"]
    c = results["cheapest"]
    tput, ratio = results["bf16_tokens_per_s_per_gpu"], results["bf16_speedup"]
    sweep = results["interval_sweep_spot_bf16"]
    cols = [
        "plan",
        "precision",
        "usd_per_gpu_hour",
        "interval_h",
        "work_h",
        "expected_h",
        "overhead_pct",
        "expected_usd",
        "p50_h",
        "p90_h",
        "p99_h",
        "p90_usd",
        "mc_vs_analytic_pct",
    ]
    heads = [
        "plan",
        "precision",
        "USD/GPU-h",
        "ckpt every (h)",
        "work (h)",
        "E[wall] (h)",
        "overhead %",
        "E[cost] USD",
        "P50 (h)",
        "P90 (h)",
        "P99 (h)",
        "P90 cost USD",
        "MC vs model %",
    ]
    if cfg.deadline_h > 0:
        cols.append("p_miss_deadline")
        heads.append(f"P(> {cfg.deadline_h:g} h)")
    risk = (
        f"P90 completion {_fmt_h(c['p90_h'])} against an expectation of "
        f"{_fmt_h(c['expected_h'])} (P99 {_fmt_h(c['p99_h'])}); P90 cost "
        f"${c['p90_usd']:,.0f}"
    )
    lines = [
        f"# Cost of a training job: {results['n_gpus']}x {results['gpu']}, "
        f"{results['total_tokens']:.3g} tokens of the `{cfg.preset}` preset",
        "",
        f"Measured/produced with: {environment_line(env)}. Regenerate with "
        "`python -m project03_capstone_infra.cost`.",
        "",
        f"**Cheapest plan: {c['plan']}, {c['precision']}**: expected ${c['expected_usd']:,.0f} "
        f"and {_fmt_h(c['expected_h'])}, {results['savings_vs_on_demand_bf16_pct']:.0f}% below "
        f"on-demand bf16 (${next(r for r in rows if r['market'] == 'on-demand' and r['precision'] == 'bf16')['expected_usd']:,.0f}). "
        f"Risk: {risk}.",
        "",
        markdown_table(rows, cols, headers=heads),
        "",
        "`E[...]` is the analytic model; P50/P90/P99 come from the Monte Carlo "
        f"({cfg.mc_runs:,} simulated jobs); `MC vs model` is the Monte Carlo mean against the "
        f"model (agreement required within {100 * MC_TOLERANCE:g}% for exponential arrivals).",
        "",
        "## Checkpoint interval (spot, bf16)",
        f"Young/Daly sqrt(2CM) = {sweep['young_daly_h'] * 60:.1f} min of work per save "
        f"(expected ${sweep['young_daly_usd']:,.2f}); the best interval a numerical search of "
        f"the model finds is {sweep['optimal_h'] * 60:.1f} min (${sweep['optimal_usd']:,.2f}). "
        f"Every {sweep['interval_h'][0] * 60:.1f} min or every {sweep['interval_h'][-1] * 60:.0f} "
        f"min instead: ${sweep['expected_usd'][0]:,.2f} or ${sweep['expected_usd'][-1]:,.2f}. "
        "Chart: `cost_interval.png`.",
        "",
        "## Checkpoint save time (spot, bf16, Young/Daly interval for each)",
        "",
        markdown_table(
            results["save_cost_sensitivity_spot_bf16"],
            ["save_s", "interval_h", "expected_h", "overhead_pct", "expected_usd"],
            headers=[
                "save blocks (s)",
                "ckpt every (h)",
                "E[wall] (h)",
                "overhead %",
                "E[cost] USD",
            ],
        ),
        "",
        "## Inputs and where they come from",
        f"- Prices: on-demand ${results['prices']['on_demand']['value']}/GPU-h "
        f"({results['prices']['on_demand']['source']}, {results['prices']['on_demand']['date']}); "
        f"spot ${results['prices']['spot']['value']}/GPU-h ({results['prices']['spot']['source']}).",
        f"- bf16 throughput: {tput['value']:,.0f} tokens/s per GPU: {tput['source']}.",
        f"- bf16 / fp32 speed ratio: {ratio['value']:.2f}: {ratio['source']}.",
        f"- Spot interruptions: {results['interruptions']['spot_source']}, per node, "
        f"{results['n_nodes']} node(s); GPU failures: {cfg.gpu_failures_per_gpu_hour:.3g} per "
        f"GPU-hour ({results['interruptions']['gpu_failure_source']}).",
        f"- Checkpoint save holds training {results['save_s']:.3g} s: "
        f"{results['save_source']['source']}.",
        f"- An interruption costs {results['restart_s']:.3g} s before training runs again: "
        f"{results['restart_source']['source']}.",
        "- Both are measured by `python -m project03_capstone_infra.bench_checkpoint` (GPU); "
        "--save-s / --restart-s override them.",
        "- Billing: the whole allocation is paid for all wall time, lost work and restarts "
        "included.",
    ]
    return "\n".join(lines) + "\n"


@main_guard
def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.table import Table

    from shared.cli import parse_dataclass

    cfg = parse_dataclass(CostConfig, argv, description=__doc__.split("\n\n")[0])
    cfg.validate()
    console = Console()
    with console.status("model + Monte Carlo over every plan"):
        results = run(cfg)
    reports_dir = Path(cfg.reports_dir) if cfg.reports_dir else _reports_dir()
    paths = write_report(cfg, results, reports_dir)
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


if __name__ == "__main__":
    raise SystemExit(main())
