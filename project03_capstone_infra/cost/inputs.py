"""The cost model's inputs, each a `Sourced` number that says where it came from: the bf16
throughput and the bf16/fp32 speed ratio measured in the project02/project03 records of this
preset on this GPU, the checkpoint's save and restart times from the project's checkpoint
benchmark, each overridable on the command line and a labelled default where the reports hold
no measurement; and interruption traces (`load_trace`). Prices come from the shared price table
(`shared.hardware`, read by plan.py). Every input's source goes into the report.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from project03_capstone_infra import PROJECT

from .model import trace_sampler

if TYPE_CHECKING:
    from .plan import CostConfig


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
    "precision": "dtype",  # project02's training recipe (an fp8 run computes in bf16 elsewhere)
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


# The precisions the plans price: fp32 and bf16 always; the others when a record measured them.
PRECISIONS = ("fp32", "bf16", "fp16", "fp8-tensorwise", "fp8-rowwise")
_DTYPE_KEYS = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}


def _dtype_key(d) -> str | None:
    d = str(d).lower().replace("torch.", "")
    d = _DTYPE_KEYS.get(d, d)
    return d if d in PRECISIONS else None


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


def precision_speedups(cfg: CostConfig, reports_dir: Path) -> dict[str, Sourced]:
    """Throughput of fp16 and the fp8 recipes relative to bf16, each measured in one record
    (project02's `precision` harness runs every recipe on the same job, in one run) at one world
    size: the largest such world size, then the fastest bf16 row. A precision no record measured
    is left out (no assumed figure): the plans price it only once it is measured."""
    from shared.hardware import get_gpu

    rows = measured_throughput(reports_dir, get_gpu(cfg.gpu).key, cfg.preset)
    out: dict[str, Sourced] = {}
    for precision in PRECISIONS[2:]:
        pairs = [
            (p, b)
            for p in rows
            if p["dtype"] == precision
            for b in rows
            if b["dtype"] == "bf16"
            and b["file"] == p["file"]
            and b["world_size"] == p["world_size"]
        ]
        if not pairs:
            continue
        p, b = max(pairs, key=lambda pb: (pb[1]["world_size"], pb[1]["tokens_per_s_per_gpu"]))
        out[precision] = Sourced(
            p["tokens_per_s_per_gpu"] / b["tokens_per_s_per_gpu"],
            f"{p['file']} ({precision} vs bf16 in one run, world size {b['world_size']})",
            True,
        )
    return out


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
