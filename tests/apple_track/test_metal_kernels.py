"""The Metal kernels through mx.fast.metal_kernel against MLX's own ops (macOS, Apple silicon),
and their argument checks (anywhere MLX installs). Off macOS the launch tests skip saying so;
the kernel bodies are still run there by test_metal_kernels_on_cpu.py."""

from __future__ import annotations

import math

import pytest

mx = pytest.importorskip("mlx.core", reason="mlx is not installed: run in .venv-apple")

from apple_track import metal_kernels as mk  # noqa: E402

no_metal = pytest.mark.skipif(
    not mk.metal_available(), reason="no Metal device: MLX runs on the CPU"
)


def test_argument_checks_come_before_any_launch():
    a = mx.zeros((4, 8))
    with pytest.raises(ValueError, match="unknown kernel 'cublas'"):
        mk.matmul(a, mx.zeros((8, 4)), kernel="cublas")
    with pytest.raises(ValueError, match="inner dimensions differ"):
        mk.matmul(a, mx.zeros((7, 4)))
    with pytest.raises(ValueError, match="b must be 2-D"):
        mk.matmul(a, mx.zeros((8,)))
    with pytest.raises(TypeError, match="a must be float32, float16 or bfloat16"):
        mk.matmul(mx.zeros((4, 8), dtype=mx.int32), mx.zeros((8, 4), dtype=mx.int32))
    with pytest.raises(TypeError, match="same dtype"):
        mk.matmul(a, mx.zeros((8, 4), dtype=mx.float16))
    with pytest.raises(TypeError, match="mlx.core.array"):
        mk.matmul([[1.0]], [[1.0]])
    q = mx.zeros((1, 2, 16, 64))
    with pytest.raises(ValueError, match="head dim D must be a multiple of 8"):
        mk.attention(mx.zeros((1, 2, 16, 12)), mx.zeros((1, 2, 16, 12)), mx.zeros((1, 2, 16, 12)))
    with pytest.raises(ValueError, match="causal attention needs S_q == S_k"):
        mk.attention(q, mx.zeros((1, 2, 8, 64)), mx.zeros((1, 2, 8, 64)), causal=True)
    with pytest.raises(ValueError, match="k must be"):
        mk.attention(q, mx.zeros((1, 3, 16, 64)), mx.zeros((1, 3, 16, 64)))
    with pytest.raises(ValueError, match="scale must be a positive finite number"):
        mk.attention(q, q, q, scale=float("nan"))


@pytest.mark.skipif(mk.metal_available(), reason="Metal is available here")
def test_launch_without_metal_says_why():
    with pytest.raises(mk.MetalUnavailableError, match="need macOS on Apple silicon"):
        mk.matmul(mx.zeros((4, 8)), mx.zeros((8, 4)))


def test_every_ladder_step_has_its_source():
    for kernel in mk.MATMUL_KERNELS:
        src = mk.kernel_source(mk._MATMUL_FILES[kernel])
        assert "c[" in src and "a_shape" in src
    assert "simdgroup_multiply_accumulate" in mk.kernel_source("matmul_03_simdgroup.metal")


@pytest.mark.macos
@no_metal
@pytest.mark.parametrize("kernel", mk.MATMUL_KERNELS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", [(1, 1, 1), (37, 29, 45), (128, 256, 64), (513, 100, 257)])
def test_matmul_matches_mlx(kernel, dtype, shape):
    M, K, N = shape
    dt = getattr(mx, dtype)
    mx.random.seed(M + K + N)
    a = mx.random.normal((M, K)).astype(dt)
    b = mx.random.normal((K, N)).astype(dt)
    ref = a.astype(mx.float32) @ b.astype(mx.float32)  # float32 reference
    ours = mk.matmul(a, b, kernel=kernel).astype(mx.float32)
    mlx_own = (a @ b).astype(mx.float32)
    err = mx.abs(ours - ref).max().item()
    mlx_err = mx.abs(mlx_own - ref).max().item()
    # Pass rule of the repo: at most twice the error of the framework's own kernel in this dtype
    # (float32: a small absolute floor, since both are near exact).
    assert err <= max(2 * mlx_err, 1e-4 * math.sqrt(K)), (err, mlx_err)


@pytest.mark.macos
@no_metal
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [16, 64, 128])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("S", [1, 37, 256])
def test_attention_matches_mlx_sdpa(causal, D, dtype, S):
    dt = getattr(mx, dtype)
    mx.random.seed(S + D)
    q, k, v = (mx.random.normal((2, 3, S, D)).astype(dt) for _ in range(3))
    scale = 1.0 / math.sqrt(D)
    mask = "causal" if causal else None
    f32 = [x.astype(mx.float32) for x in (q, k, v)]
    ref = mx.fast.scaled_dot_product_attention(*f32, scale=scale, mask=mask)
    ours = mk.attention(q, k, v, causal=causal).astype(mx.float32)
    mlx_own = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
    err = mx.abs(ours - ref).max().item()
    mlx_err = mx.abs(mlx_own.astype(mx.float32) - ref).max().item()
    assert err <= max(2 * mlx_err, 2e-5), (err, mlx_err)


@pytest.mark.macos
@no_metal
def test_mlx_model_with_the_metal_attention_kernel():
    import torch

    from apple_track.mlx_model import from_torch, to_numpy
    from shared.model import build_model

    model = build_model("tiny", seed=0).eval()
    tokens = torch.randint(0, 256, (2, 40))
    with torch.no_grad():
        ref = model(tokens).numpy()
    ported = from_torch(model, attn_fn=mk.metal_attention_fn)
    out = to_numpy(ported(mx.array(tokens.numpy())))
    assert abs(out - ref).max() < 1e-4
