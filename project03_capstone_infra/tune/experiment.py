"""The experiment: `TuneRunConfig`, the search space, ASHA (or FIFO), the `Tuner`, Ray's start,
and the `tune` command (the search, the comparison with random search, the report).

What runs:
- A `Tuner` over three hyperparameters: learning rate (log-uniform), weight decay (uniform) and
  warm-up fraction (uniform), sampled by Tune's random search with a fixed seed.
- Each trial is `project03_capstone_infra.train.train(cfg, report_fn)` (trial.py): the same
  trainer, with its checkpoints (DCP, checksummed manifests) in the trial's own directory. Every
  optimiser step is reported to Tune (`step`, `loss`, throughput); every committed trainer
  checkpoint is handed to Tune as the trial's checkpoint, so Tune persists it in the
  experiment's storage.
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

Report (report/tune.py, from the JSON record): `reports/project03_capstone_infra/tune.{json,md}`,
`tune_curves.png` (every trial's loss curve, ASHA's stops marked), `tune_random_curves.png` and
`tune_compute.png` (ASHA vs random search at the same budget).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from project03_capstone_infra import PROJECT
from shared.results import atomic_write_text

from .analysis import compare, summarise, trial_records
from .trial import METRIC, MODE, TIME_ATTR, experiment_scratch_dir, train_trial

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class TuneRunConfig:
    """Ray Tune HPO (ASHA) over learning rate, weight decay and warm-up of the shared model."""

    preset: Literal["tiny", "125m", "1b"] = "tiny"
    """model preset every trial trains"""
    max_steps: int = 32
    """optimiser steps of a trial that is never stopped"""
    global_batch: int = 8
    """sequences per optimiser step"""
    data_seed: int = 0
    """model init and data stream: the same for every trial"""
    ckpt_every: int = 4
    """trainer checkpoint (and Tune checkpoint) cadence, in steps"""
    num_samples: int = 12
    """trials (sampled configurations)"""
    search_seed: int = 0
    """seed of the random search: the same configs for ASHA and random"""
    lr_min: float = 1e-4
    """learning rate, log-uniform from lr_min ..."""
    lr_max: float = 3e-2
    """... to lr_max"""
    weight_decay_max: float = 0.3
    """weight decay, uniform from 0"""
    warmup_frac_max: float = 0.3
    """warm-up steps as a fraction of max_steps, uniform from 0"""
    scheduler: Literal["asha", "fifo"] = "asha"
    """fifo: no early stopping (random search)"""
    grace_steps: int = 4
    """ASHA: steps before the first rung"""
    reduction_factor: int = 2
    """ASHA: keep the top 1/rf at each rung"""
    compare_random: bool = True
    """also run the same configs without early stopping"""
    max_failures: int = 1
    """Tune retries of a failed trial (from its last checkpoint) Tune checkpoints kept per trial; 0 keeps them all. Tune's experiment snapshot lags the trials by up to one snapshot interval: a driver killed right after a trial's older checkpoint was deleted finds the snapshot naming it and cannot restore that trial."""
    keep_checkpoints: int = 0
    fail_at_step: int = 0
    """> 0: every trial raises once at this step (first attempt only)"""
    address: str = ""
    """"" starts a local Ray; "auto" or "ray://host:10001" joins a cluster"""
    num_cpus: int = 0
    """local Ray only; 0: all cores"""
    cpus_per_trial: float = 1.0
    """CPUs reserved per trial (and its torch threads)"""
    gpus_per_trial: float = 0.0
    """fractional allowed: 0.5 puts two trials on one GPU"""
    max_concurrent: int = 0
    """0: as many as the resources allow"""
    object_store_mb: int = 256
    """local Ray only"""
    storage_path: str = ".scratch/project03_capstone_infra/tune"
    """shared path or s3://... URI"""
    name: str = "asha"
    """experiment directory under storage_path"""
    resume: bool = False
    """Tuner.restore the experiment <storage_path>/<name> (must exist)"""
    resume_if_exists: bool = False
    """restore when it exists, else start it (restartable jobs)"""
    report: bool = True
    """write reports/project03_capstone_infra/<out_name>.*"""
    out_name: str = "tune"
    """stem of the report files"""
    reports_dir: str = ""
    """default: a new runs/<UTC time>/; reports/ only when named"""
    verbose: bool = False
    """Ray Tune's own status tables and Ray's start-up log (else one bar)"""

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


def storage_key(cfg: TuneRunConfig) -> str:
    return hashlib.sha256(cfg.storage_root().encode()).hexdigest()[:10]


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


def write_report(cfg: TuneRunConfig, results: dict, reports_dir: Path) -> list[Path]:
    """The record (JSON, with the environment) and its report: charts and Markdown."""
    from shared.results import load_result, save_result

    from ..report import tune as report

    path = save_result(
        PROJECT,
        cfg.out_name,
        results,
        config=asdict(cfg),
        reports_dir=reports_dir,
        baseline=results.get("comparison"),
    )
    return [path, *report.render(load_result(path), reports_dir / PROJECT)]


def command(cfg: TuneRunConfig) -> int:
    """`tune`: the search (and random search), its summary, record and report; exit status 1
    when a trial ended in error."""
    from shared.cli import writable_dir
    from shared.results import output_root

    cfg.validate()
    reports_dir = output_root(cfg.reports_dir)
    if cfg.report:  # before the trials, not after them
        writable_dir("--reports-dir", reports_dir / PROJECT)
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
        for p in write_report(cfg, results, reports_dir):
            print(f"wrote {p}")
    errored = results["errored"]
    if errored:
        print(f"{len(errored)} trial(s) ended in error: {errored[0]['error']}", file=sys.stderr)
        return 1
    return 0
