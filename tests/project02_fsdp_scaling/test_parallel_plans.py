"""The pieces of the parallel layouts that need no process group: the mesh degrees of each
strategy and what a layout refuses, the fused qkv weight's per-rank order, the pipeline's cut
into stages and its bubble formula."""

from __future__ import annotations

import pytest
import torch

from project02_fsdp_scaling.config import ParallelLayout, TrainConfig
from project02_fsdp_scaling.parallel import pipeline, tp
from shared.model import ModelArgs, build_model


@pytest.mark.parametrize(
    "layout, world, want",
    [
        (ParallelLayout("fsdp"), 8, {"pp": 1, "dp": 8, "tp": 1}),
        (ParallelLayout("ddp"), 2, {"pp": 1, "dp": 2, "tp": 1}),
        (ParallelLayout("tp"), 4, {"pp": 1, "dp": 1, "tp": 4}),
        (ParallelLayout("fsdp-tp", tp=2), 8, {"pp": 1, "dp": 4, "tp": 2}),
        (ParallelLayout("pp"), 4, {"pp": 4, "dp": 1, "tp": 1}),
        (ParallelLayout("pp-fsdp", pp=2), 8, {"pp": 2, "dp": 4, "tp": 1}),
    ],
)
def test_each_strategy_has_its_mesh(layout, world, want):
    assert layout.degrees(world) == want


def test_tensor_and_pipeline_ranks_share_their_batch():
    # TP over 2 ranks: one data-parallel rank, so the global batch need not split over 2
    cfg = TrainConfig(global_batch=3, layout=ParallelLayout("tp")).validate(2)
    assert cfg.dp_size(2) == 1 and cfg.local_batch(cfg.dp_size(2)) == 3
    with pytest.raises(ValueError, match="divisible"):
        TrainConfig(global_batch=3).validate(2)  # FSDP2 splits it


@pytest.mark.parametrize(
    "layout, world, match",
    [
        (ParallelLayout("fsdp-tp", tp=3), 4, "--tp"),
        (ParallelLayout("pp-fsdp", pp=0), 4, "--pp"),
        (ParallelLayout("pp", pp_schedule="gpipe", stages_per_rank=2), 2, "stages-per-rank"),
        (ParallelLayout("pp", pp_schedule="interleaved-1f1b"), 2, "at least 4"),  # 2 blocks
        (ParallelLayout("pp", pp_schedule="interleaved-1f1b", pp_microbatches=3), 2, "multiple"),
    ],
)
def test_a_layout_that_cannot_run_is_named(layout, world, match):
    n_layers = 4 if match == "multiple" else 0  # enough blocks: the micro-batches are wrong
    with pytest.raises(ValueError, match=match):
        TrainConfig(global_batch=12, n_layers=n_layers, layout=layout).validate(world)


def test_interleaving_needs_as_many_blocks_as_stages():
    layout = ParallelLayout("pp", pp_schedule="interleaved-1f1b")
    TrainConfig(n_layers=4, layout=layout).validate(2)  # 2 ranks x 2 stages, 4 blocks


def test_the_qkv_permutation_gives_each_rank_its_heads():
    split, degree = (8, 4, 4), 2  # GQA: 8 query rows, 4 key, 4 value rows
    w = torch.arange(16.0)[:, None]  # row i holds i
    ordered = tp.tp_qkv(w, split, degree).flatten().tolist()
    # rank 0: q rows 0-3, k rows 8-9, v rows 12-13; rank 1 the second halves
    assert ordered[:8] == [0, 1, 2, 3, 8, 9, 12, 13]
    assert ordered[8:] == [4, 5, 6, 7, 10, 11, 14, 15]
    assert torch.equal(tp.canonical_qkv(tp.tp_qkv(w, split, degree), split, degree), w)


def test_tp_refuses_a_degree_that_splits_a_head():
    with pytest.raises(ValueError, match="n_heads"):
        tp.check_tp_degree(ModelArgs(dim=48, n_heads=3, ffn_hidden=96, vocab_size=96), 2)


def test_stages_cut_the_blocks_in_order_and_keep_the_models_names():
    assert pipeline.split_layers(5, 2) == [[0, 1, 2], [3, 4]]
    assert pipeline.stage_ids(1, 2, 2) == [1, 3]  # the looped placement
    model = build_model(ModelArgs(**{**ModelArgs.from_preset("tiny").to_dict(), "n_layers": 4}))
    stages = pipeline.build_stage_modules(model, 0, 2, 2)  # rank 0 of 2, 2 stages each
    names = [set(dict(s.named_parameters())) for s in stages]
    assert "tok_embeddings.weight" in names[0] and "layers.0.attention.wqkv.weight" in names[0]
    assert "layers.2.feed_forward.w2.weight" in names[1] and "output.weight" not in names[1]
    everything = set(dict(model.named_parameters()))
    assert names[0] | names[1] < everything  # rank 1 holds the rest


def test_the_stages_compose_to_the_model():
    model = build_model(ModelArgs(**{**ModelArgs.from_preset("tiny").to_dict(), "n_layers": 3}))
    stages = [
        pipeline.StageModule(model, ids, first=i == 0, last=i == 2)
        for i, ids in enumerate(pipeline.split_layers(3, 3))
    ]
    x = torch.randint(0, 256, (2, 16))
    h = x
    for s in stages:
        h = s(h)
    torch.testing.assert_close(h, model(x), rtol=0, atol=0)  # the same ops in the same order


def test_bubble_formula():
    assert pipeline.bubble_formula(4, 4) == pytest.approx(3 / 7)
    assert pipeline.bubble_formula(4, 12) == pytest.approx(3 / 15)
    assert pipeline.bubble_formula(4, 4, stages_per_rank=2) == pytest.approx(3 / 11)
    assert pipeline.bubble_formula(1, 4) == 0
