"""PersistentStager (async-save staging into host buffers kept across saves) and the async saves
built on it: round trip, buffer reuse, copy by value, rebuild on a structure change, DTensors,
several async saves in one process loaded back bitwise, start-up prestaging, the failure
fallback; on a GPU, pinned buffers and the side-stream ordering."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist

from project03_capstone_infra import runner
from project03_capstone_infra.checkpoint.compare import compare_states
from project03_capstone_infra.checkpoint.layout import list_checkpoints, read_latest
from project03_capstone_infra.checkpoint.manager import CheckpointManager
from project03_capstone_infra.checkpoint.safe_read import read_full_state
from project03_capstone_infra.checkpoint.stager import PersistentStager
from project03_capstone_infra.checkpoint.verify import verify_checkpoint
from project03_capstone_infra.config import TrainConfig
from project03_capstone_infra.faults import FAULTS_ENV
from project03_capstone_infra.train import Trainer

from .conftest import RUN


def _state(device="cpu"):
    g = torch.Generator().manual_seed(0)
    return {
        "model": {
            "w": torch.randn(8, 4, generator=g).to(device),
            "ids": torch.arange(5, dtype=torch.int64).to(device),
            "mask": (torch.arange(6) % 2 == 0).to(device),
        },
        "optim": {
            "state": {"w": {"step": torch.tensor(3.0), "exp_avg": torch.ones(8, 4).to(device)}},
            "param_groups": [{"lr": 0.1, "betas": (0.9, 0.95), "params": ["w"]}],
        },
        "extra": json.dumps({"step": 3}),
        "pairs": (torch.zeros(2).to(device), "tag"),
    }


def _leaves(obj, prefix=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, f"{prefix}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _leaves(v, f"{prefix}[{i}]")
    else:
        yield prefix, obj


def _assert_equal(staged, source):
    a, b = dict(_leaves(staged)), dict(_leaves(source))
    assert a.keys() == b.keys()
    for k, x in a.items():
        y = b[k]
        if isinstance(y, torch.Tensor):
            assert isinstance(x, torch.Tensor) and x.device.type == "cpu", k
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y.cpu()), k
        else:
            assert x == y and type(x) is type(y), k


def _ptrs(staged):
    return {k: v.data_ptr() for k, v in _leaves(staged) if isinstance(v, torch.Tensor)}


def test_stager_round_trip_equals_the_source_and_shares_nothing():
    src = _state()
    stager = PersistentStager()
    staged = stager.stage(src).result()
    _assert_equal(staged, src)
    src_ptrs = _ptrs(src)
    assert all(p != src_ptrs[k] for k, p in _ptrs(staged).items())
    # Nothing staged moves with the source afterwards: tensors, CPU counters, Python values.
    src["model"]["w"].add_(1)
    src["optim"]["state"]["w"]["step"] += 1
    src["optim"]["param_groups"][0]["lr"] = 0.5
    assert staged["optim"]["param_groups"][0]["lr"] == 0.1
    assert staged["optim"]["state"]["w"]["step"].item() == 3.0
    assert not torch.equal(staged["model"]["w"], src["model"]["w"])
    assert isinstance(staged["pairs"], tuple) and stager.builds == 1
    stager.close()


def test_buffers_are_reused_across_saves_and_hold_the_new_values():
    src = _state()
    stager = PersistentStager()
    first = stager.stage(src).result()
    ptrs = _ptrs(first)
    src["model"]["w"].mul_(-2)
    src["optim"]["state"]["w"]["step"] += 1
    src["optim"]["param_groups"][0]["lr"] = 0.05
    src["extra"] = json.dumps({"step": 4})
    second = stager.stage(src).result()
    assert _ptrs(second) == ptrs and stager.builds == 1  # the same host buffers
    _assert_equal(second, src)
    assert json.loads(second["extra"]) == {"step": 4}
    assert second["optim"]["param_groups"] is not src["optim"]["param_groups"]
    stager.close()


@pytest.mark.parametrize(
    "change",
    ["shape", "dtype", "new key", "removed key"],
)
def test_a_structure_change_rebuilds_the_buffers(change):
    src = _state()
    stager = PersistentStager()
    stager.stage(src).result()
    stager.stage(src).result()
    assert stager.builds == 1
    if change == "shape":
        src["model"]["w"] = torch.randn(9, 4)
    elif change == "dtype":
        src["model"]["w"] = src["model"]["w"].double()
    elif change == "new key":
        src["model"]["b"] = torch.ones(4)
    else:
        del src["model"]["ids"]
    staged = stager.stage(src).result()
    assert stager.builds == 2
    _assert_equal(staged, src)
    stager.stage(src).result()
    assert stager.builds == 2
    stager.close()


@pytest.fixture
def world_of_one(tmp_path):
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


def test_a_dtensor_is_staged_as_a_dtensor_around_a_host_copy_of_its_shard(world_of_one):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (1,))
    d = distribute_tensor(torch.arange(24.0).reshape(6, 4), mesh, [Shard(0)])
    stager = PersistentStager()
    staged = stager.stage({"w": d, "n": 1}).result()["w"]
    assert isinstance(staged, DTensor)
    assert staged.device_mesh == mesh and staged.placements == d.placements
    assert staged.shape == d.shape and staged.stride() == d.stride()
    assert torch.equal(staged.to_local(), d.to_local())
    assert staged.to_local().data_ptr() != d.to_local().data_ptr()
    ptr = staged.to_local().data_ptr()
    with torch.no_grad():
        d.to_local().add_(1)
    again = stager.stage({"w": d, "n": 2}).result()["w"]
    assert again.to_local().data_ptr() == ptr and torch.equal(again.to_local(), d.to_local())
    stager.close()


def _trainer(tmp_path, device):
    cfg = TrainConfig(
        run_dir=str(tmp_path / "run"),
        preset="tiny",
        steps=1000,
        log_every=1000,
        ckpt_every=10**6,
        keep_last=10,
        device=device,
        preflight=False,
    )
    tr = Trainer(cfg)
    tr.setup()
    return tr


def _async_saves_match_sync_saves(tmp_path, device):
    """Three async saves in one trainer process, each next to a synchronous save of the same
    state at the same moment (plain dcp.save, no stager) into another directory; training
    goes on right after each async save. The checkpoints must be bitwise identical."""
    tr = _trainer(tmp_path, device)
    try:
        ref = CheckpointManager(tmp_path / "sync", keep_last=10)
        steps = []
        for _ in range(3):
            tr.train_step()
            ref.save(tr.step, tr._model_optim_state(), tr._extra())
            tr.save("async")
            steps.append(tr.step)
            tr.train_step()  # mutates parameters and moments while the save is in flight
            tr.train_step()
        tr.ckpt.wait()
        assert tr.ckpt.staging_info()["builds"] == 1  # one set of buffers for all saves
        assert [s.mode for s in tr.saves] == ["async"] * 3
    finally:
        tr.close()
    ours = list_checkpoints(tmp_path / "run" / "checkpoints")
    assert [int(p.name[5:]) for p in ours] == steps
    for step in steps:
        a = read_full_state(tmp_path / "sync" / f"step_{step:08d}")
        b = read_full_state(tmp_path / "run" / "checkpoints" / f"step_{step:08d}")
        assert sum(k.startswith("model.") for k in b) > 10
        diffs = compare_states(a, b)
        assert not diffs, f"step {step}:\n" + "\n".join(diffs[:10])
        assert json.loads(b["extra"])["step"] == step  # copied by value at each save
        assert a["rng.rank_0"] == b["rng.rank_0"]


def test_three_async_saves_in_one_process_equal_sync_saves(tmp_path, monkeypatch):
    monkeypatch.delenv(FAULTS_ENV, raising=False)
    _async_saves_match_sync_saves(tmp_path, "cpu")


@pytest.mark.slow  # one torchrun launch: 5-10 s on 2 cores
def test_two_rank_fsdp_async_saves_equal_a_sync_run(tmp_path, reference_run):
    """The reference run (2 gloo ranks, FSDP2) saved asynchronously at steps 3, 6 and 9 in one
    process per rank; a run saving synchronously must have the same state at 6 and 9 (the
    2nd and 3rd async saves, through reused buffers)."""
    done = runner.launch(tmp_path, nproc=2, **{**RUN, "ckpt_mode": "sync", "keep_last": 5})
    assert done.returncode == 0, done.output[-3000:]
    for step in (6, 9):
        name = f"step_{step:08d}"
        a = read_full_state(reference_run / "checkpoints" / name)
        b = read_full_state(tmp_path / "checkpoints" / name)
        assert sum(k.startswith("model.") for k in a) > 10
        diffs = compare_states(a, b)
        assert not diffs, f"{name}:\n" + "\n".join(diffs[:10])
        assert json.loads(a["extra"])["step"] == step
    manifest = json.loads(
        (reference_run / "checkpoints" / "step_00000009" / "manifest.json").read_text()
    )
    assert manifest["save_mode"] == "async" and manifest["world_size"] == 2


def _model_state():
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))
    return model, {"model": model.state_dict()}


def test_prestage_builds_the_buffers_the_first_save_then_uses(tmp_path):
    model, state = _model_state()
    mgr = CheckpointManager(tmp_path, keep_last=5)
    mgr.prestage(state, background=True)
    mgr.wait_prestage()
    assert mgr.staging_info()["builds"] == 1
    mgr.save(1, state, {"step": 1}, mode="async")
    mgr.wait()
    assert mgr.staging_info()["builds"] == 1  # the save found its buffers ready
    with torch.no_grad():
        model[0].weight.add_(1)
    mgr.save(2, {"model": model.state_dict()}, {"step": 2}, mode="async")
    mgr.wait()
    got = read_full_state(tmp_path / "step_00000002")
    assert torch.equal(got["model.0.weight"], model[0].weight)
    mgr.release_staging()
    assert mgr.staging_info() is None
    mgr.close()


@pytest.mark.filterwarnings(
    "ignore:torch.distributed is disabled"
)  # DCP's writer thread, 1 process
def test_dcp_stager_option_still_saves_and_a_bad_name_is_refused(tmp_path):
    model, state = _model_state()
    mgr = CheckpointManager(tmp_path, stager="dcp")
    for step in (1, 2):
        mgr.save(step, state, {"step": step}, mode="async")
        mgr.wait()
    assert verify_checkpoint(tmp_path / "step_00000002").ok and mgr.staging_info() is None
    got = read_full_state(tmp_path / "step_00000002")
    assert torch.equal(got["model.1.bias"], model[1].bias)
    mgr.close()
    with pytest.raises(ValueError, match="stager must be"):
        CheckpointManager(tmp_path / "x", stager="fast")


def test_a_staging_failure_is_not_committed_and_later_saves_go_sync(tmp_path, monkeypatch):
    def broken_build(self, leaves, signature):
        raise RuntimeError("cannot allocate staging buffers")

    monkeypatch.setattr(PersistentStager, "_build", broken_build)
    warnings = []
    model, state = _model_state()
    mgr = CheckpointManager(tmp_path, keep_last=5, warn=warnings.append)
    stats = mgr.save(1, state, {"step": 1}, mode="async")  # does not raise in the training loop
    assert stats.mode == "async"
    assert mgr.wait_staging() >= 0  # nor here
    second = mgr.save(2, state, {"step": 2}, mode="async")
    assert second.mode == "sync" and mgr.async_disabled
    assert len(warnings) == 1 and "cannot allocate staging buffers" in warnings[0]
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000002"]
    assert read_latest(tmp_path) == "step_00000002"
    mgr.close()


# --- GPU ----------------------------------------------------------------------------------


def _need_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


@pytest.mark.gpu
def test_gpu_staging_is_pinned_reused_and_ordered_with_the_current_stream():
    _need_cuda()
    big = torch.zeros(16 << 20, device="cuda")  # 64 MiB: a registered mapping of its own
    small = torch.zeros(1000, device="cuda")  # from the CUDA host allocator
    a = torch.randn(4096, 4096, device="cuda")
    stager = PersistentStager()
    for round_ in (1, 2, 3):
        # Queued on the current stream before stage(): the staging copy must see its result.
        for _ in range(20):
            a = a @ a.T / 4096
        big.fill_(float(round_))
        small.fill_(float(-round_))
        fut = stager.stage({"big": big, "small": small, "step": torch.tensor(round_)})
        assert stager.wait_on_current_stream()
        big.fill_(99.0)  # after the copy, on the current stream: must not reach the staged dict
        small.fill_(99.0)
        staged = fut.result()
        assert staged["big"].is_pinned() and staged["small"].is_pinned()
        assert torch.all(staged["big"] == round_) and torch.all(staged["small"] == -round_)
        assert staged["step"].item() == round_
        if round_ == 1:
            ptrs = _ptrs(staged)
        assert _ptrs(staged) == ptrs
    info = stager.last_build
    assert stager.builds == 1 and info["pinned_bytes"] >= big.nbytes + small.nbytes
    stager.close()


@pytest.mark.gpu
def test_gpu_three_async_saves_in_one_process_equal_sync_saves(tmp_path, monkeypatch):
    _need_cuda()
    monkeypatch.delenv(FAULTS_ENV, raising=False)
    _async_saves_match_sync_saves(tmp_path, "cuda")
