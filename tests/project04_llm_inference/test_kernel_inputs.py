"""CPU tier: the kernel wrappers' contract without a GPU (validation, CPU dispatch, split plan)."""

from __future__ import annotations

import math

import pytest
import torch

from project04_llm_inference.kernels import decode, reference, rope_cache


class FakeCuda(torch.Tensor):
    """A CPU tensor that reports a CUDA device, to reach the CUDA-only checks without a GPU."""

    @property
    def device(self):  # noqa: D401 - mimics torch.Tensor.device
        return torch.device("cuda", 0)


def _decode_args(b=2, hq=8, hkv=2, d=64, bs=16, nb=8, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, hq, d, generator=g).to(dtype)
    kc = torch.randn(nb, bs, hkv, d, generator=g).to(dtype)
    vc = torch.randn(nb, bs, hkv, d, generator=g).to(dtype)
    tables = torch.randperm(nb, generator=g)[: b * 3].view(b, 3).to(torch.int32)
    lens = torch.tensor([5, 40][:b], dtype=torch.int32)
    return {
        "q": q,
        "k_cache": kc,
        "v_cache": vc,
        "block_tables": tables,
        "context_lens": lens,
        "softmax_scale": d**-0.5,
        "max_context_len": None,
    }


def _rope_args(t=4, hq=4, hkv=2, d=64, dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    return {
        "q": torch.randn(t, hq, d, generator=g).to(dtype),
        "k": torch.randn(t, hkv, d, generator=g).to(dtype),
        "v": torch.randn(t, hkv, d, generator=g).to(dtype),
        "positions": torch.tensor([0, 3, 7, 2][:t]),
        "cos_sin": reference.rope_cos_sin_cache(inv_freq, 16),
        "k_cache": torch.zeros(4, 16, hkv, d, dtype=dtype),
        "v_cache": torch.zeros(4, 16, hkv, d, dtype=dtype),
        "slot_mapping": torch.tensor([3, -1, 17, 40][:t]),
    }


def _fake(args, names):
    return {k: (v.as_subclass(FakeCuda) if k in names else v) for k, v in args.items()}


# --- CPU dispatch ------------------------------------------------------------------------------


def test_importing_the_wrappers_builds_nothing():
    assert decode.EXTENSION and rope_cache.EXTENSION
    assert (decode.CSRC / "paged_decode.cu").exists()
    assert (rope_cache.CSRC / "rope_cache.cu").exists()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_on_cpu_is_the_reference(dtype):
    args = _decode_args(dtype=dtype)
    args["context_lens"] = torch.tensor([0, 33], dtype=torch.int32)
    out = decode.paged_decode_attention(**args)
    assert torch.equal(out, reference.paged_decode_attention(**args))
    assert torch.equal(out[0], torch.zeros_like(out[0]))  # empty slot -> zeros


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_on_cpu_is_the_reference(dtype):
    ours, ref = _rope_args(dtype=dtype), _rope_args(dtype=dtype)
    rope_cache.rope_and_cache(**ours)
    reference.rope_and_cache(**ref)
    for name in ("q", "k", "v", "k_cache", "v_cache"):
        assert torch.equal(ours[name], ref[name]), name
    assert ours["k_cache"].flatten(0, 1)[1].abs().sum() == 0  # nothing written for slot -1


def test_rope_on_cpu_accepts_views_into_a_fused_qkv():
    t, hq, hkv, d = 4, 4, 2, 64
    args = _rope_args()
    qkv = torch.cat([args["q"].flatten(1), args["k"].flatten(1), args["v"].flatten(1)], 1)
    views = dict(args)
    views["q"] = qkv[:, : hq * d].view(t, hq, d)
    views["k"] = qkv[:, hq * d : (hq + hkv) * d].view(t, hkv, d)
    views["v"] = qkv[:, (hq + hkv) * d :].view(t, hkv, d)
    views["k_cache"], views["v_cache"] = args["k_cache"].clone(), args["v_cache"].clone()
    rope_cache.rope_and_cache(**views)
    reference.rope_and_cache(**args)
    assert torch.equal(views["q"], args["q"]) and torch.equal(views["k_cache"], args["k_cache"])


# --- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "exc", "match"),
    [
        ({"q": [[1.0]]}, TypeError, "q must be a torch.Tensor"),
        ({"q": torch.zeros(2, 8)}, ValueError, r"q must be 3-D \(B, Hq, D\)"),
        ({"k_cache": torch.zeros(8, 16, 2)}, ValueError, "k_cache must be 4-D"),
        ({"v_cache": None}, TypeError, "v_cache must be a torch.Tensor"),
        (
            {"block_tables": torch.zeros(2, dtype=torch.int32)},
            ValueError,
            "block_tables must be 2-D",
        ),
        (
            {"context_lens": torch.zeros(2, 1, dtype=torch.int32)},
            ValueError,
            "context_lens must be 1-D",
        ),
        ({"q": torch.zeros(2, 8, 64, dtype=torch.int32)}, TypeError, "q must be a floating-point"),
        (
            {"k_cache": torch.zeros(8, 16, 2, 64, dtype=torch.bfloat16)},
            TypeError,
            "k_cache must have q's dtype",
        ),
        (
            {"v_cache": torch.zeros(8, 16, 2, 64, dtype=torch.float16)},
            TypeError,
            "v_cache must have q's dtype",
        ),
        (
            {"block_tables": torch.zeros(2, 3, dtype=torch.int64)},
            TypeError,
            "block_tables must be torch.int32",
        ),
        (
            {"context_lens": torch.zeros(2, dtype=torch.int64)},
            TypeError,
            "context_lens must be torch.int32",
        ),
        ({"v_cache": torch.zeros(8, 32, 2, 64)}, ValueError, "v_cache must have k_cache's shape"),
        (
            {"k_cache": torch.zeros(8, 16, 2, 128), "v_cache": torch.zeros(8, 16, 2, 128)},
            ValueError,
            "k_cache must have q's head dim 64",
        ),
        (
            {"k_cache": torch.zeros(8, 16, 3, 64), "v_cache": torch.zeros(8, 16, 3, 64)},
            ValueError,
            "multiple of k_cache's 3 kv heads",
        ),
        ({"block_tables": torch.zeros(3, 3, dtype=torch.int32)}, ValueError, "q's batch 2 rows"),
        ({"context_lens": torch.zeros(1, dtype=torch.int32)}, ValueError, "q's batch 2 rows"),
        ({"softmax_scale": "0.1"}, TypeError, "softmax_scale must be a float"),
        ({"softmax_scale": 0.0}, ValueError, "softmax_scale must be finite and > 0"),
        ({"softmax_scale": math.inf}, ValueError, "softmax_scale must be finite and > 0"),
        ({"max_context_len": -1}, ValueError, "max_context_len must be None or an int >= 0"),
        ({"max_context_len": 4.0}, ValueError, "max_context_len must be None or an int >= 0"),
    ],
)
def test_decode_bad_input_raises_naming_the_argument(change, exc, match):
    args = _decode_args()
    args.update(change)
    with pytest.raises(exc, match=match):
        decode.paged_decode_attention(**args)


