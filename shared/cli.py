"""Command lines that answer bad input in one line: `error: <message>` on stderr, exit code 2,
never a traceback, and the argument named.

- `main_guard`: wraps a `main(argv)` so that the ValueError/TypeError a config raises (and the
  FileNotFoundError of a missing input) end as one `error:` line with exit code 2.
- `ArgumentParser`: argparse with that same one-line error (no usage block).
- Argument types for argparse that refuse nonsense with the reason: `finite_float`,
  `positive_float`, `nonneg_float`, `positive_int`, `nonneg_int`, `nonempty_str`.
- `parse_dataclass` / `run_tyro`: tyro's parsers with the error box folded into one `error:`
  line.
- Checks to run before long work: `require_finite`, `require_nonempty`,
  `writable_dir`, `writable_file`, `input_file`, `input_dir`; environment variables read by
  `env_int` / `env_float` are named in their errors.
"""

from __future__ import annotations

import argparse
import functools
import io
import math
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from contextlib import redirect_stderr
from pathlib import Path
from typing import NoReturn, TypeVar

EXIT_USAGE = 2
ERRORS = (ValueError, TypeError, FileNotFoundError)

T = TypeVar("T")


def one_line(message: object) -> str:
    """`message` on one line: its lines stripped and joined."""
    return " ".join(part.strip() for part in str(message).splitlines() if part.strip())


