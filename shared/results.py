"""Result files: JSON records that always carry the environment they were measured in.

A record is `{"name", "project", "environment", "config", "baseline", "results"}`, written
atomically (temporary file in the same folder, fsync, rename, fsync of the folder), so a crash
never leaves a half-written file that looks whole. Markdown tables for reports, and the README
refresh between markers, read these records.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import secrets
import socket
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
REPORTS_DIR = REPO_ROOT / "reports"
RUNS_DIR = REPO_ROOT / "runs"  # ignored by git: where experiments write unless told otherwise


def new_run_dir() -> Path:
    """A new runs/<UTC time>/ folder name at the repository root (created by whoever writes)."""
    return RUNS_DIR / _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")


def output_root(reports_dir: str | os.PathLike | None) -> Path:
    """Where an experiment writes its records: `--reports-dir` when given, else a new
    runs/<UTC time>/. The published results in reports/ are written only when named
    (`--reports-dir reports`, or `make publish RUN=runs/<time>`), never by accident."""
    return Path(reports_dir) if reports_dir else new_run_dir()


SCHEMA_VERSION = 1


# --- atomic writes ---------------------------------------------------------------------------


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # some platforms cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _create_temp(path: Path) -> tuple[int, str]:
    """A new file beside `path`, created with mode 0o666 less the umask (the mode any other
    new file gets; `tempfile.mkstemp` would make it 0o600, and the rename would keep that)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            return os.open(tmp, flags, 0o666), str(tmp)
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write `data` to `path` so that readers see the old file or the whole new one, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_temp(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def _json_default(obj):
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if hasattr(obj, "item"):  # numpy / torch scalars
        return obj.item()
    if isinstance(obj, (Path, set, tuple)):
        return str(obj) if isinstance(obj, Path) else list(obj)
    return str(obj)


def _finite(obj):
    """JSON has no NaN/inf: write them as null so every reader can parse the file."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def atomic_write_json(path: str | os.PathLike, obj) -> Path:
    text = json.dumps(_finite(json.loads(json.dumps(obj, default=_json_default))), indent=2)
    return atomic_write_text(path, text + "\n")


# --- environment -----------------------------------------------------------------------------


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_commit() -> str | None:
    """$GIT_COMMIT when set (a copy of the tree whose git metadata is absent or not its own),
    else HEAD of this checkout, else None."""
    return os.environ.get("GIT_COMMIT") or _git("rev-parse", "HEAD")


def _nvidia_driver() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else v
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML library, no driver, no GPU: all mean "no driver to report"
        return None


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """The host CPU's model name (Linux: /proc/cpuinfo; elsewhere `platform.processor()`), or
    None. Host-bound figures (an engine's scheduling, a batch-1 step's launches) move with the
    host: the same engine code on two machines of one GPU model can run a workload well apart,
    with the same device time a step and a host share that differs."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name") and ":" in line:
                    return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return platform.processor() or None


def environment(*, gpu_state_start: dict | None = None) -> dict:
    """Where a result was measured: GPU, driver, CUDA, torch, Python, host and its CPU model,
    date, git commit, and the GPU's clocks, temperature and power (`gpu_state`: `start` as the
    benchmark read it when it began, None if it did not; `end` read now)."""
    import torch

    from shared.gpu_state import gpu_state

    env = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "gpu": None,
        "gpu_count": 0,
        "compute_capability": None,
        "driver": None,
        "git_commit": git_commit(),
        "git_dirty": None,
    }
    status = _git("status", "--porcelain", "--untracked-files=no")
    env["git_dirty"] = None if status is None else bool(status)
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
        env["gpu_count"] = torch.cuda.device_count()
        env["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
        env["driver"] = _nvidia_driver()
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    env["gpu_state"] = {"start": gpu_state_start, "end": gpu_state()}
    return env


# --- result records --------------------------------------------------------------------------


def save_result(
    project: str,
    name: str,
    results,
    *,
    baseline=None,
    config: dict | None = None,
    reports_dir: str | os.PathLike | None = None,
    env: dict | None = None,
    gpu_state_start: dict | None = None,
) -> Path:
    """Write reports/<project>/<name>.json with the environment and the baseline of the run.
    gpu_state_start: `shared.gpu_state.gpu_state()` read when the run began; the environment
    then holds it beside a reading taken now."""
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"result name must be a plain file stem, got {name!r}")
    root = Path(reports_dir) if reports_dir is not None else REPORTS_DIR
    record = {
        "schema": SCHEMA_VERSION,
        "project": project,
        "name": name,
        "environment": _environment_with(env, gpu_state_start),
        "config": config or {},
        "baseline": baseline,
        "results": results,
    }
    return atomic_write_json(root / project / f"{name}.json", record)


