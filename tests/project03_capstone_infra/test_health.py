"""Health: the pre-flight decisions on synthetic GPU readings (a sick GPU stops the launch with
the reason), the no-GPU path, the disk check, the Prometheus server; NVML itself on the GPU tier."""

from __future__ import annotations

import urllib.request

import pytest
import torch

from project03_capstone_infra import health
from project03_capstone_infra.__main__ import main as package_main
from project03_capstone_infra.config import EXIT_PREFLIGHT
from project03_capstone_infra.health import (
    GPUHealth,
    GPUReport,
    HealthThresholds,
    MetricsServer,
    PreflightError,
    TrainingMetrics,
    check_gpus,
)


def _gpu(**kw) -> GPUHealth:
    base = dict(
        index=0,
        name="NVIDIA H200",
        temperature_c=40.0,
        memory_used_bytes=2**30,
        memory_total_bytes=141 * 2**30,
        throttle_reasons=["gpu_idle"],
        ecc_enabled=True,
        ecc_volatile_uncorrected=0,
        remapped_rows_pending=False,
        remapped_rows_failure=False,
    )
    return GPUHealth(**{**base, **kw})


def test_healthy_gpu_passes():
    assert check_gpus(GPUReport(True, gpus=[_gpu(), _gpu(index=1)]), require_gpus=2) == []


@pytest.mark.parametrize(
    "reading, reason",
    [
        (dict(temperature_c=92.0), "92 C is above the 85 C limit"),
        (dict(ecc_volatile_uncorrected=3), "3 uncorrected ECC errors"),
        (dict(remapped_rows_failure=True), "row remapping failed"),
        (dict(remapped_rows_pending=True), "row remap is pending"),
        (dict(retired_pages_pending=True), "retired pages pending"),
        (dict(throttle_reasons=["hw_thermal_slowdown"]), "hw_thermal_slowdown"),
        (dict(memory_used_bytes=100 * 2**30), "memory already in use"),
    ],
)
def test_sick_gpu_is_reported_with_its_reason(reading, reason):
    problems = check_gpus(GPUReport(True, gpus=[_gpu(), _gpu(index=1, **reading)]))
    assert (
        len(problems) == 1
        and problems[0].startswith("GPU 1 (NVIDIA H200)")
        and reason in problems[0]
    )
    # a rank that checks only its own GPU (0) is not stopped by GPU 1
    assert (
        check_gpus(GPUReport(True, gpus=[_gpu(), _gpu(index=1, **reading)]), gpu_indices=[0]) == []
    )


def test_missing_gpus_and_thresholds():
    problems = check_gpus(GPUReport(False, reason="NVML unavailable"), require_gpus=1)
    assert problems == ["need 1 GPU(s), NVML reports 0 (NVML unavailable)"]
    hot = GPUReport(True, gpus=[_gpu(temperature_c=80.0)])
    assert check_gpus(hot) == [] and check_gpus(hot, HealthThresholds(max_temperature_c=75))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the path of a machine without a GPU")
def test_without_gpu_the_gpu_part_reports_absent_and_the_rest_works(tmp_path):
    report = health.gpu_snapshot()
    assert not report.present and report.reason and report.gpus == []
    result = health.preflight(ckpt_dir=str(tmp_path), raise_on_failure=False)
    assert result.ok and any(n.startswith("GPU health: absent") for n in result.notes)
    with pytest.raises(PreflightError, match="need 1 GPU"):
        health.preflight(require_gpus=1)
    assert package_main(["health", "--require-gpus", "1"]) == EXIT_PREFLIGHT


def test_disk_check_stops_the_launch(tmp_path):
    with pytest.raises(PreflightError, match="free for checkpoints, need"):
        health.preflight(ckpt_dir=str(tmp_path / "not" / "yet"), min_free_disk_bytes=2**62)


def test_metrics_server_serves_over_http():
    metrics = TrainingMetrics(gpu=True)
    metrics.loss.set(2.5)
    metrics.restarts.set(3)
    metrics.save_bytes.set(1234)
    server = MetricsServer(metrics, port=0, addr="127.0.0.1")
    try:
        with urllib.request.urlopen(server.url, timeout=10) as r:
            text = r.read().decode()
    finally:
        server.close()
    assert "p03_loss 2.5" in text and "p03_restarts 3.0" in text
    assert "p03_checkpoint_bytes 1234.0" in text and "p03_gpu_present" in text
    with pytest.raises(ValueError, match="port"):
        MetricsServer(metrics, port=-5)


@pytest.mark.gpu
def test_nvml_snapshot_on_a_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    report = health.gpu_snapshot()
    assert report.present and report.driver and len(report.gpus) >= 1
    g = report.gpus[0]
    assert g.memory_total_bytes > 2**30 and 0 < g.temperature_c < 120 and g.power_w > 0
    assert g.sm_clock_mhz > 0 and g.throttle_reasons is not None
    text = TrainingMetrics(gpu=True).scrape_text()
    assert "p03_gpu_present 1.0" in text and "p03_gpu_temperature_celsius{" in text
