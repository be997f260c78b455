"""CPU tier: the backward kernel choice (`bwd_kernel`: "auto" | "hopper" | "fa2") is checked before
any CUDA work, and every refusal names the argument; the Hopper backward's sources are built by
the extension. (Its numbers are tested on an H100/H200 by test_attention_hopper_bwd_gpu.py.)"""

from __future__ import annotations

import pytest
import torch

from project01_cuda_kernel import attention
from project01_cuda_kernel._build import is_hopper
from project01_cuda_kernel.attention import (
    BWD_KERNELS,
    HOPPER_HEAD_DIMS,
    flash_backward,
    flash_backward_varlen,
    select_bwd_kernel,
)
from project01_cuda_kernel.compile_check import CSRC, NO_SPILL_MARKER

NOT_HOPPER = pytest.mark.skipif(is_hopper(), reason="this machine has a Hopper GPU")


def test_auto_is_fa2_while_the_switch_is_off(monkeypatch):
    """AUTO_BWD_HOPPER off: "auto" is "fa2" whatever the GPU says, like "fa2" itself."""
    assert BWD_KERNELS == ("auto", "hopper", "fa2")
    monkeypatch.setattr(attention, "AUTO_BWD_HOPPER", False)
    for on_hopper in (False, True):
        monkeypatch.setattr(attention, "_on_hopper", lambda on_hopper=on_hopper: on_hopper)
        for local in (False, True):
            for d in (64, 128, 256, None):
                assert select_bwd_kernel("auto", local, d) == "fa2"
                assert select_bwd_kernel("fa2", local, d) == "fa2"
        assert select_bwd_kernel("auto", False, 128, varlen=True) == "fa2"


def test_auto_takes_the_hopper_backward_where_it_has_an_instance(monkeypatch):
    """AUTO_BWD_HOPPER on: "auto" is "hopper" exactly where "hopper" would be accepted (dense,
    kernel head dim 64 or 128, not varlen, a compute capability 9.0 GPU) and "fa2" wherever
    "hopper" would be refused; it never raises. "fa2" stays "fa2"."""
    monkeypatch.setattr(attention, "AUTO_BWD_HOPPER", True)
    for on_hopper in (False, True):
        monkeypatch.setattr(attention, "_on_hopper", lambda on_hopper=on_hopper: on_hopper)
        for local in (False, True):
            for d in (64, 128, 256, 32, None):
                for varlen in (False, True):
                    try:
                        expect = select_bwd_kernel("hopper", local, d, varlen)
                    except ValueError:
                        expect = "fa2"
                    if d is None:  # "hopper" checks no unknown head dim; "auto" needs one
                        expect = "fa2"
                    assert select_bwd_kernel("auto", local, d, varlen) == expect
                    assert select_bwd_kernel("fa2", local, d, varlen) == "fa2"
        hopper = select_bwd_kernel("auto", False, 128)
        assert hopper == ("hopper" if on_hopper else "fa2")


def test_check_bwd_kernel_reads_the_kernel_head_dim_and_the_mask(monkeypatch):
    """With the switch on, what flash_attention's forward expects the backward to run: the
    kernel head dim (40 is padded to 64, 200 to 256), a window or softcap only when in effect."""
    from project01_cuda_kernel.attention import check_bwd_kernel

    monkeypatch.setattr(attention, "AUTO_BWD_HOPPER", True)
    monkeypatch.setattr(attention, "_on_hopper", lambda: True)

    def qk(d, sq=20, sk=20):
        return torch.zeros(1, 2, sq, d), torch.zeros(1, 2, sk, d)

    assert check_bwd_kernel("auto", *qk(40), True) == "hopper"
    assert check_bwd_kernel("auto", *qk(128), False) == "hopper"
    assert check_bwd_kernel("auto", *qk(200), False) == "fa2"
    assert check_bwd_kernel("auto", *qk(64), True, window_size=(4, 0)) == "fa2"
    assert check_bwd_kernel("auto", *qk(64), True, softcap=30.0) == "fa2"
    assert check_bwd_kernel("auto", *qk(64), True, window_size=(99, 0)) == "hopper"  # hides none
    assert check_bwd_kernel("fa2", *qk(64), True) == "fa2"
    monkeypatch.setattr(attention, "AUTO_BWD_HOPPER", False)
    assert check_bwd_kernel("auto", *qk(64), True) == "fa2"
    with pytest.raises(ValueError, match="bwd_kernel must be one of"):
        check_bwd_kernel("cudnn", *qk(64), True)


