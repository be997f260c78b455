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
    keep = [ln for ln in stderr.splitlines()
            if any(w in ln for w in ("Error", "error", "terminate", "what()", "Traceback",
                                     "[rank", "exitcode", "Signal"))]  # fmt: skip
    return "\n".join(keep[-60:])


def _torchrun(nproc: int, out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", str(WORKER), str(out)]  # fmt: skip
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_two_gloo_ranks_of_fsdp_match_one_process_on_the_full_batch(tmp_path):
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    logs = {}
    for n, out in ((1, one), (2, two)):
        r = _torchrun(n, out)
        assert r.returncode == 0, _failure_lines(r.stderr)
        logs[n] = r.stderr
    assert "[rank 1/2]" in logs[2]  # the rank-aware logger, from a real second rank
    a, b = torch.load(one), torch.load(two)
    assert a.keys() == b.keys() and len(a) > 10
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)
    # the steps moved the weights: the comparison above is not of two untouched inits
    init = build_model("tiny", seed=0).state_dict()
    assert all(not torch.allclose(a[k], init[k]) for k in a if k.endswith("wqkv.weight"))


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
