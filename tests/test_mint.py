"""Stage mint: ids, addresses that survive edits, hashes, revisions, file names (SPEC §2, §3)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from blake3 import blake3
from conftest import chunk_md
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.models import Policy
from pipeline.stages.mint import anchor, chunk_file, chunk_files, policy_hash
from pipeline.stages.tokens import Counter, estimate_tokens

DOC = """# Guide

Intro text for the guide.

## Install

Run the installer. It takes a minute.

## Configure

Edit the file. Then restart.

### Advanced

Tune the cache.
"""
CHUNK_ID = re.compile(
    r"^(?P<doc>[^|\s]+)\|r=(?P<r>[0-9a-f]{8})\|s=(?P<s>0|[1-9]\d*(?:\.[1-9]\d*)*)\|p=000\|b=(?P<b>\d{3,})$"
)


def ids(text: str, rel: str = "guide.md", **kw) -> list[str]:
    return [r["chunk_id"] for r in chunk_md(text, rel, **kw).records]


def test_chunk_id_parts() -> None:
    recs = chunk_md(DOC, "docs/guide.md").records
    parts = [CHUNK_ID.match(r["chunk_id"]) for r in recs]
    assert all(parts)
    assert {p["doc"] for p in parts} == {"docs/guide"}  # type: ignore[index]
    assert len({p["r"] for p in parts}) == 1  # type: ignore[index]
    assert [p["s"] for p in parts] == ["1", "1.1", "1.2", "1.2.1"]  # type: ignore[index]
    assert [r["section_id"] for r in recs] == ["1", "1.1", "1.2", "1.2.1"]


def test_b_counts_pieces_within_the_section() -> None:
    text = "## S\n\n" + "\n\n".join(f"Paragraph {i} " + "word " * 40 for i in range(6))
    recs = chunk_md(text, "b.md", target_tokens=64, overlap_tokens=0).records
    bs = [int(r["chunk_id"].rsplit("b=", 1)[1]) for r in recs]
    assert bs == sorted(bs) and len(set(bs)) == len(bs) and bs[0] == 0
    assert sorted(r["chunk_id"] for r in recs) == [r["chunk_id"] for r in recs]


def test_r_survives_a_word_edit_and_rev_does_not() -> None:
    before = chunk_md(DOC, "guide.md").records
    after = chunk_md(DOC.replace("takes a minute", "takes two minutes"), "guide.md").records
    assert [r["chunk_id"] for r in before] == [r["chunk_id"] for r in after]
    assert before[0]["rev"] != after[0]["rev"]
    changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a["hash"] != b["hash"]]
    assert changed == [1]


def test_whitespace_only_edits_keep_rev() -> None:
    a = chunk_md(DOC, "guide.md").records[0]["rev"]
    b = chunk_md(DOC.replace("Intro text", "Intro    text"), "guide.md").records[0]["rev"]
    assert a == b


@pytest.mark.parametrize(
    "edit",
    [
        lambda t: t.replace("## Install", "## Installation"),
        lambda t: t.replace("## Install", "### Install"),
        lambda t: t + "\n## Appendix\n\nMore.\n",
    ],
    ids=["renamed", "moved", "added"],
)
def test_r_moves_when_the_outline_moves(edit) -> None:
    r_before = {CHUNK_ID.match(c)["r"] for c in ids(DOC)}  # type: ignore[index]
    r_after = {CHUNK_ID.match(c)["r"] for c in ids(edit(DOC))}  # type: ignore[index]
    assert r_before != r_after


def test_rev_width_widens_r() -> None:
    from pipeline.runner import chunk_document

    _doc, chunks = chunk_document(DOC.encode(), "g.md", Policy(), rev_width=12)
    assert all(re.search(r"\|r=[0-9a-f]{12}\|", c.record["chunk_id"]) for c in chunks)


@pytest.mark.parametrize(
    ("front", "uid"),
    [
        ("doc_id: stable-id", "stable-id"),
        ("doc_id: 'has space|pipe%'", "has%20space%7Cpipe%25"),
        ("doc_id: 42", "42"),
        ("doc_id: ''", "d/x"),
        ("doc_id: [a]", "d/x"),
    ],
)
def test_doc_uid(front: str, uid: str) -> None:
    (rec,) = chunk_md(f"---\n{front}\n---\ntext\n", "d/x.md").records
    assert rec["chunk_id"].split("|r=")[0] == uid
    assert rec["id"] == "doc:d/x::ch0"  # the 002 id always follows the path


def test_doc_uid_encodes_blanks_of_the_path() -> None:
    assert ids("x\n", "my docs/a b\tc.md")[0].startswith("my%20docs/a%20b%09c|r=")


def test_source_url_lang_and_title_from_front_matter() -> None:
    text = "---\ntitle: T\nurl: https://u.example/x\nlang: ja\n---\n# H\n\nbody\n"
    (rec,) = chunk_md(text, "f.md").records
    assert (rec["source_url"], rec["metadata"]["lang"], rec["fileTitle"]) == (
        "https://u.example/x",
        "ja",
        "T",
    )
    (rec,) = chunk_md("---\nsource_url: https://s\nurl: https://u\n---\nx\n", "f.md").records
    assert rec["source_url"] == "https://s"
    (rec,) = chunk_md("x\n", "dir/f.md", lang="de").records
    assert (rec["source_url"], rec["metadata"]["lang"], rec["fileTitle"]) == ("dir/f.md", "de", "f")


def test_embed_text_prefix() -> None:
    recs = chunk_md(DOC, "guide.md").records
    # the H1 is the file title: said once, not "Guide > Guide > ..."
    assert recs[3]["embedText"] == "Guide > Configure > Advanced\n\n### Advanced\n\nTune the cache."
    titled = chunk_md("---\ntitle: Handbook\n---\n" + DOC, "guide.md").records
    assert titled[3]["embedText"].startswith("Handbook > Guide > Configure > Advanced\n\n")
    assert recs[3]["headerBreadcrumb"] == "Guide > Configure > Advanced"  # never the file title
    plain = chunk_md(DOC, "guide.md", context_prefix=False).records
    assert all(r["embedText"] == r["originalText"] for r in plain)
    assert plain[0]["metadata"]["analyzer"] != recs[0]["metadata"]["analyzer"]


def test_a_long_breadcrumb_is_cut_to_a_quarter_of_the_target() -> None:
    title = " ".join(["very long heading words"] * 40)
    recs = chunk_md(f"# {title}\n\n## {title}\n\ntext\n", "l.md", target_tokens=64, overlap_tokens=0).records
    for r in recs:
        prefix = r["embedText"][: -len(r["originalText"])]
        assert prefix.endswith("…\n\n")
        assert r["tokenStats"]["tokens"] <= 64 or r["block_type"] == "heading"


def test_hash_is_blake3_of_original_text() -> None:
    for r in chunk_md(DOC, "guide.md").records:
        assert r["hash"] == "blake3:" + blake3(r["originalText"].encode()).hexdigest()


def test_policy_hash() -> None:
    assert re.fullmatch(r"[0-9a-f]{16}", policy_hash(Policy()))
    assert policy_hash(Policy()) == policy_hash(Policy())
    others = [Policy(target_tokens=512), Policy(overlap_tokens=0), Policy(tokenizer="o200k_base"),
              Policy(context_prefix=False), Policy(lang="fr")]  # fmt: skip
    assert len({policy_hash(p) for p in [Policy(), *others]}) == 6


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("# Heading\n\nFirst sentence here. Second one.", "First sentence here."),
        ("- **Bold** item with [a link](http://x) inside.", "Bold item with a link inside."),
        ("```python\nprint('x')\n```", "print('x')"),
        ("| a | b |\n|---|---|\n| 1 | 2 |", "a | b |"),
        ("# Only a heading", "Only a heading"),
        ("日本語の文です。二つ目の文。", "日本語の文です。"),
        ("x" * 500, "x" * 200),
        ("word " * 60, ("word " * 40).strip()),  # the cap falls at a word boundary
        # a sentence soft-wrapped over lines is joined, up to its end (issue 13)
        (
            'It answers "which document\nis about this?" and no more. Then x.',
            'It answers "which document is about this?" and no more.',
        ),
        ("> a quote that\n> wraps. Then more", "a quote that wraps."),
        ("- an item that\n  wraps here. More", "an item that wraps here."),
        ("- one item\n- the next item", "one item"),  # another item is another block
        ("a line\n\nanother paragraph.", "a line"),
        ("Setext title\n===\n\nBody.", "Setext title"),
        # an image inside a link: its alt text, not a string that is not in the source (issue 14)
        ("[![build status](https://x/badge.svg)](https://ci.example.com) passes.", "build status passes."),
        ("see [the [nested] guide](u) now.", "see the [nested] guide now."),
        # deeper than one level of brackets: left as it is, still text of the chunk
        ("[![a [b [c]] d](i)](u) x.", "[![a [b [c]] d](i)](u) x."),
    ],
)
def test_anchor(text: str, want: str) -> None:
    assert anchor(text) == want


_PIECES = ["# ", "## ", "> ", "- ", "1. ", "12) ", "|", "---", "```", "*", "**", "_", "__", "`", "[", "]",
           "(", ")", "![", "](u)", ".", "!", "?", "。", "！", " ", "  ", "\n", "\n\n", "\t", "word",
           "x_y", "é", "日本", "\u3000", "\xa0", "[t](u)", "[![a](i)](u)"]  # fmt: skip


def _is_subsequence(small: str, big: str) -> bool:
    chars = iter(big)
    return all(c in chars for c in small)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=40).map("".join))
def test_an_anchor_is_text_of_its_chunk(text: str) -> None:
    """Marks are dropped and lines joined, nothing is added: the anchor's characters (blanks
    aside) appear in the chunk in order; it is at most 200 characters and never empty when the
    chunk has text; and no link's syntax survives when the links are whole."""
    got = anchor(text)
    assert _is_subsequence(got.replace(" ", ""), "".join(text.split()))
    assert len(got) <= 200
    assert got or not text.split()
    rest = text.replace("[t](u)", "").replace("[![a](i)](u)", "")
    if "[" not in rest and "]" not in rest and "```" not in text:  # code is quoted as it is
        assert "](" not in got


