"""Distributed hyperparameter search with Ray Tune over the project's fault-tolerant trainer.

    python -m project03_capstone_infra.tune                      # local Ray, CPU, tiny preset
    python -m project03_capstone_infra.tune --address auto --gpus-per-trial 0.5 --preset 125m
    python -m project03_capstone_infra.tune --resume             # after the driver was killed

What runs:
- A `Tuner` over three hyperparameters: learning rate (log-uniform), weight decay (uniform) and
  warm-up fraction (uniform), sampled by Tune's random search with a fixed seed.
- Each trial is `project03_capstone_infra.train.train(cfg, report_fn)`: the same trainer, with
  its checkpoints (DCP, checksummed manifests) in the trial's own directory. Every optimiser step
  is reported to Tune (`step`, `loss`, throughput); every committed trainer checkpoint is handed
  to Tune as the trial's checkpoint, so Tune persists it in the experiment's storage.
- ASHA (asynchronous successive halving) stops the weaker trials at rungs of
  grace x reduction_factor^k steps. `--compare-random` then runs the same sampled configurations
  without early stopping (plain random search) and measures what ASHA saved.
- Failures: `FailureConfig(max_failures)` retries a failed trial; the retry copies the trial's
  latest Tune checkpoint into a clean run directory and the trainer resumes from it (data
  position, optimiser, RNG included). `--fail-at-step` makes every trial raise once at that step
  (in its first attempt only) to exercise the path.
- The driver itself may die: `--resume` calls `Tuner.restore`, which keeps the finished trials'
  results and re-runs only the unfinished ones, each from its last checkpoint.

Trial placement: `--cpus-per-trial` and `--gpus-per-trial` (fractional: 0.5 puts two trials on
one GPU); on a GPU the trainer uses bf16 and its pre-flight health checks. `--address` joins a
running Ray cluster (KubeRay or Slurm: see deploy/README.md); there the storage path must be on
a file system every node sees (or an object-store URI).

Report: `reports/project03_capstone_infra/tune.{json,md}`, `tune_curves.png` (every trial's loss
curve, ASHA's stops marked), `tune_random_curves.png` and `tune_compute.png` (ASHA vs random
search at the same budget).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from shared.cli import main_guard
from shared.results import atomic_write_text

PROJECT = "project03_capstone_infra"
REPO_ROOT = Path(__file__).resolve().parent.parent
METRIC, MODE = "loss", "min"
TIME_ATTR = "step"  # ASHA's clock: the trainer's optimiser step, robust to retries


@dataclass
class TuneRunConfig:
    """Ray Tune HPO (ASHA) over learning rate, weight decay and warm-up of the shared model."""

    preset: Literal["tiny", "125m", "1b"] = "tiny"  # model preset every trial trains
    max_steps: int = 32  # optimiser steps of a trial that is never stopped
    global_batch: int = 8  # sequences per optimiser step
    data_seed: int = 0  # model init and data stream: the same for every trial
    ckpt_every: int = 4  # trainer checkpoint (and Tune checkpoint) cadence, in steps
    num_samples: int = 12  # trials (sampled configurations)
    search_seed: int = 0  # seed of the random search: the same configs for ASHA and random
    lr_min: float = 1e-4  # learning rate, log-uniform from lr_min ...
    lr_max: float = 3e-2  # ... to lr_max
    weight_decay_max: float = 0.3  # weight decay, uniform from 0
    warmup_frac_max: float = 0.3  # warm-up steps as a fraction of max_steps, uniform from 0
    scheduler: Literal["asha", "fifo"] = "asha"  # fifo: no early stopping (random search)
    grace_steps: int = 4  # ASHA: steps before the first rung
    reduction_factor: int = 2  # ASHA: keep the top 1/rf at each rung
    compare_random: bool = True  # also run the same configs without early stopping
    max_failures: int = 1  # Tune retries of a failed trial (from its last checkpoint)
    # Tune checkpoints kept per trial; 0 keeps them all. Tune's experiment snapshot lags the
    # trials by up to one snapshot interval: a driver killed right after a trial's older
    # checkpoint was deleted finds the snapshot naming it and cannot restore that trial.
    keep_checkpoints: int = 0
    fail_at_step: int = 0  # > 0: every trial raises once at this step (first attempt only)
    address: str = ""  # "" starts a local Ray; "auto" or "ray://host:10001" joins a cluster
    num_cpus: int = 0  # local Ray only; 0: all cores
    cpus_per_trial: float = 1.0  # CPUs reserved per trial (and its torch threads)
    gpus_per_trial: float = 0.0  # fractional allowed: 0.5 puts two trials on one GPU
    max_concurrent: int = 0  # 0: as many as the resources allow
    object_store_mb: int = 256  # local Ray only
    storage_path: str = ".scratch/project03_capstone_infra/tune"  # shared path or s3://... URI
    name: str = "asha"  # experiment directory under storage_path
    resume: bool = False  # Tuner.restore the experiment <storage_path>/<name> (must exist)
    resume_if_exists: bool = False  # restore when it exists, else start it (restartable jobs)
    report: bool = True  # write reports/project03_capstone_infra/<out_name>.*
    out_name: str = "tune"  # stem of the report files
    reports_dir: str = ""  # default: the repo's reports/
    verbose: bool = False  # Ray Tune's own status tables and Ray's start-up log (else one bar)

    def validate(self) -> TuneRunConfig:
        from shared.cli import require_finite

        require_finite(
            "TuneRunConfig",
            self,
            (
                "lr_min",
                "lr_max",
                "weight_decay_max",
                "warmup_frac_max",
                "cpus_per_trial",
                "gpus_per_trial",
            ),
        )
        if not self.storage_path.strip():
            raise ValueError(
                "TuneRunConfig.storage_path: expected a path or URI, got an empty string"
            )
        if not self.out_name or "/" in self.out_name or self.out_name.startswith("."):
            raise ValueError(
                f"TuneRunConfig.out_name must be a plain file stem, got {self.out_name!r}"
            )
        for name in (
            "max_steps",
            "global_batch",
            "ckpt_every",
            "num_samples",
            "grace_steps",
            "object_store_mb",
        ):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"TuneRunConfig.{name} must be a positive int, got {v!r}")
        for name in (
            "max_failures",
            "fail_at_step",
            "num_cpus",
            "max_concurrent",
            "data_seed",
            "search_seed",
            "keep_checkpoints",
        ):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"TuneRunConfig.{name} must be a non-negative int, got {v!r}")
        if self.reduction_factor < 2:
            raise ValueError(
                f"TuneRunConfig.reduction_factor must be >= 2, got {self.reduction_factor}"
            )
        if not 0 < self.lr_min < self.lr_max:
            raise ValueError(
                f"need 0 < lr_min < lr_max, got lr_min={self.lr_min}, lr_max={self.lr_max}"
            )
        for name in ("weight_decay_max", "warmup_frac_max"):
            if getattr(self, name) < 0:
                raise ValueError(f"TuneRunConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.warmup_frac_max >= 1:
            raise ValueError(
                f"TuneRunConfig.warmup_frac_max must be < 1, got {self.warmup_frac_max}"
            )
        if not self.cpus_per_trial > 0:
            raise ValueError(f"TuneRunConfig.cpus_per_trial must be > 0, got {self.cpus_per_trial}")
        if self.gpus_per_trial < 0 or (self.gpus_per_trial > 1 and self.gpus_per_trial % 1):
            raise ValueError(
                "TuneRunConfig.gpus_per_trial must be >= 0, fractional only below 1 "
                f"(0.25, 0.5 share one GPU), got {self.gpus_per_trial}"
            )
        if self.gpus_per_trial > 1:
            raise ValueError(
                "TuneRunConfig.gpus_per_trial > 1 needs a multi-rank trial; "
                "this trainable trains on one device"
            )
        if self.fail_at_step > self.max_steps:
            raise ValueError(
                f"fail_at_step ({self.fail_at_step}) is beyond max_steps ({self.max_steps})"
            )
        if not self.name or "/" in self.name:
            raise ValueError(
                f"TuneRunConfig.name must be a plain directory name, got {self.name!r}"
            )
        return self

    @property
    def is_remote_storage(self) -> bool:
        return "://" in self.storage_path  # s3://, gs://, ...: Tune's pyarrow file systems

    def storage_root(self) -> str:
        """The storage path as Tune needs it: absolute for a local path, a URI as given."""
        if self.is_remote_storage:
            return self.storage_path.rstrip("/")
        return str(Path(self.storage_path).resolve())

    def experiment_uri(self, name: str | None = None) -> str:
        return f"{self.storage_root()}/{name or self.name}"

    def experiment_path(self) -> Path:
        return Path(self.storage_root()) / self.name


# --- the trial ---------------------------------------------------------------------------------


def _train_config(config: dict, run_dir: Path):
    from .config import TrainConfig

    base = config["base"]
    steps = int(base["max_steps"])
    on_gpu = float(base.get("gpus_per_trial", 0)) > 0
    return TrainConfig(
        preset=base["preset"],
        steps=steps,
        global_batch=int(base["global_batch"]),
        seed=int(base["data_seed"]),
        lr=float(config["lr"]),
        weight_decay=float(config["weight_decay"]),
        warmup_steps=int(round(float(config["warmup_frac"]) * steps)),
        device="cuda" if on_gpu else "cpu",
        run_dir=str(run_dir),
        resume="auto",
        ckpt_every=int(base["ckpt_every"]),
        ckpt_mode="sync",  # the checkpoint handed to Tune must be committed when reported
        keep_last=2,
        preflight=on_gpu,
        log_every=steps,
    ).validate()


# Tune uploads checkpoint directories without their dot-files, and DCP's index is `.metadata`:
# hidden files travel under this prefix and get their names back on restore.
HIDDEN_PREFIX = "_dot_"


def _stage_for_tune(step_dir: Path, staging_root: Path) -> Path:
    """A view of a trainer step directory that Tune can persist whole: hard links (copies where
    links are impossible) with dot-files renamed. Older staged views are removed."""
    if staging_root.exists():
        shutil.rmtree(staging_root)
    dest = staging_root / step_dir.name
    dest.mkdir(parents=True)
    for f in step_dir.iterdir():
        if not f.is_file():
            continue
        name = HIDDEN_PREFIX + f.name[1:] if f.name.startswith(".") else f.name
        try:
            os.link(f, dest / name)
        except OSError:
            shutil.copy2(f, dest / name)
    return dest


def _restore_tune_checkpoint(ckpt, ckpt_root: Path) -> int:
    """Copy a Tune checkpoint (one staged trainer step directory) into an empty trainer root;
    returns its step. The root is cleared first: the Tune checkpoint is the trial's state, not
    whatever an earlier attempt left on this node's disk."""
    from .checkpoint import read_manifest, step_dir_name

    if ckpt_root.exists():
        shutil.rmtree(ckpt_root)
    ckpt_root.mkdir(parents=True)
    with ckpt.as_directory() as src:
        step = int(read_manifest(Path(src))["step"])
        dest = ckpt_root / step_dir_name(step)
        shutil.copytree(src, dest)
    for f in dest.iterdir():
        if f.name.startswith(HIDDEN_PREFIX):
            f.rename(dest / ("." + f.name[len(HIDDEN_PREFIX) :]))
    return step


