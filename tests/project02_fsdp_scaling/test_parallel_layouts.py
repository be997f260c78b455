"""Every parallel layout computes the same training as one process on the full batch: DDP,
FSDP2, tensor parallel (with and without loss parallel), each pipeline schedule, and the 2-D
layouts FSDP2 x TP and PP x FSDP2, to float64 rounding; a planted bug in TP and in the pipeline
fails the comparison. A checkpoint written under TP=2 loads bitwise under FSDP2 on two ranks,
and that one's bitwise in one process.

The reference is the plainest training there is (`_one_process`): no process group, no
wrapper, one batch of 8 sequences a step. Each torchrun launch runs several layouts in sequence
(`_layouts_worker`, started as a world of gloo processes by `run_ranks`): starting them costs
more than training the tiny model.
"""

from __future__ import annotations

import json

import pytest
import torch

from project02_fsdp_scaling.config import TrainConfig
from shared.cli import parse_dataclass

from .conftest import run_ranks

WORKER = "tests.project02_fsdp_scaling._layouts_worker"
# 5 AdamW steps (1 warm-up + 4) of a 4-block tiny model (a pipeline of 2 ranks x 2 stages
# needs 4 blocks), in float64.
LR = 3e-3
COMMON = ["--preset", "tiny", "--n-layers", "4", "--global-batch", "8", "--steps", "4"]
COMMON += ["--warmup-steps", "1", "--lr", str(LR), "--log-every", "0", "--precision", "fp64"]

# Tolerances: the derivation of test_equivalence.py, for 4 blocks instead of 2. The layouts
# compute the same sums in other orders (TP splits each row-parallel matmul's in-features over
# the ranks and adds the halves in a reduce-scatter; a pipeline or DDP sums micro-batch
# gradients; FSDP2 and DDP add ranks' gradients). Four blocks make the forward chain of sums
# ~3,200 terms long (~590 per block, ~850 for head, log-sum-exp and mean) and the backward as
# long again: a gradient is off by at most ~6,400 u = 7.1e-13 (u = 2**-53) relative to the sum
# of its terms' magnitudes, which is O(1). AdamW turns that into at most LR / eps * 7.1e-13 =
# 2.1e-7 per step on a weight, 1.1e-6 over five steps to first order: ATOL = 1e-5 leaves a
# factor of 9 for the second order. The loss and gradient-norm curves: 7.1e-13 at step 1, plus
# P u / 2 = 1.4e-11 on the norm (P = 246,336 squares) and LR * sqrt(P) * 1.5 * 7.1e-13 =
# 1.6e-12 per step through the weights: < 1e-10 relative over five steps, REL = 1e-9. Measured
# differences are ~1e-13 (weights) and ~1e-16 (curves). A planted bug moves the weights by the
# learning rate's order or the gradient norm by a factor (see the planted-bug tests).
ATOL = 1e-5
REL = 1e-9


def _one_process(flags: list[str]) -> dict:
    """The training of `flags` in this process with no distributed code: the plain model,
    AdamW (the trainer's parameter groups), clipping, the full batch each step."""
    from project02_fsdp_scaling.train import build_cpu_model, build_optimizer, cross_entropy
    from shared.data import SyntheticTokens

    cfg = parse_dataclass(TrainConfig, flags)
    assert cfg.lr_warmup_steps == 0 and cfg.precision == "fp64"  # constant LR, no mixed precision
    args = cfg.model_args()
    model = build_cpu_model(args, cfg.seed).to(torch.float64)
    opt = build_optimizer(model, cfg, "cpu")
    data = SyntheticTokens(args.vocab_size, cfg.resolved_seq_len(), cfg.global_batch, 0, 0, 1)
    losses, norms = [], []
    for step in range(cfg.total_steps()):
        x, y = data.batch_at(step)
        loss = cross_entropy(model(x), y)
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)))
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    return {"losses": losses, "grad_norms": norms, "params": params}


def _launch(tmp_path, nproc: int, jobs: list[dict], *, gpu: bool = False) -> dict:
    import os

    out = tmp_path / f"layouts_{nproc}.pt"
    os.environ["P02_LAYOUTS_DEVICE"] = "cuda" if gpu else "cpu"
    try:
        run_ranks(nproc, WORKER, str(out), json.dumps(jobs), timeout=600, gpu=gpu)
    finally:
        del os.environ["P02_LAYOUTS_DEVICE"]
    return torch.load(out)