def test_chunk_file_names() -> None:
    assert chunk_file("a/b/README", 3) == "a/b/doc_README__ch3.json"
    assert chunk_file("!", 0) == "doc_!__ch0.json"
    long_a, long_b = chunk_file("d/" + "x" * 300 + "1", 0), chunk_file("d/" + "x" * 300 + "2", 0)
    assert long_a != long_b
    assert all(len(n.rsplit("/", 1)[1].encode()) <= 255 for n in (long_a, long_b))
    assert long_a.endswith("__ch0.json") and long_a.startswith("d/doc_")


@pytest.mark.parametrize(
    "text",
    [
        DOC,
        "日本語の文です。二つ目の文。中文句子通常以句号结尾。",
        "Emoji 🎉 and accents: déjà vu, naïve café.",
    ],
)
def test_estimated_tokens_err_high(text: str) -> None:
    for r in chunk_md(text, "e.md").records:
        assert r["tokenStats"]["estimatedTokens"] >= r["tokenStats"]["tokens"]


@pytest.mark.parametrize(
    "text",
    [
        "def f(x):\n    return x * 2  # code\n",
        (Path(__file__).parent / "split" / "cases" / "atomic.md").read_text().split("\n\n")[3],
        "0x" + "9f3a" * 40,
        "sha256 " + "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "data:image/png;base64," + "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk" * 4,
    ],
    ids=["code", "latex", "hex", "sha256", "base64"],
)
def test_estimated_tokens_err_high_on_dense_ascii(text: str) -> None:
    for r in chunk_md(text, "e.md").records:
        assert r["tokenStats"]["estimatedTokens"] >= r["tokenStats"]["tokens"]


