"""The md-heading-v1 rules (SPEC §4) and the test plan of seed 003, one test per line of it.

| seed 003 test plan                                          | here                               |
|-------------------------------------------------------------|------------------------------------|
| heading boundary respected (no chunk crosses H2 → H2)       | test_no_chunk_crosses_h2_to_h2     |
| code block of 800 tokens stays in one chunk at target 500   | test_800_token_code_block_...      |
| table stays a single chunk if size < 2 × target             | test_table_under_twice_the_target  |
| long paragraph split with overlap_tokens applied            | test_long_paragraph_splits_...     |
| image block produces a chunk of its own                     | test_image_only_paragraph_...      |
| identical input + policy → identical chunk ids              | test_determinism                   |
| long-section.md → chunk JSON stable                         | split/cases/long-section.* + below |
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import re
from pathlib import Path

import pytest
from conftest import chunk_md, invariant_errors, stable

from pipeline.models import Policy
from pipeline.stages.tokens import Counter

COUNT = Counter("cl100k_base").count
WORDS = [
    "the",
    "chunker",
    "splits",
    "a",
    "long",
    "paragraph",
    "at",
    "sentence",
    "ends",
    "and",
    "keeps",
    "some",
    "overlap",
    "between",
    "its",
    "pieces",
    "so",
    "that",
    "answers",
    "near",
    "a",
    "cut",
    "are",
    "still",
    "found",
    "by",
    "retrieval",
]


def prose(sentences: int, seed: int = 1, min_words: int = 6, max_words: int = 18) -> str:
    rnd = random.Random(seed)
    out = []
    for _ in range(sentences):
        words = [rnd.choice(WORDS) for _ in range(rnd.randint(min_words, max_words))]
        out.append(" ".join(words).capitalize() + ".")
    return " ".join(out)


def chunks_touching(result, start: int, end: int) -> list[dict]:
    return [
        r
        for r in result.records
        if r["charOffsets"]["charStart"] < end and r["charOffsets"]["charEnd"] > start
    ]


def holds_whole(record: dict, start: int, end: int) -> bool:
    return record["charOffsets"]["charStart"] <= start and end <= record["charOffsets"]["charEnd"]


# -- rule 1: headings ------------------------------------------------------------------


@pytest.mark.parametrize("target", [32, 64, 512])
def test_no_chunk_crosses_h2_to_h2(target: int) -> None:
    sections = [f"## Section {i}\n\n{prose(3 + i, seed=i)}\n\n- item a\n- item b\n" for i in range(5)]
    text = "# Title\n\nIntro.\n\n" + "\n".join(sections)
    result = chunk_md(text, "h.md", target_tokens=target, overlap_tokens=target // 8)
    heads = [m.start() for m in re.finditer(r"^## ", text, re.MULTILINE)]
    bounds = [*heads, len(text)]
    starts = [r["charOffsets"]["charStart"] for r in result.records]
    for i, h in enumerate(heads):
        assert h in starts, "every H2 opens a chunk"
        inside = [r for r in result.records if h <= r["charOffsets"]["charStart"] < bounds[i + 1]]
        assert inside and all(r["charOffsets"]["charEnd"] <= bounds[i + 1] for r in inside)
        assert {r["section_id"] for r in inside} == {f"1.{i + 1}"}
        assert {r["sectionTitle"] for r in inside} == {f"Section {i}"}
        assert inside[0]["originalText"].startswith(f"## Section {i}")
    assert list(invariant_errors(result)) == []


def test_heading_only_section_is_a_chunk_of_its_own() -> None:
    result = chunk_md("# A\n\n## Empty\n\n## Full\n\nText.\n", "e.md")
    assert [(r["originalText"], r["block_type"]) for r in result.records] == [
        ("# A", "heading"),
        ("## Empty", "heading"),
        ("## Full\n\nText.", "paragraph"),
    ]


def test_headings_inside_quotes_and_lists_do_not_start_chunks() -> None:
    text = "# Doc\n\n> # quoted heading\n> text\n\n- # listed heading\n\n```\n# comment\n```\n"
    result = chunk_md(text, "q.md")
    assert len(result.records) == 1
    assert result.records[0]["headerPath"] == ["Doc"]


# -- rule 2: code, HTML and math are never split ----------------------------------------


def code_block(tokens: int) -> str:
    lines, i = ["```python"], 0
    while COUNT("\n".join([*lines, "```"])) < tokens:
        lines.append(f"def handler_{i}(request, response):  # line {i} of a big block")
        lines.append(f"    return process(request.body[{i}], response.headers)")
        i += 1
    return "\n".join([*lines, "```"])


def test_800_token_code_block_stays_whole_at_target_500() -> None:
    code = code_block(800)
    assert 800 <= COUNT(code) < 830
    text = f"# Big code\n\n{prose(4)}\n\n{code}\n\n{prose(4, seed=2)}\n"
    result = chunk_md(text, "code.md", target_tokens=500, overlap_tokens=50)
    start = text.index("```python")
    end = start + len(code)
    (holder,) = chunks_touching(result, start, end)
    assert holds_whole(holder, start, end)
    assert holder["originalText"] == code
    assert holder["block_type"] == "code"
    assert holder["tokenStats"]["tokens"] > 500  # over the target, and allowed to be
    assert list(invariant_errors(result)) == []


def test_heading_may_lead_a_big_code_block() -> None:
    code = code_block(700)
    text = f"## Only code\n\n{code}\n"
    (chunk,) = chunk_md(text, "c.md", target_tokens=128, overlap_tokens=16).records
    assert chunk["originalText"] == text.rstrip("\n")
    assert chunk["block_type"] == "code"


@pytest.mark.parametrize(
    "block",
    [
        "\n".join(f"    indented code line {i} with some words in it" for i in range(80)),
        "<div>\n" + "\n".join(f"<p>html paragraph {i} with words</p>" for i in range(60)) + "\n</div>",
        "$$\n" + " + ".join(f"\\alpha_{{{i}}}" for i in range(150)) + "\n$$",
        "~~~\n" + "\n".join(f"tilde fence line {i}" for i in range(100)) + "\n~~~",
    ],
    ids=["indented-code", "html", "formula", "tilde-fence"],
)
def test_atomic_blocks_are_never_split(block: str) -> None:
    text = f"# Atomic\n\nBefore.\n\n{block}\n\nAfter.\n"
    result = chunk_md(text, "a.md", target_tokens=64, overlap_tokens=8)
    start = text.index(block)
    (holder,) = chunks_touching(result, start, start + len(block))
    assert holder["originalText"] == block
    assert holder["tokenStats"]["tokens"] > 64
    assert list(invariant_errors(result)) == []


# -- rule 3: tables ----------------------------------------------------------------------


def table(rows: int) -> str:
    lines = ["| key | value | note |", "|-----|-------|------|"]
    lines += [f"| k{i} | {i * 7} | row {i} says something short |" for i in range(rows)]
    return "\n".join(lines)


def table_of(tokens: int) -> str:
    rows = 1
    while COUNT(table(rows + 1)) < tokens:
        rows += 1
    return table(rows)


def test_table_under_twice_the_target_stays_whole() -> None:
    tab = table_of(230)  # 1.8 × the target of 128
    assert 128 < COUNT(tab) < 256
    text = f"# Tables\n\n{prose(3)}\n\n{tab}\n\n{prose(3, seed=3)}\n"
    result = chunk_md(text, "t.md", target_tokens=128, overlap_tokens=16)
    start = text.index(tab)
    (holder,) = chunks_touching(result, start, start + len(tab))
    assert holder["originalText"] == tab
    assert holder["block_type"] == "table"
    assert list(invariant_errors(result)) == []


def test_table_over_twice_the_target_splits_between_rows_only() -> None:
    tab = table(60)
    header = "\n".join(tab.split("\n")[:2])
    assert COUNT(tab) > 2 * 128
    text = f"# Tables\n\nIntro.\n\n{tab}\n"
    result = chunk_md(text, "t.md", target_tokens=128, overlap_tokens=16)
    start = text.index(tab)
    pieces = chunks_touching(result, start, start + len(tab))
    assert len(pieces) > 2
    rows = set(tab.split("\n"))
    covered = ""
    for i, r in enumerate(pieces):
        s, e = max(r["charOffsets"]["charStart"], start), r["charOffsets"]["charEnd"]
        part = text[s:e]
        assert set(part.split("\n")) <= rows, "a piece holds whole rows only"
        assert text[s - 1] == "\n" and text[e] == "\n"
        if i:
            assert header not in r["originalText"], "the header is never repeated in originalText"
            assert header in r["embedText"], "later pieces repeat the header in embedText"
        assert r["tokenStats"]["tokens"] <= 128, "the pieces of a split table fit the target"
        covered += part + "\n"
    assert covered.rstrip("\n") == tab
    assert list(invariant_errors(result)) == []


# -- rule 4: packing, lists, paragraphs ---------------------------------------------------


def test_small_blocks_are_packed_up_to_the_target() -> None:
    paras = [f"Paragraph {i} is short." for i in range(40)]
    result = chunk_md("# Pack\n\n" + "\n\n".join(paras) + "\n", "p.md", target_tokens=64, overlap_tokens=8)
    assert 4 <= len(result.records) < 40
    assert all(r["tokenStats"]["tokens"] <= 64 for r in result.records)
    # greedy: a chunk plus the next block would not have fit, give or take the token the
    # packer reserves for each blank line between blocks (``.\n\n`` is often one token) and
    # the one token of margin it keeps at the prefix boundary
    for a, b in itertools.pairwise(result.records):
        next_block = b["originalText"].split("\n\n")[0]
        slack = a["originalText"].count("\n\n") + 2
        assert a["tokenStats"]["tokens"] + COUNT(next_block) + slack > 64


def test_list_over_the_target_splits_between_items() -> None:
    items = [f"- item {i}: {prose(1, seed=i)}" for i in range(30)]
    text = "# List\n\n" + "\n".join(items) + "\n"
    result = chunk_md(text, "l.md", target_tokens=96, overlap_tokens=8)
    assert len(result.records) > 2
    for r in result.records:
        assert r["block_type"] == "list"
        body = r["originalText"].removeprefix("# List\n\n")
        assert all(line in items for line in body.split("\n")), "pieces are whole items"
        assert r["tokenStats"]["tokens"] <= 96
    assert list(invariant_errors(result)) == []


@pytest.mark.parametrize(
    ("target", "overlap", "min_words", "max_words"),
    [(512, 64, 6, 18), (128, 16, 6, 10), (128, 16, 25, 40), (64, 24, 4, 8)],
    ids=["default", "short-sentences", "sentences-over-the-overlap", "small"],
)
def test_long_paragraph_splits_with_overlap(
    target: int, overlap: int, min_words: int, max_words: int
) -> None:
    para = prose(120, seed=target, min_words=min_words, max_words=max_words)
    text = f"# Long\n\n{para}\n"
    result = chunk_md(text, "long.md", target_tokens=target, overlap_tokens=overlap)
    recs = result.records
    assert len(recs) > 2
    assert {r["block_type"] for r in recs} == {"paragraph"}
    for a, b in itertools.pairwise(recs):
        a_end, b_start = a["charOffsets"]["charEnd"], b["charOffsets"]["charStart"]
        assert b_start < a_end, f"{b['id']} shares no text with {a['id']}"
        shared = text[b_start:a_end]
        assert 0 < COUNT(shared) <= overlap + 2
        assert text[b_start - 1] == " " and not text[b_start].isspace(), "pieces start at a word"
    for r in recs:
        assert r["tokenStats"]["tokens"] <= target
        assert r["originalText"].endswith("."), "pieces end at a sentence end"
    assert list(invariant_errors(result)) == []


def test_a_sentence_too_long_for_the_target_splits_at_word_ends() -> None:
    sentence = " ".join(f"word{i}" for i in range(400)) + "."
    result = chunk_md(f"{sentence}\n", "w.md", target_tokens=64, overlap_tokens=8)
    assert len(result.records) > 5
    for r in result.records:
        s, e = r["charOffsets"]["charStart"], r["charOffsets"]["charEnd"]
        assert (s == 0 or sentence[s - 1] == " ") and (e == len(sentence) or sentence[e] == " ")
    assert list(invariant_errors(result)) == []


# -- rule 5: images -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "image",
    [
        "![Architecture](img/arch.png)",
        "![](img/empty-alt.png)",
        "[![ci](b.svg)](https://ci)",
        '![t](a.png "T")',
    ],
)
def test_image_only_paragraph_is_an_image_chunk_of_its_own(image: str) -> None:
    text = f"# Figures\n\nBefore the figure.\n\n{image}\n\nAfter the figure.\n"
    result = chunk_md(text, "i.md")
    images = [r for r in result.records if r["block_type"] == "image"]
    (img,) = images
    assert img["originalText"] == image
    assert [b["type"] for b in img["blocks"]] == ["image"]
    assert img["tokenStats"]["tokens"] == COUNT(img["embedText"])  # counted as usual
    assert len(result.records) == 3
    assert list(invariant_errors(result)) == []


def test_image_with_text_is_a_paragraph() -> None:
    result = chunk_md("An inline ![icon](i.png) image.\n", "i.md")
    assert [r["block_type"] for r in result.records] == ["paragraph"]


# -- rule 6 and the rest ------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "\n\n", "---\ntitle: x\n---\n", "+++\ntitle = 'x'\n+++\n\n  \n"])
def test_nothing_to_chunk_yields_zero_chunks(text: str) -> None:
    assert chunk_md(text, "e.md").records == []


def test_front_matter_is_never_chunked() -> None:
    text = "---\ntitle: T\nsecret: front\n---\n# Body\n\nText.\n"
    result = chunk_md(text, "f.md")
    assert all("secret" not in r["originalText"] for r in result.records)
    assert result.records[0]["charOffsets"]["charStart"] == text.index("# Body")
    assert result.records[0]["metadata"]["frontMatter"] == {"title": "T", "secret": "front"}


def test_link_reference_definitions_belong_to_a_chunk() -> None:
    text = "# Refs\n\nSee [a].\n\n[a]: https://example.com/a\n[b]: https://example.com/b\n"
    (chunk,) = chunk_md(text, "r.md").records
    assert chunk["originalText"].endswith("[b]: https://example.com/b")
    assert "linkdef" in [b["type"] for b in chunk["blocks"]]


def test_determinism() -> None:
    text = Path(__file__).parent.joinpath("split", "cases", "long-section.md").read_text()
    policy = Policy(target_tokens=128, overlap_tokens=16)
    runs = [chunk_md(text, "d/long.md", policy) for _ in range(3)]
    first = [stable(r) for r in runs[0].records]
    assert all([stable(r) for r in run.records] == first for run in runs[1:])
    assert [r["chunk_id"] for r in runs[0].records] == [r["chunk_id"] for r in runs[2].records]
    assert [c.rel_file for c in runs[0].chunks] == [c.rel_file for c in runs[1].chunks]
    other = chunk_md(text, "d/long.md", Policy(target_tokens=129, overlap_tokens=16))
    assert other.records[0]["metadata"]["policyHash"] != runs[0].records[0]["metadata"]["policyHash"]


def test_blocks_provenance_lists_every_contributing_block_in_order() -> None:
    text = "# P\n\nOne.\n\n- a\n- b\n\n> q\n\n| t |\n|---|\n| 1 |\n"
    (chunk,) = chunk_md(text, "p.md").records
    assert [b["type"] for b in chunk["blocks"]] == ["heading", "paragraph", "list", "quote", "table"]
    spans = [(b["charStart"], b["charEnd"]) for b in chunk["blocks"]]
    assert spans == sorted(spans)
    assert [text[s:e] for s, e in spans] == ["# P", "One.", "- a\n- b", "> q", "| t |\n|---|\n| 1 |"]
    assert len({b["block_id"] for b in chunk["blocks"]}) == len(spans)


def test_a_dense_table_over_twice_the_target_splits_even_when_its_text_is_short() -> None:
    """Rule 3 counts tokens: CJK cells make a table of 2 × the target in few characters."""
    rows = ["|項|説|", "|-|-|"] + [f"|{i}|鬱蒐齣鑾|" for i in range(20)]
    tab = "\n".join(rows)
    assert COUNT(tab) >= 2 * 64 and len(tab) < 4 * 64  # dense: more tokens than characters
    text = f"# 表\n\n{tab}\n"
    result = chunk_md(text, "t.md", target_tokens=64, overlap_tokens=8)
    start = text.index(tab)
    pieces = chunks_touching(result, start, start + len(tab))
    assert len(pieces) > 1, f"a table of {COUNT(tab)} tokens (2 × 64 = 128) stays whole"
    assert list(invariant_errors(result)) == []


def test_the_budget_invariant_catches_an_unsplit_table_over_twice_the_target() -> None:
    """The shared invariant exempts only what rule 3 allows: a table chunked whole under a large
    target, judged against a target it is twice of, is a violation."""
    tab = table(60)
    whole = chunk_md(f"# T\n\n{tab}\n", "t.md", target_tokens=4096)
    assert list(invariant_errors(whole)) == []
    small = dataclasses.replace(whole, policy=Policy(target_tokens=COUNT(tab) // 2 - 1))
    errors = list(invariant_errors(small))
    assert any("a whole table of" in e for e in errors), errors
