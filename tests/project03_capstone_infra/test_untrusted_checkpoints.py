"""Checkpoint files as untrusted input: a crafted pickle whose manifest was updated to match runs
nothing (resume, `checkpoint verify / compare / list`), malformed manifests are reported and skipped,
names and links cannot lead outside the checkpoint root, and retention counts only checkpoints
that verify. Each attack is first shown to be live against DCP's own readers, so that the
assertions that it runs nothing cannot pass vacuously."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict

from project03_capstone_infra.__main__ import main as package_main
from project03_capstone_infra.checkpoint.layout import (
    MANIFEST,
    QUARANTINE,
    CheckpointError,
    list_checkpoints,
)
from project03_capstone_infra.checkpoint.manager import CheckpointManager
from project03_capstone_infra.checkpoint.safe_read import UnsafeCheckpointError, read_full_state
from project03_capstone_infra.checkpoint.state import capture_rng_state
from project03_capstone_infra.checkpoint.verify import verify_checkpoint


def _model_and_opt(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    return model, opt


def _state(model, opt):
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd}


def _steps(root):
    return [int(p.name.split("_")[1]) for p in list_checkpoints(root)]


def _saved(root, steps=(1, 2), **kw):
    model, opt = _model_and_opt()
    mgr = CheckpointManager(root, keep_last=10, **kw)
    for s in steps:
        mgr.save(s, _state(model, opt), {"step": s})
    mgr.close()
    return root / f"step_{steps[-1]:08d}"


class RunsCode:
    """Unpickling this runs `exec`, which writes the marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