@settings(max_examples=300, deadline=None)
@given(
    st.text(st.sampled_from("ab/é日-_.🙂"), min_size=1, max_size=20).map(lambda s: s.strip("/") or "x"),
    st.integers(0, 130),
    st.integers(1, 1200),
)
def test_chunk_files_name_every_chunk_as_chunk_file_does(stem: str, pad: int, count: int) -> None:
    name = f"docs/{stem}{'x' * pad * 2}"  # long enough, near the limit, to need the short form
    assert chunk_files(name, count) == [chunk_file(name, n) for n in range(count)]


_DENSE = st.text(
    st.sampled_from("0123456789abcdefABCDEFxyzXYZ+/=_-. \n\u00e9\u65e5"), min_size=1, max_size=400
)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        _DENSE,
        st.binary(min_size=1, max_size=300).map(bytes.hex),
        st.text(
            st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=200
        ),
    )
)
def test_estimated_tokens_never_run_below_the_count(text: str) -> None:
    """SPEC §2: ``estimatedTokens`` errs high, on any text (a token is at least one byte)."""
    for r in chunk_md(text, "e.md").records:
        stats = r["tokenStats"]
        assert stats["tokens"] <= stats["estimatedTokens"] <= len(r["embedText"].encode("utf-8")) * 2 + 2


