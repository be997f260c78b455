"""CPU tier (no nvcc): inline PTX is written only in csrc/common/ (sm80.cuh, sm90.cuh,
wgmma.cuh), once per instruction form; kernels call those wrappers. A second copy of a wrapper in
a kernel file drifts from the first (a lost "memory" clobber, another operand order), which is
what this rule prevents. Nothing outside csrc/common/ is allowed, and the check reads comments
out first so that prose may name the instructions."""

from __future__ import annotations

import re
from pathlib import Path

CSRC = Path(__file__).resolve().parents[2] / "project01_cuda_kernel" / "csrc"
SUFFIXES = {".cu", ".cuh", ".h", ".hpp", ".cpp", ".cc"}
# `asm`, `asm volatile`, `__asm__ __volatile__`, ... followed by its parenthesis.
ASM = re.compile(r"\b(?:asm|__asm__|__asm)\b\s*(?:(?:volatile|__volatile__)\s*)?\(")
COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
STRING = re.compile(r'"(?:\\.|[^"\\\n])*"')


def inline_asm(text: str) -> list[int]:
    """1-based line numbers of inline-asm statements in C++/CUDA source, comments ignored."""

    def blank(m: re.Match) -> str:  # keep newlines so that line numbers stay right
        return re.sub(r"[^\n]", " ", m.group(0))

    # Strings first (a "//" inside one is not a comment), then comments.
    code = COMMENT.sub(blank, STRING.sub(lambda m: '""', text))
    return [code.count("\n", 0, m.start()) + 1 for m in ASM.finditer(code)]


def asm_outside_common(root: Path = CSRC) -> list[str]:
    hits = []
    for path in sorted(p for p in root.rglob("*") if p.suffix in SUFFIXES):
        rel = path.relative_to(root)
        if rel.parts[0] == "common":
            continue
        hits += [f"{rel.as_posix()}:{line}" for line in inline_asm(path.read_text())]
    return hits


def test_inline_ptx_only_in_csrc_common():
    assert asm_outside_common() == [], "write PTX as a wrapper in csrc/common/ and call it"


def test_the_wrappers_are_where_the_rule_says():
    # the rule is not vacuous: the common headers do hold the PTX, kernels hold none
    counts = {p.name: len(inline_asm(p.read_text())) for p in (CSRC / "common").glob("*.cuh")}
    assert counts["sm80.cuh"] > 0 and counts["sm90.cuh"] > 0 and counts["wgmma.cuh"] > 0, counts


def test_the_check_catches_asm_in_a_kernel_file(tmp_path):
    (tmp_path / "common").mkdir()
    (tmp_path / "common" / "ok.cuh").write_text('asm volatile("bar.sync 0;");\n')
    (tmp_path / "attention").mkdir()
    (tmp_path / "attention" / "k.cuh").write_text(
        '// asm volatile("in a comment") is prose\n'
        'const char* s = "asm(";  /* asm volatile( */\n'
        "__device__ void f() {\n"
        '  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\\n");\n'
        '  asm("mov.u32 %0, 0;" : "=r"(x));\n'
        '  __asm__ __volatile__ ("trap;");\n'
        "}\n"
    )
    assert asm_outside_common(tmp_path) == [
        "attention/k.cuh:4",
        "attention/k.cuh:5",
        "attention/k.cuh:6",
    ]