SCRATCH_ENV = "P03_TUNE_SCRATCH"


def experiment_scratch_dir(storage_key: str, experiment: str) -> Path:
    """Node-local working directory of one experiment's trials (checkpoints being written,
    events), under $P03_TUNE_SCRATCH or the temp dir. Kept out of Tune's trial directory, which
    Tune copies to the experiment storage while the trainer's files change under the copy
    (temporary save directories, retention); what must survive is handed to Tune as checkpoints.
    `storage_key` (a hash of the storage root) keeps experiments of the same name apart."""
    root = Path(os.environ.get(SCRATCH_ENV) or tempfile.gettempdir()) / "project03_tune"
    return root / f"{experiment}-{storage_key}"


def storage_key(cfg: TuneRunConfig) -> str:
    return hashlib.sha256(cfg.storage_root().encode()).hexdigest()[:10]


class InjectedTrialFailure(RuntimeError):
    """Raised once per trial by --fail-at-step, to exercise Tune's retry and restore."""


def train_trial(config: dict) -> None:
    """Tune's trainable: run the project's trainer and report every step (and checkpoint)."""
    import torch
    from ray import tune

    from .checkpoint import list_checkpoints, parse_step
    from .train import train

    base = config["base"]
    torch.set_num_threads(max(1, int(base.get("cpus_per_trial", 1))))
    ctx = tune.get_context()
    run_dir = (
        experiment_scratch_dir(base["storage_key"], ctx.get_experiment_name()) / ctx.get_trial_id()
    )
    ckpt_root = run_dir / "checkpoints"
    tune_ckpt = tune.get_checkpoint()
    restored_from = None
    if tune_ckpt is not None:
        restored_from = _restore_tune_checkpoint(tune_ckpt, ckpt_root)
    elif run_dir.exists():
        shutil.rmtree(run_dir)  # a retry with no checkpoint yet starts over
    attempt = 0 if restored_from is None else 1
    os.environ["P03_ATTEMPT"] = str(attempt)  # the trainer's fault injection keys on it
    # A trial is a world of one of its own: a rendezvous address inherited from the driver's
    # environment (a driver under torchrun, or one that ran a process group) would have
    # concurrent trials listen on the same port.
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(name, None)
    cfg = _train_config(config, run_dir)
    fail_at = int(base.get("fail_at_step", 0))
    attached = {"step": restored_from if restored_from is not None else 0}
    pending: dict = {}

    def metrics_of(summary: dict) -> dict:
        return {
            "step": summary["step"],
            "loss": summary["loss"],
            "tokens_per_s": summary["tokens_per_s"],
            "attempt": attempt,
            "restored_from_step": -1 if restored_from is None else restored_from,
        }

    def newest_checkpoint():
        found = list_checkpoints(ckpt_root)
        if not found:
            return None
        step = parse_step(found[-1].name)
        if step is None or step <= attached["step"]:
            return None
        attached["step"] = step
        return tune.Checkpoint.from_directory(
            str(_stage_for_tune(found[-1], run_dir / "tune_staging"))
        )

    def report_fn(summary: dict) -> None:
        if fail_at and summary["step"] == fail_at and restored_from is None:
            raise InjectedTrialFailure(f"injected failure at step {fail_at} (first attempt)")
        if summary["step"] >= cfg.steps:
            pending.update(metrics_of(summary))  # reported below, with the final checkpoint
            return
        tune.report(metrics_of(summary), checkpoint=newest_checkpoint())

    train(cfg, report_fn)
    if pending:
        tune.report(pending, checkpoint=newest_checkpoint())
    # else: restored from the final checkpoint (the driver died between the trial's last report
    # and marking it finished): nothing was trained, and Tune keeps the last result it has.
    shutil.rmtree(run_dir, ignore_errors=True)  # the trial's state now lives in Tune's storage


