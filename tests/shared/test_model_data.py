import math
from dataclasses import replace

import pytest
import torch

from shared.data import SyntheticTokens
from shared.model import ModelArgs, Transformer, apply_rope, build_model, rope_tables


@pytest.mark.parametrize(
    "preset, expected",
    [
        # tiny by hand: 2 x (4*64^2 + 3*64*192 + 2*64) + 2*256*64 + 64 = 139,584
        ("tiny", 139_584),
        # 12 x (4*768^2 + 3*768*2048 + 2*768) + 2*32000*768 + 768
        ("125m", 134_105_856),
        # 18 x (4*2048^2 + 3*2048*6144 + 2*2048) + 2*32000*2048 + 2048
        ("1b", 1_112_614_912),
    ],
)
def test_parameter_counts(preset, expected):
    args = ModelArgs.from_preset(preset)
    assert args.num_params() == expected
    with torch.device("meta"):  # no memory for the 1b weights
        model = Transformer(args)
    assert model.num_params() == expected


def test_bad_configs_are_clear():
    with pytest.raises(ValueError, match="unknown model preset 'huge'"):
        ModelArgs.from_preset("huge")
    with pytest.raises(ValueError, match="divisible by n_heads"):
        ModelArgs(dim=100, n_heads=3)
    with pytest.raises(ValueError, match="n_layers must be positive"):
        ModelArgs.from_preset("tiny", n_layers=0)
    model = build_model("tiny")
    with pytest.raises(ValueError, match="exceeds max_seq_len"):
        model(torch.zeros(1, 65, dtype=torch.long))
    with pytest.raises(ValueError, match="batch, seq"):
        model(torch.zeros(65, dtype=torch.long))


def test_forward_shape_init_and_determinism():
    a, b = build_model("tiny", seed=3), build_model("tiny", seed=3)
    tokens = torch.randint(0, 256, (2, 16))
    out = a(tokens)
    assert out.shape == (2, 16, 256)
    assert torch.equal(out, b(tokens))
    # untrained logits are close to uniform: loss near ln(256)
    loss = torch.nn.functional.cross_entropy(out.flatten(0, 1), tokens.flatten())
    assert abs(loss.item() - math.log(256)) < 0.3
    assert not torch.equal(build_model("tiny", seed=4).output.weight, a.output.weight)


def test_causality_future_tokens_do_not_change_the_past():
    model = build_model("tiny", seed=0)
    x = torch.randint(0, 256, (1, 20))
    y = x.clone()
    y[0, 12:] = torch.randint(0, 256, (8,))
    # Same shapes, same kernels, same inputs at positions < 12; the masked keys add exact zeros:
    # the first 12 positions are computed identically, the default tolerances are only slack.
    torch.testing.assert_close(model(x)[0, :12], model(y)[0, :12])
    assert not torch.allclose(model(x)[0, 12:], model(y)[0, 12:])


def test_rope_is_a_rotation_that_encodes_relative_position():
    cos, sin = rope_tables(8, 32, 10_000.0)
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, 8, generator=gen), torch.randn(1, 1, 1, 8, generator=gen)

    # the same vectors placed at positions (i, j): the score depends on i - j only
    def score(i, j):
        qi = apply_rope(q, cos[i : i + 1], sin[i : i + 1])
        kj = apply_rope(k, cos[j : j + 1], sin[j : j + 1])
        return (qi * kj).sum().item()

    # float32, u = 2**-24. Both positions use the same computed inv_freq (<= 1), so the relative
    # angle is exact but for the rounding of pos * inv_freq (<= pos * u rad) and of cos/sin (u):
    # a vector rotated to position p is off by at most (p + 4) u of its norm (angle, table, two
    # products and a sum), and a score of 8 terms adds 8 u: score(i, j) is off by at most
    # (i + j + 16) u |q| |k|, 39 u |q| |k| for (13, 10) and 23 u for (5, 2); 128 u leaves a factor
    # of 2 on their sum. A position encoding that is not relative moves the score by O(|q| |k|).
    u = 2.0**-24
    qk = q.norm().item() * k.norm().item()
    assert score(5, 2) == pytest.approx(score(13, 10), abs=128 * u * qk)
    rotated = apply_rope(q, cos[7:8], sin[7:8])
    # rotated by position 7: off by (7 + 4) u of |q|; each norm of 8 squares adds 5 u: 21 u
    assert rotated.norm().item() == pytest.approx(q.norm().item(), rel=32 * u)


