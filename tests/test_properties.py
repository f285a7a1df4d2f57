"""Properties of ``chunk_document`` over random Markdown (SPEC §2-4), checked with Hypothesis.

The documents are built from headings, paragraphs, fences, tables, lists, quotes,
HTML, images, math and link definitions, in CRLF or LF, with CJK and emoji; the
policy is random too, down to the smallest target the CLI accepts (16).
Examples per test: the ``chunkyard`` profile in conftest.py (150), or ``fuzz``.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import Chunked, chunk_md, has_checker, invariant_errors, load_checker, need_checker, stable
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from outline import Outline

from pipeline.errors import StageError
from pipeline.models import Policy
from pipeline.runner import chunk_document
from pipeline.stages.normalize import decode

WORDS = [
    "chunk", "token", "budget", "heading", "section", "overlap", "the", "a", "of", "and", "to",
    "retrieval", "citation", "offset", "Markdown", "pipeline", "x", "déjà", "naïve", "Ünïcödé",
    "中文", "日本語", "テスト", "한국어", "🎉", "👩‍💻", "e\u0301", "`code`", "**bold**", "_em_",
    "[link](https://example.com)", "<b>html</b>", "$x^2$", "a/b", "3.14", "v1.2.3", "(paren)",
    "\"quoted\"", "don't", "e.g.", "—", "…", "&amp;", "\\*", "<!-- c -->",
]  # fmt: skip
ENDS = [".", ".", ".", "!", "?", ";", ":", "。", "！", "", "..."]

words = st.lists(st.sampled_from(WORDS), min_size=1, max_size=12).map(" ".join)
sentence = st.tuples(words, st.sampled_from(ENDS)).map("".join)
long_word = st.sampled_from(["x" * 150, "長" * 120, "https://example.com/" + "a/b-c" * 30])


@st.composite
def paragraph(draw: Any) -> str:
    parts = draw(st.lists(st.one_of(sentence, sentence, sentence, long_word), min_size=1, max_size=40))
    text = " ".join(parts)
    if draw(st.booleans()):  # hard-wrapped lines
        out, line = [], []
        for w in text.split(" "):
            line.append(w)
            if len(line) > 8:
                out.append(" ".join(line))
                line = []
        text = "\n".join([*out, " ".join(line)]).strip("\n")
    return "Para " + text


heading = st.builds(lambda n, t: "#" * n + " " + t, st.integers(1, 6), words)
setext = st.builds(
    lambda t, u: f"{t}\n{u}", words.map(lambda w: "Title " + w), st.sampled_from(["===", "---"])
)
code_line = st.one_of(
    words, st.just("# not a heading"), st.just(""), st.just("    indented"), st.just("| a | b |")
)
fence = st.builds(
    lambda f, lang, lines: f"{f}{lang}\n" + "\n".join(lines) + f"\n{f}",
    st.sampled_from(["```", "~~~", "````"]),
    st.sampled_from(["", "python", "sh"]),
    st.lists(code_line, max_size=60),
)
indented = st.lists(words, min_size=1, max_size=5).map(lambda ls: "\n".join("    " + w for w in ls))
table = st.builds(
    lambda cols, rows: "\n".join(
        ["| " + " | ".join(f"h{i}" for i in range(cols)) + " |", "|" + "---|" * cols]
        + ["| " + " | ".join(r[:cols] + ["·"] * (cols - len(r[:cols]))) + " |" for r in rows]
    ),
    st.integers(1, 4),
    st.lists(st.lists(words.map(lambda w: w.replace("|", "/")), min_size=1, max_size=4), max_size=40),
).map(lambda t: t + "\n")  # a blank line after: GFM lets a table swallow the next line (see below)
item = st.one_of(words, paragraph())
bullet = st.lists(
    st.tuples(st.sampled_from(["- ", "* ", "1. "]), item, st.booleans()), min_size=1, max_size=20
).map(
    lambda items: "\n".join(
        m + t.replace("\n", "\n   ") + ("\n   - nested " + t[:20] if n else "") for m, t, n in items
    )
)
quote = st.lists(st.one_of(words, paragraph()), min_size=1, max_size=6).map(
    lambda ps: "\n>\n".join("> " + p.replace("\n", "\n> ") for p in ps)
)
html = st.sampled_from(
    [
        "<div>\n<p>an html block</p>\n</div>",
        "<!-- a comment\n\nwith a blank line -->",
        "<details>\n<summary>More</summary>\n\nInside.\n\n</details>",
        '<img src="x.png" alt="inline html image">',
        "<table>\n<tr><td>" + "cell " * 80 + "</td></tr>\n</table>",
    ]
)
image = st.sampled_from(
    ["![alt](img.png)", "![](empty.png)", "[![badge](b.svg)](https://ci)", '![t](a.png "T")']
)
formula = st.sampled_from(["$$\nE = mc^2\n$$", "$$ a + b $$", "$$\n" + "\\alpha + " * 60 + "1\n$$"])
linkdef = st.sampled_from(["[ref]: https://example.com", "[^1]: A footnote.", "[x]: <y> 'z'"])
thematic = st.sampled_from(["---", "***", "___"])

block = st.one_of(
    heading, heading, heading, setext, paragraph(), paragraph(), fence, indented, table, bullet, quote,
    html, image, formula, linkdef, thematic, words,
)  # fmt: skip
front_matter = st.sampled_from(
    ["", "", "---\ntitle: Front\n---\n", "---\ntitle: [bad\n---\n", "+++\ntitle = 'T'\n+++\n", "---\n---\n"]
)


@st.composite
def markdown(draw: Any) -> str:
    blocks = draw(st.lists(block, max_size=25))
    seps = draw(
        st.lists(
            st.sampled_from(["\n\n", "\n\n", "\n\n\n", "\n", "\n  \n"]),
            min_size=len(blocks),
            max_size=len(blocks),
        )
    )
    body = "".join(b + s for b, s in zip(blocks, seps, strict=True))
    if draw(st.booleans()):
        body = body.rstrip("\n")  # no final newline
    return draw(front_matter) + body


@st.composite
def policies(draw: Any) -> Policy:
    target = draw(st.sampled_from([16, 24, 48, 128, 512]))
    overlap = draw(st.sampled_from([0, 4, 8, target // 4, target // 2]))
    return Policy(
        target_tokens=target,
        overlap_tokens=min(overlap, target - 1),
        context_prefix=draw(st.booleans()),
        tokenizer=draw(st.sampled_from(["cl100k_base", "cl100k_base", "o200k_base"])),
    )


def outline(text: str):
    """What markdown-it-py (the independent checker's parser) sees in ``text``: the shared
    checker's ``Outline``, or where ../shared is absent our own on the same parser."""
    if not has_checker():
        return Outline(text)
    return load_checker().Outline(text)


def encode(text: str, crlf: bool, bom: bool) -> bytes:
    if crlf:
        text = text.replace("\n", "\r\n")
    return (b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8")


#: The slower properties (two runs per example) take a third of the profile's examples.
THIRD = max(settings.default.max_examples // 3, 1)
documents = st.tuples(markdown(), st.booleans(), st.booleans()).map(lambda t: encode(*t))


@given(documents, policies())
@example(b"Para a.\n\n\t\n", Policy(target_tokens=16, overlap_tokens=4))
@example("# 中文\n\n" + "这是一句很长的话，" * 30 + "。", Policy(target_tokens=48, overlap_tokens=12))
@example(
    b"| h0 |\n|---|\n" + b"| chunk chunk |\n" * 9 + b"\n---\n",
    Policy(target_tokens=16, overlap_tokens=0, context_prefix=False),
)
def test_chunks_keep_every_invariant(raw: bytes, policy: Policy) -> None:
    """Slices exact, lines right, nothing lost, ids unique, order kept, budget and tokens right;
    and, by the headings markdown-it (not mistletoe) sees: every document-level heading opens
    a chunk, no chunk crosses one, and each chunk's heading depths are the ones above it."""
    result = chunk_md(raw, "prop/doc.md", policy)
    seen = outline(result.text)
    assert result.doc.body_start == seen.fm_end
    assert list(invariant_errors(result, [h for h, _ in seen.headings])) == []
    starts = {r["charOffsets"]["charStart"] for r in result.records}
    for offset, _level in seen.headings:
        assert offset in starts, f"no chunk starts at the heading at {offset}"
    for r in result.records:
        assert r["headerDepths"] == seen.depths_at(r["charOffsets"]["charStart"])


@settings(max_examples=THIRD)
@given(documents, policies())
def test_same_input_same_output(raw: bytes, policy: Policy) -> None:
    first = [(c.rel_file, stable(c.record)) for c in chunk_md(raw, "a/b.md", policy).chunks]
    again = [(c.rel_file, stable(c.record)) for c in chunk_md(raw, "a/b.md", policy).chunks]
    assert first == again


@settings(max_examples=THIRD)
@given(documents)
def test_line_endings_and_bom_change_nothing_but_offsets(raw: bytes) -> None:
    """CRLF and a BOM are normalized away: the chunks of the LF form are the same chunks."""
    lf = raw.removeprefix(b"\xef\xbb\xbf").replace(b"\r\n", b"\n")
    a, b = chunk_md(raw, "d.md"), chunk_md(lf, "d.md")
    assert [stable(r) for r in a.records] == [stable(r) for r in b.records]


@given(st.text(max_size=400))
@example("\x00")
@example("\r\r\n\ufeff")
@example("> " * 120 + "x")
@example("- " * 120 + "x")
@example("[" * 300)
@example("*" * 2000)
def test_no_exception_escapes_for_any_text(text: str) -> None:
    try:
        _doc, chunks = chunk_document(
            text.encode("utf-8", "surrogatepass"), "any.md", Policy(target_tokens=16, overlap_tokens=4)
        )
    except StageError as exc:
        assert exc.stage == "normalize"  # decode errors (NUL, surrogates) aside
        return
    if chunks:
        assert all(c.record["originalText"].strip() for c in chunks)


@given(st.binary(max_size=300))
def test_no_exception_escapes_for_any_bytes(raw: bytes) -> None:
    try:
        chunk_document(raw, "bytes.md", Policy())
    except StageError as exc:
        assert exc.stage == "normalize"
        assert "byte " in exc.where


@given(
    st.text(max_size=300).filter(lambda t: "\r" not in t and "\x00" not in t and not t.startswith("\ufeff"))
)
def test_decode_changes_nothing_else(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        assume(False)
    assert decode(text.encode("utf-8"), "t.md") == text


def test_pipe_line_over_dashes_is_a_setext_heading_as_in_gfm() -> None:
    """mistletoe took it for a table; ``pipeline/stages/mdpatch/blocks.py`` now counts cells as GFM does."""
    result = chunk_md("Intro.\n\nTitle a|b\n---\n\nText.\n", "t.md")
    heads = [h for h, _ in outline(result.text).headings]
    assert heads == [8]
    assert list(invariant_errors(result, heads)) == []


def test_line_right_after_a_table_belongs_to_it_as_in_gfm() -> None:
    """mistletoe ended the table there; ``pipeline/stages/mdpatch/blocks.py`` now ends it where GFM does."""
    result = chunk_md("## A\n\n| h |\n|---|\n| 1 |\nTitle\n===\n\nText.\n", "t.md")
    seen = outline(result.text)
    assert [h for h, _ in seen.headings] == [0]
    for r in result.records:
        assert r["headerDepths"] == seen.depths_at(r["charOffsets"]["charStart"])


@pytest.mark.parametrize("target", [16, 64, 512])
def test_pathological_one_line_documents(target: int) -> None:
    """No split point at all: one long word, one CJK run, one long table row."""
    for text in ["x" * 5000, "中" * 3000, "| " + "a | " * 800, "# " + "h" * 3000, "> " + "q " * 2000]:
        result = chunk_md(text, "p.md", target_tokens=target, overlap_tokens=target // 4)
        assert list(invariant_errors(result)) == [], text[:10]


@settings(max_examples=THIRD)
@given(markdown())
def test_the_local_outline_is_the_checkers(text: str) -> None:
    """``tests/outline.py`` stands in for the shared checker's ``Outline`` without ../shared."""
    ours, theirs = Outline(text), need_checker().Outline(text)
    assert (ours.fm_end, ours.headings, ours.atomic) == (theirs.fm_end, theirs.headings, theirs.atomic)


def test_a_split_table_nested_in_a_list_repeats_its_header_without_a_context_prefix() -> None:
    """A table in a list item, split between rows, carries its header in ``embedText`` as a
    top-level one does (found by ``test_chunks_keep_every_invariant``: the check knew only a
    table at the top). Without a context prefix that header is all ``embedText`` adds."""
    rows = "".join(
        "  | chunk chunk chunk chunk chunk chunk chunk chunk chunk chunk chunk |\n" for _ in range(3)
    )
    raw = ("- item\n\n  | h0 |\n  |---|\n" + rows + "\n# next\n").encode()
    policy = Policy(target_tokens=16, overlap_tokens=0, context_prefix=False)
    doc, chunks = chunk_document(raw, "prop/doc.md", policy)
    records = [c.record for c in chunks]
    split = [r for r in records if r["block_type"] == "table" and r["embedText"] != r["originalText"]]
    assert len(split) == 2, [r["originalText"] for r in records]
    assert all(r["embedText"] == "  | h0 |\n  |---|\n" + r["originalText"] for r in split)
    assert not list(invariant_errors(Chunked(doc, chunks, policy)))
