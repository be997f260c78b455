"""The trainer called as a function (the way a Ray Tune trial calls it), in this process: the
non-finite-loss policies, the Prometheus endpoint scraped over HTTP mid-run, config errors."""

from __future__ import annotations

import json
import math
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from project03_capstone_infra.config import TrainConfig
from project03_capstone_infra.faults import FAULTS_ENV, read_events
from project03_capstone_infra.train import NonFiniteLossError, train

from .conftest import RUN


def _cfg(tmp_path, **kw) -> TrainConfig:
    return TrainConfig(run_dir=str(tmp_path), **{**RUN, **kw})


def _events(tmp_path, kind):
    return [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == kind]


def test_persistent_nan_is_rolled_back_a_bounded_number_of_times_then_skipped(
    tmp_path, monkeypatch
):
    # A batch that is NaN every time it is seen: 2 rollbacks, then its step is skipped.
    monkeypatch.setenv(FAULTS_ENV, json.dumps([{"kind": "nan", "step": 5, "times": 100}]))
    out = train(_cfg(tmp_path, max_nan_retries=2, fault_injection=True))
    assert out["status"] == "completed" and out["step"] == RUN["steps"]
    assert out["rollbacks"] == 2 and out["skipped_steps"] == 1
    assert [e["from_step"] for e in _events(tmp_path, "rollback")] == [3, 3]
    assert [e["step"] for e in _events(tmp_path, "skipped")] == [5]
    assert 5 not in out["losses"] and all(math.isfinite(v) for v in out["losses"].values())


def test_skip_policy_gives_up_after_consecutive_failures(tmp_path, monkeypatch):
    faults = [{"kind": "nan", "step": s} for s in (4, 5, 6)]
    monkeypatch.setenv(FAULTS_ENV, json.dumps(faults))
    with pytest.raises(NonFiniteLossError, match="3 consecutive non-finite steps"):
        train(_cfg(tmp_path, nan_policy="skip", max_nan_retries=2, fault_injection=True))
    assert [e["step"] for e in _events(tmp_path, "skipped")] == [4, 5]


def test_abort_policy_raises_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv(FAULTS_ENV, json.dumps([{"kind": "nan", "step": 2}]))
    with pytest.raises(NonFiniteLossError, match="nan_policy=abort"):
        train(_cfg(tmp_path, nan_policy="abort", fault_injection=True))


def test_metrics_endpoint_is_scraped_over_http_during_the_run(tmp_path, monkeypatch):
    monkeypatch.delenv(FAULTS_ENV, raising=False)
    scraped: dict[int, str] = {}
    reports: list[dict] = []

    def report_fn(summary: dict) -> None:  # the hook a Tune trial uses
        reports.append(summary)
        if summary["step"] == 5:
            with urllib.request.urlopen(summary["metrics_url"], timeout=10) as r:
                scraped[5] = r.read().decode()

    cfg = _cfg(tmp_path, metrics_port=0, metrics_addr="127.0.0.1", ckpt_mode="sync", ckpt_every=2)
    out = train(cfg, report_fn)
    assert [r["step"] for r in reports] == list(range(1, RUN["steps"] + 1))
    assert out["status"] == "completed" and out["loss"] == reports[-1]["loss"]
    values = {}
    for fam in text_string_to_metric_families(scraped[5]):
        for sample in fam.samples:
            values.setdefault(sample.name, sample.value)
    assert values["p03_step"] == 5
    assert values["p03_loss"] == pytest.approx(reports[4]["loss"])
    assert values["p03_tokens_per_second"] > 0
    assert values["p03_step_seconds_count"] == 5
    assert values["p03_checkpoints_total"] == 2  # steps 2 and 4, committed synchronously
    assert values["p03_checkpoint_bytes"] > 0 and values["p03_checkpoint_save_seconds"] > 0
    assert values["p03_restarts"] == 0 and values["p03_rollbacks_total"] == 0
    assert values["p03_gpu_present"] in (0, 1)  # 0 on a machine without NVML


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("steps", 0, "steps must be a positive int"),
        ("ckpt_every", -1, "ckpt_every must be a positive int"),
        ("lr", 0.0, "lr must be > 0"),
        ("nan_policy", "ignore", "nan_policy must be one of"),
        ("metrics_port", 70000, "metrics_port"),
        ("min_lr_ratio", 2.0, "min_lr_ratio"),
    ],
)
def test_bad_config_is_a_clear_error(field, value, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**{field: value}).validate()


def test_resume_never_refuses_to_overwrite_a_run(tmp_path, monkeypatch):
    monkeypatch.delenv(FAULTS_ENV, raising=False)
    train(_cfg(tmp_path, steps=3, ckpt_every=3))
    with pytest.raises(ValueError, match="already holds checkpoints"):
        train(_cfg(tmp_path, steps=3, ckpt_every=3, resume="never"))
    again = train(_cfg(tmp_path, steps=6, ckpt_every=3))  # resume auto, a longer run
    assert again["resume"]["from_step"] == 3 and again["step"] == 6