# --- the experiment ----------------------------------------------------------------------------


def search_space(cfg: TuneRunConfig) -> dict:
    from ray import tune

    base = {
        k: getattr(cfg, k)
        for k in (
            "preset",
            "max_steps",
            "global_batch",
            "data_seed",
            "ckpt_every",
            "fail_at_step",
            "cpus_per_trial",
            "gpus_per_trial",
        )
    }
    base["storage_key"] = storage_key(cfg)
    return {
        "lr": tune.loguniform(cfg.lr_min, cfg.lr_max),
        "weight_decay": tune.uniform(0.0, cfg.weight_decay_max),
        "warmup_frac": tune.uniform(0.0, cfg.warmup_frac_max),
        "base": base,
    }


def make_scheduler(cfg: TuneRunConfig, kind: str):
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    if kind == "asha":
        return ASHAScheduler(
            time_attr=TIME_ATTR,
            max_t=cfg.max_steps,
            grace_period=cfg.grace_steps,
            reduction_factor=cfg.reduction_factor,
        )
    if kind == "fifo":
        return FIFOScheduler()
    raise ValueError(f"scheduler must be 'asha' or 'fifo', got {kind!r}")


def _trainable(cfg: TuneRunConfig):
    from ray import tune

    resources = {"cpu": cfg.cpus_per_trial}
    if cfg.gpus_per_trial:
        resources["gpu"] = cfg.gpus_per_trial
    return tune.with_resources(train_trial, resources)