def _rehash(step_dir, name):
    """What an attacker who can write the files does: update the manifest to match."""
    m = json.loads((step_dir / MANIFEST).read_text())
    data = (step_dir / name).read_bytes()
    m["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (step_dir / MANIFEST).write_text(json.dumps(m))


def _craft_metadata(step_dir, marker):
    """A `.metadata` that is still DCP's Metadata, with a payload that runs code on unpickling."""
    with open(step_dir / ".metadata", "rb") as f:
        md = pickle.load(f)  # our own file, written by the test above: trusted here
    md.storage_meta.modules = [RunsCode(marker)]
    (step_dir / ".metadata").write_bytes(pickle.dumps(md))
    _rehash(step_dir, ".metadata")


@pytest.fixture
def crafted(tmp_path):
    """root with a good step 1 and a step 2 whose `.metadata` runs code; the manifest matches."""
    root = tmp_path / "ckpt"
    newest = _saved(root)
    marker = tmp_path / "marker"
    _craft_metadata(newest, marker)
    # The payload is live: torch's own reader runs it.
    dcp.FileSystemReader(str(newest)).read_metadata()
    assert marker.read_text() == "ran"
    marker.unlink()
    return root, newest, marker


def test_crafted_metadata_runs_nothing_on_verify_list_compare(crafted, capsys):
    root, newest, marker = crafted
    info = verify_checkpoint(newest)
    assert not info.ok and "builtins.exec" in info.problems[0] and "refused" in info.problems[0]
    assert package_main(["checkpoint", "verify", str(root)]) == 1
    out = capsys.readouterr().out
    assert "step_00000001: ok" in out and "step_00000002: FAILED" in out and "builtins.exec" in out
    assert package_main(["checkpoint", "list", str(root)]) == 0
    assert "BAD" in capsys.readouterr().out
    assert package_main(["checkpoint", "compare", str(root / "step_00000001"), str(newest)]) == 1
    assert "builtins.exec" in capsys.readouterr().out
    with pytest.raises(UnsafeCheckpointError, match="builtins.exec"):
        read_full_state(newest)  # the raw reader (it does not hash) refuses too
    assert not marker.exists()


def test_crafted_metadata_runs_nothing_on_resume(crafted):
    root, newest, marker = crafted
    model, opt = _model_and_opt(seed=1)
    with pytest.raises(CheckpointError, match="builtins.exec"):
        CheckpointManager(root).load(_state(model, opt), newest)  # an explicit --resume PATH
    res = CheckpointManager(root).load(_state(model, opt))  # auto: falls back, quarantines
    assert res.step == 1 and "builtins.exec" in res.skipped[0][1]
    assert _steps(root) == [1]
    shutil.rmtree(root / "step_00000001")
    with pytest.raises(CheckpointError, match="refusing to start over"):
        CheckpointManager(root).load(_state(model, opt))
    assert not marker.exists()


def test_crafted_metadata_only_checkpoint_stops_the_trainer(tmp_path, monkeypatch, capsys):
    from project03_capstone_infra.faults import FAULTS_ENV
    from project03_capstone_infra.train import main

    monkeypatch.delenv(FAULTS_ENV, raising=False)
    run = tmp_path / "run"
    args = ["--run-dir", str(run), "--preset", "tiny", "--ckpt-every", "3", "--log-every", "100"]
    assert main([*args, "--steps", "3"]) == 0
    marker = tmp_path / "marker"
    _craft_metadata(run / "checkpoints" / "step_00000003", marker)
    capsys.readouterr()
    assert main([*args, "--steps", "6"]) == 1
    err = capsys.readouterr().err
    assert "no good checkpoint" in err and "builtins.exec" in err
    assert not marker.exists()


def test_crafted_non_tensor_entry_runs_nothing(tmp_path):
    """The JSON blob replaced by a torch.save pickle that runs code, written through DCP and
    committed with a matching manifest (the files an attacker would produce)."""
    root = tmp_path / "ckpt"
    _saved(root, steps=(1,))
    marker = tmp_path / "marker"
    model, opt = _model_and_opt()
    mgr = CheckpointManager(root, keep_last=10)
    mgr._state = lambda state, extra: {
        **state,
        "extra": RunsCode(marker),
        "rng.rank_0": capture_rng_state(),
    }
    mgr.save(2, _state(model, opt), {})
    newest = root / "step_00000002"
    # Live: DCP's default planner unpickles it with weights_only=False.
    with warnings.catch_warnings():  # "torch.distributed is disabled ...": intended here
        warnings.simplefilter("ignore", UserWarning)
        dcp.load({"extra": ""}, storage_reader=dcp.FileSystemReader(str(newest)), no_dist=True)
    assert marker.read_text() == "ran"
    marker.unlink()
    info = verify_checkpoint(newest)
    assert not info.ok and "'extra'" in info.problems[0] and "weights_only" in info.problems[0]
    with pytest.raises(CheckpointError, match="weights_only"):
        read_full_state(newest)
    res = CheckpointManager(root).load(_state(*_model_and_opt(seed=1)))
    assert res.step == 1 and "weights_only" in res.skipped[0][1]
    assert not marker.exists()


# --- malformed manifests: reported, skipped, quarantined; never a crash -----------------------


def _manifest_cases():
    def edit(fn):
        def apply(step_dir):
            m = json.loads((step_dir / MANIFEST).read_text())
            fn(m)
            (step_dir / MANIFEST).write_text(json.dumps(m))

        return apply

    def write(text):
        return lambda step_dir: (step_dir / MANIFEST).write_text(text)

    def directory(step_dir):
        (step_dir / MANIFEST).unlink()
        (step_dir / MANIFEST).mkdir()

    def first(m):
        return next(iter(m["files"].values()))

    return {
        "a number": (write("5"), "expected a JSON object, got a number"),
        "a string": (write('"step_00000002"'), "got a string"),
        "null": (write("null"), "got null"),
        "files as a list": (edit(lambda m: m.update(files=list(m["files"]))), "'files' must be"),
        "an entry lacks bytes": (edit(lambda m: first(m).pop("bytes")), "lacks 'bytes'"),
        "bytes as a string": (edit(lambda m: first(m).update(bytes="12")), "non-negative int"),
        "negative bytes": (edit(lambda m: first(m).update(bytes=-1)), "non-negative int"),
        "sha256 not hex": (edit(lambda m: first(m).update(sha256="x" * 64)), "hex digits"),
        "step a string": (edit(lambda m: m.update(step="2")), "'step' must be"),
        "lacks world_size": (edit(lambda m: m.pop("world_size")), "lacks 'world_size'"),
        "a directory": (directory, "cannot be read"),
        "NaN": (write('{"step": NaN}'), "not valid JSON"),
        "deeply nested": (write("[" * 100000 + "]" * 100000), "not valid JSON"),
        "not UTF-8": (lambda d: (d / MANIFEST).write_bytes(b"\xff\xfe{"), "not valid JSON"),
        "a name outside": (
            edit(lambda m: m["files"].update({"../step_00000001/__0_0.distcp": first(m)})),
            "is not one DCP writes",
        ),
        "an absolute name": (
            edit(lambda m: m["files"].update({"/etc/hostname": first(m)})),
            "is not one DCP writes",
        ),
    }


MANIFEST_CASES = _manifest_cases()


@pytest.mark.parametrize("case", list(MANIFEST_CASES))
def test_malformed_manifest_is_reported_and_the_next_good_one_loads(tmp_path, case, capsys):
    damage, why = MANIFEST_CASES[case]
    root = tmp_path / "ckpt"
    newest = _saved(root)
    damage(newest)
    info = verify_checkpoint(newest)
    assert not info.ok and why in info.problems[0], info.problems
    assert package_main(["checkpoint", "list", str(root)]) == 0
    assert package_main(["checkpoint", "verify", str(root)]) == 1
    assert "step_00000002: FAILED" in capsys.readouterr().out
    res = CheckpointManager(root).load(_state(*_model_and_opt(seed=1)))
    assert res.step == 1 and res.skipped[0][0] == "step_00000002" and why in res.skipped[0][1]
    (q,) = (root / QUARANTINE).iterdir()
    assert q.name.startswith("step_00000002")


# --- names and links: nothing outside the checkpoint root ------------------------------------


def test_a_shard_that_is_a_link_is_refused(tmp_path):
    root = tmp_path / "ckpt"
    newest = _saved(root)
    outside = tmp_path / "outside.distcp"
    shard = newest / "__0_0.distcp"
    shutil.copy(shard, outside)
    shard.unlink()
    shard.symlink_to(outside)  # same bytes, same hash: only the link gives it away
    info = verify_checkpoint(newest)
    assert not info.ok and "symbolic link" in info.problems[0]
    res = CheckpointManager(root).load(_state(*_model_and_opt(seed=1)))
    assert res.step == 1


def test_metadata_pointing_at_a_file_the_manifest_does_not_name(tmp_path):
    root = tmp_path / "ckpt"
    newest = _saved(root)
    with open(newest / ".metadata", "rb") as f:
        md = pickle.load(f)
    for info in md.storage_data.values():
        info.relative_path = "../step_00000001/__0_0.distcp"
    (newest / ".metadata").write_bytes(pickle.dumps(md))
    _rehash(newest, ".metadata")
    info = verify_checkpoint(newest)
    assert not info.ok and "a file the manifest does not name" in info.problems[0]


def test_a_file_the_manifest_does_not_name_is_refused(tmp_path):
    root = tmp_path / "ckpt"
    newest = _saved(root)
    (newest / "__0_1.distcp").write_bytes(b"planted")
    info = verify_checkpoint(newest)
    assert not info.ok and "__0_1.distcp: not named in the manifest" in info.problems[0]


def test_a_linked_step_directory_is_refused_quarantined_as_a_link_and_pruned_around(tmp_path):
    root = tmp_path / "ckpt"
    _saved(root, steps=(1, 2))
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(root / "step_00000002", elsewhere)  # a valid checkpoint outside the root
    before = sorted(p.name for p in elsewhere.iterdir())
    link = root / "step_00000003"
    link.symlink_to(elsewhere, target_is_directory=True)
    info = verify_checkpoint(link)
    assert not info.ok and "symbolic link" in info.problems[0]
    # Retention walks past the link (not counted, left alone) and does not crash on it.
    assert package_main(["checkpoint", "prune", str(root), "--keep-last", "1"]) == 0
    assert _steps(root) == [2, 3] and link.is_symlink()
    warnings = []
    res = CheckpointManager(root, warn=warnings.append).load(_state(*_model_and_opt(seed=1)))
    assert res.step == 2
    assert sorted(p.name for p in elsewhere.iterdir()) == before  # nothing written through it
    moved = [p for p in (root / QUARANTINE).iterdir() if p.is_symlink()]
    assert (
        len(moved) == 1 and (root / QUARANTINE / f"{moved[0].name}.QUARANTINE_REASON.txt").exists()
    )


def test_a_failed_quarantine_does_not_stop_loading_the_older_checkpoint(tmp_path):
    root = tmp_path / "ckpt"
    newest = _saved(root)
    (newest / "__0_0.distcp").write_bytes(b"")
    (root / QUARANTINE).write_text("a file where the quarantine directory would go")
    warnings = []
    res = CheckpointManager(root, warn=warnings.append).load(_state(*_model_and_opt(seed=1)))
    assert res.step == 1
    assert any("could not move step_00000002" in w for w in warnings), warnings
    assert _steps(root) == [1, 2]  # skipped in place


# --- retention counts only checkpoints that verify --------------------------------------------


def _flip(step_dir):
    shard = step_dir / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))


