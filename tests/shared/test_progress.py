"""shared.progress: counts with units, and progress that is a bar on a terminal and a few lines
with rate and ETA in a log."""

import io

import pytest

from shared.progress import human_count, human_seconds, progress


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0"),
        (7, "7"),
        (950, "950"),
        (1000, "1.00 K"),
        (12_345, "12.3 K"),
        (139_584, "139.6 K"),
        (999_999, "1.00 M"),
        (134_217_728, "134.2 M"),
        (1_105_712_128, "1.11 B"),
        (2.5e12, "2.50 T"),
        (-139_584, "-139.6 K"),
        (float("nan"), "n/a"),
    ],
)
def test_human_count(n, text):
    assert human_count(n) == text


def test_human_seconds():
    assert [human_seconds(s) for s in (4.23, 185, 3720, None)] == [
        "4.2 s",
        "3 min 05 s",
        "1 h 02 min",
        "?",
    ]


def test_a_log_gets_the_first_every_nth_and_the_last_item_with_rate_and_eta():
    out = io.StringIO()  # not a terminal: lines
    with progress(25, "train", every=10, stream=out) as bar:
        for i in range(25):
            bar.advance(status=f"loss {i}")
    lines = out.getvalue().splitlines()
    assert [ln.split(" steps")[0] for ln in lines] == [
        "[train] 1/25",
        "[train] 11/25",
        "[train] 21/25",
        "[train] 25/25",
    ]
    assert "ETA" in lines[0] and "step/s" in lines[0] and lines[0].endswith("| loss 0")
    assert "ETA" not in lines[-1] and lines[-1].endswith("| loss 24")


def test_a_resumed_or_rolled_back_run_moves_the_count_both_ways():
    out = io.StringIO()
    with progress(30, "train", every=10, stream=out, start=20) as bar:
        bar.set(21)
        bar.set(15, status="rolled back")  # a rollback: no line, the count goes back
        bar.set(30)
    lines = out.getvalue().splitlines()
    assert [ln.split(" steps")[0] for ln in lines] == ["[train] 21/30", "[train] 30/30"]


def test_disabled_progress_prints_nothing():
    out = io.StringIO()
    with progress(5, "rank 1", stream=out, enabled=False) as bar:
        bar.advance(5)
        bar.log("hidden")
    assert out.getvalue() == ""


def test_a_bar_on_a_terminal_and_a_nested_one_falls_back_to_lines():
    out = io.StringIO()
    with progress(3, "outer", stream=out, bar=True) as bar:
        with progress(2, "inner", stream=out, bar=True) as inner:  # rich shows one live display
            inner.advance(2)
        bar.log("a line above the bar")
        bar.advance(3, status="done")
    text = out.getvalue()
    assert "[inner] 2/2 steps" in text and "a line above the bar" in text
    assert "outer" in text and "3/3" in text and "done" in text
