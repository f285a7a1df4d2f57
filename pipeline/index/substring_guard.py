"""When BM25 found nothing, whether the substring fallback can find anything at all.

A question whose words match no chunk falls back to the chunks whose ``originalText``
contains the question itself (``VectorStore.substring``). On the SQLite store that is a
scan of every row's text: at a million chunks, seconds for an answer that is almost always
empty. For the default analyzer (``pipeline.index.analyzer``: FTS5's ``unicode61`` tokens
after the CJK split) an empty BM25 result proves the scan empty in most cases, and then the
scan is skipped; the result is the same.

The argument: ``embedText`` ends with ``originalText`` (``docs/spec.md``), so a chunk whose
text contains the needle holds, in its indexed body, every word of the needle that the
needle shows whole. A word is whole when the needle has a separator on each side of it (a
character that is neither a letter, a digit, a private-use character, a mark nor ``_``:
FTS5 separates tokens there too), or when that side of it is a CJK character (the analyzer
makes each one a token of its own, so it is a whole token wherever it stands). Such a
word's tokens then stand in the body in the same order, side by side: the phrase BM25
searched for that word matches, so BM25 would not have come back empty. The word must have
been searched (``query_terms`` keeps the first ``MAX_TERMS`` distinct words, one spelling
of those equal but for case: only ASCII case is taken as equal here) and have at least one
token (a letter, a digit or a private-use character).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

from pipeline.index.analyzer import analyze, words


def _cjk(ch: str) -> bool:
    return analyze(ch) != ch


def _has_token(word: str) -> bool:
    return any(unicodedata.category(ch)[0] in "LN" or unicodedata.category(ch) == "Co" for ch in word)


def substring_ruled_out(needle: str, terms: Sequence[str]) -> bool:
    """``True`` when BM25's OR of ``terms`` (the default analyzer's ``query_terms`` of the
    query ``needle`` was cut from) found nothing, and so no chunk's text contains ``needle``."""
    exact = set(terms)
    folded = {term.casefold() for term in terms if term.isascii()}  # FTS5 folds ASCII case alike
    pieces = words(needle)
    for i, word in enumerate(pieces):
        whole_left = i > 0 or not needle.startswith(word) or _cjk(word[0])
        whole_right = i < len(pieces) - 1 or not needle.endswith(word) or _cjk(word[-1])
        term = " ".join(analyze(word).split())
        searched = term in exact or (term.isascii() and term.casefold() in folded)
        if whole_left and whole_right and _has_token(word) and searched:
            return True
    return False
