"""The FP8 step in the GEMM benchmark: fp8gemm_10_wgmma_tma against `torch._scaled_mm`.

One group per shape, measured like the ladder's (bench/gemm.py `time_shape`): random normal A
(M, K) and B (N, K) quantised to float8 e4m3 with per-tensor scales (`fp8_gemm.quantize`), the
exact product of the dequantized inputs in float64, then

- `torch._scaled_mm(a, b.t(), scale_a, scale_b, out_dtype=torch.bfloat16)` (cuBLASLt FP8, the
  baseline, recorded as the group's "cublas" row) and our kernel, each checked against that
  product (relative Frobenius error; ours passes when within twice the baseline's plus the
  floor, `fp8_gemm.within_baseline`);
- both timed `--repeats` times, alternating, on the same inputs and outputs.

Rows carry dtype "float8_e4m3fn"; their bytes are the minimum traffic (1-byte inputs, 2-byte
output) and their roofline uses the GPU's dense FP8 peak (shared.hardware).
"""

from __future__ import annotations


def measure_fp8_group(shape, dt, kernels: list[str], args, spec):
    """(baseline row, [our row]) at one (M, N, K) on this GPU; `dt` is float8_e4m3fn and
    `kernels` the FP8 step's name (the signature of bench.gemm's groups)."""
    import torch

    from shared.timing import benchmark

    from .. import fp8_gemm
    from .gemm import time_shape

    m, n, k = shape
    timing_kw = dict(warmup_ms=args.warmup_ms, rep_ms=args.rep_ms)
    gen = torch.Generator(device="cuda").manual_seed(m * 7 + n * 13 + k * 17 + 8)
    a, sa = fp8_gemm.quantize(torch.randn(m, k, device="cuda", generator=gen))
    b, sb = fp8_gemm.quantize(torch.randn(n, k, device="cuda", generator=gen))
    exact = torch.matmul(a.double() * sa.double(), (b.double() * sb.double()).t())
    bt = b.t()  # (K, N) column-major: the layout _scaled_mm's second operand needs

    def baseline():
        return torch._scaled_mm(a, bt, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)

    base_err = fp8_gemm.relative_error(baseline(), exact)
    timers = {"cublas": lambda: benchmark(baseline, **timing_kw)}
    checked: dict[str, float | str] = {}
    for kernel in kernels:
        try:
            out = torch.full((m, n), float("nan"), device="cuda", dtype=fp8_gemm.OUT_DTYPE)
            fp8_gemm.check_inputs(a, b, sa, sb)
            fp8_gemm.launch(a, b, sa, sb, out)
            finite = bool(torch.isfinite(out).all())
            err = fp8_gemm.relative_error(out, exact) if finite else float("inf")
        except Exception as e:  # record and go on: the report shows the failure
            checked[kernel] = f"{type(e).__name__}: {e}"
            continue
        checked[kernel] = err
        if fp8_gemm.within_baseline(err, base_err):
            # Timed: the kernel launch itself (inputs checked above), as the ladder's are.
            timers[kernel] = lambda out=out: benchmark(
                lambda: fp8_gemm.launch(a, b, sa, sb, out), **timing_kw
            )
    del exact
    return time_shape(shape, dt, checked, timers, args.repeats, cublas_err=base_err, spec=spec)
