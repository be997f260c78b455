"""Compute vs communication vs exposed communication, on traces whose answer is known."""

from __future__ import annotations

import gzip
import json

import pytest

from project02_fsdp_scaling.comm_analysis import (
    analyse_trace,
    collective_kind,
    kernel_kind,
    launch_origins,
    load_trace,
    merge,
    subtract,
)


def X(name, ts, dur, cat, tid=1, pid=1):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "tid": tid, "pid": pid}


def test_interval_algebra():
    assert merge([(5, 7), (0, 2), (1, 3), (7, 8)]) == [(0, 3), (5, 8)]
    assert subtract([(0, 10), (20, 30)], [(2, 3), (5, 25)]) == [(0, 2), (3, 5), (25, 30)]
    assert subtract([(0, 10)], []) == [(0, 10)]
    assert subtract([(0, 10)], [(0, 10)]) == []


def test_collective_names():
    assert (
        collective_kind("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)")
        == "allgather"
    )
    assert collective_kind("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL") == "reducescatter"
    assert collective_kind("gloo:all_reduce") == "allreduce"
    assert collective_kind("triton_poi_fused_add_0") is None
    assert collective_kind("nvjet_sm90_tst_128x256") is None


def gpu_trace():
    # One step of 100 us on the device; compute 0-40 and 50-80; NCCL 30-60 (10 us hidden under
    # compute 30-40, 10 exposed 40-50, 10 hidden 50-60) and a second NCCL 90-95 (exposed).
    return {
        "traceEvents": [
            X("ProfilerStep#3", 0, 100, "user_annotation"),  # host copy: must not count twice
            X("ProfilerStep#3", 0, 100, "gpu_user_annotation", tid=7, pid=0),
            X("nvjet_sm90_gemm", 0, 40, "kernel", tid=7, pid=0),
            X("triton_poi_fused_mul_0", 10, 20, "kernel", tid=7, pid=0),  # nested in compute
            X("nvjet_sm90_gemm", 50, 30, "kernel", tid=7, pid=0),
            X("ncclDevKernel_AllGather_RING_LL", 30, 30, "kernel", tid=20, pid=0),
            X("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", 90, 5, "kernel", tid=20, pid=0),
            X("aten::mm", 0, 100, "cpu_op"),  # host ops are ignored on a GPU trace
        ]
    }


def test_gpu_trace_breakdown():
    r = analyse_trace(gpu_trace())
    assert r["steps"] == 1
    assert r["step_ms"] == pytest.approx(0.100)
    assert r["compute_ms"] == pytest.approx(0.070)
    assert r["comm_ms"] == pytest.approx(0.035)
    assert r["exposed_comm_ms"] == pytest.approx(0.015)
    assert r["overlapped_comm_ms"] == pytest.approx(0.020)
    assert r["other_ms"] == pytest.approx(0.015)  # 80-90 and 95-100 idle
    # compute + exposed + other = the step
    assert r["compute_ms"] + r["exposed_comm_ms"] + r["other_ms"] == pytest.approx(r["step_ms"])
    assert r["collectives"]["allgather"]["count_per_step"] == 1
    assert r["collectives"]["reducescatter"]["ms_per_step"] == pytest.approx(0.005)


