"""project01's kernels as PyTorch operators (project01_cuda_kernel/ops.py).

CPU tier: `torch.library.opcheck` on every operator (schema, fake tensors, autograd registration,
AOT dispatch with dynamic shapes) through the CPU implementation; that reference against SDPA in
float64; a small transformer block compiled with `torch.compile(fullgraph=True)` (no graph
break) forward and backward; bad inputs are one clear error through the operator.
GPU tier (`gpu` marker): opcheck and the compiled block again on CUDA tensors, i.e. on the
kernels.
"""

from __future__ import annotations

import os
import shutil

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from project01_cuda_kernel import flash_attention, matmul, ops
from project01_cuda_kernel.attention import CAUSAL_VALUES, causal_offset
from project01_cuda_kernel.gemm import available_kernels

HALF_DTYPES = [torch.bfloat16, torch.float16]
# Unit roundoff (half the spacing of numbers in [1, 2)) of the 16-bit dtypes.
UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
# (batch, heads, kv heads, seq_q, seq_k, head_dim, causal): the three compiled head dims and one
# padded to 256 (160), every causal value, Sq != Sk both ways, grouped-query (ratios 2 and 3) and
# multi-query k/v heads; the MQA cases aligned bottom-right with Sq > Sk have query rows that see
# no key (output 0, lse +inf).
ATTENTION_CASES = [
    (1, 2, 2, 16, 16, 64, True),
    (2, 1, 1, 8, 24, 64, False),
    (1, 1, 1, 24, 8, 128, False),
    (1, 2, 2, 12, 12, 128, True),
    (1, 4, 2, 8, 20, 64, "bottom_right"),
    (2, 4, 1, 20, 8, 128, "bottom_right"),
    (1, 6, 2, 12, 20, 64, "top_left"),
    (1, 2, 1, 20, 12, 256, "bottom_right"),
    (1, 2, 2, 16, 16, 160, True),
]
CASE_IDS = [f"b{b}h{h}kv{hk}q{sq}k{sk}d{d}-{c}" for b, h, hk, sq, sk, d, c in ATTENTION_CASES]
# (dtype, kernel) for matmul: every kernel name is accepted on CPU (one reference product).
MATMUL_CASES = [
    (torch.float32, "auto"),
    (torch.float32, "sgemm_01_naive"),
    (torch.bfloat16, "hgemm_09_wgmma_tma"),
    (torch.float16, "auto"),
]


def attention_inputs(case, dtype, device, requires_grad=True, seed=0):
    b, h, hk, sq, sk, d, _ = case
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, n, s, d, generator=gen) for n, s in ((h, sq), (hk, sk), (hk, sk)))
    return tuple(t.to(device, dtype).requires_grad_(requires_grad) for t in (q, k, v))


def opcheck_attention(case, dtype, device, **tolerances):
    """opcheck on flash_attn_fwd (inputs requiring grad, so the autograd tests run) and on
    flash_attn_bwd with the forward's own out and lse; `causal` as the operators' int."""
    causal, scale = CAUSAL_VALUES.index(case[6]), case[5] ** -0.5
    q, k, v = attention_inputs(case, dtype, device)
    torch.library.opcheck(ops.flash_attn_fwd, (q, k, v, causal, scale), **tolerances)
    q, k, v = (t.detach() for t in (q, k, v))
    out, lse = ops.flash_attn_fwd(q, k, v, causal, scale)
    dout = torch.randn_like(out)
    bwd_args = (dout, q, k, v, out, lse, causal, scale)
    torch.library.opcheck(ops.flash_attn_bwd, bwd_args, **tolerances)


def opcheck_matmul(dtype, kernel, device, m=5, k=7, n=3):
    a = torch.randn(m, k, device=device).to(dtype).requires_grad_(True)
    b = torch.randn(k, n, device=device).to(dtype).requires_grad_(True)
    torch.library.opcheck(ops.matmul, (a, b, kernel))
    out = torch.empty(m, n, device=device, dtype=dtype)
    torch.library.opcheck(ops.matmul_out, (a.detach(), b.detach(), kernel, out))


# --------------------------------------------------------------------------------------------
# CPU tier: the operators through their CPU implementation


