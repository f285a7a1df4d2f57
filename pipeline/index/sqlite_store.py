"""The default store: one SQLite file with sqlite-vec (vectors) and FTS5 (BM25).

Why ``apsw`` and not ``pysqlite3-binary``: the stdlib ``sqlite3`` of many Pythons (this
machine's pyenv build among them) cannot load extensions; ``apsw`` can, ships wheels for
Linux, macOS and Windows with a current SQLite (FTS5 built in), and leaves transactions to
us (no implicit ``BEGIN``), which is what an all-or-nothing ``commit`` needs.
``pysqlite3-binary`` publishes Linux wheels only.

Tables: ``meta`` (key → value), ``chunks`` (the payload; its rowid is the FTS row's),
``vectors`` (``vec0``, ``chunk_id TEXT PRIMARY KEY``, cosine), ``fts`` (FTS5 over the
analyzed ``embedText``) and ``embed_cache`` ((model, digest) → vector, token count, the
generation that last used it). sqlite-vec 0.1.9 has no upsert: a changed vector is
DELETE + INSERT, inside the run's one transaction. WAL mode: ``search`` reads the last
committed index while ``index`` writes the next one.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import UsageError
from pipeline.index.analyzer import ANALYZER, FTS5_TOKENIZE, fts5_query
from pipeline.index.analyzers import analysis
from pipeline.index.rows import ChunkRow, RowState, Vector
from pipeline.index.vector_store import TIE_MARGIN, StoreError, best_first

#: Cache entries no live chunk uses are kept this many runs (an edit undone, a file moved
#: out and back in, cost no embedding), then pruned.
CACHE_RUNS = 5
_BATCH = 500  #: ids per ``IN (...)`` list
#: Dense search takes this many candidates beyond k (the matrix path then scores them as vec0
#: does); both cut at k after the tie-break, so equal scores across the cut resolve by chunk id.
_MARGIN = TIE_MARGIN
_COSINE = "SELECT vec_distance_cosine(?, ?)"
_BLOCKS = "SELECT rowid, vectors FROM vectors_vector_chunks00"
_WHERE = "SELECT id, chunk_id, chunk_offset FROM vectors_rowids WHERE chunk_id IS NOT NULL"


def _connect(path: Path) -> Any:
    try:
        import apsw
        import sqlite_vec
    except ImportError as exc:
        raise UsageError(
            f"the SQLite index needs apsw and sqlite-vec ({exc.name} is missing) "
            "(hint: pip install 'chunkyard[index]')"
        ) from None
    try:
        conn = apsw.Connection(str(path))
        conn.set_busy_timeout(10_000)
        conn.enable_load_extension(True)
        conn.load_extension(sqlite_vec.loadable_path())
        conn.enable_load_extension(False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")  # WAL: a killed process loses nothing committed
    except apsw.Error as exc:
        raise StoreError(f"{path}: cannot open the index ({exc}) (hint: is it a chunkyard index?)") from None
    return conn


#: The ``chunks`` columns a row's move may change while its embedded text (``digest``) stays;
#: each is a ``ChunkRow`` attribute of the same name (``payload`` is ``row.to_json()``).
_MOVABLE = (
    "file", "hash", "row_digest", "model_tokens", "policy_hash", "doc_id", "section_id", "source_file", "text",
)  # fmt: skip
_UPDATE = f"UPDATE chunks SET {', '.join(f'{c} = ?' for c in _MOVABLE)}, payload = ? WHERE chunk_id = ?"
_INSERTED = ("chunk_id", "digest", *_MOVABLE)
_INSERT = (
    f"INSERT INTO chunks({', '.join(_INSERTED)}, payload) VALUES ({', '.join('?' * (len(_INSERTED) + 1))})"
)


class SqliteStore:
    """``VectorStore`` over one SQLite file (see the module docstring for the layout)."""

    kind = "sqlite-vec"
    analyzer = ANALYZER

    def __init__(self, path: Path, dim: int | None = None) -> None:
        import apsw

        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = _connect(self.path)
        self._dim = dim
        self._vectors_exist = False
        self._dense_calls = 0
        self._cached_matrix: tuple[str, tuple[list[str], Any]] | None = None
        try:
            self._conn.execute(
                "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
                "CREATE TABLE IF NOT EXISTS chunks(chunk_id TEXT NOT NULL UNIQUE, file TEXT NOT NULL,"
                " hash TEXT NOT NULL, digest TEXT NOT NULL, row_digest TEXT NOT NULL,"
                " model_tokens INTEGER NOT NULL, policy_hash TEXT NOT NULL, doc_id TEXT NOT NULL,"
                " section_id TEXT NOT NULL,"
                " source_file TEXT NOT NULL, text TEXT NOT NULL, payload BLOB NOT NULL);"
                "CREATE INDEX IF NOT EXISTS chunks_doc ON chunks(doc_id);"
                "CREATE INDEX IF NOT EXISTS chunks_source ON chunks(source_file);"
                # an incremental run reads the rows of the touched files; the cache's pruning
                # looks for old entries and for digests still in use: none of them a full scan
                "CREATE INDEX IF NOT EXISTS chunks_file ON chunks(file);"
                "CREATE INDEX IF NOT EXISTS chunks_digest ON chunks(digest);"
                f"CREATE VIRTUAL TABLE IF NOT EXISTS fts USING fts5(body, tokenize='{FTS5_TOKENIZE}');"
                "CREATE TABLE IF NOT EXISTS embed_cache(model TEXT NOT NULL, digest TEXT NOT NULL,"
                " vector BLOB NOT NULL, tokens INTEGER NOT NULL, used INTEGER NOT NULL,"
                " PRIMARY KEY(model, digest)) WITHOUT ROWID;"
                "CREATE INDEX IF NOT EXISTS embed_cache_used ON embed_cache(used);"
            )
        except apsw.Error as exc:
            raise StoreError(f"{self.path}: cannot set up the index ({exc})") from None
        #: the index's own analyzer (a new index: the default, until a run chooses another)
        self.analyzer = self.meta().get("analyzer") or ANALYZER

    def _analyze(self, text: str) -> str:
        """``text`` as the full-text index gets it, by the index's analyzer (runs check it is known)."""
        found = analysis(self.analyzer, ANALYZER)
        if found is None:
            raise StoreError(
                f"{self.path}: unknown BM25 analyzer {self.analyzer!r} (hint: rebuild with --rebuild)"
            )
        return found.analyze(text)

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
            for part in _parts(sorted(values)):
                for cid, file, h, digest, row_digest, tokens, policy in self._conn.execute(
                    "SELECT chunk_id, file, hash, digest, row_digest, model_tokens, policy_hash FROM chunks "
                    f"WHERE {column} IN ({','.join('?' * len(part))})",
                    part,
                ):
                    found[cid] = RowState(file, h, digest, row_digest, int(tokens), policy)
        return found

    def rows(self, chunk_ids: Collection[str]) -> dict[str, ChunkRow]:
        found: dict[str, ChunkRow] = {}
        for part in _parts(list(chunk_ids)):
            marks = ",".join("?" * len(part))
            for cid, payload in self._conn.execute(
                f"SELECT chunk_id, payload FROM chunks WHERE chunk_id IN ({marks})", part
            ):
                found[cid] = ChunkRow.from_json(payload)
        return found

    def cached(self, model: str, digests: Collection[str]) -> dict[str, tuple[Vector, int]]:
        found: dict[str, tuple[Vector, int]] = {}
        for part in _parts(list(digests)):
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

    def _matrix(self) -> tuple[list[str], Any] | None:
        """Every stored vector as one in-memory matrix, for a ``Searcher`` asking many queries:
        one matrix product is much faster than vec0's scan (docs/benchmarks.md).

        Read from vec0's own tables (sqlite-vec 0.1's layout: vectors in blocks, a row per id
        with its block and offset) once, again whenever a run has committed since (meta
        ``generation``). ``None`` (vec0's KNN answers) when the layout is not the expected one.
        """
        import apsw

        meta = self.meta()
        generation = meta.get("generation", "")
        if self._cached_matrix is not None and self._cached_matrix[0] == generation:
            return self._cached_matrix[1]
        try:
            blocks = {int(b): blob for b, blob in self._conn.execute(_BLOCKS)}
            where = [(str(cid), int(block), int(offset)) for cid, block, offset in self._conn.execute(_WHERE)]
            count = int(next(iter(self._conn.execute("SELECT count(*) FROM chunks")))[0])
        except apsw.Error:
            return None
        dim = int(meta.get("dim", "0") or 0)
        if not dim or len(where) != count or any(len(b) % (dim * 4) for b in blocks.values()):
            return None
        base: dict[int, int] = {}
        parts = []
        rows = 0
        for block, blob in sorted(blocks.items()):
            base[block] = rows
            parts.append(np.frombuffer(blob, dtype=np.float32).reshape(-1, dim))
            rows += len(parts[-1])
        if any(block not in base for _, block, _ in where):
            return None
        positions = np.array([base[block] + offset for _, block, offset in where], dtype=np.int64)
        if len(positions) and int(positions.max()) >= rows:
            return None
        stacked = np.concatenate(parts) if parts else np.zeros((0, dim), dtype=np.float32)
        found = ([cid for cid, _, _ in where], np.ascontiguousarray(stacked[positions]))
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
        if not entries:
            return
        generation = int(self.meta().get("generation", "0"))
        with self._transaction():
            self._conn.executemany(
                "INSERT OR REPLACE INTO embed_cache(model, digest, vector, tokens, used) VALUES (?,?,?,?,?)",
                [
                    (model, d, np.asarray(v, dtype=np.float32).tobytes(), t, generation)
                    for d, (v, t) in entries.items()
                ],
            )

    def commit(
        self,
        upserts: Sequence[tuple[ChunkRow, Vector | None]],
        deletes: Collection[str],
        meta: Mapping[str, str],
        *,
        model: str,
    ) -> None:
        generation = int(meta.get("generation", "0"))
        with self._transaction():
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
            used = sorted({row.digest for row, _ in upserts})  # live digests are kept anyway (NOT IN below)
            for part in _parts(used):
                self._conn.execute(
                    f"UPDATE embed_cache SET used = ? WHERE model = ? AND digest IN ({','.join('?' * len(part))})",
                    [generation, model, *part],
                )
            self._conn.execute(
                "DELETE FROM embed_cache WHERE used < ? AND digest NOT IN (SELECT digest FROM chunks)",
                (generation - CACHE_RUNS,),
            )

    def checkpoint(self) -> None:
        """Move the WAL into the database file and empty it (before the file is swapped out)."""
        self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self) -> None:
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
        """Those of ``chunk_ids`` that have a vector, from vec0's id table (sqlite-vec 0.1's
        layout); all of them when that table cannot be read (each is then deleted, if there)."""
        import apsw

        if not self._has_vectors():
            return set()
        found: set[str] = set()
        try:
            for part in _parts(chunk_ids):
                marks = ",".join("?" * len(part))
                found.update(
                    str(cid)
                    for (cid,) in self._conn.execute(
                        f"SELECT id FROM vectors_rowids WHERE id IN ({marks})", part
                    )
                )
        except apsw.Error:
            return set(chunk_ids)
        return found

    def _stored_ids(self, chunk_ids: list[str]) -> set[str]:
        """Those of ``chunk_ids`` the store holds rows for."""
        found: set[str] = set()
        for part in _parts(chunk_ids):
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
        no per-row lookups or deletes (a new index writes every row this way)."""
        if not rows:
            return
        orphans = self._vector_ids([r.chunk_id for r, _ in rows])  # a drifted store: a vector without its row
        if orphans:
            self._conn.executemany(
                "DELETE FROM vectors WHERE chunk_id = ?", [(cid,) for cid in sorted(orphans)]
            )
        self._conn.executemany(_INSERT, [(*(getattr(r, c) for c in _INSERTED), r.to_json()) for r, _ in rows])
        self._conn.executemany(
            "INSERT INTO fts(rowid, body) SELECT rowid, ? FROM chunks WHERE chunk_id = ?",
            [(self._analyze(r.embed_text), r.chunk_id) for r, _ in rows],
        )
        self._conn.executemany(
            "INSERT INTO vectors(chunk_id, embedding) VALUES (?, ?)",
            [(r.chunk_id, np.asarray(v, dtype=np.float32).tobytes()) for r, v in rows],
        )

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
            self._conn.execute(
                _UPDATE,
                (*(getattr(row, c) for c in _MOVABLE), row.to_json(), row.chunk_id),
            )
            if self._conn.changes():
                return
        self._drop(row.chunk_id, keep_vector=vector is None)
        self._conn.execute(_INSERT, (*(getattr(row, c) for c in _INSERTED), row.to_json()))
        rowid = self._conn.last_insert_rowid()
        self._conn.execute(
            "INSERT INTO fts(rowid, body) VALUES (?, ?)", (rowid, self._analyze(row.embed_text))
        )
        if vector is not None:
            self._conn.execute(
                "INSERT INTO vectors(chunk_id, embedding) VALUES (?, ?)",
                (row.chunk_id, np.asarray(vector, dtype=np.float32).tobytes()),
            )

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """``BEGIN IMMEDIATE`` … ``COMMIT``, rolled back on any exception (a SIGKILL: SQLite's WAL)."""
        import apsw

        try:
            self._conn.execute("BEGIN IMMEDIATE")
        except apsw.Error as exc:
            raise StoreError(
                f"{self.path}: the index is locked by another writer ({exc}) "
                "(hint: wait for it, or find the process holding the file)"
            ) from None
        try:
            yield
            self._conn.execute("COMMIT")
        except apsw.Error as exc:
            if not self._conn.get_autocommit():
                self._conn.execute("ROLLBACK")
            raise StoreError(
                f"{self.path}: the index could not be written ({exc}); it is as it was"
            ) from None
        except BaseException:
            if not self._conn.get_autocommit():
                self._conn.execute("ROLLBACK")
            raise


def _parts(items: list[str]) -> Iterator[list[str]]:
    for i in range(0, len(items), _BATCH):
        yield items[i : i + _BATCH]
