"""The fused speculative program's round-to-round bookkeeping (`spec/fused.py`, rounds > 1).

Between two rounds of a program the state (the target's computed length L and last token, the
draft's computed length, its 1 or 2 catch-up tokens) advances by what the last round accepted,
and the next round's inputs (token ids, positions, cache slots through the block tables, context
lengths of both models) follow from it. `round_inputs` does both in place on the slab's device
views: CUDA tensors in one launch of `csrc/spec_rounds.cu`, CPU tensors with the torch reference
below (`reference_round_inputs`, also what the GPU test compares the kernel with: integer
arithmetic, so the two agree bit for bit). Their layout is the host builder's
(`engine/inputs.py`, which forms the inputs of a program of one round), and a CPU test checks
that the two agree on a first round. As torch operations the bookkeeping was about 50 launches
of tiny kernels a round inside the captured program.
`accept` is the round's greedy acceptance the same way: one launch on a GPU, `reference_accept`
(about nine torch launches) on the CPU and as the GPU test's reference.

Only metadata is validated (never values, so a CUDA graph can capture the call): a bad argument
raises ValueError/TypeError naming it. Importing this module needs no GPU and no compiler.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path

import torch

from .pdl import pdl_enabled

CSRC = Path(__file__).resolve().parent.parent / "csrc"
EXTENSION = "p04_spec_rounds"
CATCH_UP = 2  # draft tokens per sequence in the catch-up forward (spec/fused.py)

# The fused program's buffers (`spec/fused.py`'s slab), defined here once: name -> shape as a
# function of (w, k, q, mbd, mbt) (batch width, drafts, k + 1, block-table widths of the draft
# and the target), in slab order. `_Slab` lays them out from these tables, `check_round_inputs`
# checks against them, and a test checks ROUND_ARGS against csrc/spec_rounds.cu's signature and
# struct (the kernel's order and C types).
SLAB_INT64 = {
    "d_ids": lambda w, k, q, mbd, mbt: (w * CATCH_UP,),  # the draft's catch-up: ids
    "d_pos": lambda w, k, q, mbd, mbt: (w * CATCH_UP,),  # positions
    "d_slots": lambda w, k, q, mbd, mbt: (w * CATCH_UP,),  # cache slots
    "d_rows": lambda w, k, q, mbd, mbt: (w,),  # each sequence's last real row
    "s_pos": lambda w, k, q, mbd, mbt: (k - 1, w),  # the draft's one-token steps
    "s_slots": lambda w, k, q, mbd, mbt: (k - 1, w),
    "t_ids": lambda w, k, q, mbd, mbt: (w * q,),  # the target's verification
    "t_pos": lambda w, k, q, mbd, mbt: (w * q,),
    "t_slots": lambda w, k, q, mbd, mbt: (w * q,),
    "nd": lambda w, k, q, mbd, mbt: (w,),  # drafts each sequence verifies
}
# rounds > 1: the state each round's inputs are formed from, on the device
SLAB_STATE = {
    "L": lambda w, k, q, mbd, mbt: (w,),  # the target's computed length: the last token's position
    "last": lambda w, k, q, mbd, mbt: (w,),  # the target's last token (its K/V not yet computed)
    "cd": lambda w, k, q, mbd, mbt: (w,),  # the draft's computed length
    "dn": lambda w, k, q, mbd, mbt: (w,),  # the draft's catch-up tokens: 1 or 2
    "dtok": lambda w, k, q, mbd, mbt: (w, CATCH_UP),  # those tokens (then zeros)
    "real": lambda w, k, q, mbd, mbt: (w,),  # 1: a scheduled sequence, 0: a padding row
}
SLAB_INT32 = {
    "d_tables": lambda w, k, q, mbd, mbt: (w, mbd),
    "d_ctx": lambda w, k, q, mbd, mbt: (w,),
    "d_cu": lambda w, k, q, mbd, mbt: (w + 1,),
    "s_lens": lambda w, k, q, mbd, mbt: (k - 1, w),
    "t_tables": lambda w, k, q, mbd, mbt: (w, mbt),
    # the verification as w * q decode rows: each row's table and context length
    "t_rtables": lambda w, k, q, mbd, mbt: (w * q, mbt),
    "t_lens": lambda w, k, q, mbd, mbt: (w * q,),
}
# `spec_round_inputs`'s tensor arguments, in the kernel's order ("prev": the last round's result)
ROUND_ARGS = (
    *("L", "last", "cd", "dn", "dtok", "real", "nd", "prev"),
    *("d_ids", "d_pos", "d_slots", "d_rows", "s_pos", "s_slots", "t_ids", "t_pos", "t_slots"),
    *("d_tables", "t_tables", "d_ctx", "s_lens", "t_lens"),
)


def slab_layout(w: int, k: int, mbd: int, mbt: int, rounds: int = 1):
    """([(name, shape)] int64, [(name, shape)] int32) of a slab, in order."""
    q = k + 1
    i64 = {**SLAB_INT64, **(SLAB_STATE if rounds > 1 else {})}
    return (
        [(n, f(w, k, q, mbd, mbt)) for n, f in i64.items()],
        [(n, f(w, k, q, mbd, mbt)) for n, f in SLAB_INT32.items()],
    )


@functools.cache
def _ext():
    from shared.cuda_build import load_extension

    return load_extension(EXTENSION, CSRC, ("spec_rounds.cu",))


def check_round_inputs(
    d: Mapping[str, torch.Tensor], prev: torch.Tensor | None, k: int, dbs: int, tbs: int
) -> None:
    """Validate metadata only: every view present, contiguous, of its dtype and shape, on one
    device; prev (w, 2 + k) int64 or None; k >= 1 and positive block sizes."""
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    for name, bs in (("draft block size", dbs), ("target block size", tbs)):
        if not isinstance(bs, int) or bs < 1:
            raise ValueError(f"{name} must be an int >= 1, got {bs!r}")
    if "L" not in d or not isinstance(d["L"], torch.Tensor) or d["L"].dim() != 1:
        raise ValueError("d['L'] must be a 1-D tensor (the batch width)")
    w, q, device = d["L"].shape[0], k + 1, d["L"].device
    tables = ("d_tables", "t_tables")
    want = {}
    for layout, dtype in ((SLAB_INT64 | SLAB_STATE, torch.int64), (SLAB_INT32, torch.int32)):
        for name, f in layout.items():
            if name in ROUND_ARGS:  # the tables' widths are free (None)
                want[name] = (dtype, None if name in tables else f(w, k, q, 0, 0))
    for name, (dtype, shape) in want.items():
        x = d.get(name)
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"d[{name!r}] must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype != dtype:
            raise TypeError(f"d[{name!r}] must be {dtype}, got {x.dtype}")
        if x.device != device:
            raise ValueError(f"d[{name!r}] must be on {device}, got {x.device}")
        if not x.is_contiguous():
            raise ValueError(f"d[{name!r}] must be contiguous")
        if shape is None:
            if x.dim() != 2 or x.shape[0] != w or x.shape[1] < 1:
                raise ValueError(f"d[{name!r}] must be ({w}, max blocks), got {tuple(x.shape)}")
        elif tuple(x.shape) != shape:
            raise ValueError(f"d[{name!r}] must be {shape}, got {tuple(x.shape)}")
    if prev is not None:
        if not isinstance(prev, torch.Tensor) or prev.dtype != torch.int64:
            raise TypeError("prev must be an int64 torch.Tensor (the last round's result)")
        if tuple(prev.shape) != (w, 2 + k) or not prev.is_contiguous():
            raise ValueError(f"prev must be contiguous ({w}, {2 + k}), got {tuple(prev.shape)}")
        if prev.device != device:
            raise ValueError(f"prev must be on {device}, got {prev.device}")


def round_inputs(
    d: Mapping[str, torch.Tensor], prev: torch.Tensor | None, *, k: int, dbs: int, tbs: int
) -> None:
    """In place on d (the slab's device views): when prev (the last round's (w, 2 + k) result:
    accepted drafts, the token after them, the k drafts) is given, advance the state by it
    (padding rows, real == 0, keep theirs); then form the round's inputs from the state.
    dbs / tbs: the draft's and the target's KV block sizes."""
    check_round_inputs(d, prev, k, dbs, tbs)
    if d["L"].device.type != "cuda":
        reference_round_inputs(d, prev, k=k, dbs=dbs, tbs=tbs)
        return
    _ext().spec_round_inputs(
        *(prev if n == "prev" else d[n] for n in ROUND_ARGS),
        k,
        dbs,
        tbs,
        pdl_enabled(d["L"].device),
    )


def _slots(tables: torch.Tensor, pos: torch.Tensor, block_size: int) -> torch.Tensor:
    """Cache slots of positions pos (w, n) through the block tables (w, max blocks)."""
    idx = torch.clamp(torch.div(pos, block_size, rounding_mode="floor"), max=tables.shape[1] - 1)
    return tables.gather(1, idx).long() * block_size + pos % block_size


def reference_round_inputs(
    d: Mapping[str, torch.Tensor], prev: torch.Tensor | None, *, k: int, dbs: int, tbs: int
) -> None:
    """`round_inputs` as torch operations (any device; the CPU path and the kernel's reference)."""
    w, q, dev = d["L"].shape[0], k + 1, d["L"].device
    real = d["real"] != 0
    if prev is not None:  # the state after the last round; padding rows keep theirs
        a, bonus, drafts = prev[:, 0], prev[:, 1], prev[:, 2:]
        every = a == k  # every draft accepted: the draft is 2 behind (its last draft, bonus)
        new = {
            "L": d["L"] + a + 1,
            "last": bonus,
            "cd": d["cd"] + d["dn"] + torch.clamp(a, max=k - 1),
            "dn": 1 + every.long(),
        }
        t0 = torch.where(every, drafts[:, k - 1], bonus)
        t1 = torch.where(every, bonus, torch.zeros_like(bonus))
        for name, v in new.items():
            d[name].copy_(torch.where(real, v, d[name]))
        d["dtok"].copy_(torch.where(real[:, None], torch.stack((t0, t1), 1), d["dtok"]))
    c_range = torch.arange(CATCH_UP, device=dev)
    k_range = torch.arange(k, device=dev)
    q_range = torch.arange(q, device=dev)
    cd, dn, L = d["cd"], d["dn"], d["L"]
    dpos = cd[:, None] + c_range  # (w, CATCH_UP)
    live = real[:, None] & (c_range[None, :] < dn[:, None])
    d["d_ids"].copy_(d["dtok"].view(-1))
    d["d_pos"].copy_(dpos.view(-1))
    d["d_slots"].copy_(torch.where(live, _slots(d["d_tables"], dpos, dbs), -1).view(-1))
    d["d_rows"].copy_(torch.arange(w, device=dev) * CATCH_UP + dn - 1)
    d["d_ctx"].copy_(cd + CATCH_UP)  # bottom-right causal: the padding stays unseen
    if k > 1:  # draft step j feeds draft j + 1 at position cd + dn + j
        spos = torch.where(real[:, None], (cd + dn)[:, None] + k_range[None, : k - 1], 0)
        slots = torch.where(real[:, None], _slots(d["d_tables"], spos, dbs), -1)
        d["s_pos"].copy_(spos.t())
        d["s_slots"].copy_(slots.t())
        d["s_lens"].copy_((spos + 1).t())
    tpos = L[:, None] + q_range  # (w, q)
    tlive = real[:, None] & (q_range[None, :] < 1 + d["nd"][:, None])
    d["t_ids"].view(w, q)[:, 0].copy_(d["last"])
    d["t_pos"].copy_(tpos.view(-1))
    d["t_slots"].copy_(torch.where(tlive, _slots(d["t_tables"], tpos, tbs), -1).view(-1))
    d["t_lens"].copy_((tpos + 1).view(-1))  # verified token j as a decode row: L + j + 1 keys


# --- the greedy acceptance ------------------------------------------------------------------------


def check_accept(am: torch.Tensor, nd: torch.Tensor, out: torch.Tensor, k: int) -> None:
    """Validate metadata only: out (w, 2 + k), am (w * (k + 1)) and nd (w), all int64,
    contiguous, on one device; k >= 1."""
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    for name, x in (("am", am), ("nd", nd), ("out", out)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype != torch.int64:
            raise TypeError(f"{name} must be torch.int64, got {x.dtype}")
        if not x.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
        if x.device != out.device:
            raise ValueError(f"{name} must be on {out.device}, got {x.device}")
    if out.dim() != 2 or out.shape[1] != 2 + k:
        raise ValueError(f"out must be (w, {2 + k}), got {tuple(out.shape)}")
    w = out.shape[0]
    if tuple(am.shape) != (w * (k + 1),):
        raise ValueError(f"am must be ({w * (k + 1)},) (w rows of k + 1), got {tuple(am.shape)}")
    if tuple(nd.shape) != (w,):
        raise ValueError(f"nd must be ({w},), got {tuple(nd.shape)}")


def accept(am: torch.Tensor, nd: torch.Tensor, out: torch.Tensor, *, k: int) -> None:
    """The round's greedy acceptance, in place: out[:, 0] = the leading drafts (out[:, 2:], at
    most nd of them) equal to the target's argmax am at their position, out[:, 1] = the argmax
    after them. CUDA tensors in one launch of `csrc/spec_rounds.cu`, CPU tensors with
    `reference_accept`."""
    check_accept(am, nd, out, k)
    if out.device.type != "cuda":
        reference_accept(am, nd, out, k=k)
        return
    _ext().spec_accept(am, nd, out, k, pdl_enabled(out.device))


def reference_accept(am: torch.Tensor, nd: torch.Tensor, out: torch.Tensor, *, k: int) -> None:
    """`accept` as torch operations (any device; the CPU path and the kernel's reference)."""
    w = out.shape[0]
    am = am.view(w, k + 1)
    k_range = torch.arange(k, device=out.device)
    ok = (out[:, 2:] == am[:, :k]) & (k_range[None, :] < nd[:, None])
    n_acc = ok.long().cumprod(-1).sum(-1)
    out[:, 0].copy_(n_acc)
    out[:, 1].copy_(am.gather(1, n_acc[:, None])[:, 0])