def make_tuner(cfg: TuneRunConfig, kind: str, name: str):
    from ray import tune
    from ray.tune.search import BasicVariantGenerator

    return tune.Tuner(
        _trainable(cfg),
        param_space=search_space(cfg),
        tune_config=tune.TuneConfig(
            metric=METRIC,
            mode=MODE,
            scheduler=make_scheduler(cfg, kind),
            search_alg=BasicVariantGenerator(random_state=cfg.search_seed),
            num_samples=cfg.num_samples,
            max_concurrent_trials=cfg.max_concurrent or None,
            reuse_actors=False,
        ),
        run_config=tune.RunConfig(
            name=name,
            storage_path=cfg.storage_root(),
            failure_config=tune.FailureConfig(max_failures=cfg.max_failures),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=cfg.keep_checkpoints or None),
            # Tune's status tables (~1,000 lines for the CPU demo) only when asked for; the
            # driver shows one progress display instead (TrialProgress).
            verbose=1 if cfg.verbose else 0,
            callbacks=[] if cfg.verbose else [trial_progress(cfg.num_samples, name)],
        ),
    )


def trial_progress(total: int, name: str):
    """A Tune callback that shows the experiment as one progress display (trials finished of
    `total`, how they ended, the best loss so far) instead of Tune's status tables."""
    from ray.tune import Callback

    from shared.progress import Progress

    class TrialProgress(Callback):
        def __init__(self) -> None:
            self.total, self.name = total, name
            self.bar = None
            self.running: set[str] = set()
            self.ended = {"completed": 0, "stopped": 0, "error": 0}
            self.best: float | None = None

        def __reduce__(self):  # Tune pickles its run config: the display is not part of it
            return trial_progress, (self.total, self.name)

        def _status(self) -> str:
            e = self.ended
            best = f"; best loss {self.best:.4f}" if self.best is not None else ""
            return (
                f"{len(self.running)} running, {e['completed']} completed, {e['stopped']} "
                f"stopped early, {e['error']} failed{best}"
            )

        def _show(self, ended: str | None = None) -> None:
            if self.bar is None:
                self.bar = Progress(
                    self.total,
                    f"tune {self.name}",
                    unit="trial",
                    every=1,
                    stream=sys.stderr,
                    enabled=True,
                    bar=None,
                )
            if ended:
                self.ended[ended] += 1
                self.bar.advance(status=self._status())
            else:
                self.bar.update(status=self._status())

        def on_trial_start(self, iteration, trials, trial, **info):
            self.running.add(trial.trial_id)
            self._show()

        def on_trial_result(self, iteration, trials, trial, result, **info):
            loss = result.get(METRIC)
            finite = isinstance(loss, (int, float)) and math.isfinite(loss)
            if finite and (self.best is None or loss < self.best):
                self.best = float(loss)
                self._show()

        def _end(self, trial, how: str) -> None:
            self.running.discard(trial.trial_id)
            if how == "completed":
                last = (trial.last_result or {}).get(TIME_ATTR) or 0
                how = "completed" if last >= int(trial.config["base"]["max_steps"]) else "stopped"
            self._show(how)

        def on_trial_complete(self, iteration, trials, trial, **info):
            self._end(trial, "completed")

        def on_trial_error(self, iteration, trials, trial, **info):
            self._end(trial, "error")

        def on_experiment_end(self, trials, **info):
            if self.bar is not None:
                self.bar.close()
                self.bar = None

    return TrialProgress()


