"""`serve` takes the command line vLLM users type (`serve MODEL --max-model-len ...`) beside
the nested `--engine.*` form; parsed only (no engine is built)."""

from __future__ import annotations

import pytest

from project04_llm_inference.__main__ import PROG, ServeConfig, commands, main, preprocess
from shared.cli import parse_subcommand


@pytest.fixture(scope="module")
def table():
    return commands()


def _parse(table, argv):
    name, cfg = parse_subcommand(table, prog=PROG, description="", argv=preprocess(argv, table))
    return cfg


def _err(argv, capsys) -> tuple[int, str]:
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    return rc, capsys.readouterr().err.strip()


def test_vllm_flags_set_the_engine_and_the_server(table):
    cfg = _parse(
        table,
        [
            "serve",
            "some/model-dir",
            "--served-model-name",
            "code",
            "--max-model-len",
            "512",
            "--gpu-memory-utilization=0.5",
            "--max_num_seqs",
            "8",
            "--dtype",
            "float32",
            "--seed",
            "7",
            "--kv-cache-dtype",
            "fp8",
            "--api-key",
            "secret",
            "--host",
            "0.0.0.0",
            "--port",
            "0",
        ],
    )
    assert isinstance(cfg, ServeConfig)
    e = cfg.engine
    assert (e.model, e.max_model_len, e.gpu_memory_utilization) == ("some/model-dir", 512, 0.5)
    assert (e.max_num_seqs, e.dtype, e.seed, e.kv_cache_dtype) == (8, "float32", 7, "fp8")
    assert (cfg.served_model_name, cfg.api_key, cfg.host, cfg.port) == (
        "code",
        "secret",
        "0.0.0.0",
        0,
    )


def test_the_nested_form_still_parses(table):
    cfg = _parse(
        table,
        ["serve", "--engine.load-format", "dummy", "--engine.dummy-shape", "tiny",
         "--engine.max-model-len", "64"],
    )  # fmt: skip
    assert (cfg.engine.load_format, cfg.engine.dummy_shape, cfg.engine.max_model_len) == (
        "dummy", "tiny", 64,
    )  # fmt: skip


def test_unprefixed_dummy_weights(table):
    cfg = _parse(table, ["serve", "--load-format", "dummy", "--dummy-shape", "tiny"])
    assert cfg.engine.load_format == "dummy" and cfg.engine.model is None


def test_serve_without_a_model_names_the_real_flags(capsys):
    rc, err = _err(["serve"], capsys)
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "serve MODEL" in err and "--load-format dummy" in err and "--engine" not in err, err


def test_a_bad_vllm_flag_value_names_the_field(capsys):
    rc, err = _err(["serve", "--load-format", "dummy", "--max-model-len", "0"], capsys)
    assert rc == 2 and "max_model_len" in err and len(err.splitlines()) == 1, err


def test_an_empty_api_key_is_refused(capsys):
    rc, err = _err(["serve", "--load-format", "dummy", "--api-key", " "], capsys)
    assert rc == 2 and "api_key" in err, err


def test_an_unknown_command_lists_the_commands(capsys, table):
    rc, err = _err(["srve", "x"], capsys)
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "'srve'" in err and all(name in err for name in table), err
