"""Every package's `python -m <package> --help` reads alike (CONTRIBUTING.md, "Command lines"):
a usage line, a description of the package, then tyro's box of subcommands, each with its
description; an unknown command is one `error:` line and exit code 2."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
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
    return subprocess.run(
        [sys.executable, "-m", package, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def runs() -> dict[tuple[str, str], subprocess.CompletedProcess]:
    """(package, "help" or "unknown") -> its run; side by side, since each one imports torch."""
    jobs = [(package, kind) for package in PACKAGES for kind in ARGS]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        return dict(zip(jobs, pool.map(lambda job: _run(job[0], ARGS[job[1]]), jobs)))


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
