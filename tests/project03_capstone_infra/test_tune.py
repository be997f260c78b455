"""Ray Tune HPO over the trainer: ASHA stops trials, a failed trial resumes from its Tune
checkpoint at the exact step, the comparison arithmetic, and clear errors on bad settings.

The Ray tests start a real local Ray (2 CPUs, no dashboard) and train the tiny preset."""

from __future__ import annotations

import hashlib
import itertools
import json
import statistics
from pathlib import Path

import pytest

from project03_capstone_infra.__main__ import main as package_main
from project03_capstone_infra.tune import trial
from project03_capstone_infra.tune.analysis import compare, expected_best_of_k
from project03_capstone_infra.tune.experiment import REPO_ROOT, TuneRunConfig

ray = pytest.importorskip("ray", reason="Ray Tune is not installed (pip install 'ray[tune]')")

SMALL = ["--preset", "tiny", "--global-batch", "8", "--num-cpus", "2", "--object-store-mb", "128"]


def _rows(trial_dir: Path) -> list[dict]:
    return [
        json.loads(line) for line in (trial_dir / "result.json").read_text().splitlines() if line
    ]


@pytest.mark.slow
def test_asha_stops_trials_and_the_report_compares_it_with_random_search(tmp_path):
    reports = tmp_path / "reports"
    argv = SMALL + [
        "--num-samples",
        "4",
        "--max-steps",
        "8",
        "--grace-steps",
        "2",
        "--reduction-factor",
        "2",
        "--ckpt-every",
        "4",
        "--storage-path",
        str(tmp_path / "tune"),
        "--reports-dir",
        str(reports),
    ]
    assert package_main(["tune", *argv]) == 0
    rec = json.loads((reports / "project03_capstone_infra" / "tune.json").read_text())
    res = rec["results"]
    trials = res["trials"]
    assert len(trials) == 4 and not res["errored"]
    stopped = [t for t in trials if t["status"] == "stopped"]
    completed = [t for t in trials if t["status"] == "completed"]
    assert stopped, "ASHA stopped no trial"
    assert completed, "no trial reached max_steps"
    # ASHA's rungs are at steps 2 and 4; a trial may report a step past its rung before the
    # stop reaches it
    assert all(2 <= t["stopped_at_step"] < 8 for t in stopped)
    assert all(len(t["curve"]) == t["last_step"] for t in trials)  # every step reported once
    best = res["best"]
    assert best["status"] == "completed"
    assert best["final_loss"] == min(t["final_loss"] for t in completed)
    # the random-search run trained the same four configurations to the end
    comp = res["comparison"]
    assert len(res["random_trials"]) == 4
    assert all(t["status"] == "completed" for t in res["random_trials"])
    assert comp["configs_matched"] == 4
    assert comp["random_trial_steps"] == 4 * 8
    assert comp["asha_trial_steps"] < comp["random_trial_steps"]
    assert comp["compute_saved_pct"] > 0
    # CPU training is deterministic: same config, same step, same loss in both experiments
    assert comp["same_config_max_loss_diff"] == 0.0
    assert comp["random_best_loss"] <= comp["asha_best_loss"]
    for name in ("tune.md", "tune_curves.png", "tune_random_curves.png", "tune_compute.png"):
        assert (reports / "project03_capstone_infra" / name).stat().st_size > 0


@pytest.mark.slow
def test_a_trial_that_fails_once_resumes_from_its_tune_checkpoint(tmp_path):
    storage = tmp_path / "tune"
    argv = SMALL + [
        "--num-samples",
        "1",
        "--max-steps",
        "8",
        "--ckpt-every",
        "2",
        "--fail-at-step",
        "5",
        "--max-failures",
        "1",
        "--storage-path",
        str(storage),
        "--name",
        "retry",
        "--no-compare-random",
        "--no-report",
    ]
    assert package_main(["tune", *argv]) == 0
    (trial_dir,) = [p for p in (storage / "retry").iterdir() if p.is_dir()]
    rows = _rows(trial_dir)
    first = [r for r in rows if r["attempt"] == 0]
    second = [r for r in rows if r["attempt"] == 1]
    # attempt 0 reported steps 1..4 and died at step 5; its newest Tune checkpoint was step 2
    # (a trainer checkpoint is handed to Tune at the report after it commits). Once, on a loaded
    # 2-core machine, the result file in storage held none of attempt 0's rows although Tune had
    # printed them (Ray's file as synced around the restore): they are checked where present,
    # and what attempt 1 restored and ran is the test.
    assert [r["step"] for r in first] == [1, 2, 3, 4][: len(first)]
    assert {r["restored_from_step"] for r in second} == {2}
    assert [r["step"] for r in second] == [3, 4, 5, 6, 7, 8]
    # the replayed steps give bit-identical losses: model, optimizer, data position and RNG
    # all came back from the checkpoint
    replay = {r["step"]: r["loss"] for r in second}
    assert all(replay[r["step"]] == r["loss"] for r in first if r["step"] in replay)
    summary = json.loads((storage / "retry" / "summary.json").read_text())
    (t,) = summary["trials"]
    assert t["status"] == "completed" and t["attempts"] == 2


def test_expected_best_of_k_matches_brute_force():
    losses = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6]
    for k in range(1, len(losses) + 1):
        brute = statistics.fmean(min(c) for c in itertools.combinations(losses, k))
        assert expected_best_of_k(losses, k) == pytest.approx(brute)
    with pytest.raises(ValueError, match="k must be"):
        expected_best_of_k(losses, 0)


