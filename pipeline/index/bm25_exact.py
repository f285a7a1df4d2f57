"""FTS5's ``bm25()`` of given rows, computed outside FTS5 from the store's own statistics.

A ranker that prunes (``pipeline.index.bm25_tantivy``) and the CJK windows
(``pipeline.index.windows``) both need the score FTS5 would give a few rows, without FTS5
scoring every row that holds a query word to find them. This module is that computation,
once. For a query of phrases ``P1 .. Pm`` (``analyzer.query_terms``, each term's FTS5 tokens
a phrase, in the query's order; a phrase given twice counts twice, as it does in FTS5), SQLite's
``fts5Bm25Function`` (``ext/fts5/fts5_aux.c``) gives a row::

    score = sum_i idf_i * (tf_i * (k1 + 1)) / (tf_i + k1 * (1 - b + b * D / avgdl))
    idf_i = ln((N - n_i + 0.5) / (n_i + 0.5)), or 1e-6 where that is not positive

and ``bm25(fts)`` returns its negation. Where each figure comes from here:

- ``N`` and ``avgdl``: FTS5's ``averages`` record (row 1 of the table's ``fts_data``: the row
  count, then each column's total token count, as varints). FTS5 updates it at every insert
  and delete in the same transaction, so it is the table's exact figure for the snapshot it
  is read in, for the cost of one small read (``collection``).
- ``n_i``: the rows matching phrase ``i`` (FTS5 counts them with ``xQueryPhrase``). The caller
  gives it: an FTS5 count of the phrase (``fts5_frequency``), or the count of another index
  of the same rows and tokens (``TantivyBm25.frequency``).
- ``tf_i`` and ``D``: the row's ``body`` from the FTS5 table through FTS5's own tokenizer
  (``pipeline.index.fts_tokens``: the tokens FTS5 indexed), ``tf_i`` the phrase's
  occurrences (adjacent tokens; overlapping runs count, as FTS5's instances do), ``D`` the
  token count (FTS5's ``xColumnSize``).
- ``k1`` 1.2, ``b`` 0.75, the weight of the table's one column 1 (``bm25(fts)`` without
  weights).

The operations run in FTS5's order, in doubles, with the same ``log``, so a score equals
``bm25()``'s to the last bit, not only closely (the tests compare them).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from pipeline.index.fts_tokens import Fts5Tokens

K1 = 1.2
B = 0.75
#: FTS5's idf for a phrase in half the rows or more (its formula would be zero or negative).
IDF_FLOOR = 1e-6
#: ``fts_data``'s row holding FTS5's averages record (``FTS5_AVERAGES_ROWID``).
AVERAGES_ROWID = 1
_BATCH = 500

#: A query's phrases with their idf: ``((token, ...), idf)``, in the query's order.
Weighted = Sequence[tuple[tuple[str, ...], float]]


def fts5_idf(rows: int, frequency: int) -> float:
    """FTS5's idf: ``ln((N - n + 0.5) / (n + 0.5))``, floored at ``IDF_FLOOR``."""
    idf = math.log((rows - frequency + 0.5) / (frequency + 0.5))
    return idf if idf > 0.0 else IDF_FLOOR


def lucene_idf(rows: int, frequency: int) -> float:
    """Lucene's (and Tantivy's) idf, ``ln(1 + (N - n + 0.5) / (n + 0.5))``: never negative;
    0 for a phrase no row holds."""
    return math.log((rows - frequency + 0.5) / (frequency + 0.5) + 1.0) if frequency else 0.0


class Counted(list[str]):
    """A text's tokens with their counts: a one-token phrase is counted by a lookup, and a
    phrase whose first token the text lacks is not searched for."""

    def __init__(self, tokens: Iterable[str]) -> None:
        super().__init__(tokens)
        self.counts = Counter(self)


def occurrences(phrase: tuple[str, ...], tokens: list[str]) -> int:
    """How often ``phrase`` occurs in ``tokens`` as adjacent tokens (overlapping runs count)."""
    counts = tokens.counts if isinstance(tokens, Counted) else None
    first = phrase[0]
    if len(phrase) == 1:
        return counts[first] if counts is not None else tokens.count(first)
    if (counts is not None and not counts[first]) or first not in tokens:
        return 0
    found, size, start = 0, len(phrase), 0
    try:
        while True:  # each place the first token is, found by ``index`` (in C), then compared
            start = tokens.index(first, start) + 1
            found += tuple(tokens[start - 1 : start - 1 + size]) == phrase
    except ValueError:
        return found


