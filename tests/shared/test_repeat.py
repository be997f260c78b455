"""shared.repeat on deterministic fake measurements: the interleaved order, the median and range,
ratios paired by repetition, the record fields and what a failing measurement leaves."""

from __future__ import annotations

import json

import pytest

from shared.repeat import (
    Spread,
    flat,
    interleave,
    range_text,
    ranged,
    ratio,
    read_flat,
    repetition_order,
    row_ratio,
    spread_text,
)


def _sequence(values, log, name):
    """A fake measurement returning `values` in turn and logging each call."""
    it = iter(values)

    def fn():
        log.append(name)
        return next(it)

    return fn


def test_interleave_alternates_the_order_and_keeps_every_value():
    log: list[str] = []
    fns = {
        "ours": _sequence([1.0, 5.0, 2.0, 4.0, 3.0], log, "ours"),
        "base": _sequence([10.0, 10.0, 12.0, 8.0, 11.0], log, "base"),
    }
    r = interleave(fns, 5)
    assert log == ["ours", "base", "base", "ours", "ours", "base", "base", "ours", "ours", "base"]
    assert r.order == [["ours", "base"], ["base", "ours"]] * 2 + [["ours", "base"]]
    assert r.repeats == 5 and r.errors == {}
    s = r.spread("ours")
    assert (s.median, s.min, s.max, s.n) == (3.0, 1.0, 5.0, 5)
    assert s.values == (1.0, 5.0, 2.0, 4.0, 3.0)  # repetition order, not sorted


def test_ratio_is_per_repetition_not_of_medians():
    ours = Spread.of([1.0, 2.0, 4.0])
    base = Spread.of([2.0, 2.0, 2.0])
    r = ratio(base, ours)  # speedup of ours: base_i / ours_i
    assert r.values == (2.0, 1.0, 0.5)
    assert (r.median, r.min, r.max) == (1.0, 0.5, 2.0)
    # Where the two differ: per-repetition ratios 1, 4, 0.5 (median 1), medians 4 / 1.
    a, b = Spread.of([1.0, 4.0, 4.0]), Spread.of([1.0, 1.0, 8.0])
    assert ratio(a, b).values == (1.0, 4.0, 0.5) and ratio(a, b).median == 1.0
    assert a.median / b.median == 4.0
    with pytest.raises(ValueError):
        ratio(ours, Spread.of([0.0, 1.0, 1.0]))


def test_map_takes_the_range_from_the_derived_values():
    ms = Spread.of([2.0, 4.0, 5.0])
    tok_s = ms.map(lambda v: 1000.0 / v)  # decreasing: the slowest run is the lowest rate
    assert tok_s.min == 200.0 and tok_s.max == 500.0 and tok_s.median == 250.0


def test_even_count_median_and_relative_range():
    s = Spread.of([4.0, 1.0, 3.0, 2.0])
    assert s.median == 2.5 and s.rel_range == pytest.approx(3.0 / 2.5)
    assert Spread.of([0.0, 0.0]).rel_range == 0.0


def test_flat_fields_keep_the_old_name_for_the_median_and_round_trip():
    s = Spread.of([3.0, 1.0, 2.0])
    rec = {"batch": 1, **flat("engine_ms", s)}
    assert rec["engine_ms"] == 2.0 and rec["engine_ms_min"] == 1.0 and rec["engine_ms_max"] == 3.0
    assert rec["engine_ms_reps"] == [3.0, 1.0, 2.0]
    back = json.loads(json.dumps(rec))
    assert read_flat(back, "engine_ms") == s
    assert read_flat({"engine_ms": 1.5}, "engine_ms") == Spread.of([1.5])  # one-run record
    assert read_flat({"engine_ms": None}, "engine_ms") is None
    assert read_flat({}, "engine_ms") is None
    assert flat("x", None) == {"x": None}


def test_repetition_order_is_interleaves_order():
    assert [repetition_order(["a", "b", "c"], r) for r in range(3)] == [
        ["a", "b", "c"],
        ["c", "b", "a"],
        ["a", "b", "c"],
    ]


def test_ranged_cell_is_the_plain_value_for_one_run_and_median_min_max_for_more():
    fmt = lambda v: f"{v:.1f}"  # noqa: E731
    one = {"ms": 2.0}
    assert ranged(one, "ms", fmt) == 2.0 and ranged(one, "ms", fmt, lambda v: 10 * v) == 20.0
    many = {"ms": 2.0, **flat("ms", Spread.of([3.0, 1.0, 2.0]))}
    assert ranged(many, "ms", fmt) == "2.0 (1.0–3.0)"
    assert ranged(many, "ms", fmt, lambda v: 1 / v) == "0.5 (0.3–1.0)"  # ends sorted
    assert ranged({"ms": None}, "ms", fmt) is None and ranged(None, "ms", fmt) is None
    assert ranged({"ms": 1.0, **flat("ms", Spread.of([1.0]))}, "ms", fmt) == 1.0