@pytest.mark.parametrize("size", [24, 64, 400])
def test_the_heuristic_alone_errs_high_on_hex_and_base64(size: int) -> None:
    """The character heuristic itself, before mint's clamp: a long run with no blank is dense."""
    import base64
    import random

    rng = random.Random(size)
    raw = bytes(rng.randrange(256) for _ in range(size))
    count = Counter("cl100k_base").count
    for text in (raw.hex(), base64.b64encode(raw).decode(), "0x" + raw.hex()):
        assert estimate_tokens(text) >= count(text), text


_ASCII_LETTERS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_NOT_LETTERS = bytes(b for b in range(128) if b not in _ASCII_LETTERS)


def _estimate_by_regex(text: str) -> int:
    """``estimate_tokens`` as its docstring defines it, dense runs found by a regular expression."""
    ascii_bytes = text.encode("ascii", "ignore")
    letters = len(ascii_bytes) - len(ascii_bytes.translate(None, _ASCII_LETTERS))
    spaces = text.count(" ")
    dense = sum(
        len(run.translate(None, _NOT_LETTERS)) * 2 // 3 + 1
        for run in re.findall(rb"[A-Za-z0-9+/=_-]{24,}", ascii_bytes)
    )
    return (
        -(-letters // 3)
        + (len(ascii_bytes) - letters - spaces)
        + -(-spaces // 4)
        + 2 * (len(text) - len(ascii_bytes))
        + dense
    )


@settings(max_examples=500, deadline=None)
@given(
    st.one_of(
        _DENSE,
        st.lists(
            st.one_of(
                st.text(st.sampled_from("aZ09+/=_-"), min_size=20, max_size=60),
                st.text(st.sampled_from(" .\n\t,é日\x7f"), min_size=0, max_size=3),
            ),
            max_size=12,
        ).map("".join),
        st.text(min_size=0, max_size=200),
    )
)
def test_the_heuristic_finds_the_dense_runs_the_regular_expression_finds(text: str) -> None:
    """The dense runs are found by a byte map and ``find`` (fast); the regex is the definition."""
    assert estimate_tokens(text) == _estimate_by_regex(text), text
