"""`python -m project02_fsdp_scaling <command> [flags]`: the project's entry points in one place.

    train      FSDP2 training (run under torchrun for several processes)
    scaling    the strong-scaling benchmark (launches torchrun per world size)
    sweep      one-GPU variants (eager/compiled, activation checkpointing, attention backend)
    compare    FSDP2 vs DeepSpeed ZeRO-3 at one world size
    deepspeed  the DeepSpeed ZeRO-3 training path alone (under torchrun)
    report     re-render charts, Markdown and README.md from the JSON records
Each takes --help.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "train": "train",
    "scaling": "scaling",
    "sweep": "sweep",
    "compare": "compare",
    "deepspeed": "deepspeed_zero3",
    "report": "report",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if argv[0] not in COMMANDS:
        print(f"error: unknown command {argv[0]!r}; expected one of {sorted(COMMANDS)}",
              file=sys.stderr)  # fmt: skip
        return 2
    module = importlib.import_module(f"project02_fsdp_scaling.{COMMANDS[argv[0]]}")
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
