"""Helpers the projects' tests share (imported by tests only; forks carry it with them).

The command-line contract of every entry point (`shared.cli`): a bad argument answers with one
`error:` line naming it, exit code 2, no traceback. `run_entry` calls an entry point the way a
shell would and `assert_one_line_error` checks that contract."""

from __future__ import annotations

from collections.abc import Callable


def run_entry(main: Callable[[list[str]], object], argv: list[str], capsys) -> tuple[object, str]:
    """Call `main(argv)`; return (its exit code, what it wrote to stderr)."""
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def assert_one_line_error(code: object, err: str, names: str) -> None:
    """Exit code 2 and exactly one `error:` line on stderr that contains `names`."""
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ") and names in lines[0], lines[0]
