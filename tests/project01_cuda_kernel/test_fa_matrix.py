"""The public FlashAttention test matrix (project01_cuda_kernel/bench/fa_matrix.py).

GPU tier: the whole matrix (1440 cases) on CUDA tensors, our kernels forward and backward. Every
case `flash_attention` accepts must meet FlashAttention's rule for the output and dq, dk, dv:

    max|ours - fp32 ref| <= 2 * max|same-dtype ref - fp32 ref| + 1e-5

Why this rule: a float16/bfloat16 attention cannot be exact, and how far it must be from the
exact answer depends on the values, the head dim, the lengths and the dtype. The same-dtype
reference (the plain math run in the half dtype, as PyTorch does it) measures that unavoidable
rounding for each case, so "at most twice it" adapts to every shape where a fixed atol would be
too loose for some and too tight for others; a real bug errs by orders of magnitude more. 1e-5
absolute covers values both get (almost) exactly, where twice zero would demand bit-exactness.
Cases refused (a one-line TypeError/ValueError naming the argument) are counted and grouped by
reason; the summary is printed (shown even without -s) and nothing is written to reports/.

GQA/MQA cases (k/v with 2 or 1 heads) and causal cases of unequal lengths (bottom-right aligned,
as upstream) run and are checked like the rest, and so does every head dim (the kernels are
compiled for 64, 128 and 256; the others run zero-padded to the next): no case of the matrix is
refused. Head dims above 256 would be.

CPU tier (fast): a 16-case subset (batch 1), a head dim above the matrix's (288, refused) and
one of it (64), and two cases of head dims padded to 256 (160 and 256 itself), run by the same
`run_case` on CPU tensors, where
`flash_attention` is the operator's float32 reference math rounded once to the input dtype, not
our kernels. So it checks the harness, not the kernels: which cases are refused and with what
one-line reason, that refusals group by cause, that the accepted ones meet the rule, that the
same-dtype reference really rounds, and that the rule catches a planted error.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
import torch

from project01_cuda_kernel.bench import fa_matrix

# Subset for the CPU tier: an unsupported head dim (288: above every compiled one; the matrix
# itself has none since head dim 256 was compiled) and a supported one, an unequal and an equal
# length pair from the matrix, MHA and GQA, causal both, bfloat16: 2 x 2 x 2 x 2 = 16 cases, the
# 8 of head dim 64 accepted (288 is refused before any arithmetic). Batch 1 (the matrix has 2)
# halves the float32 math on 2 CPU cores; it checks the harness, for which one batch entry is
# enough.
UNSUPPORTED_HEAD_DIM = 288
CPU_CASES = [
    replace(case, batch=1)
    for case in fa_matrix.matrix_cases(
        head_dims=(UNSUPPORTED_HEAD_DIM, 64),
        seqlen_pairs=((113, 203), (1024, 1024)),
        mha_types=("mha", "gqa"),
        causal=(False, True),
        dtypes=("bfloat16",),
    )
]
SMALL_ACCEPTED = fa_matrix.Case(64, 113, 203, "mha", False, "bfloat16", batch=1)


def expected_refusal(case: fa_matrix.Case) -> str | None:
    """The argument `check_inputs` names for this case, or None: only a head dim above 256 is
    refused (the smaller ones run padded to 64, 128 or 256; GQA/MQA k/v heads and bottom-right
    causal with unequal lengths are supported). None for every case of the matrix."""
    if case.head_dim > 256:
        return "head_dim"
    return None


# --------------------------------------------------------------------------------------------
# GPU tier


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_matrix_on_gpu(capsys):
    summary = fa_matrix.run_matrix("cuda")
    text = fa_matrix.format_summary(summary)
    with capsys.disabled():  # show the counts and refusal reasons in the GPU run's output
        print("\n" + text)
    assert summary["cases"] == len(fa_matrix.MATRIX) == 1440
    assert summary["accepted"] + summary["refused"] == summary["cases"]
    for row in summary["rows"]:
        if row["status"] == "refused":
            assert "\n" not in row["reason"], row["case"]
    # every head dim of the matrix runs (64, 128 and 256 compiled, the rest padded): none refused
    assert all(expected_refusal(c) is None for c in fa_matrix.MATRIX)
    assert summary["refused"] == 0 and summary["refusals"] == [], text
    assert summary["accepted"] == 1440, text
    assert summary["failed"] == 0, text


# --------------------------------------------------------------------------------------------
# CPU tier


@pytest.fixture(scope="module")
def cpu_summary():
    return fa_matrix.run_matrix("cpu", CPU_CASES)


def test_matrix_is_the_public_one():
    cases = fa_matrix.MATRIX
    assert len(cases) == 12 * 10 * 3 * 2 * 2 == 1440
    assert len({c.id for c in cases}) == len(cases)
    assert {c.head_dim for c in cases} == set(fa_matrix.HEAD_DIMS)
    assert {(c.seqlen_q, c.seqlen_k) for c in cases} == set(fa_matrix.SEQLEN_PAIRS)
    assert {(c.mha_type, c.nheads, c.nheads_kv) for c in cases} == {
        ("mha", 6, 6),
        ("gqa", 6, 2),
        ("mqa", 6, 1),
    }
    assert {(c.causal, c.dtype) for c in cases} == {
        (causal, dtype) for causal in (False, True) for dtype in ("float16", "bfloat16")
    }


def test_inputs_layout_and_seed():
    case = fa_matrix.Case(40, 13, 21, "gqa", True, "float16", batch=2)
    q, k, v, dout = fa_matrix.make_inputs(case, "cpu")
    assert q.shape == dout.shape == (2, 6, 13, 40)
    assert k.shape == v.shape == (2, 2, 21, 40)
    assert all(t.dtype == torch.float16 for t in (q, k, v, dout))
    again = fa_matrix.make_inputs(case, "cpu")
    assert all(torch.equal(a, b) for a, b in zip((q, k, v, dout), again))
    other = fa_matrix.make_inputs(case, "cpu", seed=1)
    assert not torch.equal(q, other[0])


@pytest.mark.parametrize("sq,sk", [(5, 5), (3, 7), (7, 3)])
def test_reference_expands_kv_heads_and_masks_bottom_right(sq, sk):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, sq, 8, generator=g, requires_grad=True)
    k = torch.randn(1, 2, sk, 8, generator=g)
    v = torch.randn(1, 2, sk, 8, generator=g)
    out = fa_matrix.attention_math(q, k, v, True, 0.3)
    keep = torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq)
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1), attn_mask=keep, scale=0.3
    )
    live = sq - max(sq - sk, 0)  # the last rows; the first sq - sk (if any) see no key
    torch.testing.assert_close(out[:, :, -live:], sdpa[:, :, -live:])
    # Bottom-right: the last query sees every key; rows that see none are 0, without NaN grads.
    assert torch.equal(out[:, :, : sq - live], torch.zeros_like(out[:, :, : sq - live]))
    out.sum().backward()
    assert torch.isfinite(q.grad).all()
    assert torch.equal(q.grad[:, :, : sq - live], torch.zeros_like(q.grad[:, :, : sq - live]))


def test_cpu_subset_refusals_name_the_argument(cpu_summary):
    rows = {row["case"]: row for row in cpu_summary["rows"]}
    assert len(rows) == len(CPU_CASES) == 16
    for case in CPU_CASES:
        row, expect = rows[case.id], expected_refusal(case)
        if expect is None:
            assert row["status"] != "refused", (case.id, row.get("reason"))
            continue
        assert row["status"] == "refused", case.id
        assert row["error_type"] in ("TypeError", "ValueError")
        assert "\n" not in row["reason"] and row["reason"].strip() == row["reason"]
        assert row["reason"].startswith(expect), (case.id, row["reason"])
    assert cpu_summary["refused"] == sum(expected_refusal(c) is not None for c in CPU_CASES)
    assert cpu_summary["accepted"] == 8
    assert cpu_summary["accepted"] + cpu_summary["refused"] == cpu_summary["cases"]


def test_cpu_subset_refusals_group_by_cause(cpu_summary):
    groups = cpu_summary["refusals"]
    by_cause = Counter(expected_refusal(c) for c in CPU_CASES) - Counter({None: 16})
    assert len(groups) == len(by_cause) == 1
    # One group per cause, whatever the shapes in the messages; counts sum to the refusals.
    for group in groups:
        (cause,) = [c for c in by_cause if group["reason"].startswith(c)]
        assert group["count"] == by_cause[cause]
        assert fa_matrix.normalise_reason(group["example"]) == group["reason"]
    assert sum(g["count"] for g in groups) == cpu_summary["refused"]
    assert [g["count"] for g in groups] == sorted((g["count"] for g in groups), reverse=True)
    text = fa_matrix.format_summary(cpu_summary)
    assert "16 cases, 8 accepted (8 passed, 0 failed), 8 refused" in text


def test_normalise_reason():
    norm = fa_matrix.normalise_reason
    a = "causal=True needs q and k of equal sequence length, got 113 and 203 (x)"
    b = "causal=True needs q and k of equal sequence length, got 1024 and 1023 (x)"
    assert (
        norm(a) == norm(b) == "causal=True needs q and k of equal sequence length, got N and N (x)"
    )
    # Digits inside names and indices are not shapes.
    assert norm("head_dim (q.shape[-1]) must be one of (64, 128), got 59") == (
        "head_dim (q.shape[-1]) must be one of (N, N), got N"
    )
    assert norm("q must be torch.float16, got torch.float32 on sm_80") == (
        "q must be torch.float16, got torch.float32 on sm_80"
    )


def test_cpu_subset_accepted_cases_meet_the_rule(cpu_summary):
    accepted = [row for row in cpu_summary["rows"] if row["status"] != "refused"]
    assert {row["case"] for row in accepted} == {
        c.id for c in CPU_CASES if expected_refusal(c) is None
    }
    for row in accepted:
        assert row["status"] == "ok", row
        assert set(row["errors"]) == {"out", "dq", "dk", "dv"}
        for name, e in row["errors"].items():
            assert e["ok"] and e["ours"] <= e["bound"], (row["case"], name, e)
            # The same-dtype reference really computes in bfloat16 (it must not be a float32
            # reference in disguise, or the rule would demand float32 accuracy).
            assert 1e-4 < e["same_dtype"] < 0.1, (row["case"], name, e)
    assert cpu_summary["passed"] == len(accepted) and cpu_summary["failed"] == 0


def _output_bumped_by(delta: float):
    from project01_cuda_kernel import flash_attention

    def attention(q, k, v, *, causal):
        out = flash_attention(q, k, v, causal=causal)
        bump = torch.zeros_like(out)
        bump[0, 3, 17, 5] = delta
        return out + bump

    return attention


def _dq_scaled_by(factor: float):
    from project01_cuda_kernel import flash_attention

    def attention(q, k, v, *, causal):
        # The same forward values (q - q.detach() is 0), but dq comes back times `factor`.
        q = q + (q - q.detach()) * (factor - 1)
        return flash_attention(q, k, v, causal=causal)

    return attention


def test_rule_catches_a_planted_output_error(cpu_summary):
    (row,) = [r for r in cpu_summary["rows"] if r["case"] == SMALL_ACCEPTED.id]
    same_out = row["errors"]["out"]["same_dtype"]
    result = fa_matrix.run_case(
        SMALL_ACCEPTED, "cpu", attention_fn=_output_bumped_by(10 * same_out)
    )
    assert result["status"] == "failed"
    assert not result["errors"]["out"]["ok"]
    assert result["errors"]["out"]["ours"] > 5 * same_out
    # The bump is a constant: the gradients are untouched and still pass.
    assert all(result["errors"][name]["ok"] for name in ("dq", "dk", "dv"))
    assert "FAILED" not in fa_matrix.format_summary(cpu_summary)


def test_rule_catches_a_planted_gradient_error():
    # dq 10% off: about 0.1 here, ten times the rule's bound for it.
    result = fa_matrix.run_case(SMALL_ACCEPTED, "cpu", attention_fn=_dq_scaled_by(1.1))
    assert result["status"] == "failed"
    assert [n for n, e in result["errors"].items() if not e["ok"]] == ["dq"]


def test_only_argument_errors_of_the_forward_are_refusals():
    def broken(q, k, v, *, causal):
        raise RuntimeError("kernel launch failed")

    with pytest.raises(RuntimeError, match="kernel launch failed"):
        fa_matrix.run_case(SMALL_ACCEPTED, "cpu", attention_fn=broken)
    refused = fa_matrix.run_case(replace(SMALL_ACCEPTED, head_dim=UNSUPPORTED_HEAD_DIM), "cpu")
    assert refused == {
        "status": "refused",
        "reason": "head_dim (q.shape[-1]) must be at most 256 (kernels for (64, 128, 256); a "
        "smaller one is zero-padded to the next), got 288",
        "error_type": "ValueError",
    }


@pytest.mark.parametrize("head_dim", [160, 256])
def test_cpu_head_dims_padded_to_256_are_accepted_and_meet_the_rule(head_dim):
    """Matrix cases of head dims 160 (padded to 256 on CUDA) and 256, GQA and causal
    (bottom-right with Sq < Sk): accepted, and on CPU (the operator's float32 reference) within
    the rule, with a same-dtype error that really is bfloat16's."""
    case = fa_matrix.Case(head_dim, 113, 203, "gqa", True, "bfloat16", batch=1)
    assert replace(case, batch=fa_matrix.BATCH) in fa_matrix.MATRIX
    row = fa_matrix.run_case(case, "cpu")
    assert row["status"] == "ok", row
    for name, e in row["errors"].items():
        assert e["ok"] and e["ours"] <= e["bound"], (name, e)
        assert 1e-4 < e["same_dtype"] < 0.1, (name, e)
