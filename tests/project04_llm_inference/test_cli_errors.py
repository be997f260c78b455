"""`python -m project04_llm_inference` answers bad command lines in one line, never a traceback,
and never names tyro's internals."""

from __future__ import annotations

import pytest
import torch

from project04_llm_inference.__main__ import main


def _run(argv, capsys) -> tuple[int, str]:
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err.strip()
    return rc, err


DUMMY = ["--engine.load-format", "dummy", "--engine.dummy-shape", "tiny"]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["serve", *DUMMY, "--engine.block-size", "3"], "block_size"),
        (["serve", *DUMMY, "--engine.dtype", "int8"], "int8"),
        (["generate", *DUMMY, "--engine.cpu-kv-cache-gib", "1e9", "--prompt-ids", "1"], "memory"),
        (["generate", *DUMMY, "--sampling.top-k", "-3", "--prompt-ids", "1"], "top_k"),
        (["generate", *DUMMY, "--sampling.temperature", "nan", "--prompt-ids", "1"], "temperature"),
        (["serve", *DUMMY, "--max-choices", "0"], "max_choices"),
        (["serve", *DUMMY, "--read-timeout-s", "inf"], "read_timeout_s"),
        (["serve", *DUMMY, "--port", "99999"], "port"),
        (["serve", *DUMMY, "--tensor-parallel-size", "0"], "tensor_parallel_size"),
        (["serve", *DUMMY, "--quantization", "int4"], "int4"),
        (["serve", *DUMMY, "--kv-cache-dtype", "fp8_e5m2"], "fp8_e5m2"),
        (
            ["generate", *DUMMY, "--engine.tensor-parallel-size", "4", "--prompt-ids", "1"],
            "larger than the model's 2 KV heads",
        ),
        (["fp8-accuracy", "--window", "1"], "window"),
    ],
)
def test_bad_arguments_are_one_line(argv, words, capsys):
    rc, err = _run(argv, capsys)
    assert rc == 2, err
    assert err.startswith("error:") and len(err.splitlines()) == 1, err
    assert words in err and "__tyro" not in err and "Traceback" not in err, err


def test_spec_train_into_a_file_is_one_line(tmp_path, capsys):
    f = tmp_path / "a-file"
    f.write_text("")
    rc, err = _run(["spec-train", "--models-dir", str(f)], capsys)
    assert rc == 2 and "models_dir" in err and "not a folder" in err, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer on a machine without GPU")
@pytest.mark.parametrize("command", ["decode-kernel", "gemv-kernel", "prefill-kernel"])
def test_kernel_benchmarks_without_a_gpu_are_one_line(command, tmp_path, capsys):
    """Skipped with exit code 0, so that `make project04` goes on past them."""
    try:
        rc = main([command, "--reports-dir", str(tmp_path)])
    except SystemExit as e:
        rc = e.code
    out = capsys.readouterr()
    assert rc == 0 and out.out.startswith(f"{command}: needs a CUDA GPU"), out
    assert len(out.out.strip().splitlines()) == 1 and not out.err, out
    assert not any(tmp_path.iterdir())  # no record
