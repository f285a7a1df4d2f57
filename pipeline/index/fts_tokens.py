"""The BM25 analyzer's tokens, exactly as FTS5 makes them, for an engine that does not run FTS5.

The scale BM25 engine (``pipeline.index.bm25_tantivy``) must index and query the very
terms the SQLite store's FTS5 table holds, because the analyzer is part of ``index_hash``
and a citation names it. Rather than re-implement ``unicode61`` (Unicode categories,
diacritic folding) and the Porter stemmer, the text goes through FTS5's own tokenizer,
which ``apsw`` exposes as a callable (``Connection.fts5_tokenizer``): the same C code, the
same configuration string (``FTS5_TOKENIZE``), after the same ``analyze`` (CJK characters
one by one). The engine then indexes the tokens joined by single spaces with a plain
white-space tokenizer, and looks each query word up as the token (or, for a word FTS5 cuts
into several tokens, the phrase of tokens) that FTS5 would match.
"""

from __future__ import annotations

from typing import Any

from pipeline.errors import UsageError
from pipeline.index.analyzer import FTS5_TOKENIZE, analyze


class Fts5Tokens:
    """FTS5's tokenizer (``FTS5_TOKENIZE``) as a function of a text: its tokens, in order."""

    def __init__(self, tokenize: str = FTS5_TOKENIZE) -> None:
        try:
            import apsw
        except ImportError:
            raise UsageError(
                "the scale BM25 index needs apsw (hint: pip install 'chunkyard[index]')"
            ) from None
        self._apsw = apsw
        self._conn = apsw.Connection(":memory:")
        name, *args = tokenize.split()
        self._tokenizer: Any = self._conn.fts5_tokenizer(name, args)

    def _tokens(self, text: str, reason: int) -> list[str]:
        found = self._tokenizer(
            text.encode("utf-8"), reason, None, include_offsets=False, include_colocated=False
        )
        return found if isinstance(found, list) else [str(t) for t in found]  # apsw's: a list of str

    def document(self, text: str) -> list[str]:
        """The tokens FTS5 indexes for ``text`` (an ``embedText``), analyzer included."""
        return self._tokens(analyze(text), self._apsw.FTS5_TOKENIZE_DOCUMENT)

    def analyzed(self, body: str) -> list[str]:
        """The tokens FTS5 indexes for ``body``, a text ``analyze`` already ran on (the store's
        FTS5 column: ``analyze`` is idempotent, so running it again would only cost time)."""
        return self._tokens(body, self._apsw.FTS5_TOKENIZE_DOCUMENT)

    def query(self, term: str) -> list[str]:
        """The tokens of one query term (``analyzer.query_terms``' output): one token for a
        word, several (a phrase, adjacent in that order) for a CJK run or a word FTS5 cuts."""
        return self._tokens(term, self._apsw.FTS5_TOKENIZE_QUERY)

    def close(self) -> None:
        self._conn.close()
