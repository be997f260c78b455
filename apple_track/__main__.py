"""`python -m apple_track <command> --help`: export, report, profile.

python -m apple_track export                          # every variant, measured; the README
python -m apple_track export --preset 125m --seq-len 128 --train-steps 0 --name export_125m
python -m apple_track report --no-readme              # the chart and summary from the JSON alone
python -m apple_track profile litert int8 --seconds 20
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from shared.cli import main_guard, run_subcommand

PROG = "python -m apple_track"
DESCRIPTION = (
    "The shared transformer on device: Core ML, LiteRT and MLX exports measured "
    "against PyTorch, Metal kernels, the report and a profiling loop."
)


def commands() -> dict[str, tuple[type, Callable[..., int]]]:
    """Command name -> (its config class, the function that runs it and returns an exit code)."""
    from . import export, profile, report

    return {
        "export": (export.ExportCommandConfig, export.run),
        "report": (report.ReportConfig, report.run),
        "profile": (profile.ProfileConfig, profile.run),
    }


@main_guard
def main(argv: list[str] | None = None) -> int:
    return run_subcommand(commands(), prog=PROG, description=DESCRIPTION, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