def test_decode_device_mismatch_is_named():
    args = _fake(_decode_args(dtype=torch.bfloat16), {"q"})
    with pytest.raises(ValueError, match="k_cache must be on q's device cuda:0, got cpu"):
        decode.paged_decode_attention(**args)


_ALL_DECODE = {"q", "k_cache", "v_cache", "block_tables", "context_lens"}


@pytest.mark.parametrize(
    ("kwargs", "mutate", "exc", "match"),
    [
        ({"dtype": torch.float32}, None, TypeError, "bfloat16 or torch.float16 on CUDA"),
        ({"d": 96}, None, ValueError, r"head dim must be one of \(64, 128\) on CUDA, got 96"),
        ({"bs": 8}, None, ValueError, "block size must be a power of two >= 16, got 8"),
        ({"bs": 48}, None, ValueError, "block size must be a power of two >= 16, got 48"),
        ({"hq": 34, "hkv": 2}, None, ValueError, "must be <= 16 on CUDA, got 17"),
        (
            {},
            lambda a: a.update(k_cache=a["k_cache"].transpose(2, 3).contiguous().transpose(2, 3)),
            ValueError,
            "k_cache must be contiguous",
        ),
        (
            {},
            lambda a: a.update(
                v_cache=torch.zeros(8 * 16 * 2 * 64 + 1, dtype=torch.bfloat16)[1:].view(
                    8, 16, 2, 64
                )
            ),
            ValueError,
            "v_cache must start 16-byte aligned",
        ),
        (
            {},
            lambda a: a.update(q=torch.randn(2, 64, 8).to(torch.bfloat16).transpose(1, 2)),
            ValueError,
            "q must have contiguous dims",
        ),
        (
            {},
            lambda a: a.update(block_tables=a["block_tables"].t().contiguous().t()),
            ValueError,
            "block_tables must have contiguous rows",
        ),
        (
            {},
            lambda a: a.update(context_lens=torch.zeros(4, dtype=torch.int32)[::2]),
            ValueError,
            "context_lens must be contiguous",
        ),
    ],
)
def test_decode_cuda_only_checks(kwargs, mutate, exc, match):
    """What the kernel adds to the reference's contract, reached with a fake CUDA device."""
    args = _decode_args(**{"dtype": torch.bfloat16, **kwargs})
    if mutate is not None:
        mutate(args)
    with pytest.raises(exc, match=match):
        decode.paged_decode_attention(**_fake(args, _ALL_DECODE))