def test_kernel_kinds_of_real_kernel_names():
    """Names as an H200 run of the 1b model printed them (committed trace): cuDNN's attention
    kernels carry "wgmma" but are attention; Inductor's GEMM templates are GEMMs, its other
    kernels "compiled" even when their names say copy; eager casts are copies."""
    cases = {
        "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN": "gemm",
        "sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128": "gemm",
        "triton_tem_fused_mm_0": "gemm",
        "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26": "attention",
        "void cudnn::fusion::compute_dot_do_o_specialized<true, 128>(void const*)": "attention",
        "triton_poi_fused__to_copy_clone_permute_stack_3": "compiled (Inductor)",
        "triton_red_fused__log_softmax__to_copy_prepare_softmax_online_view_0": (
            "compiled (Inductor)"
        ),
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<...>": "optimizer",
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
        "namespace)::FusedOptimizerTensorListMetadata<4>, at::native::(anonymous namespace)::"
        "FusedAdamMathFunctor<float, 4>": "optimizer",
        # FSDP's all-gather copy-in (a foreach copy) is a cast, not optimizer work
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
        "namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::CopyFunctor<c10::"
        "BFloat16, float, 2, 1, 1>, at::native::Copy<c10::BFloat16, float> >": "copy / cast",
        "void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda": (
            "copy / cast"
        ),
        "void at::native::unrolled_elementwise_kernel<at::native::CUDAFunctor_add<float>>": (
            "eager element-wise"
        ),
        "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "collective",
        "void at::native::(anonymous namespace)::sum_and_scatter<c10::BFloat16, long>": "other",
    }
    for name, kind in cases.items():
        assert kernel_kind(name) == kind, name


def test_kernel_time_by_kind_per_step():
    """The step's GPU events summed by kind (nested or concurrent ones both count: a sum of
    durations, not a union), with shares and the top kernels; a kernel outside every step and
    the host ops are left out; a memcpy is a copy."""
    trace = gpu_trace()
    trace["traceEvents"] += [
        X("Memcpy HtoD (Pinned -> Device)", 82, 4, "gpu_memcpy", tid=7, pid=0),
        X("nvjet_sm90_gemm", 200, 50, "kernel", tid=7, pid=0),  # after the step
    ]
    k = analyse_trace(trace)["kernel_time"]
    assert k["total_ms_per_step"] == pytest.approx(0.129)  # 70 + 20 + 35 + 4 us
    kinds = k["kinds"]
    assert list(kinds) == ["gemm", "collective", "compiled (Inductor)", "copy / cast"]
    assert kinds["gemm"]["ms_per_step"] == pytest.approx(0.070)
    assert kinds["gemm"]["count_per_step"] == 2
    assert kinds["gemm"]["share"] == pytest.approx(70 / 129)
    assert kinds["collective"]["ms_per_step"] == pytest.approx(0.035)
    assert kinds["copy / cast"]["count_per_step"] == 1
    assert sum(v["share"] for v in kinds.values()) == pytest.approx(1.0)
    top = [(t["name"], t["kind"]) for t in k["top"][:3]]
    assert top == [
        ("nvjet_sm90_gemm", "gemm"),
        ("ncclDevKernel_AllGather_RING_LL", "collective"),
        ("triton_poi_fused_mul_0", "compiled (Inductor)"),
    ]
    assert k["top"][0]["ms_per_step"] == pytest.approx(0.070)


def launched(name, ts, dur, corr, cat="kernel", launch_ts=None, host_tid=1):
    """A GPU event and the host call that launched it (linked by the correlation id)."""
    kernel = X(name, ts, dur, cat, tid=7, pid=0)
    kernel["args"] = {"correlation": corr}
    launch = X("cudaLaunchKernel", ts if launch_ts is None else launch_ts, 1, "cuda_runtime")
    launch["tid"], launch["args"] = host_tid, {"correlation": corr}
    return [kernel, launch]


