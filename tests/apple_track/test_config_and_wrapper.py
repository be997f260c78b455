"""What the track needs only PyTorch for: its config and bad-input errors, the fixed-shape export
wrapper, the evaluation batch, the parity measure and the tolerances. Runs in the main tier."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from apple_track import export
from apple_track.model import (
    COREML_VARIANTS,
    EVAL_STEP,
    TOLERANCES,
    VARIANTS,
    ExportConfig,
    FixedShapeLM,
    build_export_model,
    eval_batch,
    parity,
    within_tolerance,
)
from shared.data import SyntheticTokens
from shared.model import build_model
from shared.testing import assert_one_line_error, run_entry


def test_unknown_preset_is_a_clear_error():
    with pytest.raises(ValueError, match=r"unknown preset 'huge'.*'1b'.*'tiny'"):
        ExportConfig(preset="huge")


@pytest.mark.parametrize(
    "runtime,bad",
    [("coreml", "int4"), ("coreml", "palettize2"), ("litert", "fp16"), ("mlx", "q2")],
)
def test_unsupported_compression_is_a_clear_error(runtime, bad):
    allowed = ", ".join(VARIANTS[runtime])
    with pytest.raises(ValueError, match=rf"unsupported {runtime} variant '{bad}'") as e:
        ExportConfig(**{runtime: (bad,)})
    assert allowed in str(e.value)


def test_other_bad_configs():
    with pytest.raises(TypeError, match="sequence of variant names"):
        ExportConfig(coreml="int8")  # a string, not a sequence of names
    with pytest.raises(ValueError, match="twice"):
        ExportConfig(litert=("int8", "int8"))
    with pytest.raises(ValueError, match="seq_len 65 exceeds the model's max_seq_len 64"):
        ExportConfig(seq_len=65)
    with pytest.raises(ValueError, match="batch must be a positive integer"):
        ExportConfig(batch=0)
    with pytest.raises(ValueError, match="train_steps"):
        ExportConfig(train_steps=-1)
    with pytest.raises(ValueError, match=r"unknown model override\(s\) \['width'\]"):
        ExportConfig(overrides={"width": 3})
    with pytest.raises(ValueError, match="divisible by n_heads"):
        ExportConfig(overrides={"dim": 66})


def test_config_accepts_overrides_and_subsets():
    cfg = ExportConfig(
        overrides={"dim": 128, "max_seq_len": 256},
        seq_len=128,
        coreml=("int8",),
        litert=(),
        mlx=("fp32", "q4"),
    )
    assert cfg.model_args().dim == 128
    d = cfg.to_dict()
    assert d["coreml"] == ("int8",) and d["litert"] == () and d["num_params"] > 139_584


def test_every_variant_has_a_stated_tolerance():
    pairs = {(rt, v) for rt, names in VARIANTS.items() for v in names}
    assert pairs == set(TOLERANCES)
    # compressing more may not be held to a tighter bound than compressing less
    order = list(COREML_VARIANTS)
    bounds = [TOLERANCES[("coreml", v)]["rel_l2"] for v in order]
    assert bounds == sorted(bounds)


def test_the_wrapper_pins_the_shape_and_takes_int32_tokens():
    model = build_model("tiny", seed=0).eval()
    wrapper = FixedShapeLM(model, batch=2, seq_len=16).eval()
    tokens, targets = wrapper.example_input(seed=3)
    assert tokens.dtype == torch.int32 and tokens.shape == (2, 16)
    assert targets.dtype == torch.int64 and targets.shape == (2, 16)
    with torch.no_grad():
        torch.testing.assert_close(wrapper(tokens), model(tokens.long()), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"exported shape \(2, 16\), got \(2, 17\)"):
        wrapper(torch.zeros(2, 17, dtype=torch.int32))
    with pytest.raises(ValueError, match="exceeds max_seq_len"):
        FixedShapeLM(model, batch=1, seq_len=65)


def test_eval_batch_is_held_out_and_deterministic():
    x, y = eval_batch(256, 2, 32, seed=0)
    x2, _ = eval_batch(256, 2, 32, seed=0)
    assert torch.equal(x, x2)
    assert torch.equal(x[:, 1:].long(), y[:, :-1])  # targets are the next tokens
    # far from the training stream's first steps
    first, _ = SyntheticTokens(256, 32, 2, 0).next_batch()
    assert not torch.equal(first.to(torch.int32), x)
    assert EVAL_STEP >= 100_000


def test_parity_measures():
    ref = torch.tensor([[[1.0, 2.0, 0.0], [0.0, 0.0, 3.0]]])  # (B=1, S=2, V=3)
    out = ref.clone()
    out[0, 0, 0] = 2.5  # arg-max of position 0 moves from token 1 to token 0
    p = parity(out, ref, targets=torch.tensor([[1, 2]]))
    assert p["max_abs"] == pytest.approx(1.5)
    assert p["rel_l2"] == pytest.approx(1.5 / (1 + 4 + 9) ** 0.5)
    assert p["top1_agree"] == pytest.approx(0.5)
    assert p["loss_delta"] > 0  # the right token lost probability
    same = parity(ref, ref, targets=torch.tensor([[1, 2]]))
    assert same["max_abs"] == 0 and same["rel_l2"] == 0 and same["loss_delta"] == 0
    with pytest.raises(ValueError, match="output shape"):
        parity(ref[:, :1], ref)


def test_within_tolerance_checks_both_bounds():
    tol = TOLERANCES[("litert", "int8")]
    assert within_tolerance("litert", "int8", {"rel_l2": tol["rel_l2"] / 2, "top1_agree": 1.0})
    assert not within_tolerance("litert", "int8", {"rel_l2": tol["rel_l2"] * 2, "top1_agree": 1})
    assert not within_tolerance("litert", "int8", {"rel_l2": 0.0, "top1_agree": 0.5})


def test_brief_training_lowers_the_loss():
    wrapper, losses = build_export_model(ExportConfig(train_steps=40))
    assert not wrapper.training
    assert losses[-1] < losses[0] - 0.5  # from ~ln(256) = 5.5 towards the stream's entropy


def test_cli_rejects_bad_arguments_with_a_message(capsys):
    for argv, message in (
        (["--coreml", "int4"], "unsupported coreml variant 'int4'"),
        (["--preset", "huge"], "unknown preset 'huge'"),
        (["--set", "dim"], "NAME=VALUE"),
        (["--name", "../elsewhere"], "--name must be a plain file stem"),
    ):
        assert_one_line_error(*run_entry(export.main, argv, capsys), message)


def test_profile_rejects_bad_arguments(capsys):
    from apple_track import profile

    for argv, message in (
        (["litert", "fp16"], "unsupported litert variant 'fp16'"),
        (["tensorrt", "fp16"], "'tensorrt'"),
        (["litert", "int8", "--record", "no/such/record.json"], "no result file"),
    ):
        assert_one_line_error(*run_entry(profile.main, argv, capsys), message)


def test_cli_help_runs(repo_root):
    for command in ([], ["export"], ["report"], ["profile"]):
        r = subprocess.run(
            [sys.executable, "-m", "apple_track", *command, "--help"],
            cwd=repo_root,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        assert " ".join(["usage: python -m apple_track", *command]) in r.stdout