@pytest.mark.parametrize(
    ("change", "exc", "match"),
    [
        ({"q": 1.0}, TypeError, "q must be a torch.Tensor"),
        ({"k": torch.zeros(4, 64)}, ValueError, r"k must be 3-D \(T, Hkv, D\)"),
        ({"positions": torch.zeros(4, 1, dtype=torch.int64)}, ValueError, "positions must be 1-D"),
        ({"cos_sin": torch.zeros(16)}, ValueError, "cos_sin must be 2-D"),
        ({"slot_mapping": None}, TypeError, "slot_mapping must be a torch.Tensor"),
        ({"q": torch.zeros(4, 4, 64, dtype=torch.int64)}, TypeError, "q must be a floating-point"),
        ({"v": torch.zeros(4, 2, 64, dtype=torch.float16)}, TypeError, "v must have q's dtype"),
        (
            {"k_cache": torch.zeros(4, 16, 2, 64, dtype=torch.bfloat16)},
            TypeError,
            "k_cache must have q's dtype",
        ),
        (
            {"positions": torch.zeros(4, dtype=torch.int32)},
            TypeError,
            "positions must be torch.int64",
        ),
        (
            {"slot_mapping": torch.zeros(4, dtype=torch.int32)},
            TypeError,
            "slot_mapping must be torch.int64",
        ),
        (
            {"cos_sin": torch.zeros(16, 64, dtype=torch.float64)},
            TypeError,
            "cos_sin must be torch.float32",
        ),
        ({"q": torch.zeros(4, 4, 63)}, ValueError, "head dim must be even"),
        ({"k": torch.zeros(3, 2, 64)}, ValueError, r"k must be \(T=4, Hkv, D=64\)"),
        ({"v": torch.zeros(4, 3, 64)}, ValueError, "v must have k's shape"),
        (
            {"positions": torch.zeros(5, dtype=torch.int64)},
            ValueError,
            "positions must have q's 4 tokens",
        ),
        (
            {"slot_mapping": torch.zeros(3, dtype=torch.int64)},
            ValueError,
            "slot_mapping must have q's 4 tokens",
        ),
        ({"cos_sin": torch.zeros(16, 32)}, ValueError, r"cos_sin must be \(max_positions, D=64\)"),
        (
            {"k_cache": torch.zeros(4, 16, 4, 64)},
            ValueError,
            "k_cache must be \\(num_blocks, block_size, Hkv=2, D=64\\)",
        ),
        ({"v_cache": torch.zeros(4, 8, 2, 64)}, ValueError, "v_cache must have k_cache's shape"),
    ],
)
def test_rope_bad_input_raises_naming_the_argument(change, exc, match):
    args = _rope_args()
    args.update(change)
    with pytest.raises(exc, match=match):
        rope_cache.rope_and_cache(**args)