def test_kernel_time_by_launch_origin():
    """Each GPU event is charged to the innermost annotation around the host call that
    launched it (FSDP's spans, the optimizer's), per-layer suffixes dropped; without one, to
    the autograd node running on the backward thread; else to "(no annotation)". Host spans
    of another thread never claim a launch."""
    events = [
        X("ProfilerStep#1", 0, 1000, "user_annotation"),
        X("ProfilerStep#1", 0, 1000, "gpu_user_annotation", tid=7, pid=0),
        # forward thread (tid 1): an FSDP span around the all-gather copy-in, then model code
        X("FSDP::pre_forward (layers.0)", 0, 20, "user_annotation"),
        *launched("void at::native::bfloat16_copy_kernel_cuda", 10, 30, 1, launch_ts=5),
        *launched("nvjet_sm90_gemm", 100, 200, 2, launch_ts=30),
        X("Optimizer.step#AdamW.step", 900, 50, "user_annotation"),
        *launched("multi_tensor_apply_kernel", 910, 20, 3, launch_ts=905),
        # backward thread (tid 2): an autograd node, and FSDP's accumulation nested inside one
        X("autograd::engine::evaluate_function: CompiledFunctionBackward", 300, 100, "cpu_op", 2),
        *launched("nvjet_sm90_gemm", 400, 100, 4, launch_ts=310, host_tid=2),
        X("autograd::engine::evaluate_function: RegisterPostBackward", 500, 50, "cpu_op", 2),
        X("FSDP::post_backward_accumulate (layers.0)", 505, 40, "user_annotation", tid=2),
        *launched("CUDAFunctor_add<float> elementwise", 600, 10, 5, launch_ts=510, host_tid=2),
        *launched("CUDAFunctor_add<float> elementwise", 620, 10, 6, launch_ts=520, host_tid=2),
        # an annotation on another thread at the same time claims nothing
        X("FSDP::post_backward_reshard (layers.1)", 0, 1000, "user_annotation", tid=3),
    ]
    events.append(X("triton_poi_fused_0", 700, 5, "kernel", tid=7, pid=0))  # no correlation
    origins = launch_origins(events)
    assert origins == {
        1: "FSDP::pre_forward",
        2: "(no annotation)",
        3: "Optimizer.step",
        4: "backward: CompiledFunctionBackward",
        5: "FSDP::post_backward_accumulate",
        6: "FSDP::post_backward_accumulate",
    }
    rows = analyse_trace({"traceEvents": events})["kernel_time"]["by_origin"]
    table = {(r["origin"], r["kind"]): (r["ms_per_step"], r["count_per_step"]) for r in rows}
    assert table == {
        ("(no annotation)", "gemm"): (pytest.approx(0.200), 1),
        ("backward: CompiledFunctionBackward", "gemm"): (pytest.approx(0.100), 1),
        ("FSDP::pre_forward", "copy / cast"): (pytest.approx(0.030), 1),
        ("FSDP::post_backward_accumulate", "eager element-wise"): (pytest.approx(0.020), 2),
        ("Optimizer.step", "optimizer"): (pytest.approx(0.020), 1),
        ("(launch not traced)", "compiled (Inductor)"): (pytest.approx(0.005), 1),
    }
    assert [r["origin"] for r in rows][:2] == [
        "(no annotation)",
        "backward: CompiledFunctionBackward",
    ]
    assert sum(r["share"] for r in rows) == pytest.approx(1.0)


def test_cpu_trace_has_no_kernel_time():
    trace = {
        "traceEvents": [
            X("ProfilerStep#1", 0, 100, "user_annotation"),
            X("aten::mm", 0, 50, "cpu_op"),
        ]
    }
    assert "kernel_time" not in analyse_trace(trace)


def test_cpu_trace_breakdown(tmp_path):
    # gloo runs collectives on its own thread (tid 9) while the training thread (tid 1) computes.
    trace = {
        "traceEvents": [
            X("ProfilerStep#1", 0, 100, "user_annotation"),
            X("aten::mm", 0, 50, "cpu_op"),
            X("aten::add", 10, 5, "cpu_op"),
            X("aten::mm", 60, 20, "cpu_op", tid=9),  # another thread: not the training thread
            X("gloo:all_gather", 40, 30, "user_annotation", tid=9),
        ]
    }
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(trace, f)
    r = analyse_trace(load_trace(path))
    assert r["compute_ms"] == pytest.approx(0.050)
    assert r["comm_ms"] == pytest.approx(0.030)
    assert r["exposed_comm_ms"] == pytest.approx(0.020)
    assert r["other_ms"] == pytest.approx(0.030)


def test_bad_traces(tmp_path):
    with pytest.raises(ValueError, match="ProfilerStep"):
        analyse_trace({"traceEvents": [X("aten::mm", 0, 1, "cpu_op")]})
    with pytest.raises(FileNotFoundError):
        load_trace(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="Chrome trace"):
        load_trace(tmp_path / "x.json")