def test_prune_with_a_corrupt_newest_keeps_the_newest_valid_one(tmp_path, capsys):
    root = tmp_path / "ckpt"
    newest = _saved(root, steps=(1, 2, 3, 4))
    _flip(newest)
    assert package_main(["checkpoint", "prune", str(root), "--keep-last", "1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would remove: step_00000001, step_00000002" in out and "step_00000004" in out
    assert package_main(["checkpoint", "prune", str(root), "--keep-last", "1"]) == 0
    assert _steps(root) == [3, 4]  # 3: the newest that verifies; 4 left for the loader
    assert verify_checkpoint(root / "step_00000003").ok
    model, opt = _model_and_opt(seed=1)
    assert CheckpointManager(root).load(_state(model, opt)).step == 3


def test_prune_with_every_checkpoint_corrupt_removes_nothing(tmp_path, capsys):
    root = tmp_path / "ckpt"
    _saved(root, steps=(1, 2, 3))
    for d in list_checkpoints(root):
        _flip(d)
    assert package_main(["checkpoint", "prune", str(root), "--keep-last", "1"]) == 0
    assert _steps(root) == [1, 2, 3] and "removed: nothing" in capsys.readouterr().out


def test_retention_after_a_save_skips_a_corrupt_checkpoint(tmp_path):
    model, opt = _model_and_opt()
    warnings = []
    mgr = CheckpointManager(tmp_path, keep_last=2, warn=warnings.append)
    for s in (1, 2, 3):
        mgr.save(s, _state(model, opt), {"step": s})
    _flip(tmp_path / "step_00000003")
    mgr.save(4, _state(model, opt), {"step": 4})
    assert _steps(tmp_path) == [2, 3, 4]  # 4 and 2 verify; 3 is not counted and not removed
    assert any("step_00000003 does not verify" in w for w in warnings), warnings
    mgr.close()


# --- checkpoint verify on one step directory, and when there is nothing -----------------------


def test_ckpt_verify_a_step_directory_and_nothing(tmp_path, capsys):
    root = tmp_path / "ckpt"
    newest = _saved(root)
    assert package_main(["checkpoint", "verify", str(newest)]) == 0
    assert capsys.readouterr().out.startswith("step_00000002: ok (")
    (newest / "__0_0.distcp").write_bytes(b"x")
    assert package_main(["checkpoint", "verify", str(newest)]) == 1
    empty = tmp_path / "empty"
    empty.mkdir()
    assert package_main(["checkpoint", "verify", str(empty)]) == 1
    assert "nothing verified" in capsys.readouterr().out


def test_latest_and_manifest_keep_the_umask_mode(tmp_path):
    old = os.umask(0o022)
    try:
        _saved(tmp_path / "ckpt", steps=(1,))
    finally:
        os.umask(old)
    assert (tmp_path / "ckpt" / "latest").stat().st_mode & 0o777 == 0o644
