"""CPU tier: shared.cuda_build without a GPU (reasons, arch list, build directory, missing sources)."""

from __future__ import annotations

import re

import pytest
import torch

from shared import cuda_build


def test_no_gpu_reason_is_one_sentence_and_require_raises():
    if torch.cuda.is_available() and torch.version.cuda is not None:
        pytest.skip("CUDA is available here: the no-GPU message cannot be produced")
    reason = cuda_build.cuda_unavailable_reason()
    assert reason and reason.endswith(".") and "\n" not in reason
    with pytest.raises(cuda_build.CudaUnavailableError, match=re.escape(reason)):
        cuda_build.require_cuda()


def test_each_missing_piece_has_its_own_reason(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    assert "CPU-only build" in cuda_build.cuda_unavailable_reason()
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "no CUDA GPU is visible" in cuda_build.cuda_unavailable_reason()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda_build, "find_nvcc", lambda: None)
    assert "nvcc was not found" in cuda_build.cuda_unavailable_reason()
    monkeypatch.setattr(cuda_build, "find_nvcc", lambda: "/usr/bin/nvcc")
    assert cuda_build.cuda_unavailable_reason() is None


def test_arch_list_is_the_gpu_with_9_0a_on_hopper_or_the_override(monkeypatch):
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert cuda_build.target_arch_list() == "9.0a"  # wgmma/TMA need the arch-specific target
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 9))
    assert cuda_build.target_arch_list() == "8.9"
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;9.0a")
    assert cuda_build.target_arch_list() == "8.0;9.0a"


def test_build_root_is_the_repo_dot_build_or_the_env_override(monkeypatch, tmp_path):
    monkeypatch.delenv("CUDA_EXT_BUILD_DIR", raising=False)
    assert cuda_build.default_build_root() == cuda_build.REPO_ROOT / ".build"
    monkeypatch.setenv("CUDA_EXT_BUILD_DIR", str(tmp_path))
    assert cuda_build.default_build_root() == tmp_path


def test_missing_source_is_named_before_any_gpu_check(tmp_path):
    (tmp_path / "there.cu").write_text("// empty\n")
    with pytest.raises(FileNotFoundError, match=r"extension demo: missing sources .*absent\.cu"):
        cuda_build.load_extension("demo", tmp_path, ("there.cu", "absent.cu"))


def test_without_cuda_loading_raises_the_reason(tmp_path, monkeypatch):
    (tmp_path / "k.cu").write_text("// empty\n")
    monkeypatch.setattr(cuda_build, "cuda_unavailable_reason", lambda: "no GPU here.")
    with pytest.raises(cuda_build.CudaUnavailableError, match="no GPU here"):
        cuda_build.load_extension("demo_unavailable", tmp_path, ["k.cu"], build_root=tmp_path)
    assert not (tmp_path / "demo_unavailable").exists()  # nothing built, nothing created


def test_project01_keeps_its_names_and_shares_the_error_class():
    from project01_cuda_kernel import CudaUnavailableError, _build

    assert CudaUnavailableError is cuda_build.CudaUnavailableError
    for name in (
        "CSRC",
        "build_root",
        "cuda_unavailable_reason",
        "is_hopper",
        "load_extension",
        "require_cuda",
        "target_arch_list",
    ):
        assert hasattr(_build, name), name
