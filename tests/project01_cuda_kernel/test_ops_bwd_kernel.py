"""`flash_attention(..., bwd_kernel=...)`: the backward kernel chosen at the call and carried by
the operators (`project01::flash_attn_fwd` / `flash_attn_bwd`, ops.py) into autograd.

CPU tier: the argument is in the signature and both schemas; a bad value, and "hopper" where it
cannot run, is a ValueError naming bwd_kernel at the forward call, before any operator or kernel
runs (eager, through the operators directly, under fake tensors and under torch.compile); with
the GPU check monkeypatched to say "Hopper", the value reaches flash_attn_bwd through eager
autograd, opcheck and a compiled graph, and the CUDA implementation hands it to
`attention.flash_backward`.
GPU tier (`gpu`, compute capability 9.0 only): gradients through autograd with "hopper" against
"fa2", eager and compiled, with the kernel that ran recorded.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from project01_cuda_kernel import attention, flash_attention, ops
from project01_cuda_kernel._build import is_hopper
from project01_cuda_kernel.attention import CAUSAL_VALUES

NOT_HOPPER = pytest.mark.skipif(is_hopper(), reason="this machine has a Hopper GPU")
ONLY_ON_HOPPER = pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)),
    reason="the Hopper backward needs compute capability 9.0",
)
# Unit roundoff (half the spacing of numbers in [1, 2)) of the 16-bit dtypes.
UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def qkv(b=1, h=2, hk=2, sq=12, sk=12, d=64, dtype=torch.bfloat16, device="cpu", seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(b, h, sq, d, generator=gen, device=device, dtype=dtype)
    k, v = (torch.randn(b, hk, sk, d, generator=gen, device=device, dtype=dtype) for _ in "kv")
    return q, k, v


def _refuse(*_args, **_kwargs):
    raise AssertionError("nothing may run for a refused bwd_kernel")


# --------------------------------------------------------------------------------------------
# CPU tier


def test_bwd_kernel_is_in_the_signature_and_both_schemas():
    param = inspect.signature(flash_attention).parameters["bwd_kernel"]
    assert param.kind is inspect.Parameter.KEYWORD_ONLY and param.default == "auto"
    for op in (ops.flash_attn_fwd, ops.flash_attn_bwd):
        arg = op._opoverload._schema.arguments[-1]
        assert (arg.name, str(arg.type), arg.default_value) == ("bwd_kernel", "str", "auto")
    # The varlen operators take none (the Hopper backward has no varlen instance).
    for op in (ops.flash_attn_varlen_fwd, ops.flash_attn_varlen_bwd):
        assert "bwd_kernel" not in {a.name for a in op._opoverload._schema.arguments}
    assert "bwd_kernel" not in inspect.signature(attention.flash_attention_varlen).parameters


@pytest.mark.parametrize("bad", ["fa3", "", "Hopper", None])
def test_a_bad_bwd_kernel_is_refused_at_the_call(monkeypatch, bad):
    """Refused by flash_attention before the operator is called, and by each implementation of
    the operators (CPU, CUDA's Python body, fake) before any math or kernel."""
    q, k, v = qkv()
    match = "bwd_kernel must be one of"
    monkeypatch.setattr(attention, "_extension", _refuse)
    monkeypatch.setattr(attention, "flash_forward", _refuse)
    monkeypatch.setattr(attention, "flash_backward", _refuse)
    monkeypatch.setattr(ops, "_fwd_math", _refuse)
    monkeypatch.setattr(ops, "_bwd_math", _refuse)
    real_op = ops.flash_attn_fwd
    monkeypatch.setattr(ops, "flash_attn_fwd", _refuse)
    with pytest.raises(ValueError, match=match):
        flash_attention(q.requires_grad_(True), k, v, causal=True, bwd_kernel=bad)
    monkeypatch.setattr(ops, "flash_attn_fwd", real_op)
    q = q.detach()
    fwd_args = (q, k, v, 1, 0.125, -1, -1, 0.0, bad)
    lse = torch.zeros(q.shape[:3])
    bwd_args = (q, q, k, v, q, lse, 1, 0.125, -1, -1, 0.0, bad)
    with pytest.raises(ValueError, match=match):
        ops.flash_attn_fwd._init_fn(*fwd_args)  # the CUDA implementation's body
    with pytest.raises(ValueError, match=match):
        ops.flash_attn_bwd._init_fn(*bwd_args)
    if isinstance(bad, str):  # the dispatcher itself refuses a non-str (a RuntimeError)
        from torch._subclasses.fake_tensor import FakeTensorMode

        with pytest.raises(ValueError, match=match):
            ops.flash_attn_fwd(*fwd_args)  # the CPU implementation
        with pytest.raises(ValueError, match=match):
            ops.flash_attn_bwd(*bwd_args)
        with FakeTensorMode(), pytest.raises(ValueError, match=match):
            ops.flash_attn_fwd(
                *(torch.empty(t.shape, dtype=t.dtype) for t in (q, k, v)), *fwd_args[3:]
            )
    torch._dynamo.reset()
    # Not fullgraph: there dynamo reports any exception in traced code as Unsupported (as for
    # check_inputs' errors); without it the ValueError itself reaches the caller.
    compiled = torch.compile(
        lambda q, k, v: flash_attention(q, k, v, causal=True, bwd_kernel=bad),
        backend="eager",
    )
    with pytest.raises(ValueError, match=match):
        compiled(q, k, v)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"window_size": (4, 0)}, "bwd_kernel='hopper' does not implement window_size"),
        ({"softcap": 30.0}, "bwd_kernel='hopper' does not implement window_size or softcap"),
        ({"d": 256}, r"bwd_kernel='hopper' is compiled for head dims \(64, 128\), not 256"),
        ({"d": 200}, r"bwd_kernel='hopper' is compiled for head dims \(64, 128\), not 256"),
    ],
)
def test_what_the_hopper_backward_lacks_is_refused_at_the_call(monkeypatch, change, match):
    """Whatever the GPU: a window or softcap in effect, a kernel head dim of 256 (200 is padded to
    it). The operator is not called."""
    monkeypatch.setattr(attention, "is_hopper", lambda: True)
    d = change.pop("d", 64)
    q, k, v = qkv(sq=20, sk=20, d=d)
    real_op = ops.flash_attn_fwd
    monkeypatch.setattr(ops, "flash_attn_fwd", _refuse)
    with pytest.raises(ValueError, match=match):
        flash_attention(q, k, v, causal=True, bwd_kernel="hopper", **change)
    monkeypatch.setattr(ops, "flash_attn_fwd", real_op)
    # A window that hides no key is no window: accepted (the CPU reference runs).
    out = flash_attention(*qkv(sq=20, sk=20), causal=True, window_size=(99, 0), bwd_kernel="hopper")
    assert out.shape == (1, 2, 20, 64)


