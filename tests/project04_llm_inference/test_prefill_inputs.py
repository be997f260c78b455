"""CPU tier: paged_prefill_attention's argument checks, and its CPU dispatch, which must be the
reference, whose semantics are checked here against dense causal attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from project04_llm_inference.kernels import prefill, reference


def make_batch(
    specs,
    *,
    hq=4,
    hkv=2,
    d=64,
    block_size=16,
    dtype=torch.float32,
    device="cpu",
    seed=0,
):
    """A packed prefill batch over a paged cache whose blocks are shuffled.

    specs: (q_len, context_len) per sequence. Returns (args, dense): args in the order of
    paged_prefill_attention (softmax_scale 1/sqrt(d)), dense[i] = (k, v) of sequence i as
    (context_len, hkv, d) tensors. Unused cache blocks hold noise and unused block-table entries
    are -1, so a kernel reading a slot it does not own shows up as a wrong answer or a fault."""
    gen = torch.Generator().manual_seed(seed)
    n_blocks = [(ctx + block_size - 1) // block_size for _, ctx in specs]
    total_blocks = sum(n_blocks) + 3
    k_cache = torch.randn(total_blocks, block_size, hkv, d, generator=gen)
    v_cache = torch.randn(total_blocks, block_size, hkv, d, generator=gen)
    perm = torch.randperm(total_blocks, generator=gen)
    max_blocks = max(n_blocks) + 1
    tables = torch.full((len(specs), max_blocks), -1, dtype=torch.int32)
    dense, start = [], 0
    for i, (_, ctx) in enumerate(specs):
        ids = perm[start : start + n_blocks[i]]
        start += n_blocks[i]
        tables[i, : len(ids)] = ids.to(torch.int32)
        dense.append(
            (k_cache[ids].flatten(0, 1)[:ctx].to(dtype), v_cache[ids].flatten(0, 1)[:ctx].to(dtype))
        )
    q_lens = [q for q, _ in specs]
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(q_lens), hq, d, generator=gen)
    ctx_lens = torch.tensor([c for _, c in specs], dtype=torch.int32)
    args = [
        q.to(dtype),
        k_cache.to(dtype),
        v_cache.to(dtype),
        tables,
        cu,
        ctx_lens,
        max(q_lens),
        d**-0.5,
    ]
    args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
    return args, dense


# --- CPU dispatch and the contract's semantics -----------------------------------------------


@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2)])
def test_cpu_dispatch_is_the_reference(hq, hkv):
    args, _ = make_batch([(5, 5), (3, 20), (1, 33)], hq=hq, hkv=hkv, block_size=8)
    torch.testing.assert_close(
        prefill.paged_prefill_attention(*args),
        reference.paged_prefill_attention(*args),
        rtol=0,
        atol=0,
    )


@pytest.mark.parametrize("hq,hkv", [(2, 2), (8, 2)])
def test_chunk_mid_context_equals_last_rows_of_full_prefill(hq, hkv):
    """A chunk of q_len queries after a cached prefix attends exactly as the last q_len rows of
    the whole prompt's causal attention (SDPA, top-left causal on the full square)."""
    specs = [(7, 30), (30, 30), (1, 19)]
    args, dense = make_batch(specs, hq=hq, hkv=hkv, block_size=4, seed=1)
    out = prefill.paged_prefill_attention(*args)
    cu = args[4].tolist()
    gen = torch.Generator().manual_seed(2)
    for i, (q_len, ctx) in enumerate(specs):
        k, v = dense[i]
        # the full prompt's queries: fresh ones before the chunk, the chunk's own at the end
        q_full = torch.randn(ctx, hq, k.shape[-1], generator=gen)
        q_full[ctx - q_len :] = args[0][cu[i] : cu[i + 1]]
        full = F.scaled_dot_product_attention(
            q_full.transpose(0, 1),
            k.transpose(0, 1).repeat_interleave(hq // hkv, 0),
            v.transpose(0, 1).repeat_interleave(hq // hkv, 0),
            is_causal=True,
            scale=args[7],
        ).transpose(0, 1)
        torch.testing.assert_close(out[cu[i] : cu[i + 1]], full[ctx - q_len :])


def test_empty_sequence_in_batch():
    args, _ = make_batch([(0, 9), (4, 4)], block_size=4)
    out = prefill.paged_prefill_attention(*args)
    assert out.shape == args[0].shape
    torch.testing.assert_close(out, reference.paged_prefill_attention(*args))


# --- argument checks: every one names the argument and what was expected --------------------

NAMES = ["q", "k_cache", "v_cache", "block_tables", "cu_seqlens_q", "context_lens"]


def good_args(**kw):
    args, _ = make_batch([(3, 10), (2, 2)], block_size=4, dtype=kw.pop("dtype", torch.float32))
    return args


def call(args, **replace):
    names = [*NAMES, "max_seqlen_q", "softmax_scale"]
    a = dict(zip(names, args))
    a.update(replace)
    return prefill.paged_prefill_attention(**a)


def test_good_args_pass():
    assert call(good_args()).shape == (5, 4, 64)


@pytest.mark.parametrize("name", NAMES)
def test_non_tensor(name):
    args = good_args()
    with pytest.raises(TypeError, match=f"{name} must be a torch.Tensor, got list"):
        call(args, **{name: args[NAMES.index(name)].tolist()})


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32])
def test_q_dtype(dtype):
    args = good_args()
    with pytest.raises(TypeError, match="q must have dtype in"):
        call(args, q=args[0].to(dtype))


