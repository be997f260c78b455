"""The speculative-step profiler (`bench.spec_profile`) on the CPU, tiny random-weight pair: it
builds every engine, times and profiles its steps and writes the JSON record and traces."""

from __future__ import annotations

import json

import pytest

from project04_llm_inference.bench import spec_profile as sp


def test_spec_profile_runs_on_the_cpu_and_writes_json(tmp_path, capsys):
    cfg = sp.SpecProfileConfig(
        out=str(tmp_path / "rec" / "spec_profile.json"),
        shape="tiny",
        device="cpu",
        ks=(2,),
        paths=("default", "fused", "rounds"),
        fused_rounds=2,
        multi_step=2,
        prompt_tokens=8,
        warmup_steps=1,
        steps=3,
        profile_steps=1,
    )
    sp.run(cfg)
    rec = json.loads((tmp_path / "rec" / "spec_profile.json").read_text())
    rows = {r["engine"]: r for r in rec["engines"]}
    assert list(rows) == [
        "plain",
        "multi-step-2",
        "draft-k2-default",
        "draft-k2-fused",
        "draft-k2-rounds2",
    ]
    for r in rows.values():
        assert r["wall_ms_per_call_median"] > 0 and r["tokens"] >= 3
        assert (tmp_path / "rec" / r["trace"]).is_file()
        assert "step" in r["phases"] and "profile" in r
    assert rows["multi-step-2"]["tokens_per_call"] == 2
    assert "draft_propose" in rows["draft-k2-default"]["phases"]
    assert rows["draft-k2-fused"]["fused_steps"] == 3  # every timed step took the fused path
    assert rows["draft-k2-fused"]["fused_round_programs"] == 0
    assert "fused_run" in rows["draft-k2-fused"]["phases"]
    # every timed step of the rounds engine ran a program of 2 rounds: up to 2 x (k + 1) tokens
    rounds = rows["draft-k2-rounds2"]
    assert rounds["fused_steps"] == rounds["fused_round_programs"] == 3
    assert rounds["tokens"] >= 2 * 3 and rounds["overrides"]["spec_fused_rounds"] == 2
    out = capsys.readouterr().out
    assert "draft-k2-fused" in out and "ms/token" in out


def test_spec_profile_help_and_bad_config():
    with pytest.raises(SystemExit) as e:
        sp.main(["--help"])
    assert e.value.code == 0
    with pytest.raises(ValueError, match="ks"):
        sp.SpecProfileConfig(ks=(0,))
    with pytest.raises(ValueError, match="fused_rounds"):
        sp.SpecProfileConfig(paths=("rounds",), fused_rounds=1)


def test_random_model_folders_load(tmp_path):
    from project04_llm_inference.model.loader import read_config

    folder = sp.write_random_model(tmp_path / "m", sp.PAIRS["tiny"][1], seed=3)
    cfg = read_config(folder)
    assert cfg["num_hidden_layers"] == 1 and (folder / "model.safetensors").is_file()