@NOT_HOPPER
@pytest.mark.parametrize("d", [64, 128, 32])  # 32 runs as 64 (padded): refused for the GPU only
def test_hopper_is_refused_at_the_call_without_a_cc_9_0_gpu(monkeypatch, d):
    q, k, v = qkv(d=d)
    match = "bwd_kernel='hopper' needs a GPU of compute capability 9.0"
    real_op = ops.flash_attn_fwd
    monkeypatch.setattr(ops, "flash_attn_fwd", _refuse)
    with pytest.raises(ValueError, match=match):
        flash_attention(q, k, v, bwd_kernel="hopper")
    monkeypatch.setattr(ops, "flash_attn_fwd", real_op)
    # The operator refuses it too (CPU implementation, CUDA body, and at trace time).
    monkeypatch.setattr(ops, "_fwd_math", _refuse)
    monkeypatch.setattr(attention, "flash_forward", _refuse)
    args = (q, k, v, 0, 0.125, -1, -1, 0.0, "hopper")
    for op in (ops.flash_attn_fwd, ops.flash_attn_fwd._init_fn):
        with pytest.raises(ValueError, match=match):
            op(*args)
    torch._dynamo.reset()
    # Not fullgraph: there dynamo reports any exception in traced code as Unsupported (as for
    # check_inputs' errors); without it the ValueError itself reaches the caller.
    compiled = torch.compile(
        lambda q, k, v: flash_attention(q, k, v, bwd_kernel="hopper"),
        backend="eager",
    )
    with pytest.raises(ValueError, match=match):
        compiled(q, k, v)


class _Recorder:
    """ops.flash_attn_bwd wrapped: records each call's bwd_kernel (its last argument)."""

    def __init__(self, op):
        self.op, self.seen = op, []

    def __call__(self, *args):
        self.seen.append(args[-1])
        return self.op(*args)


