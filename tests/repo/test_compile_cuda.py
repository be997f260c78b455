"""scripts/compile_cuda.py, the compile-only CI job: every CUDA source compiled by nvcc alone.

The reporting and exit status are checked with a stand-in nvcc (a script that fails on planted
errors), so they are tested on any machine; the real compiler is used where it is installed.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from scripts import compile_cuda

ROOT = Path(__file__).resolve().parents[2]
NEEDS_NVCC = pytest.mark.skipif(
    compile_cuda.find_nvcc() is None, reason="nvcc not found: CUDA toolkit absent"
)

# A stand-in for nvcc: fails the way nvcc does on a planted error or a torch header, else
# writes the object file named after -o.
FAKE_NVCC = f"""#!{sys.executable}
import sys
args = sys.argv[1:]
src = open(args[args.index("-c") + 1]).read()
if "planted_error" in src:
    print('bad.cu(1): error: identifier "planted_error" is undefined')
    sys.exit(1)
if "torch/extension.h" in src:
    print("torchy.cu:1:10: fatal error: torch/extension.h: No such file or directory")
    sys.exit(1)
open(args[args.index("-o") + 1], "w").write("object")
"""


@pytest.fixture
def fake_nvcc(tmp_path) -> str:
    path = tmp_path / "bin" / "nvcc"
    path.parent.mkdir()
    path.write_text(FAKE_NVCC)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _write(tmp_path, name, text):
    path = tmp_path / "csrc" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return str(path)


def test_the_sources_are_every_cu_file_under_a_project_csrc():
    found = compile_cuda.sources()
    expected = sorted(p for p in ROOT.glob("*/csrc/**/*.cu"))
    assert found == expected
    projects = {p.relative_to(ROOT).parts[0] for p in found}
    assert {"project01_cuda_kernel", "project04_llm_inference"} <= projects


def test_failures_are_reported_and_fail_the_run(tmp_path, fake_nvcc, capsys):
    good = _write(tmp_path, "good.cu", "__global__ void k() {}\n")
    bad = _write(tmp_path, "bad.cu", "__global__ void k() { planted_error; }\n")
    torchy = _write(tmp_path, "torchy.cu", "#include <torch/extension.h>\n")
    assert compile_cuda.main(["--nvcc", fake_nvcc, "--jobs", "2", good, bad, torchy]) == 1
    out = capsys.readouterr().out
    assert "ok   " in out and out.count("FAIL ") == 2
    assert 'identifier "planted_error" is undefined' in out
    assert compile_cuda.TORCH_NOTE in out and out.count(compile_cuda.TORCH_NOTE) == 1
    assert "3 CUDA source(s) compiled for sm_90a" in out and "2 failed" in out
    assert compile_cuda.main(["--nvcc", fake_nvcc, "--arch", "80", good]) == 0
    assert "for sm_80" in capsys.readouterr().out


def test_without_nvcc_it_skips_or_with_strict_fails(monkeypatch, capsys):
    monkeypatch.setattr(compile_cuda, "find_nvcc", lambda: None)
    assert compile_cuda.main([]) == 0
    assert "cuda compile skipped: nvcc was not found" in capsys.readouterr().out
    assert compile_cuda.main(["--strict"]) == 2


def test_nothing_to_compile_fails_only_with_strict(tmp_path, fake_nvcc, monkeypatch, capsys):
    monkeypatch.setattr(compile_cuda, "sources", lambda root=ROOT: [])
    assert compile_cuda.main(["--nvcc", fake_nvcc]) == 0
    assert "no CUDA sources here" in capsys.readouterr().out
    assert compile_cuda.main(["--nvcc", fake_nvcc, "--strict"]) == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--arch", "sm_90"], "argument --arch"),
        (["--jobs", "0"], "argument --jobs"),
        (["no/such/file.cu"], "no such file"),
    ],
)
def test_bad_arguments_are_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        compile_cuda.main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_the_script_needs_only_the_standard_library():
    """It runs in a bare CUDA container: no third-party or repository imports."""
    import ast

    tree = ast.parse(Path(compile_cuda.__file__).read_text())
    names = {
        a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    names |= {
        n.module.split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module
    }
    assert names <= set(sys.stdlib_module_names) | {"__future__"}, names


@NEEDS_NVCC
def test_real_nvcc_compiles_a_kernel_and_rejects_a_broken_one(tmp_path, capsys):
    good = _write(tmp_path, "good.cu", "__global__ void k(float* x) { x[threadIdx.x] = 1.f; }\n")
    bad = _write(tmp_path, "bad.cu", "__global__ void k(float* x) { x[0] = planted_error; }\n")
    assert compile_cuda.main(["--strict", good]) == 0
    assert compile_cuda.main(["--strict", bad]) == 1
    assert "planted_error" in capsys.readouterr().out


@NEEDS_NVCC
@pytest.mark.slow
def test_project04_sources_compile_with_nvcc_alone(capsys):
    """project01's sources have their own compile check (tests/project01_cuda_kernel)."""
    files = [str(p) for p in compile_cuda.sources() if p.parts[-3] == "project04_llm_inference"]
    assert files
    rc = compile_cuda.main(["--strict", "--jobs", str(min(4, os.cpu_count() or 2)), *files])
    assert rc == 0, capsys.readouterr().out


