"""Loss parity of FSDP2 and DeepSpeed ZeRO-3 on the same job, and the tolerance it is judged by.

Both run the same job: the same model code, initial weights, data per rank, AdamW (torch's),
learning-rate schedule and clipping. Two things may still differ:

1. Where the master weights start, in bf16. DeepSpeed copies its float32 master weights from the
   bf16 model, so they start at the bf16 image of the initial weights (up to 2^-9 relative off);
   FSDP2 keeps the float32 initial weights and casts them for each forward. On the CPU tier
   (`tiny`) that alone puts the two loss curves 1.2e-3 apart at step 2 (loss 5.5); started from
   the same bf16 image, at most 7.4e-5 over 7 steps. `compare` starts both from the bf16 image (`--equal-start`,
   the jobs' `--bf16-rounded-init`) so that the curves compare the implementations' arithmetic.
2. The order of floating-point operations: DeepSpeed's ZeRO-3 linear layer and FSDP2's call of
   `F.linear` may run other matmul kernels, the gradient norm for clipping is summed over other
   partitions, and on GPUs some kernels (attention's backward) accumulate with atomics in no
   fixed order.

What a different order can do is judged against R, measured in the same invocation: the
largest per-step difference between the loss of FSDP2 in bf16 and FSDP2 in float32, over the same
steps. R is what rounding every weight and every matmul output to bf16 (unit roundoff
u = 2^-9) does to this model's loss curve, on this data, over this many steps. A matmul in bf16
accumulates in float32 and rounds its output once; another summation order moves the float32
sum by about n·2^-24 relative (n: the reduction length), which changes the bf16 output only when
the sum lies that close to a rounding boundary: for a fraction of about n·2^-24 / 2^-8 = n·2^-16
of the outputs (n = 2,048 to 6,144 at `1b`: 3% to 9%; 64 to 192 at `tiny`: under 0.3%), and by
one bf16 unit in the last place. Randomly signed, a fraction f of the roundings moves the loss
by about sqrt(f) of what all of them do. So:

- bf16 pair, same start: the gap is expected at 0.2 to 0.3 x R at `1b` (sqrt(3%..9%)), 0.03 to
  0.05 x R at `tiny` (measured on the CPU tier, 7 steps: 7.4e-5 against R = 1.24e-3, 0.06).
- float32 pair: the same re-orderings at u = 2^-24, 65,536 times finer. Training amplifies a
  difference over the steps (Adam divides each gradient by its own running size, so a rounding
  on a near-zero gradient becomes a full-size update), but the gap stays far below R (CPU tier:
  2.4e-7, under one float32 unit in the last place of a loss of 5).
- A bug in either path (a wrong data shard, gradients summed instead of averaged, clipping
  missing) changes what is computed, not how it is rounded; the planted-bug test shows a data
  bug far above R.

The rule: each precision's largest per-step gap is at most R. Without the float32 FSDP2 run of
the same invocation there is no R and no verdict.
"""

from __future__ import annotations

from project02_fsdp_scaling.config import record_precision

TOLERANCE_RULE = (
    "largest per-step loss difference <= R, R = the largest per-step loss difference between "
    "FSDP2 in bfloat16 and FSDP2 in float32 over the same steps (what bf16 rounding itself does "
    "to this loss curve); a different summation order re-rounds only a few of those values"
)


def loss_gaps(a: list[float], b: list[float]) -> list[float]:
    """|a_k - b_k| per step; the two curves must cover the same steps."""
    if len(a) != len(b):
        raise ValueError(f"loss curves of different lengths: {len(a)} and {len(b)} steps")
    return [abs(x - y) for x, y in zip(a, b)]


def _ok(run: dict | None, side: str) -> list[float] | None:
    r = (run or {}).get(side) or {}
    return r.get("losses") if r.get("status") == "ok" else None


def rounding_scale(runs: list[dict]) -> float | None:
    """R: the largest per-step loss difference of FSDP2 bf16 against FSDP2 float32 (None unless
    both ran)."""
    by = {record_precision(r): r for r in runs}
    bf16, fp32 = _ok(by.get("bf16"), "fsdp"), _ok(by.get("fp32"), "fsdp")
    if bf16 is None or fp32 is None:
        return None
    return max(loss_gaps(bf16, fp32))


def pair_parity(run: dict) -> dict | None:
    """The loss gaps of one precision's FSDP2 / DeepSpeed pair (None unless both ran)."""
    fs, ds = _ok(run, "fsdp"), _ok(run, "deepspeed")
    if fs is None or ds is None:
        return None
    gaps = loss_gaps(fs, ds)
    worst = max(range(len(gaps)), key=gaps.__getitem__)
    return {"loss_diffs": gaps, "max_loss_diff": gaps[worst], "max_loss_diff_step": worst + 1}


def judge(runs: list[dict]) -> dict | None:
    """Set each run's parity verdict against R in place; return the tolerance record (None, and
    no verdicts, without R)."""
    scale = rounding_scale(runs)
    if scale is None:
        return None
    for run in runs:
        p = run.get("parity")
        if p:
            p["ratio_to_tolerance"] = p["max_loss_diff"] / scale if scale > 0 else None
            p["within_tolerance"] = p["max_loss_diff"] <= scale
    return {"loss_abs": scale, "rule": TOLERANCE_RULE}