@pytest.mark.parametrize("bad", ["Hopper", "fa3", "", None, 2])
def test_unknown_bwd_kernel_is_refused(bad):
    with pytest.raises(ValueError, match="bwd_kernel must be one of"):
        select_bwd_kernel(bad, False, 128)


def test_hopper_refusals_name_bwd_kernel_and_the_reason():
    with pytest.raises(ValueError, match="bwd_kernel='hopper' does not implement window_size"):
        select_bwd_kernel("hopper", True, 128)
    for d in (256, 32):
        with pytest.raises(
            ValueError, match=rf"bwd_kernel='hopper' is compiled for head dims .*{d}"
        ):
            select_bwd_kernel("hopper", False, d)
    with pytest.raises(ValueError, match="bwd_kernel='hopper' has no variable-length"):
        select_bwd_kernel("hopper", False, 128, varlen=True)
    assert HOPPER_HEAD_DIMS == (64, 128)


@NOT_HOPPER
@pytest.mark.parametrize("d", HOPPER_HEAD_DIMS)
def test_hopper_is_refused_without_a_hopper_gpu(d):
    with pytest.raises(ValueError, match="bwd_kernel='hopper' needs a GPU of compute capability"):
        select_bwd_kernel("hopper", False, d)


def _grads_args(sq=17, sk=17, d=64, h=2, hk=2):
    q, do = (torch.randn(1, h, sq, d).bfloat16() for _ in "qo")
    k, v = (torch.randn(1, hk, sk, d).bfloat16() for _ in "kv")
    lse = torch.zeros(1, h, sq)
    return do, q, k, v, q.clone(), lse


def test_flash_backward_checks_bwd_kernel_before_any_cuda_work(monkeypatch):
    """The refusals come before the extension is built or loaded (CPU tensors, no nvcc)."""

    def no_extension():
        raise AssertionError("the extension must not be loaded for a refused bwd_kernel")

    monkeypatch.setattr(attention, "_extension", no_extension)
    args = _grads_args()
    with pytest.raises(ValueError, match="bwd_kernel must be one of"):
        flash_backward(*args, False, 0.125, bwd_kernel="cudnn")
    with pytest.raises(ValueError, match="bwd_kernel='hopper' does not implement window_size"):
        flash_backward(*args, False, 0.125, bwd_kernel="hopper", window_size=(4, 0))
    with pytest.raises(ValueError, match="bwd_kernel='hopper' does not implement window_size"):
        flash_backward(*args, False, 0.125, bwd_kernel="hopper", softcap=30.0)
    with pytest.raises(ValueError, match="bwd_kernel='hopper' is compiled for head dims"):
        flash_backward(*_grads_args(d=256), False, 0.125, bwd_kernel="hopper")
    # A window that hides no key is not a window: the refusal is the GPU's, not the window's.
    if not is_hopper():
        with pytest.raises(ValueError, match="needs a GPU of compute capability 9.0"):
            flash_backward(*args, "bottom_right", 0.125, bwd_kernel="hopper", window_size=(99, 0))


def test_varlen_backward_refuses_the_hopper_kernel(monkeypatch):
    monkeypatch.setattr(attention, "_extension", lambda: pytest.fail("extension loaded"))
    q, do = (torch.randn(20, 2, 64).bfloat16() for _ in "qo")
    k, v = (torch.randn(30, 2, 64).bfloat16() for _ in "kv")
    cu_q = torch.tensor([0, 20], dtype=torch.int32)
    cu_k = torch.tensor([0, 30], dtype=torch.int32)
    lse = torch.zeros(2, 20)
    with pytest.raises(ValueError, match="bwd_kernel='hopper' has no variable-length"):
        flash_backward_varlen(
            do, q, k, v, q, lse, cu_q, cu_k, 20, 30, False, 0.125, bwd_kernel="hopper"
        )
    with pytest.raises(ValueError, match="bwd_kernel must be one of"):
        flash_backward_varlen(do, q, k, v, q, lse, cu_q, cu_k, 20, 30, False, 0.125, bwd_kernel="x")


def test_the_extension_builds_the_hopper_backward():
    for d in HOPPER_HEAD_DIMS:
        rel = f"attention/flash_bwd_hopper_hdim{d}.cu"
        assert rel in attention._SOURCES
        text = (CSRC / rel).read_text()
        assert NO_SPILL_MARKER in text
        assert f"flash_bwd_hopper_hdim{d}(" in (CSRC / "attention" / "flash_api.h").read_text()
    # Guarded like the Hopper forward: the kernel body only on sm_90a, so sm_80 builds it.
    header = (CSRC / "attention" / "flash_bwd_hopper.cuh").read_text()
    assert "#ifdef FLASH_SM90A" in header and "__trap();" in header