# --- --bindings: the torch bindings against torch's headers, and the launchers they call ---------


def _tree(tmp_path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_binding_units_are_csrc_cpp_files_and_cu_files_naming_the_extension(tmp_path):
    root = _tree(
        tmp_path,
        {
            "p1/csrc/gemv.cu": "__global__ void k() {}\n",
            "p1/csrc/gemv_binding.cpp": "#include <torch/extension.h>\n",
            "p1/csrc/mixed.cu": "#ifdef TORCH_EXTENSION_NAME\n#endif\n",
            "p1/csrc/sub/other_binding.cpp": "\n",
            "p1/csrc/gemv.h": "#pragma once\n",
            "p2/tools/helper.cpp": "\n",  # not under a csrc/
            "top.cpp": "\n",
        },
    )
    units = compile_cuda.binding_units(root)
    assert [u.relative_to(root).as_posix() for u in units] == [
        "p1/csrc/gemv_binding.cpp",
        "p1/csrc/mixed.cu",
        "p1/csrc/sub/other_binding.cpp",
    ]
    repo = {u.relative_to(ROOT).as_posix() for u in compile_cuda.binding_units()}
    assert {
        "project01_cuda_kernel/csrc/attention/flash_binding.cpp",
        "project01_cuda_kernel/csrc/gemm/binding.cpp",
        "project04_llm_inference/csrc/gemv_binding.cpp",
        "project04_llm_inference/csrc/paged_decode.cu",
        "project04_llm_inference/csrc/rope_cache.cu",
    } <= repo
    assert "project04_llm_inference/csrc/gemv.cu" not in repo


@pytest.mark.parametrize(
    ("demangled", "qualified"),
    [
        ("launch_gemv(GemvArgs const&, DType, CUstream_st*)", "launch_gemv"),
        (
            "cudaError flash::launch_fwd<(flash::DType)0, 64>(flash::FwdParams const&, "
            "CUstream_st*)",
            "flash::launch_fwd",
        ),
        ("(anonymous namespace)::launch(int)", "{anonymous}::launch"),
        ("typeinfo for c10::Error", "c10::Error"),
        ("p04::Vec<float>::operator()(int) const", "p04::Vec::operator"),
        ("operator new(unsigned long)", "operator"),
        ("cudaGetErrorString", "cudaGetErrorString"),
    ],
)
def test_qualified_name_drops_signature_template_arguments_and_return_type(demangled, qualified):
    assert compile_cuda.qualified_name(demangled) == qualified


def test_project_names_are_what_the_csrc_tree_declares(tmp_path):
    csrc = _tree(
        tmp_path,
        {
            "gemv.h": (
                "#pragma once\n#include <cuda_runtime.h>\nnamespace p04 {\nstruct NormParams;\n}\n"
                "enum class DType : int { kBF16 };\n"
                "cudaError_t launch_gemv(const GemvArgs& a, DType dtype,\n"
                "                        cudaStream_t stream);\n"
                'extern "C" int c_entry(int);\n'
                "// void ghost_in_a_comment(int);\n"
            ),
            "gemv.cu": (
                "float helper(float y) {\n  float x = 2.f * sqrtf(y);\n  return fabsf(x);\n}\n"
                'const char* s = "void ghost_in_a_string(int)";\n'
            ),
        },
    )
    names = compile_cuda.project_names(csrc)
    assert {"p04", "NormParams", "DType", "launch_gemv", "c_entry", "helper"} <= names
    assert 'extern "C" c_entry' in names and 'extern "C" launch_gemv' not in names
    assert not {"sqrtf", "fabsf", "ghost_in_a_comment", "ghost_in_a_string", "return"} & names


# `nm -P` output of a binding object (undefined symbols) and of its tree's kernel objects
# (defined), with c++filt's readings: the binding was built against a gemv.h whose launch_gemv
# took `DType` while gemv.cu defines it taking `int`.
NM_BINDING = """\
_Z11launch_gemvRK8GemvArgs5DTypeP11CUstream_st U
_ZN3p0415launch_rms_normERKNS_10NormParamsEP11CUstream_st U
_ZN3c104cuda20getCurrentCUDAStreamEa U
_ZNSt6vectorIlSaIlEE17_M_realloc_insertIJRKlEEEvN9__gnu_cxx17__normal_iteratorIPlS1_EEDpOT_ U
_ZTIN3c105ErrorE U
_Znwm U
_ZdlPvm U
PyErr_SetString U
cudaGetErrorString U
__cxa_throw U
memcpy U
__cxa_pure_virtual w
_ZN12_GLOBAL__N_14gemvEN2at6TensorE t 0 20
"""
NM_KERNELS = """\
_Z11launch_gemvRK8GemvArgsiP11CUstream_st T 0 10
_ZN3p0415launch_rms_normERKNS_10NormParamsEP11CUstream_st T 10 20
_ZdlPvS_ W 0 1
"""
DEMANGLED = {
    "_Z11launch_gemvRK8GemvArgs5DTypeP11CUstream_st": "launch_gemv(GemvArgs const&, DType, "
    "CUstream_st*)",
    "_Z11launch_gemvRK8GemvArgsiP11CUstream_st": "launch_gemv(GemvArgs const&, int, CUstream_st*)",
    "_ZN3p0415launch_rms_normERKNS_10NormParamsEP11CUstream_st": "p04::launch_rms_norm("
    "p04::NormParams const&, CUstream_st*)",
    "_ZN3c104cuda20getCurrentCUDAStreamEa": "c10::cuda::getCurrentCUDAStream(signed char)",
    "_ZNSt6vectorIlSaIlEE17_M_realloc_insertIJRKlEEEvN9__gnu_cxx17__normal_iteratorIPlS1_EEDpOT_": (
        "void std::vector<long, std::allocator<long> >::_M_realloc_insert<long const&>("
        "__gnu_cxx::__normal_iterator<long*, std::vector<long, std::allocator<long> > >, "
        "long const&)"
    ),
    "_ZTIN3c105ErrorE": "typeinfo for c10::Error",
    "_Znwm": "operator new(unsigned long)",
    "_ZdlPvm": "operator delete(void*, unsigned long)",
    "_ZdlPvS_": "operator delete(void*, void*)",
}


def test_a_launcher_whose_signature_drifted_is_missing_and_library_symbols_are_not():
    undefined = compile_cuda.parse_nm(NM_BINDING, undefined=True)
    assert "__cxa_pure_virtual" not in undefined  # weak: may stay undefined
    assert not any("GLOBAL__N" in s for s in undefined)  # defined here (t)
    defined = compile_cuda.parse_nm(NM_KERNELS, undefined=False)
    assert len(defined) == 3
    names = {"p04", "NormParams", "GemvArgs", "DType", "launch_gemv", "memcpy", "gemv"}
    (miss,) = compile_cuda.missing_symbols(undefined, defined, DEMANGLED, names)
    assert miss.name == "launch_gemv(GemvArgs const&, DType, CUstream_st*)"
    assert miss.elsewhere == ["_Z11launch_gemvRK8GemvArgsiP11CUstream_st"]
    # the same binding with launch_rms_norm gone from the kernels: that one is missing too
    kernels = [s for s in defined if "rms_norm" not in s]
    missing = compile_cuda.missing_symbols(undefined, kernels, DEMANGLED, names)
    assert [m.name.split("(")[0] for m in missing] == ["launch_gemv", "p04::launch_rms_norm"]
    # an undeclared launch_*/flash_* function is still the project's; a C name needs extern "C"
    assert compile_cuda.is_project_symbol("flash_fwd_hdim64(flash::FwdParams&)", set())
    assert not compile_cuda.is_project_symbol("memcpy", {"memcpy"}, c_linkage=True)
    assert compile_cuda.is_project_symbol("c_entry", {'extern "C" c_entry'}, c_linkage=True)


def _no_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError


def test_the_default_mode_never_imports_torch(tmp_path, fake_nvcc, monkeypatch, capsys):
    _no_torch(monkeypatch)
    good = _write(tmp_path, "good.cu", "__global__ void k() {}\n")
    assert compile_cuda.main(["--nvcc", fake_nvcc, good]) == 0
    assert "1 CUDA source(s) compiled" in capsys.readouterr().out


def test_bindings_without_torch_skip_or_with_strict_fail(tmp_path, fake_nvcc, monkeypatch, capsys):
    _no_torch(monkeypatch)
    assert compile_cuda.main(["--bindings", "--nvcc", fake_nvcc]) == 0
    out = capsys.readouterr().out
    assert out.startswith("binding check skipped: ") and "torch is not importable" in out
    assert compile_cuda.main(["--bindings", "--nvcc", fake_nvcc, "--strict"]) == 2


def test_bindings_without_nvcc_a_host_compiler_or_binutils_say_which(
    fake_nvcc, monkeypatch, capsys
):
    monkeypatch.setattr(compile_cuda, "find_nvcc", lambda: None)
    assert compile_cuda.main(["--bindings", "--strict"]) == 2
    assert "binding check skipped: nvcc was not found" in capsys.readouterr().out

    real_which = compile_cuda.shutil.which
    hidden = {"g++", "c++", "nm", "c++filt"}
    monkeypatch.setattr(
        compile_cuda.shutil, "which", lambda name: None if name in hidden else real_which(name)
    )
    monkeypatch.delenv("CXX", raising=False)
    assert compile_cuda.main(["--bindings", "--nvcc", fake_nvcc]) == 0
    out = capsys.readouterr().out
    assert "no host C++ compiler was found (install g++, or set CXX)" in out
    assert "nm and c++filt were not found (install binutils)" in out
    assert compile_cuda.main(["--bindings", "--nvcc", fake_nvcc, "--strict"]) == 2


def test_bindings_refuses_a_file_that_is_no_binding(tmp_path, capsys):
    kernel = _write(tmp_path, "kernel.cu", "__global__ void k() {}\n")
    with pytest.raises(SystemExit) as e:
        compile_cuda.main(["--bindings", kernel])
    assert e.value.code == 2 and "not a binding unit" in capsys.readouterr().err


# A tiny extension: a header declaring two launchers, a kernel source defining them (one with a
# planted signature drift: `double` where the header says `float`), and a binding calling both
# through c10's current stream (torch's CUDA headers, the stand-in for their generated macros
# header, the CUDA toolkit's headers) and pybind11 (Python's headers). One small binding keeps
# the compile to seconds: torch/extension.h alone takes a 2-core machine most of a minute.
TINY = {
    "tiny.h": """\
#pragma once
#include <cuda_runtime.h>
namespace tiny {
cudaError_t launch_fill(float* x, int n, cudaStream_t stream);
cudaError_t launch_scale(float* x, int n, float by, cudaStream_t stream);
}  // namespace tiny
""",
    "tiny.cu": """\
#include "tiny.h"
namespace tiny {
__global__ void fill(float* x, int n) { if (threadIdx.x < n) x[threadIdx.x] = 1.f; }
cudaError_t launch_fill(float* x, int n, cudaStream_t stream) {
  fill<<<1, 32, 0, stream>>>(x, n);
  return cudaGetLastError();
}
cudaError_t launch_scale(float* x, int n, double by, cudaStream_t stream) { return cudaSuccess; }
}  // namespace tiny
""",
    "tiny_binding.cpp": """\
#include <c10/cuda/CUDAStream.h>
#include <pybind11/pybind11.h>
#include "tiny.h"
namespace {
void run(int64_t ptr, int64_t n) {
  auto* x = reinterpret_cast<float*>(ptr);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  tiny::launch_fill(x, static_cast<int>(n), stream);
  tiny::launch_scale(x, static_cast<int>(n), 2.f, stream);
}
}  // namespace
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("run", &run); }
""",
}


@NEEDS_NVCC
@pytest.mark.slow
def test_real_compile_finds_a_launcher_whose_signature_drifted(tmp_path, capsys):
    tc, why = compile_cuda.torch_toolchain(compile_cuda.find_nvcc(), None)
    if tc is None:
        pytest.skip("; ".join(why))
    csrc = _tree(tmp_path / "proj" / "csrc", TINY)
    binding = str(csrc / "tiny_binding.cpp")
    assert compile_cuda.main(["--bindings", "--strict", "--jobs", "2", binding]) == 1
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert any(ln.startswith("ok   ") and ln.split()[1].endswith("tiny.cu") for ln in lines), out
    assert any(ln.startswith("FAIL ") and ln.split()[1] == binding for ln in lines), out
    errors = [ln.strip() for ln in lines if ln.startswith("     ")]
    assert errors[0].startswith("tiny::launch_scale(float*, int, float, CUstream_st*): called here")
    assert errors[1].endswith(
        "tiny.cu defines tiny::launch_scale(float*, int, double, CUstream_st*)"
    )
    assert len(errors) == 2, out  # launch_fill matched; c10, pybind11, Python, libc did not count
    assert "1 binding unit(s) and 1 kernel source(s)" in out and "1 failed" in out
