"""The Metal kernel bodies of apple_track/metal/, compiled as C++ against a CPU stand-in for the
Metal types (metal_emulator/metal_on_cpu.h) and run with their real launch grids: checks their
index arithmetic, tiling, edge masking and online softmax against NumPy in float64, on any
machine with a C++20 compiler. It does not compile Metal: test_metal_kernels.py does that on
macOS."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent / "metal_emulator"
CXX = shutil.which("g++") or shutil.which("clang++")


@pytest.fixture(scope="module")
def runner(tmp_path_factory) -> Path:
    if CXX is None:
        pytest.skip("no C++ compiler (g++ or clang++) to build the CPU stand-in of the kernels")
    exe = tmp_path_factory.mktemp("metal_cpu") / "run_kernel"
    r = subprocess.run(
        [
            CXX,
            "-std=c++20",
            "-O1",
            "-pthread",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-o",
            str(exe),
            str(HERE / "run_kernel.cpp"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    return exe


def _run(runner: Path, tmp_path: Path, args: list, arrays: list[np.ndarray], out_shape):
    src, dst = tmp_path / "in.bin", tmp_path / "out.bin"
    np.concatenate([a.astype(np.float32).ravel() for a in arrays]).tofile(src)
    r = subprocess.run(
        [str(runner), *map(str, args), str(src), str(dst)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return np.fromfile(dst, dtype=np.float32).reshape(out_shape)


@pytest.mark.parametrize("kernel", ["naive", "threadgroup_tiled", "simdgroup"])
@pytest.mark.parametrize("shape", [(1, 1, 1), (37, 29, 45), (64, 64, 64), (33, 70, 17)])
def test_matmul_kernels_match_numpy(runner, tmp_path, kernel, shape):
    M, K, N = shape
    rng = np.random.default_rng(M * 10_000 + K * 100 + N)
    a = rng.standard_normal((M, K), dtype=np.float32)
    b = rng.standard_normal((K, N), dtype=np.float32)
    c = _run(runner, tmp_path, ["matmul", kernel, M, K, N], [a, b], (M, N))
    ref = a.astype(np.float64) @ b.astype(np.float64)
    # A float32 dot product of K terms, in any order (tiles) and with or without fused
    # multiply-adds (the compiler's choice), is off by at most (K + 1) u sum_k |a_ik b_kj|,
    # u = 2**-24: the bound of each element, from its own terms. A wrong index or a missed edge
    # is off by O(|terms|), K times more.
    bound = (K + 1) * U * (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64))
    assert np.isfinite(c).all(), "some outputs were never written"
    _assert_within(c, ref, bound)


U = 2.0**-24  # float32 unit roundoff


def _assert_within(got: np.ndarray, ref: np.ndarray, bound: np.ndarray) -> None:
    err = np.abs(got.astype(np.float64) - ref)
    worst = float((err / bound).max())
    assert (err <= bound).all(), f"error {err.max():.2e}, {worst:.1f}x its rounding bound"


def _attention_bound(q, k, v, scale, causal) -> np.ndarray:
    """Worst-case float32 error of each attention output, to first order in u. A score of D terms
    is off by ds <= (D + 2) u sum|q_d k_d| scale (products, sum, scale, the max subtracted);
    softmax weights relative to their row, by at most 2 * max(ds) in the exponent of both the
    numerator and the sum, plus u per exp, 2u per online rescale (up to Sk of them), Sk u for the
    sum and u for the division; the output, Sk u more of sum p |v|. Twice that, for the second
    order."""
    Sq, Sk, D = q.shape[-2], k.shape[-2], q.shape[-1]
    s_abs = (np.abs(q).astype(np.float64) @ np.swapaxes(np.abs(k), -1, -2)) * scale
    if causal:
        s_abs = np.where(np.tril(np.ones((Sq, Sk), dtype=bool)), s_abs, 0.0)
    ds = (D + 2) * U * s_abs.max(-1, keepdims=True)
    rel = 4 * ds + (4 * Sk + 3) * U
    return 2 * rel * _attention_ref(q, k, np.abs(v), scale, causal)


def _attention_ref(q, k, v, scale, causal):
    s = (q.astype(np.float64) @ np.swapaxes(k, -1, -2).astype(np.float64)) * scale
    if causal:
        Sq, Sk = s.shape[-2:]
        s = np.where(np.tril(np.ones((Sq, Sk), dtype=bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v.astype(np.float64)


@pytest.mark.parametrize(
    "B,H,Sq,Sk,D,causal",
    [
        (1, 2, 37, 37, 16, True),
        (2, 1, 70, 45, 32, False),
        (1, 1, 65, 65, 64, True),
        (1, 1, 5, 80, 16, False),
        (1, 1, 1, 1, 16, True),
    ],
)
def test_attention_kernel_matches_numpy(runner, tmp_path, B, H, Sq, Sk, D, causal):
    rng = np.random.default_rng(Sq * 1000 + Sk + D)
    q = rng.standard_normal((B, H, Sq, D), dtype=np.float32)
    k = rng.standard_normal((B, H, Sk, D), dtype=np.float32)
    v = rng.standard_normal((B, H, Sk, D), dtype=np.float32)
    scale = 1.0 / np.sqrt(D)
    o = _run(
        runner,
        tmp_path,
        ["attention", B, H, Sq, Sk, D, int(causal), repr(float(scale))],
        [q, k, v],
        (B, H, Sq, D),
    )
    assert np.isfinite(o).all()
    _assert_within(
        o, _attention_ref(q, k, v, scale, causal), _attention_bound(q, k, v, scale, causal)
    )
