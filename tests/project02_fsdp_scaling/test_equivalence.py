"""Data parallelism must not change the math: 2 gloo processes of FSDP2 reach the parameters and
the loss and gradient-norm curves of one process on the full batch, to float64 rounding; DeepSpeed
ZeRO-3 (float32 only) reaches the same curves to float32 rounding. A planted sharding bug fails
both comparisons."""

from __future__ import annotations

import json

import pytest
import torch

from project02_fsdp_scaling.config import DeepSpeedConfig
from project02_fsdp_scaling.deepspeed_zero3 import deepspeed_available
from shared.distributed import DistInfo
from shared.model import build_model

from .conftest import run_torchrun

pytestmark = pytest.mark.slow

# 5 AdamW steps (1 warm-up + 4) at a learning rate large enough to move every weight.
LR = 3e-3
COMMON = f"--preset tiny --global-batch 8 --steps 4 --warmup-steps 1 --lr {LR}".split()
COMMON += ["--grad-clip", "1.0", "--log-every", "0"]
FP64 = ["--precision", "fp64"]
# What torchrun runs: (module, arguments before the flags)
TRAIN = ("project02_fsdp_scaling", "train")
DEEPSPEED = ("project02_fsdp_scaling", "deepspeed")
PLANTED = ("tests.project02_fsdp_scaling._planted_bug",)

# Why the tolerances hold on any CPU. The runs compute the same arithmetic except for the order
# of sums: one process sums the step's 8 x 64 = 512 tokens at once, two ranks sum 2 micro-batches
# of 128 each and add the halves in the reduce-scatter, and BLAS blocks differently for other
# shapes. Summing n terms in any order changes the result by at most (n - 1) * u * sum|terms|; a
# value at the end of a chain of sums carries the sum of the chain's lengths. For the tiny model
# (d 64, 2 blocks, head dim 16, SwiGLU 192, vocabulary 256) the forward chain is ~2,000 terms long
# (per block: norm 64, qkv 64, scores 16, softmax and values 64, out 64, norm 64, w1/w3 64, w2
# 192; then head 64, log-sum-exp 256, mean over 512 tokens) and the backward as long again: a
# gradient or loss is off by at most ~4,000 u relative to the sum of its terms' magnitudes, which
# is O(1) or less (RMSNorm keeps activations O(1); each token's loss gradient carries 1/512).
#
# FSDP in float64 (u = 2**-53 = 1.1e-16): |d grad| < 4,000 u = 4.4e-13. AdamW's update
# g_hat / (sqrt(v_hat) + eps) moves by at most 1/eps per unit of gradient change (its derivative
# is eps / (|g| + eps)**2 <= 1 / eps at the first step, smaller after), so a step moves a weight
# by at most LR / 1e-8 * 4.4e-13 = 1.3e-7 (the worst case: a gradient within eps of zero), five
# steps by 6.6e-7 to first order. ATOL = 1e-5 leaves a factor of 15 for the second-order growth
# (later gradients changing through the weights); the typical difference is ~1e-14.
ATOL = 1e-5
# The curves are sums (the mean token loss; the squared gradients of the norm), without Adam's
# division: at step 1 (same weights) the loss is off by at most ~4,000 u relative, the gradient
# norm by that plus its own sum over at most all P = 139,584 squares (P u on the square, half of
# it on the norm). Later they also differ through the weights; Adam divides a gradient difference
# by |g|, but the loss multiplies a weight difference by |g| again, so to first order the next
# loss moves by at most LR * ||d grad||_1 <= LR * sqrt(P) * ||grad|| * 4,000 u per step
# (||grad|| < 1.5 before clipping), and the gradient norm, a smooth function of the same weights,
# by a like fraction.
# - float64: loss 4.4e-13 at step 1 and 3e-3 * 374 * 1.5 * 4.4e-13 = 7e-13 more per step, norm
#   P u / 2 = 8e-12 more: < 2e-11 relative over 5 steps. REL_F64 = 1e-9 (typical: 1e-16).
# - float32 (u = 2**-24 = 6e-8; DeepSpeed cannot train in float64): loss 2.4e-4 at step 1 and
#   3e-3 * 374 * 1.5 * 2.4e-4 = 4e-4 more per step on a loss of ~5 (8e-5 relative): at most
#   5.6e-4 relative over 5 steps, REL_F32_LOSS = 1e-3; norm P u / 2 = 4.2e-3 more: at most 5e-3,
#   REL_F32_NORM = 1e-2 (typical for both: 1e-7).
# A sharding bug moves the weights by the learning rate's order (1e-3 to 3e-2) and the gradient
# norm by 0.3 to 1 (data read twice, gradients summed instead of averaged): the planted-bug test.
REL_F64 = 1e-9
REL_F32_LOSS = 1e-3
REL_F32_NORM = 1e-2
N_PARAMS = 139_584


def _params(path) -> dict[str, torch.Tensor]:
    return torch.load(path)


def _curves(path) -> tuple[list[float], list[float]]:
    rec = json.loads(path.read_text())
    return rec["losses"], rec["grad_norms"]


def _curve_gaps(run: tuple, ref: tuple) -> tuple[float, float]:
    """Greatest relative difference over the loss curve, and over the gradient-norm curve."""
    # Adam is almost invariant to a constant gradient scale, so parameters alone could miss a
    # sum-instead-of-mean reduction; the pre-clipping gradient norm does not.
    assert [len(c) for c in run] == [len(c) for c in ref]
    loss, norm = (
        max(abs(g - w) / abs(w) for g, w in zip(got, want)) for got, want in zip(run, ref)
    )
    return loss, norm