def test_attention_function_is_injectable():
    calls = []

    def attn(q, k, v, causal=True):
        calls.append((q.shape, causal))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    model = build_model("tiny", seed=0, attn_fn=attn)
    ref = build_model("tiny", seed=0)
    x = torch.randint(0, 256, (2, 10))
    # the same SDPA call on the same tensors: identical, the default tolerances are only slack
    torch.testing.assert_close(model(x), ref(x))
    assert calls == [((2, 4, 10, 16), True)] * 2  # one call per layer, (B, H, S, D)


# --- grouped-query attention -----------------------------------------------------------------


def test_default_kv_heads_keep_the_multi_head_shapes():
    # The tiny preset's state dict as it was before n_kv_heads existed: checkpoints stay loadable.
    d, f, v = 64, 192, 256
    per_layer = {
        "attention_norm.weight": (d,),
        "attention.wqkv.weight": (3 * d, d),
        "attention.wo.weight": (d, d),
        "ffn_norm.weight": (d,),
        "feed_forward.w1.weight": (f, d),
        "feed_forward.w3.weight": (f, d),
        "feed_forward.w2.weight": (d, f),
    }
    expected = {"tok_embeddings.weight": (v, d), "norm.weight": (d,), "output.weight": (v, d)}
    expected |= {f"layers.{i}.{k}": s for i in range(2) for k, s in per_layer.items()}
    for args in (ModelArgs.from_preset("tiny"), ModelArgs.from_preset("tiny", n_kv_heads=4)):
        shapes = {k: tuple(t.shape) for k, t in Transformer(args).state_dict().items()}
        assert shapes == expected
    assert ModelArgs.from_preset("tiny").kv_heads == 4


def _mha_from_gqa(gqa: Transformer) -> Transformer:
    """The multi-head model that GQA abbreviates: each kv head copied to every query head of its
    group (query head h reads kv head h // group)."""
    a = gqa.args
    mha = Transformer(replace(a, n_kv_heads=None))
    sd, group = gqa.state_dict(), a.n_heads // a.kv_heads

    def rep(w):  # (kv_heads * D, dim) -> (n_heads * D, dim)
        return w.view(a.kv_heads, a.head_dim, a.dim).repeat_interleave(group, 0).flatten(0, 1)

    for i in range(a.n_layers):
        key = f"layers.{i}.attention.wqkv.weight"
        q, k, v = sd[key].split((a.dim, a.kv_dim, a.kv_dim))
        sd[key] = torch.cat([q, rep(k), rep(v)])
    mha.load_state_dict(sd)
    return mha


def _sdpa(q, k, v, causal=True):
    assert q.shape == k.shape == v.shape  # injected kernels get one kv head per query head
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


GQA_RTOL = 2.5e-4  # derived in the test below


@pytest.mark.parametrize("attn_fn", [None, _sdpa], ids=["sdpa-enable-gqa", "injected-repeat"])
def test_gqa_is_mha_with_kv_heads_repeated_per_group(attn_fn):
    args = ModelArgs.from_preset("tiny", n_heads=8, n_kv_heads=2, n_layers=2)
    gqa = build_model(args, seed=0, attn_fn=attn_fn)
    with torch.no_grad():  # larger attention weights: peaked softmax, so a wrong kv head shows
        for layer in gqa.layers:
            layer.attention.wqkv.weight.normal_(0.0, 0.3)
    assert gqa.layers[0].attention.wqkv.weight.shape == (64 + 2 * 2 * 8, 64)
    mha = _mha_from_gqa(gqa)
    x = torch.randint(0, 256, (2, 24))
    # float32 throughout (u = 2**-24); the same products, at most summed in another order (inside
    # SDPA, or by a BLAS kernel chosen for the other wqkv shape). A sum of n terms in any order
    # moves by at most n u of sum|terms|; along the forward the chains of sums add up to ~1,400
    # terms (per block: norm 64, qkv 64, scores 8, softmax and values 24, out 64, norm 64, w1/w3
    # 64, w2 192; then norm and head 64 each), with sum|terms| of the logits' scale (RMSNorm keeps
    # activations O(1)): 8.3e-5 of the largest logit. GQA_RTOL = 2.5e-4 of it leaves a factor 3.
    ref = mha(x)
    scale = ref.abs().max().item()
    torch.testing.assert_close(gqa(x), ref, rtol=GQA_RTOL, atol=GQA_RTOL * scale)
    # ...and the check can fail: pairing query heads with the wrong kv heads changes the output
    wrong = _mha_from_gqa(gqa)
    with torch.no_grad():
        w = wrong.layers[0].attention.wqkv.weight
        kv = w[64:].view(2, 8, 8, 64)  # (k|v, head, D, dim)
        w[64:] = kv.roll(1, dims=1).reshape(128, 64)
    assert (wrong(x) - ref).abs().max() > 100 * GQA_RTOL * scale


