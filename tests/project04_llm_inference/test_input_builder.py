"""The one host input builder (`engine/inputs.py`): positions, cache slots and context lengths
of every layout the runner and the fused program use, checked against values written out by
hand from the module doc; and the fused program's host inputs against its device mirror
(`kernels.spec_rounds.reference_round_inputs`) for a first round. Integer arithmetic only:
every check is exact.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from project04_llm_inference.engine.inputs import build_rows, fill_tables, input_tokens
from project04_llm_inference.engine.paged import kv_slots
from project04_llm_inference.engine.sequence import Sequence
from project04_llm_inference.kernels.spec_rounds import reference_round_inputs
from project04_llm_inference.spec.fused import FusedGreedySpec, FusedItem

BS = 4  # block size


def _tables(rows, width=4):
    t = np.empty((len(rows), width), dtype=np.int32)
    fill_tables(t, rows)
    return t


def test_fill_tables_pads_with_block_zero():
    t = np.full((3, 4), 7, dtype=np.int32)
    fill_tables(t, [[5, 9], [3]])
    assert t.tolist() == [[5, 9, 0, 0], [3, 0, 0, 0], [0, 0, 0, 0]]


def test_context_crossing_a_block_boundary():
    # positions 2..5 of blocks [10, 11]: two slots in block 10, two in block 11
    r = build_rows(_tables([[10, 11]]), [2], [4], BS)
    assert r.positions.tolist() == [2, 3, 4, 5]
    assert r.slots.tolist() == [42, 43, 44, 45]
    assert r.context_lens.tolist() == [6]  # the chunk's own tokens included
    assert r.offsets.tolist() == [0, 4]


def test_packed_chunked_prefill_offsets_and_decodes():
    # two decodes, then two prefill chunks: a prompt's second chunk (positions 5..7) and a
    # first chunk (0..2); rows are concatenated in item order
    tables = _tables([[3, 4], [8], [1, 2], [6]])
    r = build_rows(
        tables,
        [4, 0, 5, 0],
        [1, 1, 3, 3],
        BS,
        tokens=[[11], [], [21, 22, 23], [31, 32, 33]],  # the second decode's token pending
        sample_from=[4, 0, 7, 9],  # the last chunk reaches no sampled position
    )
    assert r.offsets.tolist() == [0, 1, 2, 5, 8]
    assert r.positions.tolist() == [4, 0, 5, 6, 7, 0, 1, 2]
    assert r.slots.tolist() == [16, 32, 9, 10, 11, 24, 25, 26]
    assert r.context_lens.tolist() == [5, 1, 8, 3]
    assert r.ids.tolist() == [11, 0, 21, 22, 23, 31, 32, 33]
    assert r.sample_rows.tolist() == [0, 1, 4]


def test_padded_rows_and_padding_items():
    # a padded multi-token step (width 3): a verification of the last token and one draft, and
    # a padding item, which runs positions 0..2, writes nothing and sees its own 3 rows
    r = build_rows(
        np.array([[2, 5], [0, 0]], dtype=np.int32),
        [6],
        [2],
        BS,
        width=3,
        tokens=[[7, 8]],
        sample_from=[6],
    )
    assert r.positions.tolist() == [6, 7, 8, 0, 1, 2]
    assert r.slots.tolist() == [22, 23, -1, -1, -1, -1]  # padding rows write no slot
    assert r.context_lens.tolist() == [9, 3]  # bottom-right causal over the padded query
    assert r.ids.tolist() == [7, 8, 0, 0, 0, 0]
    assert r.sample_rows.tolist() == [0, 1]  # real rows only, never a padding row
    assert r.offsets.tolist() == [0, 3, 6]


def test_decode_rows_padding_reads_nothing():
    # one decode step padded to a batch of 3: padding rows get slot -1 and context length 0
    t = np.zeros((3, 4), dtype=np.int32)
    fill_tables(t, [[9]])
    r = build_rows(t, [2], [1], BS, width=1, context="rows", past="reset", idle_context=0)
    assert r.positions.tolist() == [2, 0, 0]
    assert r.slots.tolist() == [38, -1, -1]
    assert r.context_lens.tolist() == [3, 0, 0]


def test_multi_step_past_the_room_is_reset():
    # 4 steps from position 6 with room for 2 (blocks [1, 2] hold positions 0..7): steps past
    # the room would reach position 9, past the last block; they read position 0, context 1,
    # and write nothing
    r = build_rows(_tables([[1, 2]]), [6], [2], BS, width=4, context="rows", past="reset")
    assert r.positions.tolist() == [6, 7, 0, 0]
    assert r.slots.tolist() == [10, 11, -1, -1]
    assert r.context_lens.tolist() == [7, 8, 1, 1]


def test_verification_rows_keep_their_positions():
    # q = 3 decode rows of one sequence verifying 1 draft: the row past the draft keeps its
    # position and context (inside the model's positions), writing nothing
    r = build_rows(_tables([[4, 5]]), [3], [2], BS, width=3, context="rows")
    assert r.positions.tolist() == [3, 4, 5]
    assert r.slots.tolist() == [19, 20, -1]
    assert r.context_lens.tolist() == [4, 5, 6]


def test_kv_slots_clamps_past_the_table():
    # a position past the table reads its last entry (the callers above mask those rows)
    tables = np.array([[3, 7]], dtype=np.int32)
    assert kv_slots(tables, np.array([[1, 5, 9]]), BS).tolist() == [[13, 29, 29]]
    rows = np.array([0, 0])
    assert kv_slots(tables, np.array([5, 9]), BS, rows=rows).tolist() == [29, 29]


def test_zero_width_and_bad_arguments():
    r = build_rows(_tables([[1]]), [0], [0], BS, width=0, context="rows", past="reset")
    assert r.positions.shape == r.slots.shape == r.context_lens.shape == (0,)
    with pytest.raises(ValueError, match="context"):
        build_rows(_tables([[1]]), [0], [1], BS, context="decode")
    with pytest.raises(ValueError, match="block tables"):
        build_rows(_tables([[1]]), [0, 0], [1, 1], BS)  # packed: one table per item


def test_input_tokens_known_then_drafts_then_pending():
    s = Sequence("r", [5, 6, 7], None)  # type: ignore[arg-type]
    s.num_computed_tokens = 1
    assert input_tokens(s, 2) == [6, 7]
    s.num_computed_tokens = 2
    s.spec_token_ids = [40, 41]
    assert input_tokens(s, 3) == [7, 40, 41]  # the last token, then drafts
    s.spec_token_ids = []
    s.num_computed_tokens = 3
    assert input_tokens(s, 1) == []  # the newest token is still on the device


class _Draft:
    def __init__(self, tokens, computed, blocks):
        self.tokens, self.num_computed_tokens, self.block_ids = tokens, computed, blocks


def test_fused_host_inputs_match_the_device_rounds():
    """A first round of the fused program: the host builder (`_fill`) and the device mirror
    (`_fill_rounds` state, then `reference_round_inputs`) write the same inputs."""
    k = 3

    def runner(bs, mb):
        return SimpleNamespace(
            block_size=bs, max_blocks_per_seq=mb, max_model_len=bs * mb, device=torch.device("cpu")
        )

    one = FusedGreedySpec(runner(4, 8), runner(8, 4), k, 4, capture=False)
    rounds = FusedGreedySpec(runner(4, 8), runner(8, 4), k, 4, capture=False, rounds=2)
    items = []
    for i, (total, catch_up) in enumerate([(9, 1), (14, 2), (6, 2)]):
        seq = Sequence("r", list(range(100, 100 + total)), None)  # type: ignore[arg-type]
        seq.num_computed_tokens = total - 1
        seq.block_ids = [10 * i + j for j in range(-(-(total + 2 * (k + 1)) // 4))]
        draft = _Draft(list(range(200, 200 + total)), total - catch_up, [50 + 3 * i, 51 + 3 * i])
        items.append(FusedItem(seq, k, draft, catch_up, k))
    a, b = one._slab(4), rounds._slab(4, 2)
    one._fill(a, items)
    rounds._fill_rounds(b, items)
    d = {name: torch.from_numpy(v) for name, v in b.h.items()}
    reference_round_inputs(d, None, k=k, dbs=8, tbs=4)
    for name, want in a.h.items():
        got = d[name].numpy()
        if name == "t_ids":  # the drafts' columns are written on the device by each round
            want, got = want.reshape(4, k + 1)[:, 0], got.reshape(4, k + 1)[:, 0]
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_device_tensor_values_and_an_all_greedy_batch_copies_nothing(monkeypatch):
    """`device_tensor` gives the values in the dtype asked (torch.tensor's default otherwise);
    sampling a batch that is all greedy builds no per-row parameter tensor at all, so nothing
    is copied to the device between the forward and the argmax (on a GPU such a copy from
    pageable memory would sync the stream and undo the overlap of asynchronous scheduling)."""
    import torch

    from project04_llm_inference import SamplingParams
    from project04_llm_inference.engine import sampler
    from project04_llm_inference.engine.inputs import device_tensor

    cpu = torch.device("cpu")
    assert device_tensor([1, 2], cpu, torch.int64).tolist() == [1, 2]
    assert device_tensor([0.5, 1.0], cpu).dtype == torch.float32
    assert device_tensor([True, False], cpu).dtype == torch.bool
    calls = []
    real = sampler.device_tensor
    monkeypatch.setattr(sampler, "device_tensor", lambda *a, **k: calls.append(a) or real(*a, **k))

    class Seq:
        grammar = None

        def __init__(self, p):
            self.params, self.generator = p, None

    logits = torch.randn(3, 11, generator=torch.Generator().manual_seed(0))
    tokens, _ = sampler.sample(logits, [Seq(SamplingParams(temperature=0.0)) for _ in range(3)])
    assert tokens.tolist() == logits.argmax(-1).tolist() and calls == []
    sampler.sample(logits, [Seq(SamplingParams(temperature=1.0, seed=1)) for _ in range(3)])
    assert calls  # a sampled batch does need its temperatures on the device
