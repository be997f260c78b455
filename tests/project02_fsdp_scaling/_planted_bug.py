"""Run under torchrun by test_equivalence.py: project02's FSDP trainer with a planted bug, to show
that the equivalence comparison catches one.

    python -m tests.project02_fsdp_scaling._planted_bug BUG <train flags>

BUG is one of:
- "same_data": every rank trains on rank 0's shard of the batch (half the data, twice);
- "sum_grads": gradients are summed over the ranks instead of averaged (world size times too
  large; Adam is almost blind to a constant scale, the gradient norm is not).
"""

from __future__ import annotations

import sys

from torch.distributed.fsdp import FSDPModule

import project02_fsdp_scaling.train as train
from project02_fsdp_scaling.__main__ import main as package_main
from shared.data import SyntheticTokens
from shared.parallelize import parallelize

BUGS = ("same_data", "sum_grads")


def _same_data(vocab_size, seq_len, global_batch, seed, rank, world_size):
    return SyntheticTokens(vocab_size, seq_len, global_batch, seed, 0, world_size)


def _sum_grads(model, cfg, *, mesh=None):
    parallelize(model, cfg, mesh=mesh)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)  # FSDP divides by the world size: now it does not
    return model


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in BUGS:
        raise SystemExit(f"first argument must be one of {BUGS}, got {argv[:1]}")
    if argv[0] == "same_data":
        train.SyntheticTokens = _same_data
    else:
        train.parallelize = _sum_grads
    return package_main(["train", *argv[1:]])


if __name__ == "__main__":
    from shared.distributed import exit_under_launcher

    code = main(sys.argv[1:])
    # as the package's own entry points do: under torchrun, leave without the interpreter's
    # teardown, where a gloo worker thread can abort after the results are written
    exit_under_launcher(code)
    sys.exit(code)
