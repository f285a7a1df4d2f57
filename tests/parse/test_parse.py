"""Stage parse: canonical text → top-level blocks with exact char and line spans (SPEC §1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import outline
import pytest
from conftest import CHECKER, load_checker

from pipeline.models import Block, SourceDoc
from pipeline.stages.normalize import normalize
from pipeline.stages.parse import Lines, parse

CASES = sorted(Path(__file__).parent.joinpath("cases").glob("*.md"))


def as_json(block: Block, text: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "kind": block.kind,
        "span": [block.start, block.end],
        "lines": [block.line_start, block.line_end],
        "text": text[block.start : block.end],
    }
    if block.kind == "heading":
        out["level"] = block.level
        out["title"] = block.title
    if block.children:
        out["children"] = [as_json(c, text) for c in block.children]
    return out


def doc_of(case: Path) -> SourceDoc:
    return normalize(case.read_bytes(), case.name)


def block_errors(doc: SourceDoc, blocks: tuple[Block, ...], parent: Block | None = None) -> list[str]:
    """Spans are exact: in order, disjoint, inside the parent, trimmed, lines agree with chars."""
    text, lines = doc.text, Lines(doc.text)
    errors = []
    prev_end = parent.start if parent else doc.body_start
    for b in blocks:
        where = f"{b.kind}@{b.line_start}"
        if not prev_end <= b.start < b.end <= len(text):
            errors.append(f"{where}: span {b.start},{b.end} after {prev_end}")
        if parent and b.end > parent.end:
            errors.append(f"{where}: ends after its parent")
        if lines.line_of(b.start) != b.line_start or lines.line_of(b.end - 1) != b.line_end:
            errors.append(f"{where}: lines {b.line_start}-{b.line_end} vs chars {b.start},{b.end}")
        if text[b.start : b.end] != text[b.start : b.end].rstrip() or not text[b.start : b.end].strip():
            errors.append(f"{where}: span not trimmed or blank")
        if parent is None and b.start != lines.start(b.line_start):
            errors.append(f"{where}: a top-level block starts at its line's start")
        if b.kind == "heading" and not 1 <= b.level <= 6:
            errors.append(f"{where}: level {b.level}")
        if b.kind in ("list", "quote") and parent is None and not b.children:
            errors.append(f"{where}: container without children")
        errors += block_errors(doc, b.children, b)
        prev_end = b.end
    return errors


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_blocks_match_golden(case: Path, golden) -> None:
    doc = doc_of(case)
    golden(case.with_suffix(".golden.json"), [as_json(b, doc.text) for b in parse(doc)])


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_spans_are_exact(case: Path) -> None:
    doc = doc_of(case)
    assert block_errors(doc, parse(doc)) == []


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_top_level_blocks_cover_every_non_blank_char(case: Path) -> None:
    doc = doc_of(case)
    covered = set()
    for b in parse(doc):
        covered.update(range(b.start, b.end))
    lost = [i for i in range(doc.body_start, len(doc.text)) if i not in covered and not doc.text[i].isspace()]
    assert lost == []


@pytest.fixture(scope="module")
def independent() -> Any:
    """The checker (``../shared/tools/check_chunks.py``), or where ../shared is absent
    ``tests/outline.py``: the same parser (markdown-it-py) behind the same ``Outline``."""
    return load_checker() if CHECKER.exists() else outline


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_headings_agree_with_markdown_it(case: Path, independent: Any) -> None:
    """The independent parser finds the same document-level headings, at the same offsets."""
    doc = doc_of(case)
    ours = [(b.start, b.level) for b in parse(doc) if b.kind == "heading"]
    assert ours == independent.Outline(doc.text).headings


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_fences_and_tables_agree_with_markdown_it(case: Path, independent: Any) -> None:
    """Every fenced code block markdown-it sees lies inside one block of ours, whole; every
    table starts where one of ours does. (Table ends may differ: GFM lets a pipe-less line
    right after a table continue it as a row, mistletoe ends the table there; see tables.md.)
    """
    doc = doc_of(case)
    blocks = parse(doc)
    table_starts = {b.start for b in blocks if b.kind == "table"}
    for kind, start, end in independent.Outline(doc.text).atomic:
        if end <= start:
            continue
        if kind == "table":
            assert start in table_starts, f"table at {start} is not one of ours"
            continue
        holders = [b for b in blocks if b.start <= start and end <= b.end]
        assert len(holders) == 1, f"{kind} at {start}-{end} not inside one top-level block"


def test_front_matter_is_not_parsed_and_offsets_are_file_offsets() -> None:
    doc = normalize(b"---\ntitle: x\n---\n# Head\n", "f.md")
    (head,) = parse(doc)
    assert (head.kind, head.start, head.line_start, head.title) == ("heading", 17, 4, "Head")


@pytest.mark.parametrize("text", ["", "\n", "  \n\t\n", "---\na: 1\n---\n", "---\na: 1\n---\n\n  \n"])
def test_nothing_to_parse(text: str) -> None:
    assert parse(normalize(text.encode(), "e.md")) == ()


def test_deep_nesting_is_kept_as_a_leaf_not_a_crash() -> None:
    text = "> " * 200 + "deep\n"
    (block,) = parse(normalize(text.encode(), "deep.md"))
    assert block.kind == "quote"
    assert (block.start, block.end) == (0, len(text) - 1)


def test_lines_helper() -> None:
    lines = Lines("ab\n\ncd")
    assert lines.count == 3
    assert [lines.start(n) for n in (1, 2, 3)] == [0, 3, 4]
    assert [lines.end(n) for n in (1, 2, 3)] == [2, 3, 6]
    assert [lines.line_of(i) for i in range(7)] == [1, 1, 1, 2, 3, 3, 3]
    assert lines.is_blank(2) and not lines.is_blank(3)
