"""The default store: one SQLite file with sqlite-vec (vectors) and FTS5 (BM25).

The file itself (the connection, the schema, transactions) is ``pipeline.index.sqlite_db``;
reading sqlite-vec's own tables (every vector as one matrix) is ``pipeline.index.sqlite_vectors``.

Tables: ``meta`` (key → value), ``chunks`` (the payload; its rowid is the FTS row's),
``vectors`` (``vec0``, ``chunk_id TEXT PRIMARY KEY``, cosine), ``fts`` (FTS5 over the
analyzed ``embedText``) and ``embed_cache`` ((model, digest) → vector, token count, the
generation that last used it). sqlite-vec 0.1.9 has no upsert: a changed vector is
DELETE + INSERT, inside the run's one transaction. WAL mode: ``search`` reads the last
committed index while ``index`` writes the next one.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np

from pipeline.index.analyzer import ANALYZER, fts5_query
from pipeline.index.analyzers import analysis
from pipeline.index.cache_group import Entries
from pipeline.index.rows import ChunkRow, RowState, Vector
from pipeline.index.sqlite_db import (
    checkpoint_after_writes,
    deferred_checkpoint,
    in_batches,
    open_database,
    prepare_writer,
    transaction,
)
from pipeline.index.sqlite_rows import INSERT, UPDATE, insert_fresh, inserted, moved
from pipeline.index.sqlite_vectors import Matrix, ids_with_vectors, read_matrix
from pipeline.index.vector_store import TIE_MARGIN, StoreError, best_first

#: Cache entries no live chunk uses are kept this many runs (an edit undone, a file moved
#: out and back in, cost no embedding), then pruned.
CACHE_RUNS = 5
#: Dense search takes this many candidates beyond k (the matrix path then scores them as vec0
#: does); both cut at k after the tie-break, so equal scores across the cut resolve by chunk id.
_MARGIN = TIE_MARGIN
_COSINE = "SELECT vec_distance_cosine(?, ?)"


class SqliteStore:
    """``VectorStore`` over one SQLite file (see the module docstring for the layout)."""

    kind = "sqlite-vec"
    analyzer = ANALYZER

    def __init__(self, path: Path, dim: int | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = open_database(self.path)
        self._dim = dim
        self._vectors_exist = False
        self._dense_calls = 0
        self._cached_matrix: tuple[str, Matrix | None] | None = None
        self._writer_ready = False
        #: digests this store's ``put_cache`` marked used by the generation in progress:
        #: ``commit`` need not mark them again
        self._marked: tuple[int, str, set[str]] = (0, "", set())
        #: the index's own analyzer (a new index: the default, until a run chooses another)
        self.analyzer = self.meta().get("analyzer") or ANALYZER

    def _analyze(self, text: str) -> str:
        """``text`` as the full-text index gets it, by the index's analyzer (runs check it is known)."""
        return self._analyzer()(text)

    def _analyzer(self) -> Callable[[str], str]:
        """The index's analyzer as one function (looked up once for many rows)."""
        found = analysis(self.analyzer, ANALYZER)
        if found is None:
            raise StoreError(
                f"{self.path}: unknown BM25 analyzer {self.analyzer!r} (hint: rebuild with --rebuild)"
            )
        return found.analyze

    # --- reading --------------------------------------------------------------------------

    def meta(self) -> dict[str, str]:
        return {str(k): str(v) for k, v in self._conn.execute("SELECT key, value FROM meta")}

    def states(self) -> dict[str, RowState]:
        return {
            cid: RowState(file, h, digest, row_digest, int(tokens), policy)
            for cid, file, h, digest, row_digest, tokens, policy in self._conn.execute(
                "SELECT chunk_id, file, hash, digest, row_digest, model_tokens, policy_hash FROM chunks"
            )
        }

    def states_for(self, files: Collection[str], ids: Collection[str]) -> dict[str, RowState]:
        found: dict[str, RowState] = {}
        for column, values in (("file", files), ("chunk_id", ids)):
            for part in in_batches(sorted(values)):
                for cid, file, h, digest, row_digest, tokens, policy in self._conn.execute(
                    "SELECT chunk_id, file, hash, digest, row_digest, model_tokens, policy_hash FROM chunks "
                    f"WHERE {column} IN ({','.join('?' * len(part))})",
                    part,
                ):
                    found[cid] = RowState(file, h, digest, row_digest, int(tokens), policy)
        return found

    def rows(self, chunk_ids: Collection[str]) -> dict[str, ChunkRow]:
        found: dict[str, ChunkRow] = {}
        for part in in_batches(list(chunk_ids)):
            marks = ",".join("?" * len(part))
            for cid, payload in self._conn.execute(
                f"SELECT chunk_id, payload FROM chunks WHERE chunk_id IN ({marks})", part
            ):
                found[cid] = ChunkRow.from_json(payload)
        return found

    def cached(self, model: str, digests: Collection[str]) -> dict[str, tuple[Vector, int]]:
        found: dict[str, tuple[Vector, int]] = {}
        for part in in_batches(list(digests)):
            marks = ",".join("?" * len(part))
            for digest, blob, tokens in self._conn.execute(
                f"SELECT digest, vector, tokens FROM embed_cache WHERE model = ? AND digest IN ({marks})",
                [model, *part],
            ):
                found[digest] = (np.frombuffer(blob, dtype=np.float32), int(tokens))
        return found

    def dense(self, vector: Vector, k: int) -> list[tuple[str, float]]:
        if not self._has_vectors() or k <= 0:
            return []
        query = np.asarray(vector, dtype=np.float32)
        self._dense_calls += 1
        matrix = self._matrix() if self._dense_calls > 1 else None
        if matrix is None:  # one query (the CLI): vec0's own brute-force KNN, nothing to load
            hits = [
                (cid, 1.0 - float(dist))
                for cid, dist in self._conn.execute(
                    "SELECT chunk_id, distance FROM vectors WHERE embedding MATCH ? AND k = ? ORDER BY distance",
                    (query.tobytes(), min(k + _MARGIN, 4096)),  # vec0's limit on k
                )
            ]
            return best_first(hits, k)  # a tie across the cut: the chunk id decides, as in the matrix path
        ids, vectors = matrix
        if not ids:
            return []
        wanted = min(len(ids), k + _MARGIN)
        near = np.argpartition(-(vectors @ query), wanted - 1)[:wanted]
        raw = query.tobytes()
        # the candidates' scores as vec0 computes them: both paths give the same numbers
        hits = [(ids[i], 1.0 - self._cosine_distance(vectors[i].tobytes(), raw)) for i in near.tolist()]
        return best_first(hits, k)

    def _cosine_distance(self, a: bytes, b: bytes) -> float:
        for (dist,) in self._conn.execute(_COSINE, (a, b)):
            return float(dist)
        raise StoreError(f"{self.path}: vec_distance_cosine returned nothing")

    def _matrix(self) -> Matrix | None:
        """Every stored vector as one in-memory matrix, for a ``Searcher`` asking many queries:
        one matrix product is much faster than vec0's scan (docs/benchmarks.md).

        Read from vec0's own tables (``pipeline.index.sqlite_vectors``) once, again whenever a
        run has committed since (meta ``generation``). ``None`` (vec0's KNN answers) when the
        layout is not the expected one.
        """
        meta = self.meta()
        generation = meta.get("generation", "")
        if self._cached_matrix is not None and self._cached_matrix[0] == generation:
            return self._cached_matrix[1]
        found = read_matrix(self._conn, int(meta.get("dim", "0") or 0))
        if found is not None:
            self._cached_matrix = (generation, found)
        return found

    def lexical(self, terms: Sequence[str], k: int) -> list[tuple[str, float]]:
        if not terms or k <= 0:
            return []
        match = fts5_query(list(terms))
        # FTS5 alone first, scoring and sorting inside the full-text table; then the chunk ids
        # of the k best only (a join sorted by (score, chunk_id) reads every matching row)
        top = list(
            self._conn.execute(
                "SELECT rowid, bm25(fts) AS s FROM fts WHERE fts MATCH ? ORDER BY s LIMIT ?", (match, k + 1)
            )
        )
        if len(top) > k and top[k][1] == top[k - 1][1]:  # a tie across the cut: chunk ids decide
            return [
                (cid, -float(score))
                for cid, score in self._conn.execute(
                    "SELECT c.chunk_id, bm25(fts) AS s FROM fts JOIN chunks c ON c.rowid = fts.rowid "
                    "WHERE fts MATCH ? ORDER BY s, c.chunk_id LIMIT ?",
                    (match, k),
                )
            ]
        top = top[:k]
        marks = ",".join("?" * len(top))
        ids = {
            int(rowid): str(cid)
            for rowid, cid in self._conn.execute(
                f"SELECT rowid, chunk_id FROM chunks WHERE rowid IN ({marks})", [r for r, _ in top]
            )
        }
        return best_first([(ids[r], -float(score)) for r, score in top if r in ids])

    def substring(self, needle: str, k: int) -> list[tuple[str, float]]:
        if not needle or k <= 0:
            return []
        hits = [
            (cid, float((len(text) - len(text.replace(needle, ""))) // len(needle)))
            for cid, text in self._conn.execute(
                "SELECT chunk_id, text FROM chunks WHERE instr(text, ?) > 0", (needle,)
            )
        ]
        return best_first(hits, k)

    # --- writing --------------------------------------------------------------------------

    def put_cache(self, model: str, entries: Mapping[str, tuple[Vector, int]]) -> None:
        """One transaction per call: each returned batch is durable as it comes (unlike LanceDB's
        groups, ``pipeline.index.cache_group``; a run's progress shows in the file)."""
        if entries:
            # the generation the run in progress will commit: its rows need not be rewritten then
            generation = int(self.meta().get("generation", "0")) + 1
            with self._writing():
                self._insert_cache({(model, d): entry for d, entry in entries.items()}, generation)

    def _insert_cache(self, entries: Entries, generation: int) -> None:
        """Cache ``entries`` as used by ``generation``, and remember them so (``_marked``)."""
        self._conn.executemany(
            "INSERT OR REPLACE INTO embed_cache(model, digest, vector, tokens, used) VALUES (?,?,?,?,?)",
            [
                (model, d, np.asarray(v, dtype=np.float32).tobytes(), t, generation)
                for (model, d), (v, t) in entries.items()
            ],
        )
        for model, digest in entries:
            if self._marked[:2] != (generation, model):
                self._marked = (generation, model, set())
            self._marked[2].add(digest)

    def commit(
        self,
        upserts: Sequence[tuple[ChunkRow, Vector | None]],
        deletes: Collection[str],
        meta: Mapping[str, str],
        *,
        model: str,
    ) -> None:
        generation = int(meta.get("generation", "0"))
        with self._writing(checkpoint=False):
            if upserts and any(v is not None for _, v in upserts):
                self._ensure_vectors(next(len(v) for _, v in upserts if v is not None))
            for cid in sorted(deletes):
                self._drop(cid, keep_vector=False)
            stored = self._stored_ids([row.chunk_id for row, vector in upserts if vector is not None])
            fresh: list[tuple[ChunkRow, Vector]] = []
            for row, vector in upserts:
                if vector is not None and row.chunk_id not in stored:
                    fresh.append((row, vector))
                else:
                    self._put(row, vector)
            self._insert_fresh(fresh)
            self._conn.executemany(
                "INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", sorted(meta.items())
            )
            marked = self._marked[2] if self._marked[:2] == (generation, model) else set()
            # live digests are kept anyway (NOT IN below)
            used = sorted({row.digest for row, _ in upserts}.difference(marked))
            for part in in_batches(used):
                self._conn.execute(
                    "UPDATE embed_cache SET used = ? WHERE model = ? AND used <> ? "
                    f"AND digest IN ({','.join('?' * len(part))})",
                    [generation, model, generation, *part],
                )
            self._conn.execute(
                "DELETE FROM embed_cache WHERE used < ? AND digest NOT IN (SELECT digest FROM chunks)",
                (generation - CACHE_RUNS,),
            )

    @contextmanager
    def _writing(self, *, checkpoint: bool = True) -> Iterator[None]:
        """One write transaction; the first readies the connection for writing (``prepare_writer``).
        ``checkpoint=False``: this transaction's ``COMMIT`` copies no WAL back into the file
        (``deferred_checkpoint``), the run's commit: searchable without waiting for the copy."""
        with ExitStack() as after_commit, transaction(self._conn, self.path):
            if not self._writer_ready:
                prepare_writer(self._conn)
                self._writer_ready = True
            if not checkpoint:  # set after prepare_writer's own setting, reset after the COMMIT
                after_commit.enter_context(deferred_checkpoint(self._conn))
            yield

    def checkpoint(self) -> None:
        """Move the WAL into the database file and empty it (before the file is swapped out)."""
        self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self) -> None:
        if self._writer_ready:  # once: a second close has nothing to checkpoint
            self._writer_ready = False
            checkpoint_after_writes(self._conn)
        self._conn.close()

    # --- inside ---------------------------------------------------------------------------

    def _has_vectors(self) -> bool:
        if not self._vectors_exist:
            self._vectors_exist = bool(
                list(self._conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='vectors'"))
            )
        return self._vectors_exist

    def _ensure_vectors(self, dim: int) -> None:
        if not self._has_vectors():
            self._conn.execute(
                f"CREATE VIRTUAL TABLE vectors USING vec0(chunk_id TEXT PRIMARY KEY, "
                f"embedding float[{int(dim)}] distance_metric=cosine)"
            )

    def _vector_ids(self, chunk_ids: list[str]) -> set[str]:
        """Those of ``chunk_ids`` that have a vector (all of them when vec0's id table cannot be read)."""
        return ids_with_vectors(self._conn, chunk_ids) if self._has_vectors() else set()

    def _stored_ids(self, chunk_ids: list[str]) -> set[str]:
        """Those of ``chunk_ids`` the store holds rows for."""
        found: set[str] = set()
        for part in in_batches(chunk_ids):
            marks = ",".join("?" * len(part))
            found.update(
                cid
                for (cid,) in self._conn.execute(
                    f"SELECT chunk_id FROM chunks WHERE chunk_id IN ({marks})", part
                )
            )
        return found

    def _insert_fresh(self, rows: Sequence[tuple[ChunkRow, Vector]]) -> None:
        """Rows the store does not hold yet, with their vectors: three ``executemany`` in all,
        no per-row lookups or deletes (a new index writes every row this way; ``sqlite_rows``)."""
        if not rows:
            return
        orphans = self._vector_ids([r.chunk_id for r, _ in rows])  # a drifted store: a vector without its row
        if orphans:
            self._conn.executemany(
                "DELETE FROM vectors WHERE chunk_id = ?", [(cid,) for cid in sorted(orphans)]
            )
        insert_fresh(self._conn, rows, self._analyzer())

    def _drop(self, cid: str, *, keep_vector: bool) -> None:
        found = list(self._conn.execute("SELECT rowid FROM chunks WHERE chunk_id = ?", (cid,)))
        if found:
            self._conn.execute("DELETE FROM fts WHERE rowid = ?", (found[0][0],))
            self._conn.execute("DELETE FROM chunks WHERE rowid = ?", (found[0][0],))
        if not keep_vector and self._has_vectors():
            self._conn.execute("DELETE FROM vectors WHERE chunk_id = ?", (cid,))

    def _put(self, row: ChunkRow, vector: Vector | None) -> None:
        """Replace (or add) one row; a ``None`` vector keeps the stored one (same text)."""
        if vector is None:  # the same embedded text: vector and FTS row stay, the payload moves
            self._conn.execute(UPDATE, moved(row))
            if self._conn.changes():
                return
        self._drop(row.chunk_id, keep_vector=vector is None)
        self._conn.execute(INSERT, inserted(row))
        rowid = self._conn.last_insert_rowid()
        self._conn.execute(
            "INSERT INTO fts(rowid, body) VALUES (?, ?)", (rowid, self._analyze(row.embed_text))
        )
        if vector is not None:
            self._conn.execute(
                "INSERT INTO vectors(chunk_id, embedding) VALUES (?, ?)",
                (row.chunk_id, np.asarray(vector, dtype=np.float32).tobytes()),
            )
