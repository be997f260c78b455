"""The documentation's own rules: every README is a front page read in five minutes, its results
table is what the records say now, no code quotes a measured figure, and every relative Markdown
link resolves, in this repository and in each project's fork (through the fork's README generator,
not by writing a fork)."""

from __future__ import annotations

import posixpath
import re
import subprocess
from pathlib import Path

import pytest

from scripts import fork_project, refresh_readme
from scripts.fork_project import PROJECTS

ROOT = Path(__file__).resolve().parents[2]
ROOT_README = ROOT / "README.md"
PROJECT_READMES = [ROOT / p / "README.md" for p in PROJECTS]
WORD_LIMIT = {ROOT_README: 1200, **dict.fromkeys(PROJECT_READMES, 2000)}
PARAGRAPH_LIMIT = 120  # words
MAX_SECTIONS_WITHOUT_CONTENTS = 5

# --- reading Markdown ----------------------------------------------------------------------------


def prose(text: str) -> str:
    """The text without HTML comments (the generated blocks' markers)."""
    return re.sub(r"<!--.*?-->", "", text, flags=re.S)


def word_count(text: str) -> int:
    """Words as a reader counts them: tokens holding a letter or digit (a table's pipes and
    rules are not words; its cells are)."""
    return sum(1 for w in prose(text).split() if re.search(r"\w", w))


def paragraphs(text: str) -> list[str]:
    """Prose paragraphs: runs of lines between blank lines, each list item its own; fenced code,
    tables and headings left out."""
    out, current, fenced = [], [], False

    def flush():
        if current:
            out.append(" ".join(current))
            current.clear()

    for line in prose(text).splitlines():
        s = line.strip()
        if s.startswith(("```", "~~~")):
            flush()
            fenced = not fenced
            continue
        if fenced or not s or s.startswith(("|", "#", "![")):
            flush()
            continue
        if re.match(r"([-*]|\d+\.) ", s):
            flush()
        current.append(s)
    flush()
    return out


def sections(text: str) -> list[str]:
    return re.findall(r"(?m)^## (.+)$", prose(text))


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    h = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return h.replace(" ", "-")


def relative_links(text: str) -> list[str]:
    """Relative link targets outside code blocks (the fork tool's own reading of links)."""
    out, fenced = [], False
    for line in text.splitlines():
        if fork_project._FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            out += [
                m.group(3)
                for m in fork_project._LINK.finditer(line)
                if not fork_project._is_external(m.group(3))
            ]
    return out


def markdown_files() -> list[Path]:
    """Every Markdown file git tracks or would track (untracked but not ignored)."""
    r = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return sorted({ROOT / f for f in r.stdout.split() if (ROOT / f).is_file()})


# --- front pages ---------------------------------------------------------------------------------


@pytest.mark.parametrize("readme", [ROOT_README, *PROJECT_READMES], ids=lambda p: p.parent.name)
def test_a_readme_is_read_in_five_minutes(readme):
    text = readme.read_text()
    assert word_count(text) <= WORD_LIMIT[readme], word_count(text)
    long = [p[:80] for p in paragraphs(text) if word_count(p) > PARAGRAPH_LIMIT]
    assert long == []
    heads = sections(text)
    if len(heads) > MAX_SECTIONS_WITHOUT_CONTENTS:  # a table of contents links every section
        linked = {t[1:] for t in relative_links(text) if t.startswith("#")}
        linked |= set(re.findall(r"\]\(#([^)]+)\)", text))
        missing = [h for h in heads if anchor(h) not in linked and h != "Contents"]
        assert missing == [], "no table of contents entry for these sections"


@pytest.mark.parametrize("readme", PROJECT_READMES, ids=lambda p: p.parent.name)
def test_a_project_readme_has_a_picture_a_quick_start_and_its_results_table(readme):
    text = readme.read_text()
    first_screen = text[: text.index("## Results")]
    assert re.search(r"!\[[^\]]*\]\([^)]+\.png\)", first_screen), "a chart before the results"
    assert "```" in first_screen, "how to run it, before the results"
    name = readme.parent.name
    assert f"<!-- results:{name} -->" in text
    assert (readme.parent / "NOTES.md").is_file()


def test_the_design_logs_are_dated_and_name_their_records():
    for project in PROJECTS:
        notes = (ROOT / project / "NOTES.md").read_text()
        assert re.search(r"\*\*20\d\d-\d\d-\d\d", notes), project  # dated entries
        assert "](../reports/" in notes, project  # each links its record


def test_every_results_block_is_what_the_records_say_now():
    # regenerate every block from the committed records and compare with the file: a figure
    # typed by hand, or left behind by a newer record, fails here (`make readme` fixes it)
    for readme in refresh_readme.readmes(ROOT):
        text, filled = refresh_readme.refreshed(readme, ROOT / "reports")
        assert filled, f"{readme}: no results block filled from records"
        assert text == readme.read_text(), f"{readme.relative_to(ROOT)}: run `make readme`"


