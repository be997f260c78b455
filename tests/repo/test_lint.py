"""ruff is part of the CPU tier: a lint or formatting regression fails `make test` too."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("ruff", reason="ruff is in the dev extra (make setup installs it)")


@pytest.mark.parametrize("args", [["check", "."], ["format", "--check", "."]])
def test_ruff_is_clean(args):
    r = subprocess.run(
        [sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-1000:]
