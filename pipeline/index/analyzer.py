"""The BM25 side's analyzer: one function for the indexed text and the query alike (001 rule 4).

FTS5's ``unicode61`` tokenizer keeps a run of CJK characters as one token, so ``文本``
would never match inside ``中文文本``. The analyzer therefore puts a space around every
CJK character before FTS5 sees the text, at index time and at query time; a query's CJK
run then becomes a phrase of characters that must be adjacent. Query syntax is never
passed to FTS5: each whitespace-separated piece of the query is quoted as a phrase
(``"state-of-the-art"`` is the phrase *state of the art*; quotes are doubled), and the
phrases are OR-ed so that a long query still finds the chunks sharing most of its words.
"""

from __future__ import annotations

import re

#: FTS5's tokenizer configuration (the ``tokenize=`` argument of the table).
FTS5_TOKENIZE = "porter unicode61 remove_diacritics 2"
#: The analyzer's name, kept in the index and compared at every run and query.
ANALYZER = f"fts5:{FTS5_TOKENIZE}+cjk-chars"
#: The LanceDB store's analyzer (its own FTS: simple tokenizer, English stemming, lower case,
#: ASCII folding, stop words kept), on the same CJK-split text.
LANCE_ANALYZER = "lance-fts:simple+english-stem+lower+ascii-fold+cjk-chars"
#: A query longer than this many distinct pieces keeps only its first ones (a 10 KB query
#: would otherwise be an OR of thousands of phrases).
MAX_TERMS = 64

_CJK = re.compile(
    "([\u2e80-\u2fdf\u3040-\u30ff\u3100-\u312f\u3190-\u31ff\u3400-\u4dbf\u4e00-\u9fff"
    "\uac00-\ud7af\uf900-\ufaff\uff66-\uff9f\U00020000-\U0002fa1f])"
)


def analyze(text: str) -> str:
    """The text as FTS5 gets it: every CJK character a token of its own."""
    return _CJK.sub(r" \1 ", text) if _CJK.search(text) else text


def query_terms(query: str) -> list[str]:
    """The query's pieces, analyzed, de-duplicated, in order, at most ``MAX_TERMS``."""
    seen: dict[str, None] = {}
    for piece in query.split():
        term = " ".join(analyze(piece).split())
        if term and term not in seen:
            seen[term] = None
            if len(seen) >= MAX_TERMS:
                break
    return list(seen)


def fts5_query(terms: list[str]) -> str:
    """An FTS5 MATCH expression that is only quoted phrases: no syntax reaches the parser."""
    return " OR ".join('"' + term.replace('"', '""') + '"' for term in terms)