@pytest.mark.parametrize("causal", [False, True, "bottom_right"], ids=str)
def test_bwd_kernel_reaches_the_backward_through_autograd(monkeypatch, causal):
    """With the GPU check saying Hopper, flash_attention's bwd_kernel is what autograd passes to
    flash_attn_bwd ("auto" by default); on CPU every value gives the same reference gradients."""
    monkeypatch.setattr(attention, "is_hopper", lambda: True)
    recorder = _Recorder(ops.flash_attn_bwd)
    monkeypatch.setattr(ops, "flash_attn_bwd", recorder)
    sk = 12 if causal is True else 17
    q0, k0, v0 = qkv(h=4, hk=2, sk=sk)
    dout = torch.randn(q0.shape, generator=torch.Generator().manual_seed(3)).bfloat16()
    grads = {}
    for bwd_kernel in (None, "auto", "fa2", "hopper"):
        q, k, v = (t.clone().requires_grad_(True) for t in (q0, k0, v0))
        kwargs = {} if bwd_kernel is None else {"bwd_kernel": bwd_kernel}
        flash_attention(q, k, v, causal=causal, **kwargs).backward(dout)
        assert recorder.seen[-1] == (bwd_kernel or "auto")
        grads[bwd_kernel] = (q.grad, k.grad, v.grad)
    assert len(recorder.seen) == 4
    for bwd_kernel in ("auto", "fa2", "hopper"):
        assert all(torch.equal(x, y) for x, y in zip(grads[bwd_kernel], grads[None]))


def test_the_cuda_implementation_hands_bwd_kernel_to_flash_backward(monkeypatch):
    """The CUDA operator's body (called on CPU tensors, the kernels replaced by a recorder)
    passes bwd_kernel to attention.flash_backward, and runs no backward for a refused one."""
    monkeypatch.setattr(attention, "is_hopper", lambda: True)
    seen = []

    def fake_backward(dout, q, k, v, out, lse, causal, scale, **kwargs):
        seen.append(kwargs)
        return tuple(torch.zeros_like(t) for t in (q, k, v))

    monkeypatch.setattr(attention, "flash_backward", fake_backward)
    q, k, v = qkv(h=4, hk=2)
    lse = torch.zeros(q.shape[:3])
    for bwd_kernel in ("hopper", "fa2", "auto"):
        ops.flash_attn_bwd._init_fn(q, q, k, v, q, lse, 1, 0.125, -1, -1, 0.0, bwd_kernel)
        assert seen[-1]["bwd_kernel"] == bwd_kernel
    with pytest.raises(ValueError, match="bwd_kernel='hopper' does not implement window_size"):
        ops.flash_attn_bwd._init_fn(q, q, k, v, q, lse, 1, 0.125, 3, 0, 0.0, "hopper")
    assert len(seen) == 3


@pytest.mark.parametrize("bwd_kernel", ["fa2", "hopper"])
def test_opcheck_with_bwd_kernel(monkeypatch, bwd_kernel):
    """opcheck (schema, fake function, autograd registration, AOT dispatch) with the new argument
    given, on the CPU implementation ("hopper" with the GPU check saying Hopper)."""
    monkeypatch.setattr(attention, "is_hopper", lambda: True)
    q, k, v = (t.requires_grad_(True) for t in qkv(h=4, hk=2, sq=8, sk=12))
    code = CAUSAL_VALUES.index("bottom_right")
    torch.library.opcheck(ops.flash_attn_fwd, (q, k, v, code, 0.125, -1, -1, 0.0, bwd_kernel))
    q, k, v = (t.detach() for t in (q, k, v))
    out, lse = ops.flash_attn_fwd(q, k, v, code, 0.125)
    args = (torch.randn_like(out), q, k, v, out, lse, code, 0.125, -1, -1, 0.0, bwd_kernel)
    torch.library.opcheck(ops.flash_attn_bwd, args)