def _gaps(run: dict, ref: dict) -> tuple[float, float, float]:
    """(greatest weight difference, greatest relative loss gap, same for the gradient norm)."""
    assert set(run["params"]) == set(ref["params"])  # the model's own names, every parameter
    weights = max(float((run["params"][k] - ref["params"][k]).abs().max()) for k in ref["params"])
    curves = [
        max(abs(g - w) / abs(w) for g, w in zip(run[key], ref[key]))
        for key in ("losses", "grad_norms")
    ]
    assert len(run["losses"]) == len(ref["losses"])
    return weights, curves[0], curves[1]


def _job(name: str, *flags: str, bug: str | None = None, common=COMMON) -> dict:
    return {"name": name, "flags": [*common, *flags], "bug": bug}


@pytest.fixture(scope="module")
def reference():
    ref = _one_process(COMMON)
    assert ref["losses"][-1] < ref["losses"][0]  # it trained: parity below is not vacuous
    return ref


TWO_RANKS = [
    _job("fsdp", "--micro-batch", "2"),
    _job("ddp", "--parallel", "ddp", "--micro-batch", "2"),
    _job("tp", "--parallel", "tp"),
    _job("tp-no-loss-parallel", "--parallel", "tp", "--no-loss-parallel"),
    _job("pp-gpipe", "--parallel", "pp", "--pp-schedule", "gpipe"),
    _job("pp-1f1b", "--parallel", "pp", "--pp-schedule", "1f1b"),
    _job("pp-interleaved-1f1b", "--parallel", "pp", "--pp-schedule", "interleaved-1f1b"),
    _job("bug-tp", "--parallel", "tp", bug="tp_qkv_unpermuted"),
    _job("bug-pp", "--parallel", "pp", bug="pp_summed_microbatches"),
]
FOUR_RANKS = [
    _job("fsdp-tp", "--parallel", "fsdp-tp", "--tp", "2"),
    _job("pp-fsdp", "--parallel", "pp-fsdp", "--pp", "2", "--pp-microbatches", "2"),
    _job("pp4-1f1b", "--parallel", "pp", "--pp-microbatches", "4"),
]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    return _launch(tmp_path_factory.mktemp("two"), 2, TWO_RANKS)


@pytest.mark.slow
@pytest.mark.parametrize("name", [j["name"] for j in TWO_RANKS if not j["bug"]])
def test_two_rank_layout_matches_one_process(two_ranks, reference, name):
    weights, loss, norm = _gaps(two_ranks[name], reference)
    assert weights < ATOL and loss < REL and norm < REL, (weights, loss, norm)


@pytest.mark.slow
def test_the_comparison_catches_a_tp_or_pipeline_bug(two_ranks, reference):
    weights, loss, norm = _gaps(two_ranks["bug-tp"], reference)
    # the wrong heads' rows: the loss moves at once and the weights by the learning rate's order
    assert loss > 1e3 * REL and weights > LR, (weights, loss)
    # micro-batch gradients summed: Adam barely sees a constant scale, the gradient norm does
    # (x the 4 micro-batches)
    weights, loss, norm = _gaps(two_ranks["bug-pp"], reference)
    assert norm > 1.0, norm


@pytest.mark.slow
def test_pipeline_records_its_bubble_beside_the_formula(two_ranks):
    for name, v in (("pp-gpipe", 1), ("pp-1f1b", 1), ("pp-interleaved-1f1b", 2)):
        bubble = two_ranks[name]["parallel"]["bubble"]
        # p = 2 ranks, m = 4 micro-batches: (p - 1) / (v m + p - 1)
        assert bubble["formula_share"] == pytest.approx(1 / (v * 4 + 1))
        assert bubble["stages_per_rank"] == v
        # a share of wall time: each rank computes some of the step and waits for some
        assert 0 < bubble["measured_idle_share"] < 1


@pytest.mark.slow
@pytest.mark.parametrize("name", [j["name"] for j in FOUR_RANKS])
def test_four_rank_2d_layout_matches_one_process(tmp_path_factory, reference, name):
    runs = _four_ranks(tmp_path_factory)
    weights, loss, norm = _gaps(runs[name], reference)
    assert weights < ATOL and loss < REL and norm < REL, (weights, loss, norm)
    degrees = runs[name]["parallel"]["degrees"]
    assert degrees["pp"] * degrees["dp"] * degrees["tp"] == 4


_FOUR: dict = {}


def _four_ranks(tmp_path_factory) -> dict:
    if not _FOUR:
        _FOUR.update(_launch(tmp_path_factory.mktemp("four"), 4, FOUR_RANKS))
    return _FOUR


# ---- the fast tier's one representative: TP=2 on a one-block model --------------------------
ONE_BLOCK = [*COMMON[:3], "1", *COMMON[4:6], "--steps", "1", *COMMON[8:]]


