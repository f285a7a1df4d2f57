"""docs/benchmarks.md holds the current figure of every benchmark, and stays short.

The page says each ``make bench*`` target's command, machine and latest run; earlier runs
live in its git history. A target without a section, or a page grown past its budget
(a diary again), fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "benchmarks.md"
MAX_LINES = 250


def bench_targets(makefile: str) -> set[str]:
    return set(re.findall(r"^(bench(?:-[a-z-]+)?):", makefile, re.MULTILINE))


def sections(page: str) -> set[str]:
    """The targets named in the page's headings (``## Throughput: `make bench` ``)."""
    return set(re.findall(r"^#+ .*`make (bench(?:-[a-z-]+)?)`", page, re.MULTILINE))


def test_the_page_stays_within_its_budget() -> None:
    lines = PAGE.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, f"docs/benchmarks.md has {lines} lines (≤ {MAX_LINES}): replace figures, do not append"


def test_every_bench_target_has_a_section() -> None:
    targets = bench_targets((ROOT / "Makefile").read_text(encoding="utf-8"))
    assert "bench" in targets and len(targets) > 5
    missing = targets - sections(PAGE.read_text(encoding="utf-8"))
    assert not missing, f"docs/benchmarks.md has no section for: {sorted(missing)}"


def test_the_checks_can_fail() -> None:
    assert bench_targets("bench-new: $(STAMP)\n\tpython x\n") == {"bench-new"}
    assert sections("## Something: `make bench-new`\n") == {"bench-new"}
    assert sections("no heading `make bench-new`\n") == set()
