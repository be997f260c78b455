"""`make demo` writes a run folder and never the published results; `make publish` is the one
step that turns a run into reports/ and the README results."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import demo, publish, refresh_readme

ROOT = Path(__file__).resolve().parents[2]
CPU = demo.Hardware(gpus=0, gpu_name=None, nvcc=True, cuda_torch=False)
GPU = demo.Hardware(gpus=8, gpu_name="NVIDIA H200", nvcc=True, cuda_torch=True)
OUT_FLAGS = ("--reports-dir", "--reports-root", "--dir", "--out-dir")
READ_ONLY_FLAGS = ("--measurements-dir",)  # inputs: the published measurements are read


def _flags(argv: list[str]) -> list[tuple[str, str]]:
    """(flag, value) pairs of an argv, the make step's REPORT_ARGS included."""
    words = []
    for a in argv:
        if a.startswith("REPORT_ARGS="):
            words += a.removeprefix("REPORT_ARGS=").split()
        else:
            words.append(a)
    return [(w, words[i + 1]) for i, w in enumerate(words[:-1]) if w.startswith("--")]


@pytest.mark.parametrize("hw", [CPU, GPU], ids=["cpu-plan", "eight-h200-plan"])
def test_every_demo_step_writes_into_the_run_folder(hw):
    run = "runs/20260101T000000Z"
    steps = [s for s in demo.plan(hw, run) if s.argv and "pytest" not in s.argv]
    assert steps
    for step in steps:
        flags = _flags(step.argv)
        outs = [v for f, v in flags if f in OUT_FLAGS]
        assert outs, f"{step.title}: no output folder flag in {step.argv}"
        assert all(v == run or v.startswith(run + "/") for v in outs), step.argv
        for f, v in flags:
            if f not in READ_ONLY_FLAGS:
                assert not v.startswith("reports"), f"{step.title} writes to {v}"
        assert not any(a.endswith("README.md") for a in step.argv)
    # the entry points that render README blocks are told not to
    readme_writers = (
        "project01_cuda_kernel all",
        "project02_fsdp_scaling report",
        "apple_track/Makefile",
    )
    for step in steps:
        if any(w in " ".join(step.argv) for w in readme_writers):
            assert "--no-readme" in " ".join(step.argv), step.argv


def test_the_default_run_folder_is_timestamped_under_runs():
    import datetime

    t = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
    assert demo.new_run_dir(t) == Path("runs/20260102T030405Z")
    assert "/runs/" in (ROOT / ".gitignore").read_text().split()
    step = next(s for s in demo.plan(CPU) if s.argv)
    assert any(a.startswith("runs/") for a in step.argv)


def test_the_demo_refuses_an_empty_run_folder(capsys):
    with pytest.raises(SystemExit) as e:
        demo.main(["--run-dir", " ", "--list"])
    assert e.value.code == 2 and "--run-dir" in capsys.readouterr().err