def test_ranged_takes_a_format_spec_and_applies_f_before_formatting_both_ends():
    many = {"ms": 0.002, **flat("ms", Spread.of([0.0031, 0.001, 0.002]))}
    assert ranged(many, "ms", ".1f", lambda v: v * 1e3) == "2.0 (1.0–3.1)"
    assert ranged(many, "ms", ",.3g", lambda v: 1e3 / v) == "5e+05 (3.23e+05–1e+06)"
    big = {"tok_s": 12345.6, **flat("tok_s", Spread.of([12345.6, 9999.4, 20000.0]))}
    assert ranged(big, "tok_s", ",.0f") == "12,346 (9,999–20,000)"
    assert ranged(big, "tok_s", str, round) == "12346 (9999–20000)"
    # one run: the number itself, unformatted (f applied), whatever fmt is
    assert ranged({"ms": 0.002}, "ms", ".1f", lambda v: v * 1e3) == 2.0
    assert ranged({}, "ms", ".1f") is None


def test_range_text_writes_median_and_ends_in_the_order_given():
    assert range_text(2.0, 1.0, 3.0, ".2f") == "2.00 (1.00–3.00)"
    assert range_text(1234.5, 1000.0, 2000.0, lambda v: f"{v:,.0f}") == "1,234 (1,000–2,000)"
    assert range_text(2.0, 3.0, 1.0, "g") == "2 (3–1)"  # not sorted here: ranged sorts


def test_spread_text_is_the_median_for_one_value_and_the_range_for_more():
    assert spread_text(Spread.of([1.234]), ".2f") == "1.23"
    assert spread_text(Spread.of([1.5, 1.0, 1.25]), ".2f") == "1.25 (1.00–1.50)"
    assert spread_text(Spread.of([2.0, 4.0]), lambda v: f"{v:.1f}x") == "3.0x (2.0x–4.0x)"
    assert spread_text(None, ".2f") == "n/a" and spread_text(None, ".2f", missing="-") == "-"


def test_row_ratio_pairs_repetitions_and_is_none_without_a_figure_or_for_a_zero():
    ours = {"t": 2.0, **flat("t", Spread.of([2.0, 3.0, 6.0]))}
    base = {"t": 2.0, **flat("t", Spread.of([1.0, 3.0, 2.0]))}
    assert row_ratio(ours, base, "t").values == (2.0, 1.0, 3.0)
    assert row_ratio({"t": 3.0}, {"t": 2.0}, "t").values == (1.5,)  # records of one run
    assert spread_text(row_ratio(ours, base, "t"), ".2f") == "2.00 (1.00–3.00)"
    assert row_ratio(ours, None, "t") is None and row_ratio(None, base, "t") is None
    assert row_ratio(ours, {"t": None}, "t") is None
    assert row_ratio(ours, {"t": 0.0}, "t") is None


def test_a_failing_measurement_is_recorded_and_not_called_again():
    log: list[str] = []
    calls = {"n": 0}

    def flaky():
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("no kernel for this shape")
        return 1.0

    fns = {"ours": _sequence([1.0, 2.0, 3.0, 4.0], log, "ours"), "sdpa": flaky}
    r = interleave(fns, 4, catch=(RuntimeError,))
    assert calls["n"] == 2  # failed in repetition 2, not called in 3 and 4
    assert r.errors == {"sdpa": "repetition 2: RuntimeError: no kernel for this shape"}
    assert r.spread("ours").n == 4 and r.spread("sdpa").values == (1.0,)
    assert r.ratio("sdpa", "ours").values == (1.0,)  # only the repetition both sides have
    assert r.order[2] == ["ours"]


def test_uncaught_errors_propagate_and_none_is_no_value():
    def boom():
        raise KeyError("bug")

    with pytest.raises(KeyError):
        interleave({"a": boom}, 2, catch=(RuntimeError,))
    r = interleave({"a": lambda: None, "b": lambda: 2.0}, 3)
    assert "no finite value" in r.errors["a"] and r.spread("a") is None
    assert r.ratio("a", "b") is None and r.spread("b").n == 3
    assert "a" not in r.to_dict()["spreads"] and r.to_dict()["repeats"] == 3


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_repeat_counts_are_refused(bad):
    with pytest.raises(ValueError, match="repeats"):
        interleave({"a": lambda: 1.0}, bad)


def test_spread_refuses_empty_and_non_finite():
    with pytest.raises(ValueError):
        Spread.of([])
    with pytest.raises(ValueError):
        Spread.of([1.0, float("nan")])


def test_merge_runs_medians_largest_and_first_run():
    from shared.repeat import merge_runs

    runs = [
        {"tps": 3.0, "mem": 1.0, "loss": 9.0, "only_some": 1.0},
        {"tps": 1.0, "mem": 5.0, "loss": 8.0},
        {"tps": 2.0, "mem": 2.0, "loss": 7.0},
    ]
    out = merge_runs(runs, ("tps", "only_some"), largest=("mem",))
    assert out["tps"] == 2.0 and (out["tps_min"], out["tps_max"]) == (1.0, 3.0)
    assert out["tps_reps"] == [3.0, 1.0, 2.0]
    assert out["mem"] == 5.0 and out["loss"] == 9.0  # the largest; the first run's
    assert out["only_some"] == 1.0 and "only_some_min" not in out  # not every run has it
    one = merge_runs(runs[:1], ("tps",), largest=("mem",))
    assert one == runs[0] and one is not runs[0]
