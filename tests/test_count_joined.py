"""``Counter.count_joined`` and ``cut_at`` agree with a full count, whatever the text.

The splitter counts each block once and derives a chunk's count from its blocks'
(``Splitter.draft``); these properties are what makes that exact. The alphabet is
chosen to hit the pre-tokenizer's corners: newlines, blanks, ``/``, punctuation
runs, contractions, digits, combining marks, CJK, odd Unicode blanks.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.tokens import TOKENIZERS, Counter, cut_at, get_encoding

ALPHABET = [
    *"aZé9 \t\n\n\n./'s|`#-*>)…",
    *("\u0301", "\u3000", "\x1c", "\u00a0", "文", "’", "//", "\n  ", "ll"),
]
texts = st.lists(st.sampled_from(ALPHABET), max_size=40).map("".join)
gaps = st.sampled_from(["\n", "\n\n", "\n\n\n", " \n\n", "\n \n", "\t\n", "\n>\n", "", " "])


@pytest.fixture(scope="module", params=TOKENIZERS)
def counter(request: pytest.FixtureRequest) -> Counter:
    return Counter(request.param)


def full(counter: Counter, text: str) -> int:
    return len(get_encoding(counter.name).encode_ordinary(text))


@settings(max_examples=400, deadline=None)
@given(text=texts)
def test_cut_at_splits_the_count(counter: Counter, text: str) -> None:
    for k in range(1, len(text)):
        if cut_at(text, k):
            assert full(counter, text) == full(counter, text[:k]) + full(counter, text[k:]), (text, k)


@settings(max_examples=400, deadline=None)
@given(parts=st.lists(st.tuples(texts.filter(lambda t: t.strip()), gaps), min_size=1, max_size=6), lead=texts)
def test_count_joined_equals_full_count(counter: Counter, parts: list[tuple[str, str]], lead: str) -> None:
    text, spans = lead, []
    for body, gap in parts:
        spans.append((len(text), len(text) + len(body), full(counter, body)))
        text += body + gap
    start, end = spans[0][0], spans[-1][1]
    assert counter.count_joined(text, start, end, spans) == full(counter, text[start:end]), (text, spans)


@settings(max_examples=200, deadline=None)
@given(line=texts, body=texts.filter(lambda t: t.strip()))
def test_prefix_and_body_add_up_at_a_cut(counter: Counter, line: str, body: str) -> None:
    prefix = " ".join(line.split()) + "\n\n"
    embed = prefix + body
    if cut_at(embed, len(prefix)):
        assert full(counter, embed) == full(counter, prefix) + full(counter, body)


def test_cached_counts_are_the_counts(counter: Counter) -> None:
    for text in ("", "a", "Hello, world.\n\n", "x" * 300, "Hello, world.\n\n"):
        assert counter.count(text) == full(counter, text)