def test_compiled_backward_graph_carries_bwd_kernel(monkeypatch):
    """torch.compile(fullgraph=True) through AOT autograd: the backward graph calls
    project01.flash_attn_bwd with bwd_kernel "hopper", and the gradients are eager's."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    monkeypatch.setattr(attention, "is_hopper", lambda: True)
    graphs = {}

    def keep(name):
        def compiler(gm, _example_inputs):
            graphs[name] = gm
            return make_boxed_func(gm.forward)

        return compiler

    backend = aot_autograd(fw_compiler=keep("fw"), bw_compiler=keep("bw"))

    def fn(q, k, v):
        return flash_attention(q, k, v, causal="bottom_right", bwd_kernel="hopper")

    q0, k0, v0 = qkv(h=4, hk=2, sq=9, sk=13)
    results = []
    torch._dynamo.reset()
    for f in (torch.compile(fn, fullgraph=True, backend=backend), fn):
        q, k, v = (t.clone().requires_grad_(True) for t in (q0, k0, v0))
        out = f(q, k, v)
        out.float().square().sum().backward()
        results.append((out, q.grad, k.grad, v.grad))
    for got, want in zip(*results):
        assert torch.equal(got, want)
    calls = [
        n
        for n in graphs["bw"].graph.nodes
        if n.op == "call_function" and str(n.target) == "project01.flash_attn_bwd.default"
    ]
    assert len(calls) == 1
    assert "hopper" in (*calls[0].args, *calls[0].kwargs.values())


# --------------------------------------------------------------------------------------------
# GPU tier (Hopper): not run on the CPU machines


class _ExtensionSpy:
    """The attention extension with the name of every function called recorded ("bwd": the
    FlashAttention-2 backward, "bwd_hopper": the Hopper one)."""

    def __init__(self, ext):
        self._ext, self.calls = ext, []

    def __getattr__(self, name):
        fn = getattr(self._ext, name)
        if not callable(fn):
            return fn

        def call(*args, **kwargs):
            self.calls.append(name)
            return fn(*args, **kwargs)

        return call


@pytest.fixture
def spy(monkeypatch):
    ext = attention._extension()  # built (or loaded) before it is replaced
    recorder = _ExtensionSpy(ext)
    monkeypatch.setattr(attention, "_extension", lambda: recorder)
    return recorder


def _autograd_grads(fn, q0, k0, v0, dout, **kwargs):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q0, k0, v0))
    out = fn(q, k, v, **kwargs)
    out.backward(dout)
    return out.detach(), q.grad, k.grad, v.grad


def _dq_tolerance(dq: torch.Tensor) -> float:
    """One ulp of dq's dtype at its largest magnitude, bounded by 2 u max|dq| (see
    test_hopper_backward_through_autograd_matches_fa2)."""
    return 2 * UNIT_ROUNDOFF[dq.dtype] * dq.abs().max().item()


# (head dim, causal, heads, kv heads, seq_q, seq_k): both Hopper head dims, causal and not, one
# grouped-query case (4 query heads per k/v head, bottom-right with Sq > Sk: rows that see no
# key). Lengths not multiples of the 64-row query block or the 128-key block.
AUTOGRAD_CASES = [
    (64, False, 4, 4, 1000, 1000),
    (64, True, 4, 4, 1000, 1000),
    (128, False, 4, 4, 1000, 1000),
    (128, True, 4, 4, 1000, 1000),
    (128, "bottom_right", 8, 2, 1041, 777),
]


@pytest.mark.parametrize(
    ("d", "causal", "h", "hk", "sq", "sk"),
    AUTOGRAD_CASES,
    ids=[f"d{c[0]}-{c[1]}-h{c[2]}kv{c[3]}-q{c[4]}k{c[5]}" for c in AUTOGRAD_CASES],
)
@pytest.mark.gpu
@ONLY_ON_HOPPER
def test_hopper_backward_through_autograd_matches_fa2(spy, d, causal, h, hk, sq, sk):
    """flash_attention(..., bwd_kernel="hopper") through autograd runs the Hopper backward,
    "fa2" the FlashAttention-2 one, and "auto" the one `select_bwd_kernel` names for it (the
    Hopper one while AUTO_BWD_HOPPER is on, as by default; FA2 with it off); the same forward feeds both.

    dk and dv: bitwise equal to FA2's, as the H200 benchmark measured (bf16, head dims 64 and
    128, causal and not). Neither kernel uses atomics for them: one CTA accumulates each key's
    dK/dV in float32 registers over the query blocks, and GQA groups are summed by the same
    binding code. This test checks that the equality holds at these shapes too (GQA included).

    dq: within one ulp of bf16 at the largest |dq|. Arithmetic: in both kernels a CTA owns 128
    keys and adds its partial scale * dS K (128 products of 16-bit values, each exact in
    float32) into a float32 dq_accum with atomics, whose order is not fixed; dq_accum is then
    rounded once to bf16. With n = ceil(Sk / 128) <= 9 blocks adding into one element, the two
    float32 sums differ by at most about n * u32 * max|partial| (u32 = 2^-24), plus the
    partials' own float32 rounding in each kernel's tensor-core order, about 128 * u32 *
    max|partial|: together below 2^-16 * max|partial|, orders of magnitude under one bf16 ulp
    (2^-8 of the value's binade) for random inputs, where max|partial| is within a small factor
    of max|dq|. Two float32 values that close round to the same bf16 value or to neighbours, so
    each element may differ by 1 ulp of bf16 at its magnitude, at most 2 u max|dq| (u = 2^-8
    for bf16, one ulp of the largest value's binade). The benchmark measured 2.3e-3 max|dq|,
    within 2 u = 7.8e-3.
    """
    dtype = torch.bfloat16
    q, k, v = qkv(2, h, hk, sq, sk, d, dtype=dtype, device="cuda", seed=41)
    gen = torch.Generator(device="cuda").manual_seed(43)
    dout = torch.randn(q.shape, generator=gen, device="cuda", dtype=dtype)
    spy.calls.clear()
    hop = _autograd_grads(flash_attention, q, k, v, dout, causal=causal, bwd_kernel="hopper")
    assert "bwd_hopper" in spy.calls and "bwd" not in spy.calls, spy.calls
    spy.calls.clear()
    auto = _autograd_grads(flash_attention, q, k, v, dout, causal=causal, bwd_kernel="auto")
    ran = "bwd_hopper" if attention.select_bwd_kernel("auto", False, d) == "hopper" else "bwd"
    assert ran in spy.calls and len(set(spy.calls) & {"bwd", "bwd_hopper"}) == 1, spy.calls
    spy.calls.clear()
    fa2 = _autograd_grads(flash_attention, q, k, v, dout, causal=causal, bwd_kernel="fa2")
    assert "bwd" in spy.calls and "bwd_hopper" not in spy.calls, spy.calls
    if ran == "bwd":  # "auto" ran the FA2 backward: dk and dv bitwise (dq: atomics' order)
        assert torch.equal(auto[2], fa2[2]) and torch.equal(auto[3], fa2[3])
    else:  # "auto" ran the Hopper backward: bitwise equal to "hopper" for dk and dv
        assert torch.equal(auto[2], hop[2]) and torch.equal(auto[3], hop[3])
    assert torch.equal(hop[0], fa2[0])  # the same forward
    for g in hop[1:]:
        assert torch.isfinite(g).all()
    assert torch.equal(hop[2], fa2[2]), "dk differs from the FA2 backward's"
    assert torch.equal(hop[3], fa2[3]), "dv differs from the FA2 backward's"
    tol = _dq_tolerance(fa2[1])
    err = (hop[1].float() - fa2[1].float()).abs().max().item()
    assert err <= tol, f"dq: max |hopper - fa2| {err:.3e} > one ulp at max|dq| {tol:.3e}"


@pytest.mark.gpu
@ONLY_ON_HOPPER
def test_compiled_call_runs_the_hopper_backward(spy):
    """torch.compile(fullgraph=True) of flash_attention(..., bwd_kernel="hopper"): the compiled
    backward runs the Hopper kernel; gradients as eager FA2's (dk, dv bitwise, dq within one
    bf16 ulp at max|dq|, as in the eager test)."""
    pytest.importorskip("triton", reason="inductor on CUDA needs triton")
    q, k, v = qkv(2, 8, 2, 1000, 1000, 128, dtype=torch.bfloat16, device="cuda", seed=47)
    dout = torch.randn_like(q)

    def fn(q, k, v, bwd_kernel="hopper"):
        return flash_attention(q, k, v, causal=True, bwd_kernel=bwd_kernel)

    torch._dynamo.reset()
    spy.calls.clear()
    got = _autograd_grads(torch.compile(fn, fullgraph=True), q, k, v, dout)
    assert "bwd_hopper" in spy.calls and "bwd" not in spy.calls, spy.calls
    want = _autograd_grads(fn, q, k, v, dout, bwd_kernel="fa2")
    assert torch.equal(got[0], want[0])
    assert torch.equal(got[2], want[2]) and torch.equal(got[3], want[3])
    err = (got[1].float() - want[1].float()).abs().max().item()
    assert err <= _dq_tolerance(want[1]), err


@pytest.mark.gpu
@ONLY_ON_HOPPER
def test_refusals_at_the_call_on_hopper(spy):
    """On the GPU it runs on, what the Hopper backward lacks is still refused at the forward
    call, before any kernel (no extension call recorded)."""
    q, k, v = qkv(1, 2, 2, 200, 200, 64, device="cuda", seed=53)
    spy.calls.clear()
    with pytest.raises(ValueError, match="bwd_kernel='hopper' does not implement window_size"):
        flash_attention(q, k, v, causal=True, window_size=(16, 0), bwd_kernel="hopper")
    with pytest.raises(ValueError, match="bwd_kernel='hopper' is compiled for head dims"):
        flash_attention(*qkv(1, 2, 2, 64, 64, 256, device="cuda"), bwd_kernel="hopper")
    with pytest.raises(ValueError, match="bwd_kernel must be one of"):
        flash_attention(q, k, v, bwd_kernel="fa3")
    assert spy.calls == []