def init_ray(cfg: TuneRunConfig) -> None:
    import ray

    if ray.is_initialized():
        return
    if cfg.address:
        ray.init(address=cfg.address)
        return
    # Local Ray: trial workers import this package from the repo checkout.
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    ray.init(
        num_cpus=cfg.num_cpus or None,
        include_dashboard=False,
        logging_level=logging.INFO if cfg.verbose else logging.WARNING,
        object_store_memory=cfg.object_store_mb * 1024 * 1024,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
        log_to_driver=False,
    )


def run_experiment(cfg: TuneRunConfig, kind: str, name: str, *, resume: bool = False):
    """Fit (or restore and finish) one experiment; returns its ResultGrid."""
    from ray import tune

    path = cfg.experiment_uri(name)
    if resume:
        if not tune.Tuner.can_restore(path):
            raise FileNotFoundError(f"no Tune experiment to restore at {path}")
        tuner = tune.Tuner.restore(
            path, trainable=_trainable(cfg), resume_errored=True, param_space=search_space(cfg)
        )
    else:
        if tune.Tuner.can_restore(path):
            raise FileExistsError(
                f"{path} already holds an experiment: pass --resume to finish it, or another --name"
            )
        tuner = make_tuner(cfg, kind, name)
    try:
        return tuner.fit()
    finally:
        if not cfg.address:  # a local Ray: every trial's scratch is on this machine
            shutil.rmtree(experiment_scratch_dir(storage_key(cfg), name), ignore_errors=True)


