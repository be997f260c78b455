"""The repository's own rules: layering, the README refresh, the demo plan (forks:
test_fork.py; the demo's run folder and publishing: test_demo_publish.py)."""

import ast
import re
import subprocess
from pathlib import Path

import pytest

from scripts import demo, refresh_readme
from scripts.fork_project import PROJECTS, cross_project_imports, imported_top_level_names

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("project", PROJECTS)
def test_no_project_imports_another(project):
    assert cross_project_imports(project) == []


def test_shared_imports_no_project():
    for py in (ROOT / "shared").rglob("*.py"):
        assert not imported_top_level_names(py) & set(PROJECTS), py


def test_the_import_check_catches_a_cross_import(tmp_path):
    pkg = tmp_path / "project02_fsdp_scaling"
    pkg.mkdir()
    (pkg / "bad.py").write_text("from project01_cuda_kernel import matmul\nimport shared\n")
    (tmp_path / "tests").mkdir()
    problems = cross_project_imports("project02_fsdp_scaling", root=tmp_path)
    assert problems == ["project02_fsdp_scaling/bad.py imports project01_cuda_kernel"]


def test_readme_refresh(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(
        "x\n<!-- results:p1 -->\nold\n<!-- /results:p1 -->\n"
        "<!-- results:p2 -->\nold\n<!-- /results:p2 -->\n"
    )
    (tmp_path / "reports" / "p1").mkdir(parents=True)
    (tmp_path / "reports" / "p1" / "summary.md").write_text("| a |\n| --- |\n| 1 |\n")
    assert refresh_readme.refresh(readme, tmp_path / "reports") == ["p1"]
    text = readme.read_text()
    assert "| a |\n| --- |\n| 1 |" in text and "old" not in text
    assert "No results recorded yet: `reports/p2/summary.md`" in text


def test_every_readme_holds_the_current_results():
    # each results block is what `make readme` renders from the committed records now
    readmes = refresh_readme.readmes(ROOT)
    assert ROOT / "README.md" in readmes and len(readmes) == 6
    for readme in readmes:
        text, filled = refresh_readme.refreshed(readme, ROOT / "reports")
        assert filled, readme
        assert text == readme.read_text(), f"{readme}: run `make readme`"


def test_the_root_readme_gives_the_two_commands_first():
    text = (ROOT / "README.md").read_text()
    first_block = text.split("```bash", 1)[1].split("```", 1)[0]
    assert "make test" in first_block and "make demo" in first_block
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_demo_plan_follows_the_hardware():
    cpu = demo.plan(demo.Hardware(gpus=0, gpu_name=None, nvcc=False, cuda_torch=False))
    p01 = [s for s in cpu if s.project == "project01"]
    assert all(s.skip_reason for s in p01)
    assert any("nvcc not found" in s.skip_reason for s in p01)
    p02 = next(s for s in cpu if s.project == "project02")
    assert "--gpus" not in p02.argv  # sizes itself: tiny over gloo
    gpu = demo.plan(demo.Hardware(gpus=4, gpu_name="NVIDIA H200", nvcc=True, cuda_torch=True))
    assert all(s.skip_reason is None for s in gpu if "DeepSpeed" not in s.title)
    p02 = next(s for s in gpu if s.project == "project02")
    assert p02.argv[-2:] == ["--gpus", "1,2,4"]


def test_make_help_lists_the_targets():
    r = subprocess.run(["make", "help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    for target in (
        "setup",
        "test",
        "gpu-test",
        "demo",
        "publish",
        "project01",
        "project02",
        "project03",
        "apple",
        "lint",
        "fork",
    ):
        assert f"make {target} " in r.stdout, target


def _gpu_marked(node) -> bool:
    """Whether a decorator list or a pytestmark value names pytest.mark.gpu."""
    return any(
        isinstance(n, ast.Attribute) and n.attr == "gpu" and ast.unparse(n) == "pytest.mark.gpu"
        for n in ast.walk(node)
    )


def gpu_only(path: Path) -> bool | None:
    """True when every test of a test module is in the GPU tier (a module-level pytestmark
    naming pytest.mark.gpu, or the mark on every test function), False when none or some are,
    None when it defines no test."""
    tree = ast.parse(path.read_text())
    for stmt in tree.body:
        if (
            isinstance(stmt, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in stmt.targets)
            and _gpu_marked(stmt.value)
        ):
            return True
    tests = [
        s
        for s in tree.body
        if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef) and s.name.startswith("test_")
    ]
    if not tests:
        return None
    return all(any(_gpu_marked(d) for d in t.decorator_list) for t in tests)


def test_test_files_are_named_by_what_they_test_and_gpu_files_end_in_gpu():
    """CONTRIBUTING's rule: tests/<package>/test_<module or behaviour>.py, lower case; a file
    whose tests are all in the GPU tier ends in _gpu.py, and only such a file."""
    wrong = []
    for path in sorted((ROOT / "tests").glob("*/test_*.py")):
        rel = path.relative_to(ROOT)
        if not re.fullmatch(r"test_[a-z0-9_]+\.py", path.name):
            wrong.append(f"{rel}: not test_<lower_case_words>.py")
        only = gpu_only(path)
        if only and not path.stem.endswith("_gpu"):
            wrong.append(f"{rel}: every test is GPU-tier, so its name ends in _gpu")
        if path.stem.endswith("_gpu") and only is False:
            wrong.append(f"{rel}: named _gpu but holds CPU-tier tests")
    assert wrong == []


def test_the_naming_rule_sees_module_and_function_marks(tmp_path):
    mod = tmp_path / "test_x_gpu.py"
    mod.write_text(
        "import pytest\npytestmark = [pytest.mark.gpu, pytest.mark.skipif(True, reason='')]\n"
    )
    assert gpu_only(mod) is True
    funcs = tmp_path / "test_y.py"
    funcs.write_text(
        "import pytest\n@pytest.mark.gpu\ndef test_a(): pass\n@pytest.mark.gpu\ndef test_b(): pass\n"
    )
    assert gpu_only(funcs) is True
    funcs.write_text("import pytest\n@pytest.mark.gpu\ndef test_a(): pass\ndef test_b(): pass\n")
    assert gpu_only(funcs) is False
    funcs.write_text("X = 1\n")
    assert gpu_only(funcs) is None


# Modules that may name the published reports/ folder: the report renderers (regeneration from
# JSON), scaling's README refresh (only when told to write there) and the cost model's measured
# inputs. An experiment writes through shared.results.output_root: runs/<UTC time>/ by default.
REPORTS_DIR_USERS = {
    "apple_track/report.py",
    "project01_cuda_kernel/report/__init__.py",
    "project02_fsdp_scaling/report.py",
    "project02_fsdp_scaling/scaling.py",
    "project03_capstone_infra/cost/plan.py",
    "project03_capstone_infra/report/render.py",
    "project03_capstone_infra/report/summary.py",
    "shared/results.py",
}


def test_only_report_renderers_name_the_published_reports_folder():
    users = {
        str(p.relative_to(ROOT))
        for top in (*PROJECTS, "shared")
        if (ROOT / top).is_dir()
        for p in (ROOT / top).rglob("*.py")
        if "REPORTS_DIR" in p.read_text()
    }
    assert users <= REPORTS_DIR_USERS, sorted(users - REPORTS_DIR_USERS)


def test_experiments_write_to_a_new_run_folder_unless_told(tmp_path):
    from shared.results import REPORTS_DIR, RUNS_DIR, output_root

    assert output_root(str(tmp_path)) == tmp_path
    for unset in (None, ""):
        d = output_root(unset)
        assert d.parent == RUNS_DIR and re.fullmatch(r"\d{8}-\d{6}", d.name)
        assert REPORTS_DIR not in (d, *d.parents)