def _rec(lr, losses, max_steps=8):
    last = len(losses)
    return {
        "lr": lr,
        "weight_decay": 0.1,
        "status": "completed" if last == max_steps else "stopped",
        "final_loss": losses[-1],
        "curve": {str(i + 1): v for i, v in enumerate(losses)},
    }


def test_compare_counts_compute_and_the_random_search_budget():
    fifo = [
        _rec(1e-3, [5, 4, 3, 2, 1.9, 1.8, 1.7, 1.6]),
        _rec(1e-2, [5] * 8),
        _rec(1e-4, [5, 4.9, 4.8, 4.7, 4.6, 4.5, 4.4, 4.3]),
        _rec(3e-3, [5, 4, 3, 2.5, 2.4, 2.3, 2.2, 2.1]),
    ]
    asha = [fifo[0], _rec(1e-2, [5, 5]), _rec(1e-4, [5, 4.9]), _rec(3e-3, [5, 4, 3, 2.5])]
    c = compare(asha, fifo, 8)
    assert c["asha_trial_steps"] == 8 + 2 + 2 + 4
    assert c["random_trial_steps"] == 32
    assert c["compute_saved_pct"] == pytest.approx(50.0)
    assert c["asha_best_loss"] == 1.6 and c["random_best_loss"] == 1.6
    assert c["random_trials_at_asha_budget"] == 2
    assert c["random_expected_best_at_asha_budget"] == pytest.approx(
        expected_best_of_k([1.6, 5, 4.3, 2.1], 2)
    )
    # one configuration in four reaches ASHA's best: k random trials find it with chance k / 4
    assert c["random_p_match_at_asha_budget"] == pytest.approx(0.5)
    assert c["random_trials_for_p50_match"] == 2 and c["random_steps_for_p50_match"] == 16
    assert c["random_trials_for_p90_match"] == 4 and c["random_steps_for_p90_match"] == 32
    assert c["same_config_max_loss_diff"] == 0.0 and c["configs_matched"] == 4


def test_tune_checkpoint_staging_keeps_dcp_metadata(tmp_path):
    """Tune drops dot-files when it persists a checkpoint; DCP's index is `.metadata`."""
    from project03_capstone_infra.checkpoint.layout import MANIFEST

    step_dir = tmp_path / "ckpts" / "step_00000004"
    step_dir.mkdir(parents=True)
    (step_dir / ".metadata").write_bytes(b"index")
    (step_dir / "__0_0.distcp").write_bytes(b"shard")
    files = {
        p.name: {"sha256": hashlib.sha256(p.read_bytes()).hexdigest(), "bytes": p.stat().st_size}
        for p in step_dir.iterdir()
    }
    manifest = {"format_version": 1, "step": 4, "files": files, "world_size": 1, "config_hash": "x"}
    (step_dir / MANIFEST).write_text(json.dumps(manifest))
    staged = trial._stage_for_tune(step_dir, tmp_path / "staging")
    assert not any(p.name.startswith(".") for p in staged.iterdir())

    class FakeCheckpoint:  # the one method of ray.tune.Checkpoint the restore uses
        def __init__(self, path):
            self.path = path

        def as_directory(self):
            import contextlib

            return contextlib.nullcontext(str(self.path))

    root = tmp_path / "restored"
    (root / "step_00000009").mkdir(parents=True)  # left by an earlier attempt: must go
    assert trial._restore_tune_checkpoint(FakeCheckpoint(staged), root) == 4
    assert sorted(p.name for p in root.iterdir()) == ["step_00000004"]
    assert (root / "step_00000004" / ".metadata").read_bytes() == b"index"


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"lr_min": -1e-3}, "lr_min"),
        ({"lr_min": 1e-2, "lr_max": 1e-3}, "lr_min"),
        ({"num_samples": 0}, "num_samples"),
        ({"gpus_per_trial": -0.5}, "gpus_per_trial"),
        ({"gpus_per_trial": 1.5}, "gpus_per_trial"),
        ({"cpus_per_trial": 0.0}, "cpus_per_trial"),
        ({"reduction_factor": 1}, "reduction_factor"),
        ({"warmup_frac_max": 1.0}, "warmup_frac_max"),
        ({"fail_at_step": 40, "max_steps": 8}, "fail_at_step"),
        ({"name": "a/b"}, "name"),
    ],
)
def test_bad_settings_give_clear_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        TuneRunConfig(**kw).validate()


def test_fractional_gpus_are_accepted():
    assert TuneRunConfig(gpus_per_trial=0.25).validate().gpus_per_trial == 0.25


def test_deploy_files_parse():
    """The KubeRay manifests are valid YAML of the expected kinds; the Slurm script parses."""
    import shutil
    import subprocess

    yaml = pytest.importorskip("yaml")
    deploy = REPO_ROOT / "project03_capstone_infra" / "deploy"
    kinds = {}
    for path in sorted((deploy / "kuberay").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        kinds[path.name] = doc["kind"]
    assert kinds == {
        "raycluster.yaml": "RayCluster",
        "rayjob.yaml": "RayJob",
        "tune-storage.yaml": "PersistentVolumeClaim",
    }
    job = yaml.safe_load((deploy / "kuberay" / "rayjob.yaml").read_text())
    assert "project03_capstone_infra.tune" in job["spec"]["entrypoint"]
    assert "--resume-if-exists" in job["spec"]["entrypoint"]
    bash = shutil.which("bash")
    if bash:
        subprocess.run([bash, "-n", str(deploy / "slurm" / "ray_tune.sbatch")], check=True)
