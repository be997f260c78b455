"""One Ray Tune trial: the project's trainer (`train(cfg, report_fn)`) as Tune's trainable.

- `train_trial(config)` builds the trial's `TrainConfig` from the sampled hyperparameters and
  the experiment's fixed settings (`config["base"]`), trains in a node-local run directory
  (`experiment_scratch_dir`), and reports every optimiser step to Tune (`step`, `loss`,
  throughput, attempt); every committed trainer checkpoint is handed to Tune as the trial's
  checkpoint, so Tune persists it in the experiment's storage.
- A retried (or restored) trial gets its latest Tune checkpoint back into a clean checkpoint
  root (`_restore_tune_checkpoint`) and the trainer resumes from it: data position, optimiser
  and RNG included.
- Tune uploads checkpoint directories without their dot-files, and DCP's index is `.metadata`:
  hidden files travel under `HIDDEN_PREFIX` (`_stage_for_tune`) and get their names back on
  restore.
- `--fail-at-step` makes every trial raise `InjectedTrialFailure` once at that step (in its
  first attempt only) to exercise Tune's retry path.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

METRIC, MODE = "loss", "min"  # what a trial reports, and which way is better
TIME_ATTR = "step"  # ASHA's clock: the trainer's optimiser step, robust to retries


def _train_config(config: dict, run_dir: Path):
    from ..config import TrainConfig

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


HIDDEN_PREFIX = "_dot_"  # a dot-file's name inside a Tune checkpoint (Tune skips dot-files)


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
    from ..checkpoint.layout import read_manifest, step_dir_name

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


class InjectedTrialFailure(RuntimeError):
    """Raised once per trial by --fail-at-step, to exercise Tune's retry and restore."""


def train_trial(config: dict) -> None:
    """Tune's trainable: run the project's trainer and report every step (and checkpoint)."""
    import torch
    from ray import tune

    from ..checkpoint.layout import list_checkpoints, parse_step
    from ..train import train

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