def test_tensor_parallel_two_ranks_match_one_process(tmp_path):
    """One world of 2 gloo processes (a few seconds): TP=2 with sequence and loss parallel,
    2 steps. Same bound as above (fewer blocks, fewer steps: only smaller)."""
    ref = _one_process(ONE_BLOCK)
    runs = _launch(tmp_path, 2, [_job("tp", "--parallel", "tp", common=ONE_BLOCK)])
    weights, loss, norm = _gaps(runs["tp"], ref)
    assert weights < ATOL and loss < REL and norm < REL, (weights, loss, norm)
    assert runs["tp"]["parallel"]["degrees"] == {"pp": 1, "dp": 1, "tp": 2}


# ---- checkpoints across layouts ----------------------------------------------------------------
CKPT = ["--preset", "tiny", "--global-batch", "8", "--steps", "2", "--warmup-steps", "0"]
CKPT += ["--lr", str(LR), "--log-every", "0", "--precision", "fp32"]


def _same(a: dict, b: dict) -> None:
    assert set(a) == set(b), sorted(set(a) ^ set(b))
    assert any(k.startswith("optim.state.") for k in a)  # the optimizer moved with the weights
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, differ[:5]


@pytest.mark.slow
def test_a_checkpoint_moves_from_tp_to_fsdp_to_one_process_bitwise(tmp_path):
    a, b = tmp_path / "tp2", tmp_path / "fsdp2"
    two = _launch(
        tmp_path,
        2,
        [
            _job("tp", "--parallel", "tp", "--save-checkpoint", str(a), common=CKPT),
            _job("fsdp", "--resume", str(a), "--save-checkpoint", str(b), common=CKPT),
        ],
    )
    # float32 weights and Adam moments, saved in TP's shards and loaded into FSDP2's: a copy
    _same(two["tp"]["state_end"], two["fsdp"]["state_resumed"])
    one = _launch(tmp_path, 1, [_job("one", "--resume", str(b), common=CKPT)])
    _same(two["fsdp"]["state_end"], one["one"]["state_resumed"])
    # and training went on from there: the resumed runs' losses keep falling
    losses = two["tp"]["losses"] + two["fsdp"]["losses"] + one["one"]["losses"]
    assert losses[-1] < losses[0]


@pytest.mark.slow
def test_a_checkpoint_moves_between_the_2d_layouts_bitwise(tmp_path):
    """FSDP2 x TP (its qkv weight TP-ordered inside 2-D shards) -> PP x FSDP2 (a rank holds half
    the stages) -> FSDP2 x TP again, on 4 ranks."""
    a, b = tmp_path / "fsdp_tp", tmp_path / "pp_fsdp"
    flags = [*CKPT, "--n-layers", "4", "--steps", "1"]
    runs = _launch(
        tmp_path,
        4,
        [
            _job("fsdp-tp", "--parallel", "fsdp-tp", "--save-checkpoint", str(a), common=flags),
            _job(
                "pp-fsdp",
                *("--parallel", "pp-fsdp", "--pp-microbatches", "2"),
                *("--resume", str(a), "--save-checkpoint", str(b)),
                common=flags,
            ),
            _job("again", "--parallel", "fsdp-tp", "--resume", str(b), common=flags),
        ],
    )
    _same(runs["fsdp-tp"]["state_end"], runs["pp-fsdp"]["state_resumed"])
    _same(runs["pp-fsdp"]["state_end"], runs["again"]["state_resumed"])


@pytest.mark.slow
def test_a_checkpoint_moves_between_ddp_and_an_interleaved_pipeline_bitwise(tmp_path):
    """DDP (every rank the whole model, names under DDP's `module.`) -> interleaved 1F1B (a
    rank holds stages 0 and 2, or 1 and 3; its optimizer only their parameters) -> DDP."""
    a, b = tmp_path / "ddp", tmp_path / "pp"
    flags = [*CKPT, "--n-layers", "4", "--steps", "1"]
    pp = ("--parallel", "pp", "--pp-schedule", "interleaved-1f1b")
    runs = _launch(
        tmp_path,
        2,
        [
            _job("ddp", "--parallel", "ddp", "--save-checkpoint", str(a), common=flags),
            _job("pp", *pp, "--resume", str(a), "--save-checkpoint", str(b), common=flags),
            _job("again", "--parallel", "ddp", "--resume", str(b), common=flags),
        ],
    )
    _same(runs["ddp"]["state_end"], runs["pp"]["state_resumed"])
    _same(runs["pp"]["state_end"], runs["again"]["state_resumed"])