# --- analysis ----------------------------------------------------------------------------------


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


# --- report ------------------------------------------------------------------------------------


def write_report(cfg: TuneRunConfig, results: dict, reports_dir: Path) -> list[Path]:
    from shared.results import atomic_write_text, environment, load_result, save_result

    env = environment()
    out = reports_dir / PROJECT
    name = cfg.out_name
    paths = [
        save_result(
            PROJECT,
            name,
            results,
            config=asdict(cfg),
            reports_dir=reports_dir,
            env=env,
            baseline=results.get("comparison"),
        )
    ]
    paths += write_charts(load_result(paths[0]), out)
    paths.append(atomic_write_text(out / f"{name}.md", render_markdown(cfg, results, env)))
    return paths


def write_charts(record: dict, out: Path) -> list[Path]:
    """tune_curves.png, tune_random_curves.png and tune_compute.png from a tune record."""
    from shared.charts import bar_chart, footer, line_chart

    results, c = record["results"], record["config"]
    name = c.get("out_name") or record.get("name", "tune")
    foot = footer(record["environment"], f"{c['preset']} preset, {c['num_samples']} trials")
    paths = []

    def curves(records: list[dict]) -> dict:
        series = {}
        for r in records:
            xs = [int(s) for s in r["curve"]]
            tag = {
                "completed": "",
                "stopped": f" stopped@{r['stopped_at_step']}",
                "error": " error",
            }[r["status"]]
            series[f"lr {r['lr']:.1e} wd {r['weight_decay']:.2f}{tag}"] = (
                xs,
                list(r["curve"].values()),
            )
        return series

    paths.append(
        line_chart(
            out / f"{name}_curves.png",
            curves(results["trials"]),
            title=f"ASHA: training loss of every trial (grace {c['grace_steps']}, rf {c['reduction_factor']})",
            xlabel="optimiser step",
            ylabel="training loss (nats)",
            y_from_zero=False,
            footnote=foot,
        )
    )
    comp = results.get("comparison")
    if results.get("random_trials"):
        paths.append(
            line_chart(
                out / f"{name}_random_curves.png",
                curves(results["random_trials"]),
                title="Random search (no early stopping): the same configurations",
                xlabel="optimiser step",
                ylabel="training loss (nats)",
                y_from_zero=False,
                footnote=foot,
            )
        )
    if comp:
        labels = ["ASHA", "random search"]
        values = [comp["asha_trial_steps"], comp["random_trial_steps"]]
        for q in (50, 90):
            if comp.get(f"random_steps_for_p{q}_match"):
                labels.append(f"random: {q}% chance\nto match ASHA")
                values.append(comp[f"random_steps_for_p{q}_match"])
        paths.append(
            bar_chart(
                out / f"{name}_compute.png",
                labels,
                values,
                title="Compute to search (trial-steps; lower is better)",
                ylabel="optimiser steps over all trials",
                footnote=foot,
            )
        )
    return paths