def test_a_hand_edited_figure_is_caught(tmp_path):
    # the comparison above is not vacuous: change one figure in a copy and it differs
    readme = ROOT / "project04_llm_inference" / "README.md"
    text = readme.read_text()
    row = next(ln for ln in text.splitlines() if ln.startswith("| batch-1 decode, context 1,024"))
    planted = text.replace(row, row.replace("| 0.", "| 0.1", 1).replace("| 1.", "| 1.1", 1))
    assert planted != text
    assert refresh_readme.refreshed(readme, ROOT / "reports", planted)[0] != planted


def test_every_claim_reads_a_figure_from_its_record():
    from shared import front_page

    for project in PROJECTS:
        claims = refresh_readme.claims_of(project, ROOT)
        assert claims, project
        assert any(c.root for c in claims), f"{project}: nothing for the repository README"
        for c in claims:
            rec = front_page.load_record(ROOT / "reports" / project, c.record)
            assert rec is not None, (project, c.record)
            assert c.measure(rec) is not None, (project, c.what)


# --- figures in code -----------------------------------------------------------------------------

CODE_SUFFIXES = {".py", ".cu", ".cuh", ".cpp", ".h", ".metal", ".sh", ".sbatch"}
# A measured figure: a time "on" a machine, a rate with its unit, a speed-up in words, or a
# sentence naming the GPU a number came from. Units alone ("TFLOP/s" as a column title) pass.
MEASURED = [
    re.compile(r"\b\d[\d,.]*\s?(?:ms|us|µs)\s+on\b"),
    re.compile(r"\b\d[\d,.]*\s?(?:TFLOP/s|GFLOP/s|tok/s|tokens/s|GB/s|TB/s)"),
    re.compile(r"\bon (?:an?|one|two|the|a lent|1|2) H[12]00s?\b"),
    re.compile(r"\bon H[12]00s?\b"),
    re.compile(r"\b\d+(?:\.\d+)?x (?:over|faster|slower)\b"),
    re.compile(r"~\d[\d.]*\s?(?:s|ms|us|min)\b"),
]
# The hardware table holds datasheet figures and the one measured reference (copy bandwidth),
# each with its source and date: that is where such constants belong.
ALLOWED = {ROOT / "shared" / "hardware.py"}


def cites_measured_figure(line: str) -> bool:
    return any(p.search(line) for p in MEASURED)


def test_the_pattern_catches_a_measured_figure_and_passes_a_unit():
    assert cites_measured_figure("# one split ran the step in 3.91 ms on this batch")
    assert cites_measured_figure('"""the kernel reads 4,300 GB/s at batch 64"""')
    assert cites_measured_figure("    (measured on an H200: faster at batch 1)")
    assert cites_measured_figure("# 1.38x over no speculation")
    assert cites_measured_figure("# chaos on 2 ranks, ~1.5 min")
    assert not cites_measured_figure('headers=["TFLOP/s", "GB/s"]  # units')
    assert not cites_measured_figure("batch-1 decode <= 0.80 ms/token")  # a target


def test_no_code_or_docstring_cites_a_measured_figure():
    folders = [ROOT / p for p in PROJECTS] + [ROOT / "shared", ROOT / "scripts"]
    found = []
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            if path.suffix not in CODE_SUFFIXES or path in ALLOWED or not path.is_file():
                continue
            for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if cites_measured_figure(line):
                    found.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert found == [], "numbers live in records and NOTES.md:\n" + "\n".join(found)


# --- links ---------------------------------------------------------------------------------------


def test_every_relative_link_of_every_markdown_file_resolves():
    broken = []
    for md in markdown_files():
        for target in relative_links(md.read_text()):
            path = target.partition("#")[0]
            if path and not (md.parent / path).exists():
                broken.append(f"{md.relative_to(ROOT)} -> {target}")
    assert broken == []


@pytest.fixture(scope="module")
def selections():
    return {}


def _selection(selections, project):
    if project not in selections:
        selections[project] = fork_project.select(ROOT, project)
    return selections[project]


@pytest.mark.parametrize("project", PROJECTS)
def test_the_fork_readme_is_written_for_the_fork(project, selections):
    sel = _selection(selections, project)
    locate = fork_project.locator(sel)
    text = fork_project.fork_readme(sel, ROOT, locate)
    # every relative link lands on a file or folder the fork carries
    broken = [
        t
        for t in relative_links(text)
        if t.partition("#")[0]
        and locate(posixpath.normpath(t.partition("#")[0])) is None
        and t.partition("#")[0] != "README.md"
    ]
    assert broken == []
    # its set-up comes first, and it names no make target its Makefile lacks
    first_block = text.split("```bash", 1)[1].split("```", 1)[0]
    assert "make test" in first_block and "make demo" in first_block
    makefile = fork_project._makefile_for(sel, ROOT, [])
    targets = set(re.findall(r"(?m)^([a-z0-9-]+):", makefile))
    named = set(re.findall(r"`make ([a-z0-9][a-z0-9-]*)", text)) | set(
        re.findall(r"(?m)^make ([a-z0-9][a-z0-9-]*)", text)
    )
    assert named - targets == set(), "the fork's README names targets it lacks"
    assert "verify-results" not in text and "make fork" not in text
    for script in re.findall(r"scripts/[\w.]+", text):
        assert script in sel.files, script
