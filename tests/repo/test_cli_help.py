"""Every package's `python -m <package> --help` reads alike (CONTRIBUTING.md, "Command lines"):
a usage line, a description of the package, then tyro's box of subcommands, each with its
description; an unknown command is one `error:` line and exit code 2."""

from __future__ import annotations

import contextlib
import io
import re
import runpy
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PACKAGES = [
    "project01_cuda_kernel",
    "project02_fsdp_scaling",
    "project03_capstone_infra",
    "project04_llm_inference",
    "apple_track",
]

ARGS = {"help": ["--help"], "unknown": ["no-such-command"]}


def _run(package: str, args: list[str]) -> subprocess.CompletedProcess:
    """`python -m <package> <args>` run in this process as `-m` runs it (runpy, `__main__`), its
    output and exit code captured: the ten runs pay for importing torch and the packages once,
    not ten times. Each package's `test_cli_errors.py` checks the real entry point in a process
    of its own."""
    # UTF-8 text streams, as a pipe to a child process is: tyro draws its boxes only there
    out, err = (io.TextIOWrapper(io.BytesIO(), encoding="utf-8") for _ in range(2))
    code = 0
    argv = sys.argv
    sys.argv = [f"-m {package}", *args]
    try:
        # runpy warns when <package>.__main__ was imported before (by another test)
        with (
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("ignore", RuntimeWarning)
            runpy.run_module(package, run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    finally:
        sys.argv = argv
    text = []
    for stream in (out, err):
        stream.flush()
        text.append(stream.buffer.getvalue().decode())
    return subprocess.CompletedProcess([sys.executable, "-m", package, *args], code, *text)


@pytest.fixture(scope="module")
def runs() -> dict[tuple[str, str], subprocess.CompletedProcess]:
    """(package, "help" or "unknown") -> its run."""
    return {(p, kind): _run(p, ARGS[kind]) for p in PACKAGES for kind in ARGS}


def subcommand_entries(help_text: str) -> dict[str, str]:
    """The `• name  description` entries of tyro's subcommands box: name -> its description
    (wrapped lines joined)."""
    entries: dict[str, str] = {}
    rows = iter(help_text.splitlines())
    for row in rows:
        if row.strip().startswith("╭─ subcommands"):
            break
    name = None
    for row in rows:
        if row.strip().startswith("╰"):
            break
        inner = row.strip().strip("│").strip()
        entry = re.match(r"• (\S+)\s*(.*)", inner)
        if entry:
            name, entries[entry[1]] = entry[1], entry[2]
        elif name is not None and inner:
            entries[name] = f"{entries[name]} {inner}".strip()
    return entries


def test_the_box_parser_sees_a_missing_description():
    box = """\
╭─ subcommands ─────────────────╮
│ (required)                    │
│   • run      Run the thing,   │
│              wrapped.         │
│   • report                    │
╰───────────────────────────────╯
"""
    assert subcommand_entries(box) == {"run": "Run the thing, wrapped.", "report": ""}


@pytest.mark.parametrize("package", PACKAGES)
def test_help_has_usage_description_and_described_commands(runs, package):
    r = runs[package, "help"]
    assert r.returncode == 0, r.stderr
    usage, _, rest = r.stdout.partition("\n\n")
    assert usage.startswith(f"usage: python -m {package} "), usage
    description = rest.lstrip("\n").splitlines()[0].strip()
    assert description and not description.startswith("╭"), f"no description line:\n{r.stdout}"
    listed = re.search(r"\{([^}]*)\}", usage)
    assert listed, usage
    entries = subcommand_entries(r.stdout)
    assert list(entries) == listed[1].split(","), r.stdout
    undescribed = [name for name, text in entries.items() if not text]
    assert not undescribed, f"commands without a description: {undescribed}"


@pytest.mark.parametrize("package", PACKAGES)
def test_an_unknown_command_is_one_error_line(runs, package):
    r = runs[package, "unknown"]
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