def _environment_with(env: dict | None, gpu_state_start: dict | None) -> dict:
    if env is None:
        return environment(gpu_state_start=gpu_state_start)
    if gpu_state_start is None:
        return env
    from shared.gpu_state import gpu_state

    return {**env, "gpu_state": {"start": gpu_state_start, "end": gpu_state()}}


def load_result(path: str | os.PathLike) -> dict:
    path = Path(path)
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"no result file at {path}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e
    missing = {"environment", "results"} - set(record)
    if missing:
        raise ValueError(f"{path} is not a result record: missing {sorted(missing)}")
    return record


def environment_line(env: dict) -> str:
    """One line naming where a result came from, for report captions."""
    gpu = env.get("gpu") or f"CPU ({env.get('cpu_count')} cores)"
    commit = (env.get("git_commit") or "unknown")[:10]
    dirty = "+dirty" if env.get("git_dirty") else ""
    return (
        f"{gpu}, driver {env.get('driver') or 'n/a'}, torch {env.get('torch')}, "
        f"CUDA {(env.get('cuda') or 'n/a') if env.get('gpu') else 'n/a'}, "
        f"Python {env.get('python')}, "
        f"{(env.get('date') or '')[:10]}, commit {commit}{dirty}"
    )


# --- Markdown --------------------------------------------------------------------------------


def _fmt(v, floatfmt: str) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "n/a"
        return format(v, floatfmt)
    return str(v).replace("|", "\\|")


def markdown_table(
    rows: Iterable[dict],
    columns: Sequence[str] | None = None,
    *,
    headers: Sequence[str] | None = None,
    floatfmt: str = ",.3g",
) -> str:
    """A GitHub Markdown table of `rows` (dicts); numbers right-aligned, None as n/a, `|` escaped.

    Not tabulate (which pandas' to_markdown also calls): its pipe format pads every cell to the
    column's width, so one changed figure rewrites a whole table in the diffs of reports/ and of
    the README blocks; here each row is its own line."""
    rows = list(rows)
    if columns is None:
        columns = list(dict.fromkeys(k for r in rows for k in r))
    if headers is not None and len(headers) != len(columns):
        raise ValueError(f"{len(headers)} headers for {len(columns)} columns")
    headers = list(headers or columns)

    def is_number(v) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    numeric = [
        bool(rows) and all(is_number(r.get(c)) or r.get(c) is None for r in rows) for c in columns
    ]
    lines = [
        "| " + " | ".join(headers) + " |",
        "| " + " | ".join("---:" if n else "---" for n in numeric) + " |",
    ]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c), floatfmt) for c in columns) + " |")
    return "\n".join(lines)


def replace_between_markers(text: str, marker: str, content: str) -> str:
    """Replace what stands between `<!-- marker -->` and `<!-- /marker -->` with `content`."""
    start, end = f"<!-- {marker} -->", f"<!-- /{marker} -->"
    i, j = text.find(start), text.find(end)
    if i < 0 or j < 0 or j < i:
        raise ValueError(f"markers {start} ... {end} not found (in that order)")
    return text[: i + len(start)] + "\n" + content.strip("\n") + "\n" + text[j:]