def _max_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b), sorted(set(a) ^ set(b))
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def _two_ranks(tmp_path, *, entry=TRAIN, dtype=FP64, bug=(), extra=()) -> tuple:
    """Two gloo ranks of local batch 4 in micro-batches of 2 (also checks accumulation)."""
    outputs = ["--save-params", str(tmp_path / "p.pt"), "--out", str(tmp_path / "r.json")]
    run_torchrun(2, *entry, *bug, *COMMON, *dtype, "--micro-batch", "2", *extra, *outputs)
    rec = json.loads((tmp_path / "r.json").read_text())
    assert rec["world_size"] == 2 and rec["backend"] == "gloo"
    return _params(tmp_path / "p.pt"), _curves(tmp_path / "r.json"), rec


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One process, full batch of 8 sequences, no accumulation, float64."""
    d = tmp_path_factory.mktemp("ref")
    run_torchrun(
        1, *TRAIN, *COMMON, *FP64, "--save-params", str(d / "p.pt"), "--out", str(d / "r.json")
    )
    return _params(d / "p.pt"), _curves(d / "r.json")


def test_reference_moved_from_init(reference):
    params, (losses, norms) = reference
    assert all(v.dtype == torch.float64 for v in params.values())
    assert sum(v.numel() for v in params.values()) == N_PARAMS  # the P of the bound above
    init = {k: v.detach() for k, v in build_model("tiny", seed=0).named_parameters()}
    # Training did something: otherwise parity below would be vacuous.
    assert _max_diff(params, init) > 1e-3
    assert len(losses) == 5 and losses[-1] < losses[0]
    assert all(0 < n < 1.5 for n in norms)  # as the bound above takes it


def test_fsdp_two_processes_match_one_process(reference, tmp_path):
    params, curves, rec = _two_ranks(tmp_path)
    assert rec["grad_accum_steps"] == 2 and rec["compute_dtype"] == "float64"
    assert rec["mfu"] is None  # no float64 peak: MFU is n/a, not made up
    assert _max_diff(params, reference[0]) < ATOL
    assert max(_curve_gaps(curves, reference[1])) < REL_F64


def test_parameters_kept_gathered_through_the_step_match_one_process(reference, tmp_path):
    """--no-reshard-after-forward keeps the gathered parameters through both micro-batches of a
    step (resharded after the last backward only): the same arithmetic, so the same bound."""
    params, curves, rec = _two_ranks(tmp_path, extra=["--no-reshard-after-forward"])
    assert rec["grad_accum_steps"] == 2 and rec["config"]["reshard_after_forward"] is False
    assert _max_diff(params, reference[0]) < ATOL
    assert max(_curve_gaps(curves, reference[1])) < REL_F64


def test_the_fused_output_projection_and_loss_match_one_process(reference, tmp_path):
    """--fused-loss (shared.fused_loss: projection and cross-entropy together, gradients formed
    in the forward) changes only the order of the loss's sums: the same float64 bound."""
    params, curves, rec = _two_ranks(tmp_path, extra=["--fused-loss"])
    assert rec["config"]["fused_loss"] is True and rec["compute_dtype"] == "float64"
    assert _max_diff(params, reference[0]) < ATOL
    assert max(_curve_gaps(curves, reference[1])) < REL_F64


@pytest.mark.parametrize("bug", ["same_data", "sum_grads"])
def test_the_comparison_catches_a_sharding_bug(reference, tmp_path, bug):
    params, curves, _ = _two_ranks(tmp_path, entry=PLANTED, bug=(bug,))
    loss_gap, norm_gap = _curve_gaps(curves, reference[1])
    # Far outside the float64 tolerance, and outside the float32 ones used for DeepSpeed.
    assert loss_gap > 1e3 * REL_F64, f"planted {bug} moved the loss by only {loss_gap:.2e}"
    assert norm_gap > 10 * REL_F32_NORM, f"planted {bug} moved the norm by only {norm_gap:.2e}"
    worst = _max_diff(params, reference[0])
    assert worst > 10 * ATOL, f"planted {bug} moved the weights by only {worst:.2e}"
    if bug == "same_data":  # half the data: of the learning rate's order, as the bound says
        assert worst > LR


def test_deepspeed_two_processes_match_fsdp_one_process(reference, tmp_path):
    ok, why = deepspeed_available()
    if not ok:
        pytest.skip(f"{why}: install the deepspeed extra to run this test")
    # float32 against the float64 reference: the gap is DeepSpeed's own float32 rounding. Its
    # weights are not compared: in float32, Adam's division turns a rounding difference on a
    # near-zero gradient into up to 2 x LR per step, as large as a bug's (see the bound above).
    params, curves, rec = _two_ranks(
        tmp_path,
        entry=DEEPSPEED,
        dtype=["--precision", "fp32"],
    )
    assert rec["grad_accum_steps"] == 2 and rec["compute_dtype"] == "float32"
    assert set(params) == set(reference[0])  # the same parameters, under the same names
    loss_gap, norm_gap = _curve_gaps(curves, reference[1])
    assert loss_gap < REL_F32_LOSS and norm_gap < REL_F32_NORM


def test_deepspeed_refuses_float64():
    ok, why = deepspeed_available()
    if not ok:
        pytest.skip(f"{why}: install the deepspeed extra to run this test")
    from project02_fsdp_scaling.deepspeed_zero3 import run_deepspeed

    info = DistInfo(0, 0, 1, "gloo", torch.device("cpu"))
    with pytest.raises(ValueError, match="precision 'fp64' is for the FSDP path only"):
        run_deepspeed(DeepSpeedConfig(precision="fp64"), info)
