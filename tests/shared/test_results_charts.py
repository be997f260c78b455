import json
import os

import pytest

from shared import charts
from shared.results import (
    atomic_write_json,
    atomic_write_text,
    environment,
    environment_line,
    load_result,
    markdown_table,
    replace_between_markers,
    save_result,
)


def test_environment_has_every_field():
    env = environment()
    for key in (
        "gpu",
        "driver",
        "cuda",
        "torch",
        "python",
        "host",
        "date",
        "git_commit",
        "git_dirty",
    ):
        assert key in env
    assert env["torch"] and env["python"] and env["date"]
    assert "torch" in environment_line(env)


def test_git_commit_override_wins(monkeypatch):
    from shared.results import git_commit

    monkeypatch.setenv("GIT_COMMIT", "abc1234")
    assert git_commit() == "abc1234"  # a copied tree may carry stale git metadata
    monkeypatch.delenv("GIT_COMMIT")
    head = git_commit()
    assert head is None or (len(head) == 40 and head != "abc1234")


def test_save_and_load_result(tmp_path):
    path = save_result(
        "demo",
        "run1",
        [{"x": 1.5}],
        baseline={"cublas_tflops": 700.0},
        config={"n": 3},
        reports_dir=tmp_path,
    )
    assert path == tmp_path / "demo" / "run1.json"
    rec = load_result(path)
    assert rec["results"] == [{"x": 1.5}]
    assert rec["baseline"] == {"cublas_tflops": 700.0}
    assert rec["config"] == {"n": 3}
    assert rec["environment"]["torch"]
    with pytest.raises(ValueError, match="plain file stem"):
        save_result("demo", "../escape", {}, reports_dir=tmp_path)


def test_load_result_rejects_bad_files(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_result(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_result(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(ValueError, match="not a result record"):
        load_result(tmp_path / "other.json")


def test_atomic_write_leaves_no_temporary_files_and_replaces(tmp_path):
    p = tmp_path / "a" / "f.json"
    atomic_write_json(p, {"v": float("nan"), "w": [1, 2]})
    assert json.loads(p.read_text()) == {"v": None, "w": [1, 2]}  # NaN is not JSON
    atomic_write_text(p, "second")
    assert p.read_text() == "second"
    assert os.listdir(p.parent) == ["f.json"]


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path):
    p = tmp_path / "f.json"
    atomic_write_text(p, "old")

    class Boom:
        def to_dict(self):
            raise RuntimeError("serialisation failed")

    with pytest.raises(RuntimeError):
        atomic_write_json(p, {"x": Boom()})
    assert p.read_text() == "old"
    assert os.listdir(tmp_path) == ["f.json"]


def test_markdown_table_by_hand():
    md = markdown_table(
        [{"kernel": "naive", "tflops": 1.234, "ok": True}, {"kernel": "a|b", "tflops": None}],
        ["kernel", "tflops", "ok"],
        headers=["kernel", "TFLOP/s", "checked"],
    )
    assert md.splitlines() == [
        "| kernel | TFLOP/s | checked |",
        "| --- | ---: | --- |",
        "| naive | 1.23 | yes |",
        "| a\\|b | n/a | n/a |",
    ]


def test_replace_between_markers():
    text = "a\n<!-- t -->\nold\n<!-- /t -->\nb\n"
    assert replace_between_markers(text, "t", "new") == "a\n<!-- t -->\nnew\n<!-- /t -->\nb\n"
    with pytest.raises(ValueError, match="markers"):
        replace_between_markers("nothing", "t", "new")


def _is_png(path):
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 2000


def test_charts_write_pngs(tmp_path):
    paths = [
        charts.bar_chart(
            tmp_path / "bar.png",
            ["a", "b"],
            [1.0, 2.0],
            title="t",
            ylabel="TFLOP/s",
            baseline=1.5,
            baseline_label="cuBLAS",
        ),
        charts.grouped_bar_chart(
            tmp_path / "g.png",
            ["512", "1k"],
            {"ours": [1, 2], "sdpa": [2, None]},
            title="t",
            ylabel="TFLOP/s",
        ),
        charts.line_chart(
            tmp_path / "l.png",
            {"fsdp": ([1, 2, 4], [1, 1.9, 3.7])},
            title="t",
            xlabel="GPUs",
            ylabel="tokens/s",
            ideal=([1, 4], [1, 4]),
            logx=True,
        ),
        charts.roofline_chart(
            tmp_path / "r.png",
            [("k", 100.0, 2e14)],
            peak_flops=989e12,
            peak_bandwidth=4.8e12,
            title="roofline",
        ),
        charts.stacked_bar_chart(
            tmp_path / "s.png",
            ["1", "2"],
            {"compute": [1, 1], "comm": [0, 0.2]},
            title="t",
            ylabel="ms",
            footnote="H200",
        ),
    ]
    for p in paths:
        assert _is_png(p)
    with pytest.raises(ValueError, match="lengths differ"):
        charts.bar_chart(tmp_path / "x.png", ["a"], [1, 2], title="t", ylabel="y")


def test_atomic_writes_keep_the_umask_mode(tmp_path):
    """A result file gets the mode any new file gets (0o666 less the umask), not mkstemp's 0o600."""
    import os

    from shared.results import atomic_write_text

    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.json", "{}")
        os.umask(0o077)
        atomic_write_text(tmp_path / "b.json", "{}")
    finally:
        os.umask(old)
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "b.json").stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json"]  # no temporaries


def test_cpu_model_reads_cpuinfo_and_falls_back(tmp_path, monkeypatch):
    from shared import results

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: X\nmodel name\t: Example CPU @ 2.0GHz\n")
    assert results.cpu_model(str(info)) == "Example CPU @ 2.0GHz"
    monkeypatch.setattr(results.platform, "processor", lambda: "fallback-cpu")
    assert results.cpu_model(str(tmp_path / "missing")) == "fallback-cpu"
    monkeypatch.setattr(results.platform, "processor", lambda: "")
    assert results.cpu_model(str(tmp_path / "missing")) is None
    assert "cpu_model" in results.environment()
