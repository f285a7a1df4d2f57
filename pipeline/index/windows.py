"""BM25 over a chunk and its neighbours: how ``search`` ranks CJK text on the BM25 side.

A chunk's budget is counted in cl100k tokens, and cl100k spends about a token per Chinese or
Japanese character where an English word costs one: a 256-token chunk of Chinese holds a
few sentences, a fraction of what the same budget holds in English. A learner's question
shares a handful of bigrams with its answer, and in so little text those bigrams are often
spread over the chunk and its neighbours, so BM25 over the chunk alone ranks the answer's
chunk below a chunk that repeats one frequent bigram (the per-question evidence on the
d2l-zh and fastapi-zh-ja gold sets is in docs/benchmarks.md).

``WindowScorer`` re-scores the BM25 list of an index with the CJK analyzer: each candidate's
score becomes ``(1 - WINDOW_SHARE) * own + WINDOW_SHARE * window``, where ``window`` is
Okapi BM25 (``pipeline.index.bm25_exact``: k1 1.2, b 0.75 as FTS5's, but Lucene's idf, never
negative) of the query over the text of the chunk and its
``WINDOW`` neighbours on each side in its document, read as one text (the term counts and
lengths summed), against an average length ``2 * WINDOW + 1`` times the index's. The
candidates are the ``WINDOW_POOL`` best by BM25 over the chunk alone **and every chunk whose
window holds one of them** (a candidate's neighbours): the chunk that answers often shares few
of the question's bigrams itself while its neighbour shares many, and it is that chunk the
window exists to find. A neighbour's own score is FTS5's BM25 of its row, 0 when it matches no
term, computed for that row alone (``bm25_exact.RowScorer``: the number ``bm25()`` gives it,
on the scale the candidates' scores are on, whichever ranker found them), not by running the
query through FTS5 again. The list returned is the rescored one, best first. Term statistics
(rows and total tokens from FTS5's averages record, document frequencies counted by FTS5, or
by the scale BM25 index while it is current: the same numbers) come from the index's own FTS5 table, the tokens from FTS5's own tokenizer over the analyzed
``embedText`` (what the table holds), the neighbours from the chunk folder (as the passage
merge finds them), so an index updated run by run ranks as a fresh build of the same chunks
does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pipeline.index.analyzer import FTS5_TOKENIZE
from pipeline.index.analyzers import Analysis
from pipeline.index.bm25_exact import (
    Counted,
    RowScorer,
    bm25,
    collection,
    fts5_frequency,
    fts5_idf,
    lucene_idf,
)
from pipeline.index.expand import ChunkFiles, ChunkSpan
from pipeline.index.fts_tokens import Fts5Tokens

#: Neighbours on each side that join a chunk's window (0: BM25 over the chunk alone).
WINDOW = 1
#: The window score's share of a candidate's BM25 score (the chunk's own keeps the rest).
WINDOW_SHARE = 0.5
#: BM25 candidates rescored (the best of them by window score make the BM25 list).
WINDOW_POOL = 200
#: Chunks whose tokens are kept across queries (past it the memory starts over).
TOKENS_KEPT = 50_000

Reader = Callable[[Path], dict[str, Any] | None]


class WindowScorer:
    """Window BM25 over the SQLite index at ``path`` (its FTS5 table ``fts``) and the chunk
    folder ``out``; ``analysis``: the index's analyzer; ``read``: how a chunk file is read."""

    def __init__(
        self,
        path: Path,
        out: Path,
        analysis: Analysis,
        read: Reader,
        window: int = WINDOW,
        counts: Callable[[tuple[str, ...]], int | None] | None = None,
    ) -> None:
        import apsw

        self.out = out
        self.analysis = analysis
        self.read = read
        self.window = window
        self._conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
        self._conn.set_busy_timeout(10_000)
        self._fts = Fts5Tokens(FTS5_TOKENIZE)  # FTS5's own tokenizer, for queries and texts alike
        self._rows = RowScorer(self._conn, self._fts)
        self._stats: tuple[str, int, float] | None = None  # (generation, rows, mean tokens per row)
        self._df: dict[str, int] = {}
        self._tokens: dict[tuple[str, str], Counted] = {}
        #: Another index's count of the rows holding a phrase (the searcher's scale BM25 index
        #: while it is current: a lookup where FTS5 reads every match); ``None`` from it, or no
        #: such index: FTS5 counts.
        self.counts = counts

    def close(self) -> None:
        self._fts.close()
        self._conn.close()

    def _collection(self, generation: str) -> tuple[int, float]:
        """(rows, mean tokens per row) of the FTS5 table, read again when ``generation`` moves."""
        if self._stats is None or self._stats[0] != generation:
            rows, total = collection(self._conn)
            self._stats = (generation, rows, float(total) / rows if rows else 0.0)
            self._df = {}
        return self._stats[1], self._stats[2]

    def _frequency(self, term: str) -> int:
        """Rows holding the query term (a phrase for a term of several tokens), as FTS5 counts them."""
        if term not in self._df:
            tokens = tuple(self._fts.query(term))
            found = self.counts(tokens) if self.counts is not None and tokens else None
            self._df[term] = fts5_frequency(self._conn, term) if found is None else found
        return self._df[term]

    def _chunk_tokens(self, chunk_id: str, record: dict[str, Any]) -> Counted:
        text = str(record.get("embedText") or record.get("originalText") or "")
        key = (chunk_id, str(record.get("hash", "")))
        if key not in self._tokens:
            if len(self._tokens) >= TOKENS_KEPT:
                self._tokens.clear()
            self._tokens[key] = Counted(self._fts.analyzed(self.analysis.analyze(text)))
        return self._tokens[key]

    def rescore(
        self,
        query: str,
        hits: Sequence[tuple[str, float]],
        files: dict[str, str],
        generation: str,
        depth: int,
    ) -> list[tuple[str, float]]:
        """``hits`` (chunk id, BM25 over the chunk; best first) rescored with their windows, the
        best ``depth`` of them; ``files``: each hit's chunk file, relative to the chunk folder."""
        if not hits or self.window <= 0:
            return list(hits[:depth])
        rows, mean = self._collection(generation)
        terms, exact = [], []
        for term in self.analysis.query_terms(query):
            tokens = self._fts.query(term)
            if tokens:
                frequency = self._frequency(term)
                terms.append((tuple(tokens), lucene_idf(rows, frequency)))
                exact.append((tuple(tokens), fts5_idf(rows, frequency)))
        lookup = ChunkFiles(self.out, None, self.read)
        own = dict(hits)
        members = {chunk_id: self._members(lookup, chunk_id, files.get(chunk_id)) for chunk_id, _ in hits}
        # the candidates' neighbours are candidates too: a window holding a good candidate
        # may be better than the candidate's own
        extra = sorted({m for found in members.values() for m in found} - own.keys())
        if extra:
            own.update(self._own_scores(exact, extra, mean))
            for chunk_id in extra:
                own.setdefault(chunk_id, 0.0)
                members[chunk_id] = self._members(lookup, chunk_id, self._file_of(lookup, chunk_id))
        scored = []
        for chunk_id, found in members.items():
            window = self._tokens_of(lookup, found)
            score = own[chunk_id]
            if window:
                score = (1.0 - WINDOW_SHARE) * score + WINDOW_SHARE * bm25(
                    terms, window, mean * (2 * self.window + 1)
                )
            scored.append((chunk_id, score))
        scored.sort(key=lambda p: (-p[1], p[0]))
        return scored[:depth]

    def _own_scores(
        self, terms: Sequence[tuple[tuple[str, ...], float]], chunk_ids: Sequence[str], mean: float
    ) -> dict[str, float]:
        """FTS5's BM25 (positive, as ``lexical`` gives it) of the rows of the chunks ``chunk_ids``
        that match a phrase of ``terms`` (tokens, FTS5's idf); a chunk matching none is absent."""
        if not terms:
            return {}
        ids: dict[int, str] = {}
        for i in range(0, len(chunk_ids), 500):
            part = list(chunk_ids[i : i + 500])
            marks = ",".join("?" * len(part))
            for rowid, chunk_id in self._conn.execute(
                f"SELECT rowid, chunk_id FROM chunks WHERE chunk_id IN ({marks})", part
            ):
                ids[int(rowid)] = str(chunk_id)
        return {ids[rowid]: score for rowid, score in self._rows.scores(terms, list(ids), mean)}

    def _file_of(self, lookup: ChunkFiles, chunk_id: str) -> str | None:
        """A neighbour's chunk file, relative to the chunk folder (as ``lookup`` found it)."""
        path = lookup.paths.get(chunk_id)
        return path.relative_to(self.out).as_posix() if path is not None else None

    def _members(self, lookup: ChunkFiles, chunk_id: str, chunk_file: str | None) -> list[str]:
        """The chunk and its neighbours within the window (``[]`` when its file cannot be read)."""
        if chunk_file is None:
            return []
        lookup.remember(chunk_id, chunk_file)
        span = lookup(chunk_id)
        if span is None:
            return []
        members = [chunk_id]
        before: ChunkSpan | None = span
        after: ChunkSpan | None = span
        for _ in range(self.window):
            before = lookup(before.prev_id) if before is not None and before.prev_id else None
            after = lookup(after.next_id) if after is not None and after.next_id else None
            members += [s.chunk_id for s in (before, after) if s is not None]
        return members

    def _tokens_of(self, lookup: ChunkFiles, members: Sequence[str]) -> list[Counted]:
        """The token lists of a window's chunks (those whose files can be read)."""
        out = []
        for member in members:
            record = self.read(lookup.paths[member]) if member in lookup.paths else None
            if record is not None:
                out.append(self._chunk_tokens(member, record))
        return out


def window_scorer(
    db: Any,
    meta: dict[str, str],
    out: Path,
    read: Reader,
    window: int | None,
    counts: Callable[[tuple[str, ...]], int | None] | None = None,
) -> WindowScorer | None:
    """The scorer ``search`` uses over the open store ``db``: an index built with the CJK
    analyzer in the SQLite store gets ``WINDOW`` (or ``window``) neighbours a side; any other
    index (or ``window`` 0) ranks BM25 over each chunk alone (``None``). ``counts``: the phrase
    counts of the scale BM25 index, when the searcher has one (``WindowScorer.counts``)."""
    from pipeline.index.analyzers import analysis, base_of
    from pipeline.index.cjk import BIGRAMS

    name = meta.get("analyzer", "")
    size = WINDOW if window is None else window
    if size <= 0 or db.kind != "sqlite-vec" or not name.endswith(BIGRAMS):
        return None
    found = analysis(name, base_of(name) + "+cjk-chars")
    if found is None:
        return None
    return WindowScorer(Path(db.path), out, found, read, size, counts)