def test_gqa_parameter_count_and_bad_kv_heads():
    # tiny with 2 kv heads of 16: per block 2*64*64 + 2*64*32 + 3*64*192 + 2*64 = 49,280
    args = ModelArgs.from_preset("tiny", n_kv_heads=2)
    assert args.num_params() == 2 * 49_280 + 2 * 256 * 64 + 64 == Transformer(args).num_params()
    tied = ModelArgs.from_preset("tiny", n_kv_heads=2, tie_embeddings=True)
    model = Transformer(tied)
    assert model.output.weight is model.tok_embeddings.weight
    assert tied.num_params() == args.num_params() - 256 * 64 == model.num_params()
    for bad in (0, -2):
        with pytest.raises(ValueError, match="n_kv_heads must be positive"):
            ModelArgs.from_preset("tiny", n_kv_heads=bad)
    for bad in (3, 8):
        with pytest.raises(ValueError, match=r"n_heads \(4\) must be divisible by n_kv_heads"):
            ModelArgs.from_preset("tiny", n_kv_heads=bad)


# --- data ------------------------------------------------------------------------------------


def test_stream_is_deterministic_and_resumable():
    a = SyntheticTokens(256, 32, 8, seed=1)
    first = [a.next_batch() for _ in range(3)]
    b = SyntheticTokens(256, 32, 8, seed=1)
    b.load_state_dict({**a.state_dict(), "step": 2})
    torch.testing.assert_close(b.next_batch(), first[2])
    c = SyntheticTokens(256, 32, 8, seed=2)
    assert not torch.equal(c.next_batch()[0], first[0][0])


@pytest.mark.parametrize("world", [2, 4])
def test_global_batch_is_the_same_for_any_world_size(world):
    full_x, full_y = SyntheticTokens(256, 16, 8, seed=0).batch_at(5)
    parts = [
        SyntheticTokens(256, 16, 8, seed=0, rank=r, world_size=world).batch_at(5)
        for r in range(world)
    ]
    torch.testing.assert_close(torch.cat([p[0] for p in parts]), full_x)
    torch.testing.assert_close(torch.cat([p[1] for p in parts]), full_y)
    assert parts[0][0].shape == (8 // world, 16)


def test_targets_follow_the_successor_table():
    d = SyntheticTokens(64, 32, 4, seed=0)
    x, y = d.next_batch()
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are inputs shifted by one
    succ = torch.from_numpy(d._successors)
    allowed = (succ[x] == y.unsqueeze(-1)).any(-1)
    assert bool(allowed.all())
    assert 0.8 < d.entropy < 1.0 < d.uniform_loss


def test_bad_stream_configs_are_clear():
    with pytest.raises(ValueError, match="multiple of the world size"):
        SyntheticTokens(256, 16, 6, world_size=4)
    with pytest.raises(ValueError, match="not in a world"):
        SyntheticTokens(256, 16, 8, rank=2, world_size=2)
    d = SyntheticTokens(256, 16, 8, seed=0)
    with pytest.raises(ValueError, match="another run configuration"):
        d.load_state_dict({"step": 3, "seed": 9})


def test_the_model_learns_the_stream():
    torch.manual_seed(0)
    model = build_model("tiny", seed=0)
    data = SyntheticTokens(256, 64, 16, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(80):
        x, y = data.next_batch()
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[0] > 5.0
    assert sum(losses[-10:]) / 10 < 2.0  # far below ln(256) = 5.55: it learned the table
