import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from shared.distributed import DistInfo, get_logger, init_distributed
from shared.model import build_model

WORKER = Path(__file__).with_name("_fsdp_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def _failure_lines(stderr: str) -> str:
    """What the ranks said before torchrun's summary (the summary alone hides the cause)."""
    keep = [
        ln
        for ln in stderr.splitlines()
        if any(
            w in ln
            for w in (
                "Error",
                "error",
                "terminate",
                "what()",
                "Traceback",
                "[rank",
                "exitcode",
                "Signal",
            )
        )
    ]
    return "\n".join(keep[-60:])


def _torchrun(nproc: int, out: Path, bug: str = "") -> subprocess.CompletedProcess:
    # Prepend the repo to the caller's PYTHONPATH: packages installed outside site-packages stay.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        str(WORKER),
        str(out),
        *([bug] if bug else []),
    ]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


# Why ATOL holds on any CPU. The two runs compute the same float64 arithmetic except for the order
# of sums (one process sums the batch's 256 tokens at once; two ranks sum 128 each, then add the
# halves in the reduce-scatter; BLAS kernels block differently). A sum of n float64 terms in any
# order is within (n - 1) * u * sum|terms| of the exact one (u = 2**-53 = 1.1e-16); here n <= 256
# and sum|terms| < 1 (activations are O(1) and each token's loss gradient carries 1/256), so
# |d grad| < 3e-14. AdamW's update g_hat / (sqrt(v_hat) + eps) moves by at most lr / eps per unit
# of gradient change (its derivative is eps / (|g| + eps)**2 <= 1 / eps at the first step, and
# smaller after), so each step moves a weight by at most 1e-2 / 1e-8 * 3e-14 = 3e-8; three steps
# (plus the tiny change of later gradients through the weights) stay under 1e-7. ATOL = 1e-6
# leaves a factor of ten on the worst case; the typical difference is ~1e-15. A sharding bug moves
# weights by the learning rate's order (1e-3 to 1e-2): the test below shows one fails it.
ATOL = 1e-6
LR = 1e-2  # the worker's learning rate


def _train_one_and_two(tmp_path: Path, bug: str = "") -> tuple[dict, dict, str]:
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    logs = {}
    for n, out in ((1, one), (2, two)):
        r = _torchrun(n, out, bug if n == 2 else "")
        assert r.returncode == 0, _failure_lines(r.stderr)
        logs[n] = r.stderr
    return torch.load(one), torch.load(two), logs[2]


@pytest.mark.slow
def test_two_gloo_ranks_of_fsdp_match_one_process_on_the_full_batch(tmp_path):
    a, b, log2 = _train_one_and_two(tmp_path)
    assert "[rank 1/2]" in log2  # the rank-aware logger, from a real second rank
    assert a.keys() == b.keys() and len(a) > 10
    assert all(v.dtype == torch.float64 for v in a.values())
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=ATOL)
    # the steps moved the weights: the comparison above is not of two untouched inits
    init = build_model("tiny", seed=0).double().state_dict()
    assert all(not torch.allclose(a[k], init[k]) for k in a if k.endswith("wqkv.weight"))


@pytest.mark.slow
def test_the_comparison_catches_a_sharding_bug(tmp_path):
    # Every rank trains on rank 0's half of the batch: the gradient is that of half the data.
    a, b, _ = _train_one_and_two(tmp_path, bug="same_data")
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    assert worst > 100 * ATOL, f"a planted sharding bug moved the weights by only {worst:.2e}"
    assert worst > LR / 10  # of the learning rate's order, as the bound above says


def test_single_process_world(monkeypatch):
    import torch.distributed as dist

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    info = init_distributed(device="cpu")
    try:
        assert info == DistInfo(0, 0, 1, "gloo", torch.device("cpu"))
        t = torch.ones(3)
        dist.all_reduce(t)
        assert t.tolist() == [1.0, 1.0, 1.0]
    finally:
        dist.destroy_process_group()


def test_bad_backend_is_clear():
    with pytest.raises(ValueError, match="backend must be"):
        init_distributed(backend="mpi", device="cpu")
    with pytest.raises(ValueError, match="needs CUDA"):
        init_distributed(backend="nccl", device="cpu")


def test_logger_prints_rank_zero_info(capsys):
    log = get_logger("shared-test")
    log.info("hello from rank zero")
    assert "hello from rank zero" in capsys.readouterr().err


@pytest.mark.parametrize("launched", [True, False])
def test_exit_under_launcher_flushes_and_ends_only_under_torchrun(launched):
    # Under torchrun the process ends at once with the given code, its buffered output and log
    # records written first; outside it the call returns and the program goes on.
    script = (
        "import logging, sys\n"
        "from shared.distributed import exit_under_launcher\n"
        "logging.basicConfig(stream=sys.stderr, level=logging.INFO)\n"
        "logging.getLogger('t').info('logged before exit')\n"
        "print('printed before exit', end='')\n"
        "exit_under_launcher(7)\n"
        "print(' and after')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TORCHELASTIC_RUN_ID"}
    if launched:
        env["TORCHELASTIC_RUN_ID"] = "test"
    r = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert "logged before exit" in r.stderr
    if launched:
        assert (r.returncode, r.stdout) == (7, "printed before exit")
    else:
        assert (r.returncode, r.stdout) == (0, "printed before exit and after\n")