@pytest.mark.slow
def test_the_entry_points_accept_the_flags_the_demo_passes():
    """Every module a demo step runs knows the output flags it is given (its --help names
    them): a renamed flag fails here, not after an hour of training."""
    seen = set()
    for step in demo.plan(GPU, "runs/x") + demo.plan(CPU, "runs/x"):
        if not step.argv or step.argv[0] != sys.executable or "pytest" in step.argv:
            continue
        module = step.argv[2]
        # a package's dispatcher: the subcommand's --help names its flags
        command = [module, *(a for a in step.argv[3:4] if not a.startswith("-"))]
        flags = {f for f, _ in _flags(step.argv)} - {"--gpus", "--preset"}
        if module == "project04_llm_inference":
            continue  # subcommands: its Makefile target runs the same lines
        if (tuple(command), tuple(sorted(flags))) in seen or not demo._module_exists(module):
            continue
        seen.add((tuple(command), tuple(sorted(flags))))
        r = subprocess.run(
            [sys.executable, "-m", *command, "--help"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        text = r.stdout + r.stderr
        for flag in flags:
            assert flag in text, f"{' '.join(command)} --help does not list {flag}"
    assert len(seen) >= 6


@pytest.mark.slow
def test_a_demo_step_writes_its_run_folder_and_leaves_reports_and_readmes_alone(tmp_path, capsys):
    """The cost step for real (a few seconds): its files land in the run folder, and git sees
    no change under reports/ nor in any Markdown file."""

    def status():
        r = subprocess.run(
            ["git", "status", "--porcelain", "--", "reports", "*.md"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        return r.stdout

    before = status()
    run = tmp_path / "runs" / "t"
    steps = [s for s in demo.plan(CPU, run) if "project03_capstone_infra.cost" in s.argv]
    assert len(steps) == 1
    outcomes = demo.run(steps)
    assert outcomes[0][1] == "ok", outcomes
    written = sorted(p.name for p in (run / "project03_capstone_infra").iterdir())
    assert {"cost.json", "cost.md", "cost.png"} <= set(written)
    assert status() == before
    rec = json.loads((run / "project03_capstone_infra" / "cost.json").read_text())
    assert "environment" in rec


# --- publish -----------------------------------------------------------------------------------


@pytest.fixture
def monorepo_copy(tmp_path):
    """The parts of the repository publishing reads and writes: README.md, each project's
    README and package marker, and reports/."""
    root = tmp_path / "repo"
    root.mkdir()
    shutil.copy2(ROOT / "README.md", root / "README.md")
    shutil.copytree(ROOT / "reports", root / "reports")
    for project in publish.REFRESHERS:
        (root / project).mkdir()
        (root / project / "__init__.py").write_text("")
        for name in ("README.md", "headlines.py"):  # the page and the claims it shows
            if (ROOT / project / name).is_file():
                shutil.copy2(ROOT / project / name, root / project / name)
    return root


def _cpu_run(root: Path, tokens: int) -> Path:
    """A run holding a CPU scaling record (the published one, with a planted figure)."""
    run = root / "runs" / "20260101T000000Z"
    out = run / "project02_fsdp_scaling"
    out.mkdir(parents=True)
    rec = json.loads((root / "reports/project02_fsdp_scaling/scaling_cpu.json").read_text())
    rec["results"]["runs"][0]["tokens_per_s"] = tokens
    (out / "scaling_cpu.json").write_text(json.dumps(rec))
    shutil.copy2(root / "reports/project02_fsdp_scaling/scaling_cpu_throughput.png", out)
    (out / ".scaling_cpu.json.123.tmp").write_text("half a file")  # never published
    return run


def test_publish_copies_a_run_and_refreshes_every_readme_block(monorepo_copy):
    root = monorepo_copy
    readme_before = (ROOT / "README.md").read_bytes()
    from shared.results import replace_between_markers

    top = root / "README.md"
    marker = "results:all:root"
    top.write_text(replace_between_markers(top.read_text(), marker, "stale"))
    run = _cpu_run(root, 987654)
    lines: list[str] = []
    assert publish.publish(run, root=root, log=lines.append) == 2
    assert any("copied 2 file(s) into reports/project02_fsdp_scaling/" in ln for ln in lines)
    assert not (root / "reports/project02_fsdp_scaling/.scaling_cpu.json.123.tmp").exists()
    published = json.loads((root / "reports/project02_fsdp_scaling/scaling_cpu.json").read_text())
    assert published["results"]["runs"][0]["tokens_per_s"] == 987654
    summary = (root / "reports/project02_fsdp_scaling/summary.md").read_text()
    assert "987654" in summary and "on GPUs" in summary  # the GPU records stay published
    # every README's results table is regenerated from the records: a stale one is replaced
    assert "stale" not in top.read_text()
    for readme in (root / "README.md", root / "project02_fsdp_scaling/README.md"):
        text = readme.read_text()
        assert refresh_readme.refreshed(readme, root / "reports")[0] == text
        assert "](reports/project02_fsdp_scaling/scaling_gpu.json)" in text or (
            "](../reports/project02_fsdp_scaling/scaling_gpu.json)" in text
        )
    assert (ROOT / "README.md").read_bytes() == readme_before  # the real repository untouched


def test_publish_refuses_what_is_not_a_run(monorepo_copy, tmp_path):
    root = monorepo_copy
    with pytest.raises(publish.PublishError, match="is not a folder"):
        publish.publish(tmp_path / "nowhere", root=root)
    with pytest.raises(publish.PublishError, match="expected a run folder"):
        publish.publish("", root=root)
    empty = tmp_path / "empty"
    (empty / "project02_fsdp_scaling").mkdir(parents=True)
    (empty / "project02_fsdp_scaling" / "notes.json").write_text('{"no": "environment"}')
    (empty / "elsewhere").mkdir()
    (empty / "elsewhere" / "x.json").write_text('{"environment": {}}')  # not a project here
    with pytest.raises(publish.PublishError, match="holds no result records"):
        publish.publish(empty, root=root)
    with pytest.raises(publish.PublishError, match="inside reports/"):
        publish.publish(root / "reports", root=root)


def test_publish_command_line_says_what_is_wrong_in_one_line(tmp_path, capsys):
    assert publish.main([str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("publish: RUN:") and "\n" not in err
    r = subprocess.run(
        ["make", "--no-print-directory", "publish", f"PYTHON={sys.executable}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "usage: make publish RUN=" in r.stdout
