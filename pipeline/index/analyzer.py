"""The BM25 side's analyzer: one function for the indexed text and the query alike (001 rule 4).

FTS5's ``unicode61`` tokenizer keeps a run of CJK characters as one token, so ``文本``
would never match inside ``中文文本``. The analyzer therefore puts a space around every
CJK character before FTS5 sees the text, at index time and at query time; a query's CJK
run then becomes a phrase of characters that must be adjacent. Query syntax is never
passed to FTS5: the query is cut into words at white space, punctuation and symbols (as
FTS5's ``unicode61`` cuts the text; ``_`` joins, so ``response_model`` stays one phrase),
each word is quoted as a phrase (quotes are doubled), and the phrases are OR-ed so that a
long query still finds the chunks sharing most of its words. Words, not white-space pieces
(``state-of-the-art`` is four terms, not one phrase; ``Get-ChildItem`` two): better on the
gold sets of ``bench/gold`` in hybrid search (docs/benchmarks.md).
"""

from __future__ import annotations

import re
import unicodedata

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


#: Every character below the first CJK block: text made of these alone has no CJK character
#: (one range test per character, where ``_CJK`` tests each of its ranges).
_BELOW_CJK = re.compile("[\x00-\u2e7f]*")


def may_hold_cjk(text: str) -> bool:
    """False when ``text`` has no character from U+2E80 on, hence no CJK one (most texts)."""
    return _BELOW_CJK.match(text).end() != len(text)  # type: ignore[union-attr]  # ``*`` always matches


def analyze(text: str) -> str:
    """The text as FTS5 gets it: every CJK character a token of its own (a space either side).

    ``split`` on the capturing pattern alternates text and CJK characters, so joining the
    pieces by spaces is ``sub(r" \\1 ")`` without a Python call per character."""
    return " ".join(_CJK.split(text)) if may_hold_cjk(text) and _CJK.search(text) else text


def words(query: str) -> list[str]:
    """The query's words: runs of the characters FTS5's ``unicode61`` keeps in a token (Unicode
    categories L*, N*, Co), plus combining marks (M*: a word's marks stay with it, and FTS5
    then cuts the quoted word as it cuts the text) and ``_`` (``response_model`` stays one
    phrase). Everything else (white space, punctuation, symbols, emoji) separates words."""
    out: list[str] = []
    current: list[str] = []
    for ch in query:
        category = unicodedata.category(ch)
        if ch == "_" or category[0] in "LNM" or category == "Co":
            current.append(ch)
        elif current:
            out.append("".join(current))
            current = []
    if current:
        out.append("".join(current))
    return out


def query_terms(query: str) -> list[str]:
    """The query's words, analyzed, de-duplicated ignoring case, in order, at most ``MAX_TERMS``."""
    seen: dict[str, str] = {}
    for word in words(query):
        term = " ".join(analyze(word).split())
        if term and term.casefold() not in seen:
            seen[term.casefold()] = term
            if len(seen) >= MAX_TERMS:
                break
    return list(seen.values())


def fts5_query(terms: list[str]) -> str:
    """An FTS5 MATCH expression that is only quoted phrases: no syntax reaches the parser."""
    return " OR ".join('"' + term.replace('"', '""') + '"' for term in terms)