def render_markdown(cfg: TuneRunConfig, results: dict, env: dict) -> str:
    from shared.results import environment_line, markdown_table

    best = results["best"]
    lines = [
        f"# Ray Tune HPO: ASHA over lr, weight decay, warm-up ({cfg.preset} preset)",
        "",
        f"Measured with: {environment_line(env)}, Ray {results['ray_version']}. "
        f"{cfg.num_samples} trials of up to {cfg.max_steps} steps (global batch "
        f"{cfg.global_batch}); ASHA grace {cfg.grace_steps} steps, reduction factor "
        f"{cfg.reduction_factor}; search seed {cfg.search_seed}. Wall time "
        f"{results['wall_s']:.0f} s (ASHA) and {results.get('random_wall_s') or 0:.0f} s (random).",
        "",
        f"Per trial (median): {results['median_first_report_s'] or 0:.1f} s from start to its "
        f"first report (actor start, imports, model build, first step), then "
        f"{results['median_step_s'] or 0:.3f} s per step: at this size start-up dominates, so "
        "ASHA's saving in trial-steps shows only partly in wall time.",
        "",
        f"**Best configuration**: lr {best['lr']:.3g}, weight decay {best['weight_decay']:.3g}, "
        f"warm-up fraction {best['warmup_frac']:.3g}: loss {best['final_loss']:.4f} at step "
        f"{best['last_step']}.",
        "",
    ]
    comp = results.get("comparison")
    if comp:
        lines += [
            "## ASHA against random search at the same compute",
            f"- ASHA used {comp['asha_trial_steps']} trial-steps, random search (every trial to the "
            f"end) {comp['random_trial_steps']}: **{comp['compute_saved_pct']:.0f}% less compute**.",
            f"- Best loss: ASHA {comp['asha_best_loss']:.4f}, random search {comp['random_best_loss']:.4f}.",
        ]
        if comp.get("random_trials_at_asha_budget"):
            lines.append(
                f"- With ASHA's budget, random search affords {comp['random_trials_at_asha_budget']} "
                f"full trials; their expected best loss is {comp['random_expected_best_at_asha_budget']:.4f} "
                "(mean over every subset of that size of the measured random-search trials)."
            )
        if comp.get("random_p_match_at_asha_budget") is not None:
            lines.append(
                f"- The chance that those {comp['random_trials_at_asha_budget']} trials include a "
                f"configuration as good as ASHA's best is {comp['random_p_match_at_asha_budget']:.0%}; "
                f"a 50% chance needs {comp['random_steps_for_p50_match']} trial-steps, a 90% "
                f"chance {comp['random_steps_for_p90_match']} (ASHA: {comp['asha_trial_steps']}, "
                "found with certainty among the same configurations)."
            )
        lines.append(
            "- ASHA is asynchronous: a trial is judged against the trials that reached its rung "
            "before it, so which trials it stops, and the compute it saves, varies with trial "
            "order and machine load from one run to the next."
        )
        if comp.get("same_config_max_loss_diff") is not None:
            lines.append(
                f"- The same configuration gives the same loss at the same step in both "
                f"experiments (max difference {comp['same_config_max_loss_diff']:.2e} over "
                f"{comp['configs_matched']} shared configurations): the comparison is like for like."
            )
        lines.append("")
    cols = [
        "lr",
        "weight_decay",
        "warmup_frac",
        "status",
        "stopped_at_step",
        "last_step",
        "final_loss",
        "attempts",
    ]
    lines += ["## Trials (ASHA)", "", markdown_table(results["trials"], cols), ""]
    lines.append("Charts: `tune_curves.png` (ASHA), `tune_random_curves.png`, `tune_compute.png`.")
    return "\n".join(lines) + "\n"


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