def fail(message: object) -> NoReturn:
    """Print `error: <message>` (one line) to stderr and exit with code 2."""
    print(f"error: {one_line(message)}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_USAGE)


def main_guard(main: Callable[..., T]) -> Callable[..., T]:
    """Decorate a `main(argv=None)`: ValueError, TypeError and FileNotFoundError become one
    `error:` line on stderr and exit code 2 (SystemExit), without a traceback."""

    @functools.wraps(main)
    def guarded(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except ERRORS as e:
            fail(e)

    return guarded


# --- argparse ------------------------------------------------------------------------------------


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are one line on stderr (`error: argument --x: ...`), exit code 2."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {one_line(message)} (see {self.prog} --help)", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_USAGE)


def _number(text: str, kind: type, what: str, ok: Callable[[float], bool]):
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not (math.isfinite(value) and ok(value)):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def finite_float(text: str) -> float:
    return _number(text, float, "a finite number", lambda v: True)


def positive_float(text: str) -> float:
    return _number(text, float, "a finite number > 0", lambda v: v > 0)


def nonneg_float(text: str) -> float:
    return _number(text, float, "a finite number >= 0", lambda v: v >= 0)


def positive_int(text: str) -> int:
    return _number(text, int, "an integer >= 1", lambda v: v >= 1)


def nonneg_int(text: str) -> int:
    return _number(text, int, "an integer >= 0", lambda v: v >= 0)


def nonempty_str(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a non-empty value, got an empty string")
    return text


def nonempty_path(text: str) -> Path:
    return Path(nonempty_str(text))


# --- tyro ----------------------------------------------------------------------------------------

_BOX = re.compile(r"[\u2500-\u257f]")  # box drawing characters
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_TYRO_INNER = re.compile(r"__tyro[-_]dummy[-_]inner__\.")
_RULE = re.compile(r"^[\s\-=_\u2500-\u257f+|]*$")


def _fold_box(text: str) -> str:
    """tyro's error box as one line: the lines of its first section (the one after the title;
    later sections are help text). Borders of either drawing style are dropped."""
    sections: list[list[str]] = [[]]
    rows = [_ANSI.sub("", ln).strip() for ln in text.splitlines()]
    rows = [r for r in rows if r]
    for i, row in enumerate(rows):
        if i == 0 and row[:1] in ("\u256d", "\u250c", "+"):
            continue  # a top border, which holds the title
        inner = _BOX.sub(" ", row).strip().strip("|").strip()
        if _RULE.match(inner):
            sections.append([])
        else:
            sections[-1].append(inner)
    sections = [sec for sec in sections if sec]
    if len(sections) > 1 and len(sections[0]) == 1 and ":" not in sections[0][0]:
        sections = sections[1:]  # a title line drawn above a rule
    message = " ".join(" ".join(sections[0]).split()) if sections else ""
    # tyro names a subcommand's nested config by an internal wrapper ("Error parsing
    # __tyro-dummy-inner__.engine: ..."): say the flag's prefix instead
    message = _TYRO_INNER.sub("--", message)
    return message or one_line(text)


def parse_dataclass(cls: Callable[..., T], argv: Sequence[str] | None = None, **kwargs) -> T:
    """`tyro.cli(cls, args=argv, **kwargs)`, with a parse error (tyro's box) printed as one
    `error:` line on stderr, exit code 2. --help is left as tyro prints it."""
    import tyro

    return run_tyro(tyro.cli, cls, args=argv, **kwargs)


def run_tyro(parse: Callable[..., T], *args, **kwargs) -> T:
    """Call a tyro parser (`tyro.cli`, `tyro.extras.subcommand_cli_from_dict`, ...) with its
    error box folded into one `error:` line (exit code 2)."""
    captured = io.StringIO()
    try:
        with redirect_stderr(captured):
            out = parse(*args, **kwargs)
    except SystemExit as e:
        if e.code in (0, None):
            sys.stderr.write(captured.getvalue())
            raise
        fail(_fold_box(captured.getvalue()))
    sys.stderr.write(captured.getvalue())  # what tyro printed on success (warnings)
    return out


def parse_subcommand(
    table: dict[str, tuple[type, Callable]],
    *,
    prog: str,
    description: str,
    argv: list[str] | None = None,
) -> tuple[str, object]:
    """A package's `python -m <package> <command>` line: `table` maps each command to (its
    config dataclass, the function that runs it); returns the chosen command's name and its
    parsed config. Errors are one line with exit code 2 (`run_tyro`)."""
    import tyro

    cfg = run_tyro(
        tyro.extras.subcommand_cli_from_dict,
        {name: cls for name, (cls, _) in table.items()},
        args=sys.argv[1:] if argv is None else argv,
        prog=prog,
        description=description,
    )
    return next(name for name, (cls, _) in table.items() if type(cfg) is cls), cfg


def run_subcommand(
    table: dict[str, tuple[type, Callable]],
    *,
    prog: str,
    description: str,
    argv: list[str] | None = None,
    runner: Callable[[str, Callable, object], object] | None = None,
) -> int:
    """A package's `main`: parse the command line against `table` (`parse_subcommand`) and run
    the chosen command; returns its exit status (a command that returns something else, a
    record's path or None, exits 0). `runner(name, fn, cfg)` replaces the plain `fn(cfg)`."""
    name, cfg = parse_subcommand(table, prog=prog, description=description, argv=argv)
    fn = table[name][1]
    rc = runner(name, fn, cfg) if runner is not None else fn(cfg)
    return rc if isinstance(rc, int) else 0


# --- values and paths ----------------------------------------------------------------------------


def require_finite(owner: str, obj, names: Iterable[str]) -> None:
    """ValueError naming `owner.name` for any of `names` that is not a finite number."""
    for name in names:
        v = getattr(obj, name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{owner}.{name} must be a finite number, got {v!r}")


def require_nonempty(what: str, value) -> str:
    if value is None or not str(value).strip():
        raise ValueError(f"{what}: expected a path, got an empty string")
    return str(value)


def _existing_ancestor(path: Path) -> Path:
    p = path
    while not p.exists():
        if p.parent == p:
            break
        p = p.parent
    return p


def writable_dir(what: str, path: str | os.PathLike) -> Path:
    """Check, before any long work, that the folder `path` exists and is writable or can be made
    (its nearest existing ancestor is a writable folder). Creates nothing; returns the Path."""
    path = Path(require_nonempty(what, path))
    if path.exists() and not path.is_dir():
        raise ValueError(f"{what}: {path} exists and is not a folder")
    base = _existing_ancestor(path)
    if not base.is_dir():
        raise ValueError(f"{what}: cannot create {path}: {base} is not a folder")
    try:
        with tempfile.TemporaryFile(dir=base):
            pass
    except OSError as e:
        raise ValueError(f"{what}: cannot write under {base} ({e.strerror or e})") from None
    return path


def writable_file(what: str, path: str | os.PathLike) -> Path:
    """Check that the file `path` can be written (its folder writable or makeable, the path not
    a folder). Creates nothing; returns the Path."""
    path = Path(require_nonempty(what, path))
    if path.is_dir():
        raise ValueError(f"{what}: {path} is a folder, expected a file path")
    writable_dir(what, path.parent if str(path.parent) else ".")
    return path


def input_file(what: str, path: str | os.PathLike) -> Path:
    """FileNotFoundError naming `what` unless `path` is an existing file."""
    path = Path(require_nonempty(what, path))
    if not path.is_file():
        why = "is a folder" if path.is_dir() else "does not exist"
        raise FileNotFoundError(f"{what}: {path} {why}; expected a file")
    return path


def input_dir(what: str, path: str | os.PathLike) -> Path:
    """FileNotFoundError naming `what` unless `path` is an existing folder."""
    path = Path(require_nonempty(what, path))
    if not path.is_dir():
        why = "is a file" if path.exists() else "does not exist"
        raise FileNotFoundError(f"{what}: {path} {why}; expected a folder")
    return path


# --- environment ---------------------------------------------------------------------------------


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    """The integer environment variable `name` (default when unset); a ValueError names it."""
    text = os.environ.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"environment variable {name}={text!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ValueError(f"environment variable {name}={text!r} must be >= {minimum}")
    return value


def env_float(name: str, default: float | None = None) -> float | None:
    """The finite float environment variable `name` (default when unset); errors name it."""
    text = os.environ.get(name)
    if text is None or text == "":
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"environment variable {name}={text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"environment variable {name}={text!r} must be finite")
    return value
