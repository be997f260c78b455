"""Long runs you can follow: a progress bar with rate and ETA on a terminal, a line every N
items (and at the end) when the output is a file or a pipe, so CI logs stay short.

    with progress(total=60, description="train", unit="step", every=10) as bar:
        for step in range(60):
            ...
            bar.advance(status=f"loss {loss:.3f}")

`human_count(139_584)` -> '139.6 K'; `human_count(1.106e9)` -> '1.11 B'.
"""

from __future__ import annotations

import math
import sys
import time
from contextlib import contextmanager
from typing import IO

_LIVE: list = []  # the bar on screen (rich allows one live display)
_UNITS = ((1e3, "K"), (1e6, "M"), (1e9, "B"), (1e12, "T"))


def human_count(n: float) -> str:
    """A count with a unit suffix and 3-4 significant digits: 950, 139.6 K, 134.2 M, 1.11 B."""
    if n is None or not math.isfinite(n):
        return "n/a"
    sign, a = ("-" if n < 0 else ""), abs(n)
    if a < 1000:
        return f"{sign}{a:.0f}" if float(a).is_integer() else f"{sign}{a:.4g}"
    i = max(k for k, (scale, _) in enumerate(_UNITS) if a >= scale)
    v = a / _UNITS[i][0]
    if round(v, 1 if v >= 10 else 2) >= 1000 and i + 1 < len(_UNITS):
        i += 1  # 999.97 K reads 1.00 M
        v = a / _UNITS[i][0]
    return f"{sign}{v:.1f} {_UNITS[i][1]}" if v >= 10 else f"{sign}{v:.2f} {_UNITS[i][1]}"


def human_seconds(s: float | None) -> str:
    """4.2 s, 3 min 05 s, 1 h 02 min."""
    if s is None or not math.isfinite(s):
        return "?"
    s = max(0.0, s)
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"


def _rate(per_s: float, unit: str) -> str:
    if per_s >= 100:
        return f"{per_s:,.0f} {unit}/s"
    return f"{per_s:.3g} {unit}/s" if per_s >= 1 else f"{1 / per_s:.3g} s/{unit}"


def _is_terminal(stream: IO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class Progress:
    """What `progress()` yields: `advance(n, status=...)`, `update(status=...)`, `log(line)`."""

    def __init__(
        self,
        total: int | None,
        description: str,
        *,
        unit: str,
        every: int,
        stream: IO,
        enabled: bool,
        bar: bool | None,
        start: int = 0,
    ) -> None:
        self.total, self.description, self.unit = total, description, unit
        self.every = max(1, int(every))
        self.stream, self.enabled = stream, enabled
        self.start = self.done = self._last_line_at = start
        self.status = ""
        self.t0 = time.perf_counter()
        self._rich = None
        self._task = None
        if enabled and (bar if bar is not None else _is_terminal(stream)) and not _LIVE:
            self._start_bar()

    # -- a rich bar on a terminal --

    def _start_bar(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            ProgressColumn,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.text import Text

        unit = self.unit

        class Rate(ProgressColumn):
            def render(self, task) -> Text:
                speed = task.finished_speed or task.speed
                if not speed:
                    return Text("")
                return Text(_rate(speed, unit), style="progress.data.speed")

        self._rich = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TaskProgressColumn(),
            Rate(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[status]}"),
            console=Console(file=self.stream),
            auto_refresh=False,  # no refresh thread: nothing competes with the timed work
            transient=False,
        )
        self._rich.start()
        _LIVE.append(self)
        self._task = self._rich.add_task(
            self.description, total=self.total, status="", completed=self.start
        )

    # -- the public side --

    def advance(self, n: int = 1, *, status: str | None = None) -> None:
        self.done += n
        if status is not None:
            self.status = status
        if not self.enabled:
            return
        if self._rich is not None:
            self._rich.update(self._task, advance=n, status=self.status)
            self._rich.refresh()
        elif (
            self.done - self._last_line_at >= self.every
            or self.done == self.total
            or self.done == self.start + 1
        ):
            self._line()  # the first item (start-up cost shows), every N-th and the last

    def set(self, done: int, *, status: str | None = None) -> None:
        """Move to `done` items (it may go back: a rollback, a restart from a checkpoint)."""
        if done == self.done:
            if status is not None and status != self.status:
                self.update(status=status)
            return
        if done < self.done:
            self.done = done
            self._last_line_at = min(self._last_line_at, done)
            if self._rich is not None and self.enabled:
                self._rich.update(self._task, completed=done)
            self.update(status=status)
            return
        self.advance(done - self.done, status=status)

    def update(self, *, status: str | None = None, description: str | None = None) -> None:
        """Change the status text (and description) without advancing; a terminal bar shows it
        at once, a log gets it with the next line."""
        if status is not None:
            self.status = status
        if description is not None:
            self.description = description
        if self.enabled and self._rich is not None:
            self._rich.update(self._task, status=self.status, description=self.description)
            self._rich.refresh()

    def log(self, message: str) -> None:
        """A line of its own (above the bar on a terminal)."""
        if not self.enabled:
            return
        if self._rich is not None:
            self._rich.console.print(message, markup=False, highlight=False)
        else:
            print(message, file=self.stream, flush=True)

    def line(self) -> str:
        """The periodic line: `[train] 20/60 steps (33%), 2.1 step/s, 9.5 s, ETA 19.0 s | ...`."""
        elapsed = time.perf_counter() - self.t0
        rate = (self.done - self.start) / elapsed if elapsed > 0 else None
        if self.total:
            count = f"{self.done}/{self.total} {self.unit}s ({100 * self.done / self.total:.0f}%)"
        else:
            count = f"{self.done} {self.unit}s"
        parts = [f"[{self.description}] {count}"]
        if rate:
            parts.append(_rate(rate, self.unit))
        parts.append(f"elapsed {human_seconds(elapsed)}")
        if self.total and rate and self.done < self.total:
            parts.append(f"ETA {human_seconds((self.total - self.done) / rate)}")
        text = ", ".join(parts)
        return f"{text} | {self.status}" if self.status else text

    def _line(self) -> None:
        self._last_line_at = self.done
        print(self.line(), file=self.stream, flush=True)

    def close(self) -> None:
        if self._rich is not None:
            self._rich.refresh()
            self._rich.stop()
            self._rich = None
            _LIVE.remove(self)
        elif self.enabled and self.done != self.start and self._last_line_at != self.done:
            self._line()  # the last line, whatever N is


@contextmanager
def progress(
    total: int | None,
    description: str,
    *,
    unit: str = "step",
    every: int = 10,
    stream: IO | None = None,
    enabled: bool = True,
    bar: bool | None = None,
    start: int = 0,
):
    """A progress display for `total` items (None: unknown) on `stream` (default stderr): a rich
    bar with rate and ETA when the stream is a terminal (or `bar=True`), else one line every
    `every` items and one at the end. `enabled=False` (e.g. ranks other than 0) shows nothing.
    `start`: items already done (a resumed run). Only one bar is live at a time: a progress
    opened while a bar shows prints lines instead."""
    p = Progress(
        total,
        description,
        unit=unit,
        every=every,
        stream=stream or sys.stderr,
        enabled=enabled,
        bar=bar,
        start=start,
    )
    try:
        yield p
    finally:
        p.close()