def test_the_operators_and_their_schemas():
    schemas = {
        str(op._opoverload._schema) for op in ops.__dict__.values() if hasattr(op, "_opoverload")
    }
    # window_left/window_right/softcap have defaults (no window, no soft-capping), and so has
    # the dense operators' bwd_kernel ("auto"): calls with the first five (eight) arguments are
    # the operators they were.
    window = "int window_left=-1, int window_right=-1, float softcap=0."
    bwd_kernel = 'str bwd_kernel="auto"'
    varlen = "Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k"
    assert schemas == {
        "project01::flash_attn_fwd(Tensor q, Tensor k, Tensor v, int causal, "
        f"float softmax_scale, {window}, {bwd_kernel}) -> (Tensor, Tensor)",
        "project01::flash_attn_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, "
        f"Tensor lse, int causal, float softmax_scale, {window}, {bwd_kernel}) "
        "-> (Tensor, Tensor, Tensor)",
        "project01::flash_attn_varlen_fwd(Tensor q, Tensor k, Tensor v, "
        f"{varlen}, int causal, float softmax_scale, {window}) -> (Tensor, Tensor)",
        "project01::flash_attn_varlen_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, "
        f"Tensor lse, {varlen}, int causal, float softmax_scale, {window}) "
        "-> (Tensor, Tensor, Tensor)",
        "project01::matmul(Tensor a, Tensor b, str kernel) -> Tensor",
        "project01::matmul_out(Tensor a, Tensor b, str kernel, Tensor(a3!) out) -> ()",
        "project01::scaled_matmul(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b) -> Tensor",
    }


@pytest.mark.parametrize("case", ATTENTION_CASES, ids=CASE_IDS)
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
def test_opcheck_flash_attention_cpu(case, dtype):
    opcheck_attention(case, dtype, "cpu")


@pytest.mark.parametrize(("dtype", "kernel"), MATMUL_CASES, ids=str)
def test_opcheck_matmul_cpu(dtype, kernel):
    opcheck_matmul(dtype, kernel, "cpu")


