"""The fused rounds' bookkeeping and the greedy acceptance (`kernels/spec_rounds.py`): argument
checks, the torch references against row-by-row oracles written from the module doc of
`spec/fused.py` (CPU tier), and the CUDA kernels against the references (GPU tier). Integer
arithmetic and exact comparisons only: every check is exact.
"""

from __future__ import annotations

import pytest
import torch

from project04_llm_inference.kernels import spec_rounds
from project04_llm_inference.kernels.spec_rounds import CATCH_UP

INT32 = ("d_tables", "t_tables", "d_ctx", "s_lens", "t_lens")


def _state(w, k, mbd, mbt, device, seed, *, dbs=16, tbs=16):
    """A slab's device views (every name the program uses) with a random state: rows real or
    padding, catch-up of 1 or 2, tables of random block ids, and a last round's result with
    every acceptance count 0..k."""
    g = torch.Generator().manual_seed(seed)
    q = k + 1

    def ints(shape, lo, hi):
        return torch.randint(lo, hi, shape, generator=g, dtype=torch.int64)

    d = {
        "real": ints((w,), 0, 2),
        "nd": ints((w,), 0, k + 1),
        "dn": ints((w,), 1, CATCH_UP + 1),
        "dtok": ints((w, CATCH_UP), 0, 1000),
        "last": ints((w,), 0, 1000),
        "d_tables": ints((w, mbd), 0, 5000).to(torch.int32),
        "t_tables": ints((w, mbt), 0, 5000).to(torch.int32),
    }
    room = k + 1 + CATCH_UP + 2 * (k + 1)  # positions a round and an advance may reach
    d["L"] = ints((w,), 0, max(1, mbt * tbs - room))
    d["cd"] = torch.clamp(d["L"] - ints((w,), 0, 3), min=0).clamp(max=max(0, mbd * dbs - room))
    # the outputs: filled with garbage, every element must be written (or kept: t_ids' drafts)
    for name, shape in (
        ("d_ids", (w * CATCH_UP,)),
        ("d_pos", (w * CATCH_UP,)),
        ("d_slots", (w * CATCH_UP,)),
        ("d_rows", (w,)),
        ("s_pos", (k - 1, w)),
        ("s_slots", (k - 1, w)),
        ("t_ids", (w * q,)),
        ("t_pos", (w * q,)),
        ("t_slots", (w * q,)),
    ):
        d[name] = ints(shape, -99, 99)
    for name, shape in (
        ("d_ctx", (w,)),
        ("s_lens", (k - 1, w)),
        ("t_lens", (w * q,)),
    ):
        d[name] = ints(shape, -99, 99).to(torch.int32)
    prev = torch.cat((ints((w, 1), 0, k + 1), ints((w, 1 + k), 0, 1000)), 1)
    return {n: v.to(device) for n, v in d.items()}, prev.to(device)


