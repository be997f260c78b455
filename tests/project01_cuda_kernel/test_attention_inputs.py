"""CPU tier: flash_attention's argument checks raise clear errors before any CUDA is needed.

The checks are the same for CPU and CUDA tensors: well-formed CPU inputs run the operator's CPU
reference (tests/project01_cuda_kernel/test_ops.py checks its numbers)."""

from __future__ import annotations

import pytest
import torch

from project01_cuda_kernel.attention import (
    flash_attention,
    resolve_fwd_kernel,
    resolve_softmax_scale,
)


def qkv(b=2, h=3, sq=17, sk=17, d=64, dtype=torch.bfloat16, device="cpu", hk=None):
    """Tensors of the given shape (k/v with hk heads, h by default); CPU by default (metadata
    checks need no GPU)."""
    hk = h if hk is None else hk
    q = torch.randn(b, h, sq, d, device=device).to(dtype)
    k = torch.randn(b, hk, sk, d, device=device).to(dtype)
    v = torch.randn(b, hk, sk, d, device=device).to(dtype)
    return q, k, v


def test_well_formed_cpu_inputs_run_the_cpu_reference():
    q, k, v = qkv()
    out = flash_attention(q, k, v)
    assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device


def test_devices_other_than_cpu_and_cuda_are_refused():
    q, k, v = qkv(device="meta")
    with pytest.raises(ValueError, match="must be CPU or CUDA tensors, got device meta"):
        flash_attention(q, k, v)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_default_scale_is_inverse_sqrt_head_dim(d):
    assert resolve_softmax_scale(None, d) == pytest.approx(d**-0.5, rel=1e-12)
    assert resolve_softmax_scale(0.3, d) == 0.3
    assert resolve_softmax_scale(2, d) == 2.0


@pytest.mark.parametrize("name", ["q", "k", "v"])
def test_non_tensor_argument(name):
    q, k, v = qkv()
    args = {"q": q, "k": k, "v": v}
    args[name] = args[name].tolist()
    with pytest.raises(TypeError, match=f"{name} must be a torch.Tensor, got list"):
        flash_attention(**args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32])
@pytest.mark.parametrize("name", ["q", "k", "v"])
def test_unsupported_dtype(name, dtype):
    q, k, v = qkv()
    args = {"q": q, "k": k, "v": v}
    args[name] = args[name].to(dtype)
    with pytest.raises(TypeError, match=f"{name} must be torch.float16 or torch.bfloat16"):
        flash_attention(**args)


def test_mixed_dtypes():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="share one dtype"):
        flash_attention(q, k.half(), v)


@pytest.mark.parametrize("shape", [(17, 64), (3, 17, 64), (1, 2, 3, 17, 64)])
@pytest.mark.parametrize("name", ["q", "k", "v"])
def test_wrong_rank(name, shape):
    q, k, v = qkv()
    args = {"q": q, "k": k, "v": v}
    args[name] = torch.randn(shape).bfloat16()
    with pytest.raises(ValueError, match=f"{name} must have 4 dimensions"):
        flash_attention(**args)


def test_k_v_shapes_differ():
    q, k, v = qkv(sk=20)
    with pytest.raises(ValueError, match="k and v must have the same shape"):
        flash_attention(q, k, v[:, :, :19])


@pytest.mark.parametrize("kb,kh", [(1, 3), (2, 2), (2, 6)])
def test_batch_heads_mismatch(kb, kh):
    """k/v heads must divide q's (3 here): 2 and 6 do not; the batch must match."""
    q, _, _ = qkv(b=2, h=3)
    k = torch.randn(kb, kh, 17, 64).bfloat16()
    with pytest.raises(ValueError, match="must have q's batch 2 and a number of heads dividing"):
        flash_attention(q, k, k.clone())


@pytest.mark.parametrize("hk", [1, 2, 4, 8])
def test_grouped_kv_heads_are_accepted(hk):
    """Grouped-query (Hk = 2, 4) and multi-query (Hk = 1) k/v heads; dk, dv keep k's shape."""
    q, k, v = qkv(h=8, hk=hk)
    for t in (q, k, v):
        t.requires_grad_(True)
    out = flash_attention(q, k, v, causal="bottom_right")
    assert out.shape == q.shape
    out.float().sum().backward()
    assert k.grad.shape == v.grad.shape == (2, hk, 17, 64)


def test_head_dim_mismatch():
    q, _, _ = qkv(d=64)
    _, k, v = qkv(d=128)
    with pytest.raises(ValueError, match="must have q's head_dim 64, got 128"):
        flash_attention(q, k, v)


@pytest.mark.parametrize("d", [257, 320, 512])
def test_unsupported_head_dim(d):
    q, k, v = qkv(d=d)
    with pytest.raises(ValueError, match=r"head_dim \(q.shape\[-1\]\) must be at most 256"):
        flash_attention(q, k, v)


@pytest.mark.parametrize(
    "d,runs_as",
    [
        *((1, 64), (32, 64), (59, 64), (64, 64), (80, 128), (128, 128)),
        *((129, 256), (160, 256), (192, 256), (255, 256), (256, 256)),
    ],
)
def test_head_dims_up_to_256_run_padded_to_a_compiled_one(d, runs_as):
    from project01_cuda_kernel.attention import kernel_head_dim, pad_head_dim

    assert kernel_head_dim(d) == runs_as
    t = torch.randn(2, 3, 5, d)
    p = pad_head_dim(t, runs_as)
    assert p.shape == (2, 3, 5, runs_as) and torch.equal(p[..., :d], t)
    assert not p[..., d:].any()  # zeros: they add nothing to q.k and give 0 output columns
    assert pad_head_dim(t, d) is t