@pytest.mark.parametrize("case", ATTENTION_CASES, ids=CASE_IDS)
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
def test_cpu_reference_matches_sdpa_in_float64(case, dtype):
    """Output, lse and the three gradients of the CPU reference against SDPA in float64.

    Tolerance, from the arithmetic: the inputs (q, k, v, dout) are 16-bit values, exact in
    float32 and float64, so the float64 SDPA is the exact answer for them. The reference works in
    float32 (relative error ~2^-24 per operation, sums of at most 256 terms of magnitude ~10:
    below 2^-16 absolute, the additive term) and rounds each result once to the 16-bit dtype
    (at most u |x|, u = its unit roundoff). The gradients also read the forward's output already
    rounded to the 16-bit dtype, in D = rowsum(dout * out) (relative error u in D), which enters
    dS = P (dP - D): of the order of u times the gradient's magnitude. So each tensor must be
    within 2 u max|exact| + 2^-16 of the exact one (measured: at most 0.9 u max|exact|). Grouped
    k/v heads add one float32 sum of at most 3 per-head gradients before that rounding (relative
    ~2^-23, inside the additive term). lse is float32 throughout: 1e-5 relative.

    SDPA gets the k/v heads through enable_gqa and the causal mask as an explicit boolean mask
    (tril with the alignment's offset); its math backend, like ours, outputs 0 and passes no
    gradient on a row that sees no key.
    """
    causal = case[6]
    q, k, v = attention_inputs(case, dtype, "cpu")
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    out = flash_attention(q, k, v, causal=causal)
    out.backward(dout)
    exact_in = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    sq, sk = q.shape[2], k.shape[2]
    offset = causal_offset(causal, sq, sk)
    mask = None if offset is None else torch.ones(sq, sk, dtype=torch.bool).tril(offset)
    exact = F.scaled_dot_product_attention(*exact_in, attn_mask=mask, enable_gqa=True)
    exact.backward(dout.double())

    u = UNIT_ROUNDOFF[dtype]
    got = (out, q.grad, k.grad, v.grad)
    want = (exact, *(t.grad for t in exact_in))
    for name, x, y in zip(("out", "dq", "dk", "dv"), got, want):
        assert x.dtype == dtype and x.shape == y.shape, name
        err = (x.double() - y).abs().max().item()
        bound = 2 * u * y.abs().max().item() + 2.0**-16
        assert err <= bound, f"{name}: max error {err:.3e} > {bound:.3e}"

    scale = case[5] ** -0.5
    code = CAUSAL_VALUES.index(causal)
    _, lse = ops.flash_attn_fwd(q.detach(), k.detach(), v.detach(), code, scale)
    k64 = exact_in[1].detach().repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores = exact_in[0].detach() @ k64.transpose(-2, -1) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, -torch.inf)
    # A row that sees no key: logsumexp -inf, ours +inf (the kernels' convention).
    want = torch.logsumexp(scores, -1).nan_to_num(neginf=torch.inf)
    torch.testing.assert_close(lse.double(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("dtype", "kernel"), MATMUL_CASES, ids=str)
def test_cpu_matmul_and_its_gradients(dtype, kernel):
    """The product and its backward (dA = dC B^T, dB = A^T dC through the same operator) against
    float64: one rounding to the dtype after float32 accumulation (2 u max|exact| + 2^-16)."""
    gen = torch.Generator().manual_seed(2)
    a, b, dc = (torch.randn(*s, generator=gen).to(dtype) for s in ((33, 17), (17, 9), (33, 9)))
    a.requires_grad_(True)
    b.requires_grad_(True)
    c = matmul(a, b, kernel=kernel)
    c.backward(dc)
    a64, b64, dc64 = (t.detach().double() for t in (a, b, dc))
    u = 2.0**-24 if dtype == torch.float32 else UNIT_ROUNDOFF[dtype]
    for x, y in ((c, a64 @ b64), (a.grad, dc64 @ b64.t()), (b.grad, a64.t() @ dc64)):
        assert x.dtype == dtype
        assert (x.double() - y).abs().max() <= 2 * u * y.abs().max() + 2.0**-16
    out = torch.full((33, 9), float("nan"), dtype=dtype)
    assert matmul(a.detach(), b.detach(), kernel=kernel, out=out) is out
    assert torch.equal(out, c.detach())


def test_matmul_out_refuses_autograd():
    a, b = torch.randn(4, 3, requires_grad=True), torch.randn(3, 2)
    with pytest.raises(RuntimeError, match="does not support autograd"):
        matmul(a, b, out=torch.empty(4, 2))


@pytest.mark.parametrize(
    ("change", "exc", "match"),
    [
        ({"dtype": torch.float32}, TypeError, "q must be torch.float16 or torch.bfloat16"),
        ({"d": 320}, ValueError, r"head_dim \(q.shape\[-1\]\) must be at most 256"),
        ({"sk": 9}, ValueError, "causal=True needs q and k of equal sequence length"),
        ({"hk": 3}, ValueError, "k and v must have q's batch 1 and a number of heads dividing"),
    ],
)
def test_bad_inputs_are_one_clear_error_through_the_operator(change, exc, match):
    """The same checks run in the public function, in the operator's CPU implementation and in
    its fake function (so torch.compile refuses at trace time with the same message)."""
    dims = {"b": 1, "h": 2, "hk": 2, "sq": 8, "sk": 8, "d": 64, "dtype": torch.bfloat16, **change}
    q, k, v = (
        torch.randn(dims["b"], dims[h], s, dims["d"]).to(dims["dtype"])
        for h, s in (("h", dims["sq"]), ("hk", dims["sk"]), ("hk", dims["sk"]))
    )
    with pytest.raises(exc, match=match):
        flash_attention(q, k, v, causal=True)
    with pytest.raises(exc, match=match):
        ops.flash_attn_fwd(q, k, v, True, 0.125)
    with pytest.raises(exc, match=match):
        torch.compile(lambda q, k, v: flash_attention(q, k, v, causal=True), backend="eager")(
            q, k, v
        )


def test_bwd_operator_checks_its_extra_inputs():
    q, k, v = attention_inputs(ATTENTION_CASES[0], torch.bfloat16, "cpu", requires_grad=False)
    out, lse = ops.flash_attn_fwd(q, k, v, True, 0.125)
    with pytest.raises(ValueError, match="dout must have q's shape"):
        ops.flash_attn_bwd(out[..., :32], q, k, v, out, lse, True, 0.125)
    with pytest.raises(ValueError, match="lse must be a"):
        ops.flash_attn_bwd(out, q, k, v, out, lse.half(), True, 0.125)


def test_operator_causal_int():
    """The operators carry causal as its index in CAUSAL_VALUES; a bool keeps its old meaning
    (True: top-left, equal lengths only), anything else is one clear error."""
    q, k, v = attention_inputs((1, 2, 1, 8, 12, 64, False), torch.bfloat16, "cpu", False)
    by_value = [flash_attention(q, k, v, causal=c) for c in (False, "top_left", "bottom_right")]
    for code, want in zip((0, 2, 3), by_value):
        assert torch.equal(ops.flash_attn_fwd(q, k, v, code, 0.125)[0], want)
    assert not torch.equal(by_value[1], by_value[2])  # the two alignments differ when Sq != Sk
    assert torch.equal(ops.flash_attn_fwd(q, k, v, False, 0.125)[0], by_value[0])
    with pytest.raises(ValueError, match="causal=True needs q and k of equal sequence length"):
        ops.flash_attn_fwd(q, k, v, 1, 0.125)
    with pytest.raises(ValueError, match=r"causal must be 0 \(False\), 1 \(True\)"):
        ops.flash_attn_fwd(q, k, v, 4, 0.125)


def test_fake_shapes_follow_k_and_v_heads():
    """Under fake tensors (what torch.compile traces with) dk and dv take k's and v's
    (B, Hk, Sk, D), out and dq q's (B, H, Sq, D), lse (B, H, Sq)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(2, 8, 5, 64, dtype=torch.bfloat16)
        k = torch.empty(2, 2, 7, 64, dtype=torch.bfloat16)
        v = torch.empty(2, 2, 7, 64, dtype=torch.bfloat16)
        out, lse = ops.flash_attn_fwd(q, k, v, 3, 0.125)
        dq, dk, dv = ops.flash_attn_bwd(out, q, k, v, out, lse, 3, 0.125)
    assert out.shape == dq.shape == (2, 8, 5, 64) and lse.shape == (2, 8, 5)
    assert dk.shape == dv.shape == (2, 2, 7, 64)
    assert lse.dtype == torch.float32 and dk.dtype == torch.bfloat16


def test_rows_that_see_no_key_output_zero_with_zero_gradient():
    """Bottom-right with Sq > Sk: query rows i < Sq - Sk see no key. FlashAttention's convention:
    output 0, no gradient through them, lse +inf; nothing is NaN."""
    q, k, v = attention_inputs((1, 4, 2, 11, 4, 64, False), torch.bfloat16, "cpu")
    out = flash_attention(q, k, v, causal="bottom_right")
    out.float().square().sum().backward()
    for t in (out, q.grad, k.grad, v.grad):
        assert torch.isfinite(t).all()
    assert torch.equal(out[:, :, :7], torch.zeros_like(out[:, :, :7]))
    assert torch.equal(q.grad[:, :, :7], torch.zeros_like(q.grad[:, :, :7]))
    assert out[:, :, 7:].abs().amax(-1).min() > 0
    _, lse = ops.flash_attn_fwd(q.detach(), k.detach(), v.detach(), 3, 0.125)
    assert torch.isinf(lse[:, :, :7]).all() and (lse[:, :, :7] > 0).all()
    assert torch.isfinite(lse[:, :, 7:]).all()


def test_grouped_heads_read_their_own_kv_head():
    """Query head h attends with k/v head h // (H / Hk) (repeat_interleave's grouping): changing
    k/v head 1 changes exactly query heads 2 and 3 of 4 (Hk = 2)."""
    q, k, v = attention_inputs((1, 4, 2, 6, 6, 64, False), torch.bfloat16, "cpu", False)
    before = flash_attention(q, k, v)
    v2 = v.clone()
    v2[:, 1] += 1
    after = flash_attention(q, k, v2)
    changed = [not torch.equal(before[:, h], after[:, h]) for h in range(4)]
    assert changed == [False, False, True, True]


def test_lse_is_not_differentiable():
    q, k, v = attention_inputs(ATTENTION_CASES[0], torch.bfloat16, "cpu")
    out, lse = ops.flash_attn_fwd(q, k, v, True, 0.125)
    assert out.requires_grad and not lse.requires_grad


class Block(nn.Module):
    """A pre-norm transformer block: attention through `flash_attention` (q, k, v as strided
    views of one fused projection, causal) and an MLP whose up-projection is project01's
    `matmul`, so both operators sit inside the compiled graph."""

    def __init__(self, dim: int = 128, heads: int = 2):  # head dim 64
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.w_up = nn.Parameter(torch.randn(dim, 4 * dim) / dim**0.5)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, c = x.shape
        qkv = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, c // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        x = x + self.proj(flash_attention(q, k, v, causal=True).transpose(1, 2).reshape(b, s, c))
        h = matmul(self.norm2(x).reshape(b * s, c), self.w_up)
        return x + self.down(F.gelu(h)).view(b, s, c)


def rel_err(x: torch.Tensor, y: torch.Tensor) -> float:
    return ((x.double() - y.double()).norm() / y.double().norm()).item()


def check_compiled_block(device: str, backend: str = "inductor") -> None:
    """explain: one graph, 0 breaks, both operators in it; torch.compile(fullgraph=True) (which
    raises on any break) forward and backward match eager.

    Tolerance: inductor fuses the layer norms, GELU and residual adds and keeps float32 values
    where eager rounds every op's output to bfloat16 (u = 2^-8 each time), so the two differ by
    a few roundings along each chain of ops: relative (Frobenius) error at most 2^-5 = 8 u
    (measured on CPU: at most 2.2 u).
    """
    torch.manual_seed(0)
    block = Block().to(device, torch.bfloat16)
    x = torch.randn(2, 16, 128, device=device, dtype=torch.bfloat16, requires_grad=True)
    params = [*block.parameters(), x]

    def run(fn):
        for p in params:
            p.grad = None
        y = fn(x)
        y.float().square().mean().backward()
        return [y.detach()] + [p.grad for p in params]

    torch._dynamo.reset()
    explained = torch._dynamo.explain(block)(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    targets = {str(n.target) for n in explained.graphs[0].graph.nodes}
    assert {"project01.flash_attn_fwd.default", "project01.matmul.default"} <= targets

    eager = run(block)
    torch._dynamo.reset()
    compiled = run(torch.compile(block, fullgraph=True, backend=backend))
    for i, (got, want) in enumerate(zip(compiled, eager)):
        assert got is not None and torch.isfinite(got).all()
        assert rel_err(got, want) <= 2.0**-5, f"tensor {i}: {rel_err(got, want):.2e}"


@pytest.mark.slow  # inductor compiles C++ for the forward and backward: ~40 s on 2 cores
def test_compiled_transformer_block_cpu_has_no_graph_break():
    # inductor on CPU generates C++ and needs a compiler (g++ on the CPU-tier machines); without
    # one, aot_eager still traces the whole block through dynamo and AOT autograd (the graph
    # break and fake-tensor checks), only without code generation.
    has_cxx = any(shutil.which(c) for c in (os.environ.get("CXX", "g++"), "g++", "c++"))
    check_compiled_block("cpu", backend="inductor" if has_cxx else "aot_eager")


def test_compiled_with_dynamic_shapes_and_a_varying_scale():
    """dynamic=True (symbolic sequence lengths and M) and a softmax_scale that changes between
    calls (a symbolic float): still one graph, same numbers as eager. aot_eager (no code
    generation) keeps this quick; the same CPU implementation runs on both sides, so exact."""

    def fn(q, k, v, a, b, scale):
        return flash_attention(q, k, v, softmax_scale=scale), matmul(a, b)

    compiled = torch.compile(fn, fullgraph=True, dynamic=True, backend="aot_eager")
    for sq, sk, m, scale in ((9, 13, 5, 0.3), (17, 4, 8, 0.7)):
        q, k, v = attention_inputs((1, 2, 2, sq, sk, 64, False), torch.bfloat16, "cpu")
        a, b = torch.randn(m, 7, requires_grad=True), torch.randn(7, 3, requires_grad=True)
        grads = []
        for f in (compiled, fn):
            for t in (q, k, v, a, b):
                t.grad = None
            o, c = f(q, k, v, a, b, scale)
            (o.float().square().sum() + c.square().sum()).backward()
            grads.append([o, c] + [t.grad for t in (q, k, v, a, b)])
        for got, want in zip(*grads):
            assert torch.equal(got, want)


# --------------------------------------------------------------------------------------------
# GPU tier: the same checks on CUDA tensors, i.e. on the kernels


def _cuda_tolerances(dtype):
    """opcheck compares eager with AOT-compiled runs of the kernels; the backward accumulates dQ
    with float32 atomics (order not fixed), so dq may differ by one rounding of the 16-bit
    dtype between runs: one ulp (2 u) relative, plus 1e-4 absolute for values that cancel.
    (opcheck takes atol/rtol from torch 2.7.)"""
    return {"rtol": 2 * UNIT_ROUNDOFF[dtype], "atol": 1e-4}


@pytest.mark.gpu
@pytest.mark.parametrize("case", ATTENTION_CASES, ids=CASE_IDS)
@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
def test_opcheck_flash_attention_cuda(case, dtype):
    opcheck_attention(case, dtype, "cuda", **_cuda_tolerances(dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, *HALF_DTYPES], ids=str)
def test_opcheck_matmul_cuda(dtype):
    for kernel in ("auto", *available_kernels(dtype)):
        opcheck_matmul(dtype, kernel, "cuda", m=70, k=33, n=40)


@pytest.mark.gpu
def test_compiled_transformer_block_cuda_has_no_graph_break():
    pytest.importorskip("triton", reason="inductor on CUDA needs triton")
    check_compiled_block("cuda")