@pytest.mark.parametrize("name", ["k_cache", "v_cache"])
def test_cache_dtype_must_match_q(name):
    args = good_args()
    bad = args[NAMES.index(name)].to(torch.bfloat16)
    with pytest.raises(TypeError, match=f"{name} must have q's dtype torch.float32"):
        call(args, **{name: bad})


@pytest.mark.parametrize("name", ["block_tables", "cu_seqlens_q", "context_lens"])
def test_index_tensors_must_be_int32(name):
    args = good_args()
    bad = args[NAMES.index(name)].long()
    with pytest.raises(TypeError, match=f"{name} must be torch.int32, got torch.int64"):
        call(args, **{name: bad})


def test_q_rank():
    args = good_args()
    with pytest.raises(ValueError, match=r"q must be \(T, Hq, head_dim\)"):
        call(args, q=args[0][None])


def test_cache_rank():
    args = good_args()
    with pytest.raises(ValueError, match="k_cache must be \\(num_blocks, block_size"):
        call(args, k_cache=args[1].flatten(0, 1))


def test_cache_shapes_must_match():
    args = good_args()
    with pytest.raises(ValueError, match="v_cache must have k_cache's shape"):
        call(args, v_cache=args[2][:-1])


def test_head_dim_must_match():
    args = good_args()
    with pytest.raises(ValueError, match=r"k_cache's head_dim must equal q's \(32\)"):
        call(args, q=args[0][..., :32])


def test_heads_must_be_a_multiple_of_kv_heads():
    args = good_args()
    with pytest.raises(ValueError, match=r"q's heads \(3\) must be a multiple"):
        call(args, q=args[0][:, :3])


def test_block_tables_rank():
    args = good_args()
    with pytest.raises(ValueError, match=r"block_tables must be \(N, max_blocks_per_seq\)"):
        call(args, block_tables=args[3].flatten())


def test_cu_seqlens_shape():
    args = good_args()
    with pytest.raises(ValueError, match=r"cu_seqlens_q must be \(N \+ 1,\) = \(3,\)"):
        call(args, cu_seqlens_q=args[4][:-1])


def test_context_lens_shape():
    args = good_args()
    with pytest.raises(ValueError, match=r"context_lens must be \(N,\) = \(2,\)"):
        call(args, context_lens=args[5][:1])


@pytest.mark.parametrize("bad", [2.0, True, None])
def test_max_seqlen_q_type(bad):
    with pytest.raises(TypeError, match="max_seqlen_q must be a host int"):
        call(good_args(), max_seqlen_q=bad)


def test_max_seqlen_q_negative():
    with pytest.raises(ValueError, match="max_seqlen_q must be >= 0, got -1"):
        call(good_args(), max_seqlen_q=-1)


@pytest.mark.parametrize("bad", ["0.1", True, None])
def test_softmax_scale_type(bad):
    with pytest.raises(TypeError, match="softmax_scale must be a real number"):
        call(good_args(), softmax_scale=bad)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_softmax_scale_value(bad):
    with pytest.raises(ValueError, match="softmax_scale must be finite and positive"):
        call(good_args(), softmax_scale=bad)


def test_device_mismatch_is_named():
    args = good_args()
    with pytest.raises(ValueError, match="context_lens must be on q's device cpu, got meta"):
        call(args, context_lens=args[5].to("meta"))


def test_import_needs_no_gpu_and_no_compiler():
    # The extension is built on first CUDA call only: importing and CPU calls never build it.
    assert prefill._ext.cache_info().currsize == 0