def _oracle(d, prev, k, dbs, tbs):
    """Row by row from spec/fused.py's module doc: a new dict of expected values (CPU)."""
    e = {n: v.clone().cpu() for n, v in d.items()}
    w, q = e["L"].shape[0], k + 1

    def slot(table, pos, bs):
        return int(table[min(pos // bs, table.shape[0] - 1)]) * bs + pos % bs

    for i in range(w):
        real = bool(e["real"][i])
        if prev is not None and real:
            a, b = int(prev[i, 0]), int(prev[i, 1])
            cd, dn = int(e["cd"][i]), int(e["dn"][i])
            e["L"][i] += a + 1
            e["last"][i] = b
            e["cd"][i] = cd + dn + min(a, k - 1)
            e["dn"][i] = 2 if a == k else 1
            e["dtok"][i] = torch.tensor([int(prev[i, 2 + k - 1]), b] if a == k else [b, 0])
        L, cd, dn = int(e["L"][i]), int(e["cd"][i]), int(e["dn"][i])
        for c in range(CATCH_UP):
            j = i * CATCH_UP + c
            e["d_ids"][j] = e["dtok"][i, c]
            e["d_pos"][j] = cd + c
            e["d_slots"][j] = slot(e["d_tables"][i], cd + c, dbs) if real and c < dn else -1
        e["d_rows"][i] = i * CATCH_UP + dn - 1
        e["d_ctx"][i] = cd + CATCH_UP
        for j in range(k - 1):
            p = cd + dn + j if real else 0
            e["s_pos"][j, i] = p
            e["s_slots"][j, i] = slot(e["d_tables"][i], p, dbs) if real else -1
            e["s_lens"][j, i] = p + 1
        for c in range(q):
            live = real and c < 1 + int(e["nd"][i])
            e["t_pos"][i * q + c] = L + c
            e["t_slots"][i * q + c] = slot(e["t_tables"][i], L + c, tbs) if live else -1
            e["t_lens"][i * q + c] = L + c + 1  # a decode row sees keys 0..its position
        e["t_ids"][i * q] = e["last"][i]
    return e


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("advance", [False, True])
def test_reference_follows_the_documented_rounds(k, advance):
    d, prev = _state(w=8, k=k, mbd=6, mbt=9, device="cpu", seed=k)
    want = _oracle(d, prev if advance else None, k, 16, 16)
    spec_rounds.round_inputs(d, prev if advance else None, k=k, dbs=16, tbs=16)  # CPU: reference
    for name in want:
        assert torch.equal(d[name], want[name]), name


def test_block_size_other_than_16_and_clamped_tables():
    # positions past a table's last block read its last entry (the torch version's clamp)
    d, prev = _state(w=4, k=3, mbd=2, mbt=2, device="cpu", seed=7, dbs=4, tbs=8)
    d["L"][:] = 100  # far past 2 blocks of 8
    d["cd"][:] = 50
    want = _oracle(d, prev, 3, 4, 8)
    spec_rounds.round_inputs(d, prev, k=3, dbs=4, tbs=8)
    for name in want:
        assert torch.equal(d[name], want[name]), name


@pytest.mark.parametrize(
    "mutate, exc, match",
    [
        (lambda d, p: d.__setitem__("t_lens", d["t_lens"].long()), TypeError, "t_lens"),
        (lambda d, p: d.__setitem__("s_pos", d["s_pos"][:, :1]), ValueError, "s_pos"),
        (lambda d, p: d.__setitem__("d_tables", d["d_tables"].t()), ValueError, "d_tables"),
        (lambda d, p: d.pop("nd"), TypeError, "nd"),
        (lambda d, p: p.__setitem__(0, p[0][:, :3]), ValueError, "prev"),
        (lambda d, p: p.__setitem__(0, p[0].int()), TypeError, "prev"),
    ],
)
def test_bad_arguments_name_the_field(mutate, exc, match):
    d, prev = _state(w=4, k=4, mbd=3, mbt=3, device="cpu", seed=1)
    box = [prev]
    mutate(d, box)
    with pytest.raises(exc, match=match):
        spec_rounds.round_inputs(d, box[0], k=4, dbs=16, tbs=16)


def test_bad_sizes():
    d, prev = _state(w=2, k=2, mbd=3, mbt=3, device="cpu", seed=2)
    with pytest.raises(ValueError, match="k must"):
        spec_rounds.round_inputs(d, prev, k=0, dbs=16, tbs=16)
    with pytest.raises(ValueError, match="target block size"):
        spec_rounds.round_inputs(d, prev, k=2, dbs=16, tbs=0)


@pytest.mark.gpu
@pytest.mark.parametrize("w", [1, 8, 130])
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_kernel_equals_reference(w, k):
    for advance in (False, True):
        d, prev = _state(w=w, k=k, mbd=7, mbt=11, device="cuda", seed=w * 10 + k)
        ref = {n: v.clone() for n, v in d.items()}
        p = prev if advance else None
        spec_rounds.reference_round_inputs(ref, p, k=k, dbs=16, tbs=16)
        spec_rounds.round_inputs(d, p, k=k, dbs=16, tbs=16)
        torch.cuda.synchronize()
        for name in ref:
            assert torch.equal(d[name], ref[name]), (name, advance)


# --- the greedy acceptance ------------------------------------------------------------------------


def _accept_case(w, k, device, seed):
    """A round's result (w, 2 + k) with random drafts and garbage in columns 0-1, a target argmax
    agreeing with the drafts for a random number of leading positions (so every acceptance
    count 0..k occurs), and nd 0..k drafts verified per row."""
    g = torch.Generator().manual_seed(seed)
    vocab = 50
    out = torch.randint(0, vocab, (w, 2 + k), generator=g)
    out[:, :2] = -7
    am = torch.randint(0, vocab, (w, k + 1), generator=g)
    agree = torch.randint(0, k + 1, (w,), generator=g)
    for i in range(w):
        n = int(agree[i])
        am[i, :n] = out[i, 2 : 2 + n]
        if n < k:  # the first disagreement is a real one
            am[i, n] = (out[i, 2 + n] + 1) % vocab
    nd = torch.randint(0, k + 1, (w,), generator=g)
    return am.reshape(-1).to(device), nd.to(device), out.to(device)


def _accept_oracle(am, nd, out, k):
    """Row by row: count the leading drafts equal to the argmax at their position, stopping at
    nd; the argmax after them."""
    am = am.view(-1, k + 1).tolist()
    res = out.clone()
    for i, row in enumerate(out.tolist()):
        n = 0
        while n < min(int(nd[i]), k) and row[2 + n] == am[i][n]:
            n += 1
        res[i, 0], res[i, 1] = n, am[i][n]
    return res


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_reference_accept_follows_the_rule(k):
    am, nd, out = _accept_case(w=512, k=k, device="cpu", seed=k)
    want = _accept_oracle(am, nd, out, k)
    spec_rounds.accept(am, nd, out, k=k)  # the CPU path: the reference
    assert torch.equal(out, want)
    assert set(out[:, 0].tolist()) == set(range(k + 1))  # every count occurred (seeded data)


@pytest.mark.parametrize(
    "mutate, exc, match",
    [
        (lambda am, nd, out: (am.int(), nd, out), TypeError, "am must be torch.int64"),
        (lambda am, nd, out: (am, nd[:-1], out), ValueError, r"nd must be \(8,\)"),
        (lambda am, nd, out: (am[:-1], nd, out), ValueError, "am must be"),
        (lambda am, nd, out: (am, nd, out[:, :-1]), ValueError, "out must be"),
        (lambda am, nd, out: (am, nd, out.t()), ValueError, "out must be contiguous"),
        (lambda am, nd, out: (am.tolist(), nd, out), TypeError, "am must be a torch.Tensor"),
    ],
)
def test_accept_bad_arguments_name_the_field(mutate, exc, match):
    am, nd, out = _accept_case(w=8, k=3, device="cpu", seed=0)
    with pytest.raises(exc, match=match):
        spec_rounds.accept(*mutate(am, nd, out), k=3)
    with pytest.raises(ValueError, match="k must"):
        spec_rounds.accept(am, nd, out, k=0)


@pytest.mark.gpu
@pytest.mark.parametrize("w", [1, 8, 130])
@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_accept_kernel_equals_reference(w, k):
    am, nd, out = _accept_case(w=w, k=k, device="cuda", seed=w * 10 + k)
    ref = out.clone()
    spec_rounds.reference_accept(am, nd, ref, k=k)
    spec_rounds.accept(am, nd, out, k=k)
    torch.cuda.synchronize()
    assert torch.equal(out, ref)


# --- the slab's layout is defined once (kernels/spec_rounds.py) ------------------------------------


def _cu_source() -> str:
    return (spec_rounds.CSRC / "spec_rounds.cu").read_text()


def test_kernel_signature_and_struct_follow_round_args():
    """csrc/spec_rounds.cu takes the tensors in ROUND_ARGS' order, its RoundParams holds them
    in that order, and each C element type is the dtype of that view in the slab layout."""
    import re

    src = _cu_source()
    sig = re.search(r"void spec_round_inputs\((.*?)\)\s*\{", src, re.S).group(1)
    params = [p.split()[-1] for p in sig.replace("\n", " ").split(",")]
    assert params == [*spec_rounds.ROUND_ARGS, "k", "dbs", "tbs", "pdl"]
    struct = re.search(r"struct RoundParams \{(.*?)\};", src, re.S).group(1)
    fields = re.findall(r"(int64_t|int32_t)\*\s*(\w+);", struct)
    assert [n for _, n in fields] == list(spec_rounds.ROUND_ARGS)
    int64 = spec_rounds.SLAB_INT64 | spec_rounds.SLAB_STATE
    for ctype, name in fields:
        if name != "prev":
            assert (name in int64) == (ctype == "int64_t"), name
            assert name in int64 or name in spec_rounds.SLAB_INT32, name


def test_fused_slab_views_are_the_layout():
    """spec/fused.py's slab has exactly the layout's views, of their shapes and dtypes."""
    from project04_llm_inference.spec.fused import _Slab

    w, k, mbd, mbt = 4, 3, 5, 7
    for rounds in (1, 2):
        s = _Slab(w, k, mbd, mbt, torch.device("cpu"), pinned=False, rounds=rounds)
        i64, i32 = spec_rounds.slab_layout(w, k, mbd, mbt, rounds)
        assert set(s.d) == {n for n, _ in i64 + i32}
        for layout, dtype in ((i64, torch.int64), (i32, torch.int32)):
            for name, shape in layout:
                assert s.d[name].dtype == dtype and tuple(s.d[name].shape) == shape, name