_ALL_ROPE = {"q", "k", "v", "positions", "cos_sin", "k_cache", "v_cache", "slot_mapping"}


@pytest.mark.parametrize(
    ("mutate", "exc", "match"),
    [
        (
            lambda a: a.update(
                q=torch.zeros(4, 4, 64, dtype=torch.float64),
                k=torch.zeros(4, 2, 64, dtype=torch.float64),
                v=torch.zeros(4, 2, 64, dtype=torch.float64),
                k_cache=torch.zeros(4, 16, 2, 64, dtype=torch.float64),
                v_cache=torch.zeros(4, 16, 2, 64, dtype=torch.float64),
            ),
            TypeError,
            "bfloat16, float16 or float32 on CUDA",
        ),
        (
            lambda a: a.update(
                q=torch.zeros(4, 4, 12),
                k=torch.zeros(4, 2, 12),
                v=torch.zeros(4, 2, 12),
                cos_sin=torch.zeros(16, 12),
                k_cache=torch.zeros(4, 16, 2, 12),
                v_cache=torch.zeros(4, 16, 2, 12),
            ),
            ValueError,
            "head dim must be a multiple of 8",
        ),
        (
            lambda a: a.update(q=torch.zeros(4, 64, 4).transpose(1, 2)),
            ValueError,
            "q must be contiguous within a token",
        ),
        (
            lambda a: a.update(k=torch.zeros(4, 2 * 64 + 1)[:, 1:].view(4, 2, 64)),
            ValueError,
            "k must start 16-byte aligned",
        ),
        (
            lambda a: a.update(v=torch.zeros(4, 2 * 64 + 2)[:, : 2 * 64].view(4, 2, 64)),
            ValueError,
            "v must start 16-byte aligned",
        ),
        (
            lambda a: a.update(cos_sin=torch.zeros(64, 16).t()),
            ValueError,
            "cos_sin must be contiguous",
        ),
        (
            lambda a: a.update(v_cache=torch.zeros(4, 2, 16, 64).transpose(1, 2)),
            ValueError,
            "v_cache must be contiguous",
        ),
        (
            lambda a: a.update(cos_sin=torch.zeros(16 * 64 + 1)[1:].view(16, 64)),
            ValueError,
            "cos_sin must start 16-byte aligned",
        ),
        (
            lambda a: a.update(positions=torch.zeros(8, dtype=torch.int64)[::2]),
            ValueError,
            "positions and slot_mapping must be contiguous",
        ),
    ],
)
def test_rope_cuda_only_checks(mutate, exc, match):
    args = _rope_args()
    mutate(args)
    with pytest.raises(exc, match=match):
        rope_cache.rope_and_cache(**_fake(args, _ALL_ROPE))


# --- split plan --------------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [1, 8, 64, 256])
@pytest.mark.parametrize("max_len", [1, 100, 1024, 8192, 32768, 1 << 20])
def test_split_plan_covers_the_context_in_whole_partitions(batch, max_len):
    part, splits = decode.split_plan(batch, 8, max_len, num_sms=132)
    assert part % 64 == 0 and splits >= 1
    assert part * splits >= max_len and part * (splits - 1) < max_len  # no empty trailing split
    if splits > 1:
        assert part >= decode.MIN_PARTITION
        assert batch * 8 * splits <= decode.WAVES * 132  # at most WAVES CTAs per SM


def test_split_plan_fills_the_gpu_at_batch_1_and_splits_large_batches_little():
    part, splits = decode.split_plan(1, 8, 32768, num_sms=132)
    assert 8 * splits >= 4 * 132  # a few waves of CTAs for one sequence
    assert decode.split_plan(64, 8, 32768, num_sms=132) == (8192, 4)  # 512 CTAs x 4 <= 16 x 132
    # 2,048 CTAs (15.5 per SM) already: one split, no combine pass
    assert decode.split_plan(256, 8, 1024, num_sms=132) == (1024, 1)
    assert decode.split_plan(256, 8, 32768, num_sms=132) == (32768, 1)
