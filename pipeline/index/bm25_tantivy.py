"""BM25 that prunes: a Tantivy index beside the SQLite store (extra ``scale``).

FTS5 scores every row that holds any query word; Tantivy's BlockMax-WAND skips the blocks
of postings that cannot reach the current top k, so a query costs about its top k, not its
matches. The SQLite store stays the truth: its FTS5 table is still written (the exact path,
the fallback), and this index is derived from it and keyed to it:

- **Documents** are the store's ``chunks`` rows: the integer ``row`` (the row's SQLite
  ``rowid``: a fast field, read back without loading documents) and ``body``, the row's
  tokens from FTS5's own tokenizer (``pipeline.index.fts_tokens``) joined by spaces and
  indexed with Tantivy's ``whitespace`` tokenizer: the same terms as the FTS5 table.
- **Queries** are ``analyzer.query_terms``: each term's tokens a term query (one token) or
  a phrase query (several), all SHOULD clauses of one boolean query, so the OR of FTS5's
  query is kept and Tantivy runs BlockMax-WAND over the term clauses.
- **Scores are FTS5's** (``exact``): Tantivy only finds the candidates (``CANDIDATES`` times
  the rows asked for); each candidate is then scored with FTS5's own formula and statistics
  (``pipeline.index.bm25_exact``: ``N`` and ``avgdl`` from FTS5's averages record, the
  exact token counts of the rows), so the list is the one ``bm25()`` gives whenever FTS5's
  top k is among the candidates. Tantivy's own scores differ (Lucene's
  ``ln(1 + (N - n + 0.5) / (n + 0.5))``, lengths quantised to a byte): to rank the
  candidates as FTS5 would, each clause is boosted by FTS5's idf over Tantivy's, so a word
  in most rows (FTS5's idf floor) weighs nearly nothing there either. How often the exact
  top k is among the candidates, and the nDCG both ways, is measured (docs/benchmarks.md).
- **Document counts** ``n`` (``frequency``) are this index's, and exact: Tantivy's
  ``doc_freq`` of the term while no row was deleted since the last build (it would count
  deleted documents until their segment is merged), else the count of live documents
  matching the term or phrase (what FTS5 counts); a phrase is always counted. The index
  holds the store's rows at the generation it records, and a search uses it only at that
  generation, so each ``n`` is FTS5's. Once the rows deleted since the last build pass
  ``REBUILD_RATIO`` of the index, the next run rebuilds it (counting costs more than
  ``doc_freq``; the scores stay exact either way).
- **Exact, and where not**: every score returned is the number ``bm25()`` gives that row,
  and ``N``, ``avgdl`` and each ``n`` are FTS5's, deleted documents or not (before a rebuild,
  below ``REBUILD_RATIO``, they cost time, not exactness). What is not guaranteed is the
  list: a row of FTS5's top k that Tantivy's ranking (boosted, but with its quantised
  lengths) leaves out of the candidates is missing, and the next row takes its place.
- **Freshness**: ``state.json`` inside the folder names the store ``generation`` the index
  reflects; it is replaced (atomically) only after Tantivy's own commit. A reader uses the
  index only when that generation equals the store's, read in the same snapshot as the
  rows it scores, and the searcher it asks is the one opened at that generation; otherwise
  the store's FTS5 answers.
  A rebuild goes to ``<folder>.new`` and is swapped in by renames, so a SIGKILL at any
  point leaves either the previous index or none (then FTS5 answers) and never half of one.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson

from pipeline.errors import UsageError
from pipeline.index.bm25_exact import RowScorer, Weighted, collection, fts5_idf, lucene_idf
from pipeline.index.fts_tokens import Fts5Tokens

STATE = "state.json"
SUFFIX = ".tantivy"  #: the folder beside the store: ``index.sqlite.tantivy``
WRITER_HEAP = 64_000_000  #: bytes of Tantivy's indexing buffer for a run's changes (one thread)
#: A rebuild's buffer: larger, so a million rows make a few segments (fewer merges), not dozens.
REBUILD_HEAP = 512_000_000
#: Rows deleted (or replaced) since the last build, as a share of the index, past which a
#: run rebuilds instead of updating (the statistics of deleted documents stop counting).
REBUILD_RATIO = 0.1
#: Candidates Tantivy finds per row asked for, scored again exactly. The rows asked for include
#: the caller's ``TIE_MARGIN``, which is the slack: with the clauses boosted to FTS5's idf, the
#: exact top 10 of every gold question in the 1M haystack was among them, and more candidates
#: changed no gold set's nDCG but cost each query Python time (docs/benchmarks.md).
CANDIDATES = 1
#: Document counts kept between queries (per generation; past it the memory starts over).
COUNTS_KEPT = 100_000


def _tantivy() -> Any:
    try:
        import tantivy
    except ImportError:
        raise UsageError(
            "the scale BM25 index needs tantivy (hint: pip install 'chunkyard[scale]')"
        ) from None
    return tantivy


def folder_for(store_path: Path) -> Path:
    """Where the BM25 index of the store at ``store_path`` lives."""
    return store_path.with_name(store_path.name + SUFFIX)


def read_state(folder: Path) -> dict[str, Any]:
    """The folder's ``state.json`` (empty when absent or unreadable: treated as stale)."""
    try:
        data = orjson.loads((folder / STATE).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def write_state(folder: Path, state: dict[str, Any]) -> None:
    """Replace ``state.json`` in one step (write beside it, fsync, rename)."""
    tmp = folder / (STATE + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(orjson.dumps(state))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, folder / STATE)


def _schema(tantivy: Any) -> Any:
    builder = tantivy.SchemaBuilder()
    builder.add_integer_field("row", stored=False, indexed=True, fast=True)
    builder.add_text_field("body", stored=False, tokenizer_name="whitespace", index_option="position")
    return builder.build()


class TantivyBm25:
    """The BM25 index in ``folder``: write with ``apply`` / ``rebuild``, read with ``search``."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self._tantivy = _tantivy()
        self._schema = _schema(self._tantivy)
        self._tokens = Fts5Tokens()
        self._index: Any = None
        self._searcher: Any = None
        self._generation: str | None = None
        self._counts: dict[tuple[str, ...], int] = {}
        self._deleted = 0  #: rows deleted since the last build, as the open searcher's state says

    # --- reading --------------------------------------------------------------------------

    def generation(self) -> str | None:
        """The store generation this index reflects (``None``: no index, or never finished)."""
        if not (self.folder / "meta.json").exists():
            return None
        value = read_state(self.folder).get("generation")
        return None if value is None else str(value)

    def _open(self) -> Any:
        state = read_state(self.folder)
        generation = None if state.get("generation") is None else str(state["generation"])
        if self._index is None:
            self._index = self._tantivy.Index.open(str(self.folder))
        if self._searcher is None or generation != self._generation:
            self._index.reload()
            self._searcher = self._index.searcher()
            self._generation = generation
            self._counts = {}
            self._deleted = int(state.get("deleted", 0))
        return self._searcher

    def phrases(self, terms: Sequence[str]) -> list[tuple[str, ...]]:
        """Each query term's FTS5 tokens, in order, a repeated one again (FTS5 scores it again);
        a term without a token is left out (FTS5 drops it too)."""
        found = (tuple(self._tokens.query(term)) for term in terms)
        return [tokens for tokens in found if tokens]

    def _clause(self, tokens: Sequence[str]) -> Any:
        tantivy = self._tantivy
        if len(tokens) == 1:
            return tantivy.Query.term_query(self._schema, "body", tokens[0])
        return tantivy.Query.phrase_query(self._schema, "body", list(tokens))

    def query(self, terms: Sequence[str]) -> Any:
        """The boolean OR of the terms (each a term or a phrase of FTS5 tokens); ``None``: no token."""
        should = self._tantivy.Occur.Should
        clauses = [(should, self._clause(tokens)) for tokens in self.phrases(terms)]
        return self._tantivy.Query.boolean_query(clauses) if clauses else None

    def frequency(self, phrase: tuple[str, ...], searcher: Any = None) -> int:
        """Live documents holding ``phrase`` (adjacent tokens): FTS5's count of rows matching it."""
        searcher = self._open() if searcher is None else searcher
        if phrase not in self._counts:
            if len(self._counts) >= COUNTS_KEPT:
                self._counts = {}
            if len(phrase) == 1 and not self._deleted:
                count = int(searcher.doc_freq("body", phrase[0]))  # no deleted document to count
            else:
                count = int(searcher.search(self._clause(phrase), 1, count=True).count)
            self._counts[phrase] = count
        return self._counts[phrase]

    def candidates(self, terms: Weighted, limit: int, searcher: Any = None) -> list[int]:
        """The rowids of Tantivy's best ``limit`` rows for the phrases ``terms`` (tokens, FTS5's
        idf), each clause boosted from Tantivy's idf to FTS5's, best first."""
        if not terms or limit <= 0:
            return []
        searcher = self._open() if searcher is None else searcher
        tantivy = self._tantivy
        docs = int(searcher.num_docs)
        clauses = []
        for phrase, idf in terms:
            own = sum(lucene_idf(docs, int(searcher.doc_freq("body", token))) for token in phrase)
            clause = self._clause(phrase)
            if own > 0:
                clause = tantivy.Query.boost_query(clause, idf / own)
            clauses.append((tantivy.Occur.Should, clause))
        hits = searcher.search(tantivy.Query.boolean_query(clauses), limit, count=False).hits
        rows = searcher.fast_field_values("row", [address for _, address in hits])
        return [int(row) for row in rows if row is not None]

    def exact(
        self, conn: Any, terms: Sequence[str], k: int, generation: str
    ) -> list[tuple[int, float]] | None:
        """``(rowid, FTS5's BM25)`` of the best rows among ``CANDIDATES * k`` candidates, best
        first, at most ``k``; ``conn``: a connection to the store (its FTS5 table ``fts``) in a
        snapshot at ``generation``. ``None`` when this index has moved past ``generation``
        meanwhile (a run finished between the caller's check and now: FTS5 answers)."""
        phrases = self.phrases(terms)
        searcher = self._open()
        if self._generation != generation:
            return None
        rows, tokens = collection(conn)
        if not phrases or not rows or k <= 0:
            return []
        weighted = [(phrase, fts5_idf(rows, self.frequency(phrase, searcher))) for phrase in phrases]
        found = self.candidates(weighted, CANDIDATES * k, searcher)
        return RowScorer(conn, self._tokens).scores(weighted, found, tokens / rows)[:k]

    def search(self, terms: Sequence[str], k: int) -> list[tuple[int, float]]:
        """``(rowid, Tantivy's BM25 score)`` of Tantivy's ``k`` best rows, best first (ties in
        Tantivy's order): the candidates as Tantivy ranks them, unboosted (``exact`` ranks as FTS5)."""
        query = self.query(terms)
        if query is None or k <= 0:
            return []
        searcher = self._open()
        hits = searcher.search(query, k, count=False).hits
        rows = searcher.fast_field_values("row", [address for _, address in hits])
        return [
            (int(row), float(score)) for (score, _), row in zip(hits, rows, strict=True) if row is not None
        ]

    def worn(self) -> bool:
        """More rows deleted since the last build than ``REBUILD_RATIO`` of the index."""
        state = read_state(self.folder)
        return int(state.get("deleted", 0)) > REBUILD_RATIO * max(1, int(state.get("chunks", 0)))

    def count(self) -> int:
        """Live documents in the index."""
        return int(self._open().num_docs)

    # --- writing --------------------------------------------------------------------------

    def _document(self, rowid: int, tokens: list[str]) -> Any:
        doc = self._tantivy.Document()
        doc.add_integer("row", int(rowid))
        doc.add_text("body", " ".join(tokens))
        return doc

    def apply(
        self, removed: Iterable[int], added: Iterable[tuple[int, str]], generation: str, *, chunks: int
    ) -> None:
        """Drop the rows ``removed``, add ``added`` (rowid, the store's FTS5 body: ``embedText``
        through the index's analyzer, whichever it is), then commit and record ``generation``
        (after Tantivy's commit: a crash in between leaves it stale)."""
        deleted = int(read_state(self.folder).get("deleted", 0))
        index = self._tantivy.Index.open(str(self.folder))
        writer = index.writer(heap_size=WRITER_HEAP, num_threads=1)
        try:
            for rowid in removed:
                writer.delete_documents_by_term("row", int(rowid))
                deleted += 1
            for rowid, text in added:
                writer.add_document(self._document(rowid, self._tokens.analyzed(text)))
            writer.commit()
        except BaseException:
            writer.rollback()
            raise
        writer.wait_merging_threads()
        write_state(self.folder, {"generation": generation, "chunks": chunks, "deleted": deleted})
        self._index = self._searcher = None

    def rebuild(self, rows: Iterable[tuple[int, str]], generation: str, *, chunks: int) -> None:
        """A new index of ``rows`` (rowid, the store's FTS5 body: ``embedText`` analyzed) in
        ``<folder>.new``, swapped in when whole; one commit at the end."""
        fresh = self.folder.with_name(self.folder.name + ".new")
        shutil.rmtree(fresh, ignore_errors=True)
        fresh.mkdir(parents=True)
        index = self._tantivy.Index(self._schema, path=str(fresh))
        writer = index.writer(heap_size=REBUILD_HEAP, num_threads=1)
        for rowid, body in rows:
            writer.add_document(self._document(rowid, self._tokens.analyzed(body)))
        writer.commit()
        writer.wait_merging_threads()
        write_state(fresh, {"generation": generation, "chunks": chunks, "deleted": 0})
        swap_in(fresh, self.folder)
        self._index = self._searcher = None

    def close(self) -> None:
        self._index = self._searcher = None
        self._tokens.close()


def swap_in(fresh: Path, folder: Path) -> None:
    """Replace ``folder`` by ``fresh``: the old one is renamed away first, removed last."""
    old = folder.with_name(folder.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        os.replace(folder, old)
    os.replace(fresh, folder)
    shutil.rmtree(old, ignore_errors=True)


def remove(folder: Path) -> None:
    """Delete the index (and any leftover of an interrupted rebuild)."""
    for path in (folder, folder.with_name(folder.name + ".new"), folder.with_name(folder.name + ".old")):
        shutil.rmtree(path, ignore_errors=True)