@main_guard
def main(argv: list[str] | None = None) -> int:
    from shared.cli import parse_dataclass, writable_dir

    cfg = parse_dataclass(TuneRunConfig, argv, description=__doc__.split("\n\n")[0]).validate()
    if cfg.report:  # before the trials, not after them
        writable_dir("--reports-dir", Path(cfg.reports_dir or REPO_ROOT / "reports") / PROJECT)
    if not cfg.is_remote_storage:
        writable_dir("--storage-path", cfg.storage_path)
    import ray

    init_ray(cfg)
    try:
        t0 = time.perf_counter()
        from ray import tune

        def resuming(name: str) -> bool:
            exists = tune.Tuner.can_restore(cfg.experiment_uri(name))
            return (cfg.resume or cfg.resume_if_exists) and exists

        if cfg.resume and not tune.Tuner.can_restore(cfg.experiment_uri()):
            raise FileNotFoundError(f"--resume: no Tune experiment at {cfg.experiment_uri()}")
        grid = run_experiment(cfg, cfg.scheduler, cfg.name, resume=resuming(cfg.name))
        results = summarise(cfg, grid, time.perf_counter() - t0)
        if cfg.compare_random and cfg.scheduler == "asha":
            t0 = time.perf_counter()
            rname = f"{cfg.name}-random"
            rgrid = run_experiment(cfg, "fifo", rname, resume=resuming(rname))
            results["random_wall_s"] = time.perf_counter() - t0
            results["random_trials"] = trial_records(rgrid, cfg.max_steps)
            results["comparison"] = compare(
                results["trials"], results["random_trials"], cfg.max_steps
            )
    finally:
        ray.shutdown()
    best = results["best"]
    if best:
        print(
            f"best: lr {best['lr']:.3g} wd {best['weight_decay']:.3g} warm-up "
            f"{best['warmup_frac']:.3g} -> loss {best['final_loss']:.4f} (step {best['last_step']})"
        )
    for t in results["stopped_by_asha"]:
        print(
            f"ASHA stopped lr {t['lr']:.3g} wd {t['weight_decay']:.3g} at step {t['stopped_at_step']}"
        )
    if results.get("comparison"):
        c = results["comparison"]
        print(
            f"ASHA {c['asha_trial_steps']} trial-steps vs random {c['random_trial_steps']}: "
            f"{c['compute_saved_pct']:.0f}% saved; best loss {c['asha_best_loss']:.4f} vs "
            f"{c['random_best_loss']:.4f}"
        )
    if not cfg.is_remote_storage:  # beside Tune's own state, for scripts and tests
        summary_path = cfg.experiment_path() / "summary.json"
        atomic_write_text(summary_path, json.dumps(results, indent=2, default=str))
    if cfg.report:
        reports_dir = Path(cfg.reports_dir) if cfg.reports_dir else REPO_ROOT / "reports"
        for p in write_report(cfg, results, reports_dir):
            print(f"wrote {p}")
    errored = results["errored"]
    if errored:
        print(f"{len(errored)} trial(s) ended in error: {errored[0]['error']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