@pytest.mark.parametrize("sq,sk", [(0, 5), (5, 0)])
def test_empty_sequences(sq, sk):
    q, k, v = qkv(sq=sq, sk=sk)
    with pytest.raises(ValueError, match="must be non-empty"):
        flash_attention(q, k, v)


def test_causal_true_needs_equal_lengths():
    """True keeps its meaning (top-left = bottom-right when Sq == Sk) and refuses unequal
    lengths, pointing at the two explicit alignments."""
    q, k, v = qkv(sq=17, sk=33)
    with pytest.raises(
        ValueError, match="causal=True needs q and k of equal sequence length.*'bottom_right'"
    ):
        flash_attention(q, k, v, causal=True)


@pytest.mark.parametrize("causal", [False, "top_left", "bottom_right"])
@pytest.mark.parametrize("sq,sk", [(17, 33), (33, 17)])
def test_unequal_lengths_are_accepted_when_not_causal_or_aligned(causal, sq, sk):
    q, k, v = qkv(sq=sq, sk=sk)
    assert flash_attention(q, k, v, causal=causal).shape == q.shape


def test_alignments_agree_on_equal_lengths_and_differ_otherwise():
    q, k, v = qkv(sq=17, sk=17)
    same = [flash_attention(q, k, v, causal=c) for c in (True, "top_left", "bottom_right")]
    assert torch.equal(same[0], same[1]) and torch.equal(same[0], same[2])
    q, k, v = qkv(sq=9, sk=17)
    assert not torch.equal(
        flash_attention(q, k, v, causal="top_left"), flash_attention(q, k, v, causal="bottom_right")
    )


@pytest.mark.parametrize("causal", [1, 0, None, 1.0])
def test_causal_must_be_bool_or_alignment(causal):
    q, k, v = qkv()
    with pytest.raises(
        TypeError, match="causal must be a bool or one of 'top_left', 'bottom_right'"
    ):
        flash_attention(q, k, v, causal=causal)


@pytest.mark.parametrize("causal", ["bottom-right", "TOP_LEFT", "", "true"])
def test_unknown_causal_alignment(causal):
    q, k, v = qkv()
    with pytest.raises(
        ValueError,
        match=f"causal must be False, True, 'top_left' or 'bottom_right', got '{causal}'",
    ):
        flash_attention(q, k, v, causal=causal)


@pytest.mark.parametrize(
    "scale,exc",
    [
        ("0.1", TypeError),
        (True, TypeError),
        (0.0, ValueError),
        (-1.0, ValueError),
        (float("nan"), ValueError),
        (float("inf"), ValueError),
    ],
)
def test_bad_softmax_scale(scale, exc):
    q, k, v = qkv()
    with pytest.raises(exc, match="softmax_scale must be"):
        flash_attention(q, k, v, softmax_scale=scale)


def test_mixed_devices():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="must be on one device"):
        flash_attention(q, k.to("meta"), v)


@pytest.mark.parametrize("kernel", ["fa3", "", "Hopper", None])
def test_unknown_forward_kernel(kernel):
    with pytest.raises(ValueError, match="kernel must be one of"):
        resolve_fwd_kernel(kernel)


@pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0),
    reason="checks the refusal on a machine without a compute-capability-9.0 GPU",
)
def test_hopper_kernel_refused_without_hopper_gpu():
    with pytest.raises(ValueError, match="compute capability 9.0"):
        resolve_fwd_kernel("hopper")
    assert resolve_fwd_kernel("auto") == "fa2"
    assert resolve_fwd_kernel("fa2") == "fa2"


@pytest.mark.parametrize("d", [129, 200, 256])
def test_head_dims_above_128_are_accepted(d):
    """Head dims 129..256 run (zero-padded to 256 on CUDA); on CPU tensors the operator's
    reference, forward and backward, with k/v's and q's gradients shaped like them."""
    q, k, v = qkv(h=4, hk=2, sq=9, sk=13, d=d)
    for t in (q, k, v):
        t.requires_grad_(True)
    out = flash_attention(q, k, v, causal="bottom_right", window_size=(5, -1), softcap=20.0)
    assert out.shape == q.shape and out.dtype == q.dtype
    out.float().sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == v.grad.shape == (2, 2, 13, d)


def test_head_dim_256_forward_kernel_choice():
    """The Hopper forward is compiled for head dims 64 and 128 only: with head dim 256 "auto"
    runs the FlashAttention-2 forward on every GPU and "hopper" is refused (on any machine: the
    head dim is checked first). Without a head dim (or at 64, 128) nothing changes."""
    from project01_cuda_kernel.attention import HOPPER_HEAD_DIMS, select_fwd_kernel

    assert HOPPER_HEAD_DIMS == (64, 128)
    assert select_fwd_kernel("auto", False, 256) == "fa2"
    assert select_fwd_kernel("fa2", False, 256) == "fa2"
    assert select_fwd_kernel("auto", True, 256) == "fa2"
    with pytest.raises(ValueError, match=r"kernel='hopper' is compiled for head dims \(64, 128\)"):
        select_fwd_kernel("hopper", False, 256)
    for d in (None, 64, 128):
        assert select_fwd_kernel("auto", False, d) == resolve_fwd_kernel("auto")
