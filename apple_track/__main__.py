"""python -m apple_track {export,report,profile} [...]: the track's commands."""

from __future__ import annotations

import sys

COMMANDS = {
    "export": "export every variant, measure, write reports/apple_track/ and the README",
    "report": "rewrite the charts, summary and README from the recorded JSON",
    "profile": "run one exported variant in a loop (a target for Instruments / powermetrics)",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in COMMANDS and argv[0] not in ("-h", "--help"):
        print(
            f"error: unknown command {argv[0]!r}; expected one of {sorted(COMMANDS)} "
            "(see python -m apple_track --help)",
            file=sys.stderr,
        )
        return 2
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m apple_track {export,report,profile} [--help]\n")
        for name, what in COMMANDS.items():
            print(f"  {name:<8} {what}")
        return 0
    import importlib

    return importlib.import_module(f"apple_track.{argv[0]}").main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
