"""Failure injection inside the trainer, driven by an environment variable, and the run's event log.

`P03_FAULTS` holds a JSON list of faults. The trainer acts on it only when its command line says
`--fault-injection` as well (a variable left in an environment is ignored with a warning: it
must never kill or corrupt a real run), and then says so on every rank. It calls
`FaultInjector.at_step(step)` before each step and the hooks below fire real failures:

    kill      os.kill(own pid, SIGKILL): the process dies mid-run, as on an OOM kill or lost node
    sigterm   os.kill(own pid, SIGTERM): a preemption notice (the handler saves and exits)
    hang      sleep forever inside the step: the peers' next collective times out
    nan       the step's loss becomes NaN (a bad batch or a numerical blow-up)
    truncate  cut the newest checkpoint's largest shard in half, then SIGKILL
    flip      flip one byte in the middle of the newest checkpoint's largest shard, then SIGKILL

Each fault is {"kind", "rank" (default 0), and either "step" (fire when about to run that
step) or "after" (fire after that many steps of the current attempt)}, optionally "attempt"
(only in that launch attempt: torchrun's TORCHELASTIC_RESTART_COUNT, or P03_ATTEMPT) and
"times" (how often it may fire in one process; default 1). Keying faults by attempt keeps them
stateless: a relaunched run does not die again at the same step.

The event log (`events.jsonl` in the run directory) is appended one JSON line at a time with
O_APPEND, so lines from several ranks and attempts never interleave; a SIGKILL after a write
loses nothing. The chaos tool reads it to measure steps lost and time to recover.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

FAULTS_ENV = "P03_FAULTS"
ATTEMPT_ENV = "P03_ATTEMPT"
KINDS = ("kill", "sigterm", "hang", "nan", "truncate", "flip")


def current_attempt() -> int:
    """Which launch attempt this process belongs to (0 for the first)."""
    for name in ("TORCHELASTIC_RESTART_COUNT", ATTEMPT_ENV):
        v = os.environ.get(name)
        if v is not None:
            try:
                value = int(v)
            except ValueError:
                raise ValueError(f"environment variable {name}={v!r} is not an integer") from None
            if value < 0:
                raise ValueError(f"environment variable {name}={v!r} must be >= 0")
            return value
    return 0


@dataclass
class Fault:
    kind: str
    rank: int = 0
    step: int | None = None
    after: int | None = None
    attempt: int | None = None
    times: int = 1
    fired: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"fault kind must be one of {KINDS}, got {self.kind!r}")
        if (self.step is None) == (self.after is None):
            raise ValueError(f"fault {self.kind!r} needs exactly one of 'step' or 'after'")
        if self.times < 1:
            raise ValueError(f"fault 'times' must be >= 1, got {self.times}")


def parse_faults(text: str | None) -> list[Fault]:
    if not text:
        return []
    try:
        items = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{FAULTS_ENV} is not valid JSON: {e}") from None
    if not isinstance(items, list):
        raise ValueError(f"{FAULTS_ENV} must be a JSON list of faults, got {type(items).__name__}")
    allowed = {"kind", "rank", "step", "after", "attempt", "times"}
    faults = []
    for item in items:
        if not isinstance(item, dict) or set(item) - allowed:
            raise ValueError(
                f"bad fault {item!r}: expected an object with keys from {sorted(allowed)}"
            )
        try:
            faults.append(Fault(**item))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{FAULTS_ENV}: bad fault {item!r}: {e}") from None
    return faults


class EventLog:
    """Append-only JSON lines shared by every rank and attempt of a run."""

    def __init__(self, path: str | os.PathLike | None, *, rank: int = 0, attempt: int = 0) -> None:
        self.path = Path(path) if path else None
        self.rank, self.attempt = rank, attempt
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, event: str, **data) -> None:
        if self.path is None:
            return
        record = {
            "t": time.time(),
            "event": event,
            "rank": self.rank,
            "attempt": self.attempt,
            "pid": os.getpid(),
            **data,
        }
        line = (json.dumps(record) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


def read_events(path: str | os.PathLike) -> list[dict]:
    """The events of a run; a torn last line (writer killed mid-write) is ignored."""
    out = []
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        return []
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _damage_newest_checkpoint(ckpt_root: Path, how: str) -> str:
    from .checkpoint.layout import list_checkpoints

    dirs = list_checkpoints(ckpt_root)
    if not dirs:
        return "no checkpoint to damage"
    newest = dirs[-1]
    shards = sorted(newest.glob("*.distcp"), key=lambda p: p.stat().st_size)
    target = shards[-1]
    size = target.stat().st_size
    if how == "truncate":
        os.truncate(target, size // 2)
        return f"truncated {newest.name}/{target.name} from {size} to {size // 2} bytes"
    with open(target, "r+b") as f:
        f.seek(size // 2)
        b = f.read(1)
        f.seek(size // 2)
        f.write(bytes([b[0] ^ 0xFF]))
        f.flush()
        os.fsync(f.fileno())
    return f"flipped byte {size // 2} of {newest.name}/{target.name}"


class FaultInjector:
    def __init__(
        self,
        faults: list[Fault],
        *,
        rank: int,
        attempt: int,
        events: EventLog,
        ckpt_root: Path,
        flush=lambda: None,
    ) -> None:
        self.rank, self.attempt, self.events, self.ckpt_root = rank, attempt, events, ckpt_root
        # Before a fault that damages the newest checkpoint, let pending work land (an async
        # checkpoint in flight would otherwise be torn at a random point: that is tested too, by
        # plain kills).
        self.flush = flush
        this_attempt = [f for f in faults if f.attempt is None or f.attempt == attempt]
        self.faults = [f for f in this_attempt if f.rank == rank]
        # Every rank lets its own save land before any rank damages a checkpoint. The commit of
        # an async save is a collective of every rank's background thread; a rank waiting for it
        # alone, while its peers run on into the next step's collectives (which wait for it),
        # can wait forever: on two GPUs a peer blocked there did not get its save committed, the
        # NCCL watchdog ended it, and the damage never happened. Copies: firing is counted per
        # process, and these only flush here.
        self._peer_damage = [
            replace(f, fired=0)
            for f in this_attempt
            if f.rank != rank and f.kind in ("truncate", "flip")
        ]
        self.steps_this_attempt = 0

    @classmethod
    def from_env(cls, **kwargs) -> FaultInjector:
        return cls(parse_faults(os.environ.get(FAULTS_ENV)), **kwargs)

    def _due(self, f: Fault, step: int) -> bool:
        if f.fired >= f.times:
            return False
        if f.step is not None:
            return step == f.step
        return self.steps_this_attempt == f.after

    def at_step(self, step: int) -> bool:
        """Called before running `step`. Fires process-level faults; returns True when this
        step's loss must be made NaN."""
        nan = False
        for f in self._peer_damage:
            if self._due(f, step):
                f.fired += 1
                self.flush()
        for f in self.faults:
            if not self._due(f, step):
                continue
            f.fired += 1
            detail = ""
            if f.kind in ("truncate", "flip"):
                self.flush()
                detail = _damage_newest_checkpoint(self.ckpt_root, f.kind)
            self.events.write("fault", kind=f.kind, step=step, detail=detail)
            if f.kind in ("kill", "truncate", "flip"):
                os.kill(os.getpid(), signal.SIGKILL)
            elif f.kind == "sigterm":
                os.kill(os.getpid(), signal.SIGTERM)
            elif f.kind == "hang":
                while True:  # the peers' collectives time out; the launcher kills us
                    time.sleep(3600)
            elif f.kind == "nan":
                nan = True
        self.steps_this_attempt += 1
        return nan
