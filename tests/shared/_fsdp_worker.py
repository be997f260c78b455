"""Run under torchrun by test_distributed.py: a few FSDP2 steps of the tiny model on gloo.

Writes the final full parameters (rank 0) to the path in argv[1]. The model trains in float64,
so that reduction-order rounding (one process vs two ranks sum in different orders) stays far
below the test's tolerance on any CPU (see the test for the bound).

argv[2] (optional) plants a sharding bug, to show the comparison catches one:
- "same_data": every rank trains on rank 0's shard of the batch.
"""

import sys

import torch
import torch.nn.functional as F

from shared.data import SyntheticTokens
from shared.distributed import cleanup, exit_under_launcher, get_logger, init_distributed
from shared.model import build_model
from shared.parallelize import ParallelConfig, parallelize


def main(out_path: str, bug: str = "", steps: int = 3) -> None:
    info = init_distributed(backend="gloo", timeout_s=120, device="cpu")
    log = get_logger("fsdp_worker", all_ranks=True)
    log.info("world %d backend %s", info.world_size, info.backend)
    torch.manual_seed(0)
    model = build_model("tiny", seed=0).double()
    # No mixed precision: parameters, gradients and their reduction stay float64.
    parallelize(model, ParallelConfig(param_dtype=None, reduce_dtype=None))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    data_rank = 0 if bug == "same_data" else info.rank
    data = SyntheticTokens(256, 32, 8, seed=0, rank=data_rank, world_size=info.world_size)
    for _ in range(steps):
        x, y = data.next_batch()
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
    full = {k: v.full_tensor() for k, v in model.state_dict().items()}
    if info.is_main:
        torch.save(full, out_path)
    cleanup()
    # A gloo worker can abort in the interpreter's teardown ("terminate called without an
    # active exception") after its work is done, and torchrun then fails the whole job.
    exit_under_launcher(0)


if __name__ == "__main__":
    main(sys.argv[1], *sys.argv[2:3])
