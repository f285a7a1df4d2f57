"""Stage sections: blocks → section tree, sect_path numbering, slugs, file title (SPEC §2, §3)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline.models import SourceDoc
from pipeline.stages.normalize import normalize
from pipeline.stages.parse import parse
from pipeline.stages.sections import Slugger, build_sections, file_title, outline, slugify

CASES = sorted(Path(__file__).parent.joinpath("cases").glob("*.md"))


def sections_json(doc: SourceDoc) -> dict[str, Any]:
    blocks = parse(doc)
    return {
        "file_title": file_title(doc, blocks),
        "outline": outline(blocks).split("\n"),
        "sections": [
            {
                "path": s.path,
                "titles": list(s.titles),
                "depths": list(s.depths),
                "slugs": list(s.slugs),
                "blocks": [f"{b.kind}@{b.line_start}" for b in s.blocks],
            }
            for s in build_sections(blocks)
        ],
    }


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_sections_match_golden(case: Path, golden) -> None:
    golden(case.with_suffix(".golden.json"), sections_json(normalize(case.read_bytes(), case.name)))


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_section_invariants(case: Path) -> None:
    doc = normalize(case.read_bytes(), case.name)
    blocks = parse(doc)
    sections = build_sections(blocks)
    assert [b for s in sections for b in s.blocks] == list(blocks)  # every block in one section, in order
    paths = [s.path for s in sections]
    assert len(set(paths)) == len(paths)
    slugs = [s.slugs[-1] for s in sections if s.slugs]
    assert len(set(slugs)) == len(slugs)  # de-duplicated per document
    for s in sections:
        assert (
            len(s.titles) == len(s.depths) == len(s.slugs) == (0 if s.path == "0" else len(s.path.split(".")))
        )
        assert list(s.depths) == sorted(set(s.depths))  # strictly deeper down the path
        if s.path == "0":
            assert s.blocks[0].kind != "heading" and s is sections[0]
        else:
            assert s.blocks[0].kind == "heading" and s.blocks[0].level == s.depths[-1]
            assert all(b.kind != "heading" for b in s.blocks[1:])


def test_numbering_with_skipped_levels() -> None:
    doc = normalize((CASES[0].parent / "numbering.md").read_bytes(), "numbering.md")
    got = [(s.path, s.titles[-1] if s.titles else "") for s in build_sections(parse(doc))]
    assert got == [
        ("0", ""),
        ("1", "A"),
        ("1.1", "A.1"),
        ("1.2", "A.2"),
        ("1.2.1", "A.2.a"),
        ("2", "B"),
        ("2.1", "B skips a level"),
        ("2.2", "B.2 after the skip"),
        ("2.2.1", "B.2 deep, skipping again"),
        ("3", "C"),
    ]


@pytest.mark.parametrize(
    ("title", "slug"),
    [
        ("Hello World", "hello-world"),
        ("Hello, World! (again)", "hello-world-again"),
        ("C++ & Rust: a quick tour", "c--rust-a-quick-tour"),
        ("snake_case and kebab-case", "snake_case-and-kebab-case"),
        ("Über Café naïve", "über-café-naïve"),
        ("日本語の見出し", "日本語の見出し"),
        ("FastAPI 教程 🚀", "fastapi-教程-"),
        ("🎉 Party", "-party"),
        ("v1.2.3", "v123"),
        ("  trim  me  ", "--trim--me--"),
        ("", ""),
        ("Ⅻ Roman", "ⅻ-roman"),
        ("ÀÉÎ", "àéî"),
    ],
)
def test_slugify_like_github(title: str, slug: str) -> None:
    assert slugify(title) == slug


def test_slugger_deduplicates_like_github() -> None:
    slugger = Slugger()
    got = [slugger.slug(t) for t in ["A", "A", "a-1", "A", "a", "", ""]]
    assert got == ["a", "a-1", "a-1-1", "a-2", "a-3", "", "-1"]


def doc(text: str, rel: str = "dir/stem.md") -> SourceDoc:
    return normalize(text.encode(), rel)


@pytest.mark.parametrize(
    ("text", "title"),
    [
        ("---\ntitle: From  front\n  matter\n---\n# H1\n", "From front matter"),
        ("---\ntitle: 2024\n---\n# H1\n", "2024"),
        ("---\ntitle: ''\n---\n# H1\n", "H1"),
        ("---\ntitle: [a, b]\n---\n# H1\n", "H1"),
        ("---\ntitle: [unclosed\n---\n# H1\n", "H1"),
        ("## H2 first\n\n# The *first* H1\n\n# Second H1\n", "The first H1"),
        ("## Only H2\n", "stem"),
        ("> # H1 in a quote\n", "stem"),
        ("#\n\n# Real\n", "Real"),
        ("Setext\n======\n", "Setext"),
        ("", "stem"),
    ],
)
def test_file_title_precedence(text: str, title: str) -> None:
    d = doc(text)
    assert file_title(d, parse(d)) == title


def test_outline_ignores_body_text_and_collapses_whitespace() -> None:
    a, b = doc("# One  two\n\ntext\n\n## Three\n"), doc("# One two\n\nother text\n\n## Three\n")
    assert outline(parse(a)) == outline(parse(b)) == "1 One two\n2 Three"
