"""shared.cli: one `error:` line naming the argument, exit code 2, never a traceback."""

import argparse
from dataclasses import dataclass

import pytest

from shared import cli


def test_main_guard_turns_config_errors_into_one_line(capsys):
    @cli.main_guard
    def main(argv=None):
        raise ValueError("TrainConfig.lr must be a finite number,\n  got inf")

    with pytest.raises(SystemExit) as e:
        main([])
    assert e.value.code == 2
    assert capsys.readouterr().err == "error: TrainConfig.lr must be a finite number, got inf\n"


def test_main_guard_leaves_other_errors_alone():
    @cli.main_guard
    def main(argv=None):
        raise RuntimeError("a bug: keep its traceback")

    with pytest.raises(RuntimeError):
        main([])


def test_argument_parser_errors_are_one_line(capsys):
    p = cli.ArgumentParser(prog="prog")
    p.add_argument("--lr", type=cli.positive_float)
    p.add_argument("--steps", type=cli.nonneg_int)
    p.add_argument("--out", type=cli.nonempty_path)
    for argv, expected in (
        (["--lr", "inf"], "argument --lr: expected a finite number > 0, got 'inf'"),
        (["--lr", "nan"], "argument --lr"),
        (["--steps", "-1"], "argument --steps"),
        (["--out", ""], "argument --out: expected a non-empty value"),
    ):
        with pytest.raises(SystemExit) as e:
            p.parse_args(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"error: {expected}"), err


@pytest.mark.parametrize("kind", [cli.finite_float, cli.positive_float, cli.nonneg_float])
def test_float_types_refuse_non_finite_values(kind):
    for text in ("inf", "-inf", "nan", "abc"):
        with pytest.raises(argparse.ArgumentTypeError):
            kind(text)
    assert kind("2.5") == 2.5


UNICODE_BOX = """\
╭─ Value error ─────────────────────────────────────────────────╮
│ Error parsing --global-batch: invalid literal for int() with  │
│ base 10: 'abc'                                                │
│ ───────────────────────────────────────────────────────────── │
│ Argument helptext:                                            │
│     --global-batch INT                                        │
╰───────────────────────────────────────────────────────────────╯
"""
PLAIN_BOX = """\
 Value error
 ---------------------------------------------------------------
  Error parsing BenchConfig: warmup_ms must be a finite number > 0, got inf
  ---------------------------------------------------------------
  For full helptext, see prog --help
"""


def test_tyro_error_boxes_fold_into_their_message():
    assert cli._fold_box(UNICODE_BOX) == (
        "Error parsing --global-batch: invalid literal for int() with base 10: 'abc'"
    )
    assert cli._fold_box(PLAIN_BOX) == (
        "Error parsing BenchConfig: warmup_ms must be a finite number > 0, got inf"
    )


def test_parse_dataclass_answers_in_one_line(capsys):
    from dataclasses import dataclass

    @dataclass
    class Config:
        steps: int = 1

    assert cli.parse_dataclass(Config, ["--steps", "3"]).steps == 3
    with pytest.raises(SystemExit) as e:
        cli.parse_dataclass(Config, ["--steps", "three"], prog="prog")
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "--steps" in err, err


def test_paths_are_checked_without_creating_anything(tmp_path):
    (tmp_path / "a_file").write_text("x")
    assert cli.writable_dir("--out", tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    assert not (tmp_path / "new").exists()
    with pytest.raises(ValueError, match="--out: cannot create .* is not a folder"):
        cli.writable_dir("--out", tmp_path / "a_file" / "sub")
    with pytest.raises(ValueError, match="--out: .* exists and is not a folder"):
        cli.writable_dir("--out", tmp_path / "a_file")
    with pytest.raises(ValueError, match="--out: expected a path, got an empty string"):
        cli.writable_dir("--out", "")
    with pytest.raises(ValueError, match="--save: .* is a folder"):
        cli.writable_file("--save", tmp_path)
    with pytest.raises(FileNotFoundError, match="--trace: .* does not exist"):
        cli.input_file("--trace", tmp_path / "none.json")
    with pytest.raises(FileNotFoundError, match="--dir: .* is a file"):
        cli.input_dir("--dir", tmp_path / "a_file")


def test_environment_variables_are_named(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="environment variable WORLD_SIZE='two'"):
        cli.env_int("WORLD_SIZE", 1)
    monkeypatch.setenv("WORLD_SIZE", "0")
    with pytest.raises(ValueError, match="WORLD_SIZE='0' must be >= 1"):
        cli.env_int("WORLD_SIZE", 1, minimum=1)
    monkeypatch.setenv("T0", "inf")
    with pytest.raises(ValueError, match="T0='inf' must be finite"):
        cli.env_float("T0")
    monkeypatch.delenv("T0")
    assert cli.env_float("T0", 1.5) == 1.5


@dataclass
class A:
    n: int = 1


@dataclass
class B:
    x: float = 0.5


def test_parse_subcommand_returns_the_command_and_its_config(capsys):
    from shared.cli import parse_subcommand

    table = {"a": (A, print), "b-cmd": (B, print)}
    assert parse_subcommand(table, prog="p", description="d", argv=["b-cmd", "--x", "3"]) == (
        "b-cmd",
        B(x=3.0),
    )
    assert parse_subcommand(table, prog="p", description="d", argv=["a"]) == ("a", A())
    with pytest.raises(SystemExit) as e:
        parse_subcommand(table, prog="p", description="d", argv=["c"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:")


def test_run_subcommand_runs_the_chosen_command_and_returns_its_status():
    from shared.cli import run_subcommand

    ran = []
    table = {"a": (A, lambda cfg: ran.append(cfg) or cfg.n), "b": (B, lambda cfg: "record.json")}
    assert run_subcommand(table, prog="p", description="d", argv=["a", "--n", "3"]) == 3
    assert ran == [A(n=3)]
    assert run_subcommand(table, prog="p", description="d", argv=["b"]) == 0  # not an int: 0
    seen = []

    def runner(name, fn, cfg):
        seen.append((name, cfg))
        return 7

    assert run_subcommand(table, prog="p", description="d", argv=["b"], runner=runner) == 7
    assert seen == [("b", B())]
