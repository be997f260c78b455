"""shared.gpu_state on the CPU: the 'why not' record without NVML or a GPU, and every field read
from a fake pynvml module (units converted, clock-event bits named, unsupported queries None)."""

from __future__ import annotations

import sys
import types

import pytest

from shared import gpu_state as gs
from shared.results import environment, load_result, save_result


class _NVMLError(Exception):
    pass


def fake_nvml(*, count=2, fail_init=False, mask=0x4 | 0x40, unsupported=()) -> types.ModuleType:
    """A pynvml stand-in: GPU i reports an SM clock of 1,500 + i MHz, 700 W limit, etc."""
    m = types.ModuleType("pynvml")
    m.NVML_CLOCK_SM, m.NVML_CLOCK_MEM, m.NVML_TEMPERATURE_GPU = 1, 2, 0
    m.calls = []

    def call(name, value):
        def fn(*args):
            m.calls.append(name)
            if name in unsupported:
                raise _NVMLError("Not Supported")
            return value(*args) if callable(value) else value

        return fn

    def init():
        m.calls.append("init")
        if fail_init:
            raise _NVMLError("NVML Shared Library Not Found")

    m.nvmlInit, m.nvmlShutdown = init, call("shutdown", None)
    m.nvmlDeviceGetCount = call("count", count)
    m.nvmlDeviceGetHandleByIndex = call("by_index", lambda i: ("h", i))
    m.nvmlDeviceGetHandleByUUID = call("by_uuid", lambda u: ("h", u))
    m.nvmlDeviceGetName = call("name", b"NVIDIA H200")
    clocks = {1: 1500, 2: 3201}
    m.nvmlDeviceGetClockInfo = call(
        "clock", lambda h, kind: clocks[kind] + (h[1] if kind == 1 else 0)
    )
    m.nvmlDeviceGetMaxClockInfo = call("max_clock", lambda h, kind: 1980)
    m.nvmlDeviceGetTemperature = call("temperature", 61)
    m.nvmlDeviceGetPowerUsage = call("power", 652_250)  # milliwatts
    m.nvmlDeviceGetEnforcedPowerLimit = call("limit", 700_000)
    m.nvmlDeviceGetPerformanceState = call("pstate", 0)
    m.nvmlDeviceGetCurrentClocksEventReasons = call("reasons", mask)
    return m


def test_every_field_from_a_fake_nvml(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml = fake_nvml()
    s = gs.gpu_state(nvml=nvml)
    assert s["available"] is True and s["device"] == 0 and s["name"] == "NVIDIA H200"
    assert (s["sm_clock_mhz"], s["sm_clock_max_mhz"], s["mem_clock_mhz"]) == (1500, 1980, 3201)
    assert s["temperature_c"] == 61 and s["pstate"] == "P0"
    assert s["power_w"] == pytest.approx(652.25) and s["power_limit_w"] == pytest.approx(700.0)
    assert s["clock_event_mask"] == 0x44
    assert s["clock_events"] == ["sw_power_cap", "hw_thermal_slowdown"]
    assert gs.slowdowns(s) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert nvml.calls[0] == "init" and nvml.calls[-1] == "shutdown"
    line = gs.state_line(s)
    assert line == (
        "SM 1,500/1,980 MHz, 61 C, 652/700 W, P0, clock events: sw_power_cap, hw_thermal_slowdown"
    )


def test_the_visible_device_is_the_one_read(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    assert gs.gpu_state(nvml=fake_nvml())["sm_clock_mhz"] == 1501  # GPU 1's clock
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-abc,GPU-def")
    s = gs.gpu_state(nvml=fake_nvml())
    assert s["available"] and s["device"] == "GPU-abc"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    s = gs.gpu_state(nvml=fake_nvml())
    assert s["available"] is False and "CUDA_VISIBLE_DEVICES is empty" in s["reason"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    s = gs.gpu_state(5, nvml=fake_nvml(count=2))
    assert s["available"] is False and "no GPU at NVML index 5 (2 present)" in s["reason"]


def test_unsupported_queries_are_none_not_a_failure(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    s = gs.gpu_state(nvml=fake_nvml(unsupported={"power", "reasons", "pstate"}))
    assert s["available"] and s["sm_clock_mhz"] == 1500
    assert s["power_w"] is None and s["clock_events"] is None and s["pstate"] is None
    assert gs.state_line(s) == "SM 1,500/1,980 MHz, 61 C, n/a/700 W, P?, clock events: n/a"


def test_no_driver_says_why(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    s = gs.gpu_state(nvml=fake_nvml(fail_init=True))
    assert s == {
        "available": False,
        "time": s["time"],
        "reason": "NVML could not start: _NVMLError: NVML Shared Library Not Found",
    }
    assert gs.state_line(s).startswith("GPU state: not read (NVML could not start")
    assert gs.state_line(None) == "GPU state: not recorded"


def test_on_this_machine_without_a_gpu_the_record_says_why():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present here: the 'why not' record is tested with fakes above")
    s = gs.gpu_state()
    assert s["available"] is False and s["reason"]


def test_clock_event_names_cover_unknown_bits():
    assert gs.clock_event_names(0) == []
    assert gs.clock_event_names(0x1 | 0x200) == ["gpu_idle", "bit 0x200"]


def test_records_carry_the_state_at_start_and_end(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(mask=0))
    start = gs.gpu_state()
    env = environment(gpu_state_start=start)
    assert env["gpu_state"]["start"] == start and env["gpu_state"]["end"]["available"]
    assert env["gpu_state"]["end"]["clock_events"] == []
    assert environment()["gpu_state"]["start"] is None
    path = save_result(
        "p", "r", {"x": 1}, reports_dir=tmp_path, env={"gpu": "G"}, gpu_state_start=start
    )
    rec = load_result(path)
    assert rec["environment"]["gpu"] == "G"
    assert rec["environment"]["gpu_state"]["start"]["sm_clock_mhz"] == 1500
    assert rec["environment"]["gpu_state"]["end"]["power_w"] == pytest.approx(652.25)
    # an environment given without a start reading is written as it was given
    path = save_result("p", "r", {"x": 1}, reports_dir=tmp_path, env={"gpu": "G"})
    assert load_result(path)["environment"] == {"gpu": "G"}