def okapi(idfs: Sequence[float], tfs: Sequence[int], length: int, average: float) -> float:
    """The BM25 sum over phrases of idf ``idfs`` occurring ``tfs`` times in a text of ``length``
    tokens, against the mean length ``average``, in FTS5's order of operations."""
    norm = K1 * (1 - B + B * length / average) if average > 0 else K1
    score = 0.0
    for idf, count in zip(idfs, tfs, strict=True):
        if count:
            tf = float(count)
            score += idf * ((tf * (K1 + 1.0)) / (tf + norm))
    return score


def bm25(terms: Weighted, texts: Sequence[list[str]], average: float) -> float:
    """Okapi BM25 of the phrases ``terms`` over ``texts`` read as one text (their counts and
    lengths summed), against the mean length ``average``."""
    tfs = [sum(occurrences(phrase, tokens) for tokens in texts) for phrase, _ in terms]
    return okapi([idf for _, idf in terms], tfs, sum(len(t) for t in texts), average)


def read_varints(blob: bytes) -> list[int]:
    """SQLite's varints (big-endian groups of 7 bits, the 9th byte whole), as FTS5 writes them."""
    values: list[int] = []
    i = 0
    while i < len(blob):
        value = 0
        for j in range(9):
            byte = blob[i]
            i += 1
            if j == 8:
                value = (value << 8) | byte
                break
            value = (value << 7) | (byte & 0x7F)
            if not byte & 0x80:
                break
        values.append(value)
    return values


def collection(conn: Any, table: str = "fts") -> tuple[int, int]:
    """``(N, total tokens)`` of the FTS5 ``table``, from its averages record (``(0, 0)`` for a
    table never written)."""
    for (block,) in conn.execute(f"SELECT block FROM {table}_data WHERE id = ?", (AVERAGES_ROWID,)):
        values = read_varints(bytes(block))
        if values:
            return values[0], sum(values[1:])
    return 0, 0


def fts5_frequency(conn: Any, term: str, table: str = "fts") -> int:
    """The rows of ``table`` that match the query term ``term`` (one quoted phrase), as FTS5
    counts them. It reads every match: for an index whose other engine counts faster, that one."""
    phrase = '"' + term.replace('"', '""') + '"'
    return int(next(iter(conn.execute(f"SELECT count(*) FROM {table} WHERE {table} MATCH ?", (phrase,))))[0])


def fts_bodies(conn: Any, rowids: Sequence[int]) -> list[tuple[int, str]]:
    """``(rowid, body)`` of these rows of the FTS5 table ``fts`` (``embedText`` through the
    index's analyzer: what FTS5 indexed), in batches of bound parameters; rows gone are absent."""
    found: list[tuple[int, str]] = []
    for i in range(0, len(rowids), _BATCH):
        part = list(rowids[i : i + _BATCH])
        marks = ",".join("?" * len(part))
        for rowid, body in conn.execute(f"SELECT rowid, body FROM fts WHERE rowid IN ({marks})", part):
            found.append((int(rowid), str(body)))
    return found


class RowScorer:
    """FTS5's BM25 of given rows of the table ``fts`` on the connection ``conn``."""

    def __init__(self, conn: Any, tokens: Fts5Tokens | None = None) -> None:
        self.conn = conn
        self.tokens = tokens if tokens is not None else Fts5Tokens()

    def texts(self, rowids: Sequence[int]) -> dict[int, list[str]]:
        """Each row's tokens (its ``body`` through FTS5's tokenizer); rows gone are absent."""
        wanted = list(dict.fromkeys(int(r) for r in rowids))
        return {rowid: self.tokens.analyzed(body) for rowid, body in fts_bodies(self.conn, wanted)}

    def scores(self, terms: Weighted, rowids: Sequence[int], average: float) -> list[tuple[int, float]]:
        """``(rowid, score)`` of the rows that match a phrase of ``terms`` (FTS5's ``-bm25()``),
        best first, ties by rowid; rows that match none, or are gone, are left out."""
        idfs = [idf for _, idf in terms]
        firsts = {phrase[0] for phrase, _ in terms}
        scored = []
        for rowid, tokens in self.texts(rowids).items():
            # the phrases' first tokens counted in one pass in C (``filter`` over a set's
            # ``__contains__``): a row's other tokens cost no Python call
            counts = Counter(filter(firsts.__contains__, tokens))
            if not counts:
                continue
            tfs = [
                counts[phrase[0]]
                if len(phrase) == 1 or not counts[phrase[0]]
                else occurrences(phrase, tokens)
                for phrase, _ in terms
            ]
            if any(tfs):
                scored.append((rowid, okapi(idfs, tfs, len(tokens), average)))
        scored.sort(key=lambda h: (-h[1], h[0]))
        return scored
