"""Token counts: toktok (the counter) gives tiktoken's counts (the reference), whatever the text.

The alphabet is chosen to hit the pre-tokenizer's corners: newlines, blanks, ``/``,
punctuation runs, contractions, digits, combining marks, CJK, odd Unicode blanks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.stages.tokens import ENCODINGS, Counter, get_encoding

ALPHABET = [
    *"aZé9 \t\n\n\n./'s|`#-*>)…",
    *("\u0301", "\u3000", "\x1c", "\u00a0", "文", "’", "//", "\n  ", "ll"),
]
texts = st.lists(st.sampled_from(ALPHABET), max_size=40).map("".join)


@pytest.fixture(scope="module", params=ENCODINGS)  # wordpiece: tests/test_wordpiece.py
def counter(request: pytest.FixtureRequest) -> Counter:
    return Counter(request.param)


def full(counter: Counter, text: str) -> int:
    return len(get_encoding(counter.name).encode_ordinary(text))


def test_cached_counts_are_the_counts(counter: Counter) -> None:
    for text in ("", "a", "Hello, world.\n\n", "x" * 300, "Hello, world.\n\n"):
        assert counter.count(text) == full(counter, text)


# The counter is toktok (Rust); tiktoken is the reference. Counts must match exactly.
EDGES = [
    "<|endoftext|>", "a<|endoftext|>b", "<|fim_prefix|>x", " " * 3000, "a" * 5000, "\n" * 700,
    "文字化け、日本語のテキスト。", "👩‍👩‍👧‍👦 family", "e\u0301\u0301", "\ufeffBOM", "\x00\x01\x1f", "\r\n\r\n",
    "https://example.com/a/b?c=d&e=f#g", "    indented code\n\tand a tab", "ﬁ ligature ǅ", "0" * 1001,
    "".join(map(chr, range(0x20, 0x3000, 7))),
]


@pytest.mark.parametrize("text", EDGES, ids=range(len(EDGES)))
def test_toktok_counts_as_tiktoken_on_edge_cases(counter: Counter, text: str) -> None:
    assert Counter(counter.name).count(text) == full(counter, text)


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=200) | texts)
def test_toktok_counts_as_tiktoken_on_any_text(counter: Counter, text: str) -> None:
    assert Counter(counter.name).count(text) == full(counter, text)


@pytest.mark.corpora
def test_toktok_counts_as_tiktoken_on_every_corpus_paragraph(counter: Counter, corpora_dir: Path) -> None:
    """Every paragraph (blank-line separated) of every shared corpus, both encodings."""
    encode = get_encoding(counter.name).encode_ordinary
    fresh = Counter(counter.name)
    checked = 0
    for path in sorted(corpora_dir.rglob("*.md")):
        text = path.read_bytes().decode("utf-8", "replace").replace("\r\n", "\n")
        for para in text.split("\n\n"):
            assert fresh.count(para) == len(encode(para)), (path, para[:80])
            fresh._cache.clear()
            checked += 1
    assert checked > 100_000
