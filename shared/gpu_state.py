"""The state a GPU ran in while a figure was measured, read from NVML: SM clock against its
maximum, memory clock, temperature, power draw against the enforced limit, performance state
(P0 is full speed) and the reasons NVML gives for holding the clocks down (power cap, thermal
slowdown, ...).

A slow run and a slow kernel look the same in a timing; a record saying that the SM clock sat at
1,400 of 1,980 MHz with the software power cap engaged tells them apart. Benchmarks read
`gpu_state()` when they start and `shared.results.save_result(gpu_state_start=...)` stores it
with a second reading at the end, in the record's environment.

Without pynvml (`nvidia-ml-py`), without a driver or without a visible GPU the reading is
`{"available": False, "reason": "..."}`: a record says why it holds no clocks, never zeros.
A query one GPU does not support leaves that field None.

Which GPU: the first one CUDA_VISIBLE_DEVICES names (an index or a GPU-/MIG- UUID), else NVML
index 0. NVML numbers GPUs in PCI bus order; CUDA does too only with CUDA_DEVICE_ORDER=PCI_BUS_ID,
so on a host with several GPUs give UUIDs in CUDA_VISIBLE_DEVICES, set that order, or pass
`index`.
"""

from __future__ import annotations

import datetime as _dt
import os
from types import ModuleType

# NVML's clock-event (formerly "throttle") reason bits, nvml.h `nvmlClocksEventReason*`.
CLOCK_EVENT_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# Reasons that mean the GPU ran slower than it could for the work given (idle is not one).
SLOWDOWN_REASONS = frozenset(
    {
        "sw_power_cap",
        "hw_slowdown",
        "sw_thermal_slowdown",
        "hw_thermal_slowdown",
        "hw_power_brake_slowdown",
    }
)


def clock_event_names(mask: int) -> list[str]:
    """The names of the bits set in an NVML clock-event mask; unknown bits as 'bit 0x...'."""
    names = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    rest = mask & ~sum(CLOCK_EVENT_REASONS)
    bit = 1
    while rest:
        if rest & bit:
            names.append(f"bit {bit:#x}")
            rest &= ~bit
        bit <<= 1
    return names


def _not_available(reason: str) -> dict:
    return {"available": False, "reason": reason, "time": _now()}


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _try(fn, *args):
    try:
        return fn(*args)
    except Exception:  # NVMLError_NotSupported and kin: this GPU does not report it
        return None


def _visible_device() -> tuple[str, int | str] | str:
    """('index', i) or ('uuid', id) of the first GPU CUDA_VISIBLE_DEVICES shows this process
    (index 0 when unset), or a string saying why there is none."""
    text = os.environ.get("CUDA_VISIBLE_DEVICES")
    if text is None:
        return ("index", 0)
    first = text.split(",")[0].strip()
    if not first:
        return "no GPU visible to this process (CUDA_VISIBLE_DEVICES is empty)"
    if first.lstrip("-").isdigit():
        i = int(first)
        return ("index", i) if i >= 0 else f"no GPU visible (CUDA_VISIBLE_DEVICES={text!r})"
    return ("uuid", first)


def gpu_state(index: int | None = None, *, nvml: ModuleType | None = None) -> dict:
    """One NVML reading of the GPU with NVML index `index` (default: the first GPU this process
    sees through CUDA_VISIBLE_DEVICES). `nvml` replaces the pynvml module (tests)."""
    if nvml is None:
        import pynvml as nvml  # nvidia-ml-py, a dependency: it imports without a driver or GPU
    if index is None:
        device = _visible_device()
        if isinstance(device, str):
            return _not_available(device)
    else:
        device = ("index", index)
    try:
        nvml.nvmlInit()
    except Exception as e:  # no library, no driver
        return _not_available(f"NVML could not start: {type(e).__name__}: {_text(e)}")
    try:
        try:
            if device[0] == "index":
                count = nvml.nvmlDeviceGetCount()
                if device[1] >= count:
                    return _not_available(f"no GPU at NVML index {device[1]} ({count} present)")
                handle = nvml.nvmlDeviceGetHandleByIndex(device[1])
            else:
                handle = nvml.nvmlDeviceGetHandleByUUID(device[1])
        except Exception as e:
            return _not_available(f"NVML found no GPU {device[1]}: {type(e).__name__}: {e}")
        return _read(nvml, handle, device)
    finally:
        _try(nvml.nvmlShutdown)


def _read(nvml, h, device) -> dict:
    sm, mem = getattr(nvml, "NVML_CLOCK_SM", 1), getattr(nvml, "NVML_CLOCK_MEM", 2)
    power_mw = _try(nvml.nvmlDeviceGetPowerUsage, h)
    limit_mw = _try(nvml.nvmlDeviceGetEnforcedPowerLimit, h)
    reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
    )
    mask = _try(reasons, h) if reasons else None
    pstate = _try(nvml.nvmlDeviceGetPerformanceState, h)
    return {
        "available": True,
        "time": _now(),
        "device": device[1],
        "name": _try(lambda: _text(nvml.nvmlDeviceGetName(h))),
        "sm_clock_mhz": _try(nvml.nvmlDeviceGetClockInfo, h, sm),
        "sm_clock_max_mhz": _try(nvml.nvmlDeviceGetMaxClockInfo, h, sm),
        "mem_clock_mhz": _try(nvml.nvmlDeviceGetClockInfo, h, mem),
        "temperature_c": _try(
            nvml.nvmlDeviceGetTemperature, h, getattr(nvml, "NVML_TEMPERATURE_GPU", 0)
        ),
        "power_w": power_mw / 1e3 if power_mw is not None else None,
        "power_limit_w": limit_mw / 1e3 if limit_mw is not None else None,
        "pstate": f"P{pstate}" if isinstance(pstate, int) else None,
        "clock_event_mask": mask,
        "clock_events": clock_event_names(mask) if isinstance(mask, int) else None,
    }


def slowdowns(state: dict | None) -> list[str]:
    """The reasons in a reading that mean the clocks were held below what the work could use."""
    return [r for r in (state or {}).get("clock_events") or [] if r in SLOWDOWN_REASONS]


def state_line(state: dict | None) -> str:
    """One line for a log: 'SM 1,980/1,980 MHz, 41 C, 128/700 W, P0, clock events: none'."""
    if not state:
        return "GPU state: not recorded"
    if not state.get("available"):
        return f"GPU state: not read ({state.get('reason')})"

    def num(v, unit: str) -> str:
        return "n/a" if v is None else f"{v:,.0f}{unit}"

    events = state.get("clock_events")
    events_text = "n/a" if events is None else (", ".join(events) or "none")
    return (
        f"SM {num(state.get('sm_clock_mhz'), '')}/{num(state.get('sm_clock_max_mhz'), ' MHz')}, "
        f"{num(state.get('temperature_c'), ' C')}, "
        f"{num(state.get('power_w'), '')}/{num(state.get('power_limit_w'), ' W')}, "
        f"{state.get('pstate') or 'P?'}, clock events: {events_text}"
    )
