"""The second store: a LanceDB folder (extra ``lancedb``), for when one SQLite file is not enough.

Tables ``chunks`` (payload, analyzed text, vector) and ``cache`` ((model, digest) → vector),
plus ``meta.json``. Their text columns are written uncompressed (``UNCOMPRESSED``: a new
table's; an older store's compressed ones are read and written as they are). Rows and cache
entries the tables lack are appended (``add``: one Arrow table built column by column, no join); the others are ``merge_insert`` on their key, which
joins against the whole table. Deletes are ``delete(IN …)``. Each write is a table version
and a data file, so cached vectors are written in groups (``pipeline.index.cache_group``).
LanceDB has no transaction across tables, so ``commit`` orders its steps: rows in, rows
out, the FTS index rebuilt, then ``meta.json`` (the cursor) replaced atomically. A run
killed in between leaves the cursor behind its writes; the next run replays the same
changes, which are idempotent (at-least-once, where SQLite gives exactly-once). Each
commit is a new table version: ``optimize()`` compacts them every few runs.

The FTS index is rebuilt whole by each commit that changes rows, which costs in proportion
to the table, not to the change: it is what keeps BM25 scores equal to a fresh index's.
Lance's incremental paths differ: rows not yet indexed are scanned but scored with the
index's statistics alone, and an index updated by ``optimize()`` keeps deleted rows in its
document count, lengths and frequencies until rebuilt (an edit is a delete and an add).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Collection, Mapping, Sequence
from operator import attrgetter
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from pipeline.errors import UsageError
from pipeline.index.analyzer import LANCE_ANALYZER
from pipeline.index.analyzers import analysis
from pipeline.index.cache_group import WaitingVectors
from pipeline.index.rows import ChunkRow, RowState, Vector
from pipeline.index.vector_store import TIE_MARGIN, StoreError, best_first

META = "meta.json"
OPTIMIZE_EVERY = 10  #: commits between compactions
#: Lance's field metadata for a column written as it is: compressing the text columns (their
#: default) is most of ``add``'s time, for a quarter of the table's size (docs/benchmarks.md)
UNCOMPRESSED = {"lance-encoding:compression": "none"}
_COLUMNS = ["chunk_id", "file", "hash", "digest", "row_digest", "policy_hash", "model_tokens"]
#: the ``chunks`` columns that are ``ChunkRow`` attributes of the same name, as one getter
_ROW_COLUMNS = (*(c for c in _COLUMNS if c != "row_digest"), "doc_id", "section_id", "source_file", "text")
_row_columns = attrgetter(*_ROW_COLUMNS)


def _quote(values: Collection[str]) -> str:
    return ",".join("'" + v.replace("'", "''") + "'" for v in values)


class LanceStore:
    """``VectorStore`` over a LanceDB folder (see the module docstring)."""

    kind = "lancedb"
    analyzer = LANCE_ANALYZER

    def __init__(self, path: Path, dim: int | None = None) -> None:
        try:
            import lancedb
            import pyarrow as pa
        except ImportError as exc:
            raise UsageError(
                f"the LanceDB store needs lancedb ({exc.name} is missing) (hint: pip install 'chunkyard[lancedb]')"
            ) from None
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._pa = pa
        self._db = lancedb.connect(str(self.path))
        self._dim = dim or int(self.meta().get("dim", "0") or 0)
        self._chunks: Any = self._open("chunks")
        self._cache: Any = self._open("cache")
        #: keys this store found absent from the cache (``cached``) and has not written since:
        #: one writer holds the store (``store_lock``), so they can be added without a merge
        self._absent: set[str] = set()
        self._waiting = WaitingVectors()  #: ``put_cache``'s vectors not written yet
        #: the index's own analyzer (a new index: the default, until a run chooses another)
        self.analyzer = self.meta().get("analyzer") or LANCE_ANALYZER

    def _analyze(self, text: str) -> str:
        """``text`` as the full-text index gets it, by the index's analyzer (runs check it is known)."""
        found = analysis(self.analyzer, LANCE_ANALYZER)
        if found is None:
            raise StoreError(
                f"{self.path}: unknown BM25 analyzer {self.analyzer!r} (hint: rebuild with --rebuild)"
            )
        return found.analyze(text)

    def _open(self, name: str) -> Any:
        try:
            return self._db.open_table(name)
        except (FileNotFoundError, ValueError):
            return None

    def _schema(self, name: str) -> Any:
        pa, dim = self._pa, self._dim
        vector = pa.field("vector", pa.list_(pa.float32(), dim))
        if name == "cache":
            return pa.schema(
                [
                    pa.field("key", pa.string(), metadata=UNCOMPRESSED),
                    vector,
                    pa.field("tokens", pa.int64()),
                    pa.field("used", pa.int64()),
                ]
            )
        text = [
            pa.field(c, pa.string(), metadata=UNCOMPRESSED)
            for c in ("doc_id", "section_id", "source_file", "text", "body", "payload")
        ]
        head = [pa.field(c, pa.string(), metadata=UNCOMPRESSED) for c in _COLUMNS[:-1]]
        return pa.schema([*head, pa.field("model_tokens", pa.int64()), *text, vector])

    def _table(self, name: str) -> Any:
        table = self._chunks if name == "chunks" else self._cache
        if table is None:
            if not self._dim:
                raise StoreError(
                    f"{self.path}: the index has no vectors yet (hint: run `chunkyard index` first)"
                )
            table = self._db.create_table(name, schema=self._schema(name), exist_ok=True)
            if name == "chunks":
                self._chunks = table
            else:
                self._cache = table
        return table

    # --- reading --------------------------------------------------------------------------

    def meta(self) -> dict[str, str]:
        try:
            data = orjson.loads((self.path / META).read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, orjson.JSONDecodeError) as exc:
            raise StoreError(
                f"{self.path / META}: unreadable ({exc}) (hint: rebuild with --rebuild)"
            ) from None
        return {str(k): str(v) for k, v in data.items()}

    def _scan(self, table: Any, where: str | None, columns: list[str]) -> list[dict[str, Any]]:
        if table is None:
            return []
        query = table.search()
        if where:
            query = query.where(where)
        rows: list[dict[str, Any]] = query.select(columns).limit(None).to_list()
        return rows

    def states(self) -> dict[str, RowState]:
        return {
            r["chunk_id"]: RowState(
                r["file"], r["hash"], r["digest"], r["row_digest"], int(r["model_tokens"]), r["policy_hash"]
            )
            for r in self._scan(self._chunks, None, _COLUMNS)
        }

    def states_for(self, files: Collection[str], ids: Collection[str]) -> dict[str, RowState]:
        wanted_files, wanted_ids = set(files), set(ids)
        return {cid: s for cid, s in self.states().items() if cid in wanted_ids or s.file in wanted_files}

    def rows(self, chunk_ids: Collection[str]) -> dict[str, ChunkRow]:
        if not chunk_ids:
            return {}
        found = self._scan(self._chunks, f"chunk_id IN ({_quote(chunk_ids)})", ["chunk_id", "payload"])
        return {r["chunk_id"]: ChunkRow.from_json(r["payload"]) for r in found}

    def _vectors(self, chunk_ids: Collection[str]) -> dict[str, Vector]:
        if not chunk_ids:
            return {}
        found = self._scan(self._chunks, f"chunk_id IN ({_quote(chunk_ids)})", ["chunk_id", "vector"])
        return {r["chunk_id"]: np.asarray(r["vector"], dtype=np.float32) for r in found}

    def cached(self, model: str, digests: Collection[str]) -> dict[str, tuple[Vector, int]]:
        if not digests:
            return {}
        waiting = self._waiting.found(model, digests)
        asked = [f"{model}\t{d}" for d in digests if d not in waiting]
        found = (
            self._scan(self._cache, f"key IN ({_quote(asked)})", ["key", "vector", "tokens"]) if asked else []
        )
        self._absent.update(set(asked).difference(r["key"] for r in found))
        return {
            **{
                r["key"].split("\t", 1)[1]: (np.asarray(r["vector"], dtype=np.float32), int(r["tokens"]))
                for r in found
            },
            **waiting,
        }

    def dense(self, vector: Vector, k: int) -> list[tuple[str, float]]:
        if self._chunks is None or k <= 0:
            return []
        found = (
            self._chunks.search(np.asarray(vector, dtype=np.float32))
            .distance_type("cosine")
            .limit(k + TIE_MARGIN)
            .select(["chunk_id", "_distance"])
            .to_list()
        )
        hits = [(r["chunk_id"], 1.0 - float(r["_distance"])) for r in found]
        return best_first(hits, k)  # equal scores across the cut: the chunk id decides (001 rule 5)

    def lexical(self, terms: Sequence[str], k: int) -> list[tuple[str, float]]:
        if self._chunks is None or not terms or k <= 0:
            return []
        from lancedb import query as lq

        phrase: Any = lq.PhraseQuery  # a pydantic model: its defaults are invisible to mypy
        query = lq.BooleanQuery([(lq.Occur.SHOULD, phrase(t, "body")) for t in terms])
        try:
            found = (
                self._chunks.search(query, query_type="fts")
                .limit(k + TIE_MARGIN)
                .select(["chunk_id", "_score"])
                .to_list()
            )
        except (ValueError, RuntimeError):  # no FTS index yet (an empty table)
            return []
        hits = [(r["chunk_id"], float(r["_score"])) for r in found]
        return best_first(hits, k)

    def substring(self, needle: str, k: int) -> list[tuple[str, float]]:
        if not needle or k <= 0:
            return []
        hits = [
            (r["chunk_id"], float(r["text"].count(needle)))
            for r in self._scan(self._chunks, None, ["chunk_id", "text"])
            if needle in r["text"]
        ]
        return best_first(hits, k)

    # --- writing --------------------------------------------------------------------------

    def put_cache(self, model: str, entries: Mapping[str, tuple[Vector, int]]) -> None:
        if self._waiting.add(model, entries):
            self._write_cache()

    def _write_cache(self) -> None:
        """Append (or merge) the vectors ``put_cache`` holds: one table version for all of them."""
        waiting = self._waiting.take()
        if not waiting:
            return
        pa = self._pa
        generation = int(self.meta().get("generation", "0"))
        keys = [f"{model}\t{digest}" for model, digest in waiting]
        values = list(waiting.values())
        batch = pa.table(
            {
                "key": pa.array(keys, pa.string()),
                "vector": self._vector_column([v for v, _ in values]),
                "tokens": pa.array([t for _, t in values], pa.int64()),
                "used": pa.array([generation] * len(keys), pa.int64()),
            },
            schema=self._schema("cache"),
        )
        table = self._table("cache")
        if self._absent.issuperset(keys):  # none of them is there: an append, no join
            table.add(batch)
        else:
            table.merge_insert("key").when_matched_update_all().when_not_matched_insert_all().execute(batch)
        self._absent.difference_update(keys)

    def commit(
        self,
        upserts: Sequence[tuple[ChunkRow, Vector | None]],
        deletes: Collection[str],
        meta: Mapping[str, str],
        *,
        model: str,
    ) -> None:
        self._write_cache()
        kept = self._vectors([row.chunk_id for row, v in upserts if v is None])
        vectors = []
        for row, vector in upserts:
            vec = vector if vector is not None else kept.get(row.chunk_id)
            if vec is None:
                raise StoreError(f"{self.path}: {row.chunk_id} has no vector to keep (hint: --reconcile)")
            vectors.append(vec)
        table = self._table("chunks")
        if upserts:
            rows = self._rows_table([row for row, _ in upserts], vectors)
            stored = self._stored_ids(table)
            old = [i for i, (row, _) in enumerate(upserts) if row.chunk_id in stored]
            if old:  # replaced rows: a merge on the id
                merge = table.merge_insert("chunk_id").when_matched_update_all().when_not_matched_insert_all()
                merge.execute(rows.take(old))
            if not old:  # a first index: every row is new, one append
                table.add(rows)
            elif len(old) < len(upserts):  # the rows the table lacks: one append
                table.add(rows.take([i for i, (row, _) in enumerate(upserts) if row.chunk_id not in stored]))
        doomed = sorted(deletes)
        for i in range(0, len(doomed), 500):
            table.delete(f"chunk_id IN ({_quote(doomed[i : i + 500])})")
        if upserts or doomed or self._needs_fts(table):
            build_fts(table)
        generation = int(meta.get("generation", "0"))
        if self._cache is not None and generation % OPTIMIZE_EVERY == 0:
            for t in (table, self._cache):
                t.optimize()
        tmp = self.path / (META + ".tmp")
        tmp.write_bytes(orjson.dumps(dict(meta), option=orjson.OPT_SORT_KEYS))
        os.replace(tmp, self.path / META)

    def _vector_column(self, vectors: Sequence[Vector]) -> Any:
        """The vectors as one fixed-size-list column, built from one contiguous float32 buffer."""
        pa = self._pa
        flat = np.asarray(vectors, dtype=np.float32).reshape(-1)  # one copy, row after row
        return pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float32()), self._dim)

    def _rows_table(self, rows: Sequence[ChunkRow], vectors: Sequence[Vector]) -> Any:
        """The ``chunks`` rows as one Arrow table, column by column; each row's payload and
        ``row_digest`` from one encoding (``ChunkRow.encoded``)."""
        pa = self._pa
        encoded = [r.encoded() for r in rows]
        values = zip(*map(_row_columns, rows), strict=True) if rows else ([] for _ in _ROW_COLUMNS)
        columns: dict[str, Any] = dict(zip(_ROW_COLUMNS, values, strict=True))
        columns["row_digest"] = [digest for _, digest in encoded]
        columns["body"] = [self._analyze(r.embed_text) for r in rows]
        columns["payload"] = utf8_column(pa, [payload for payload, _ in encoded])
        columns["vector"] = self._vector_column(vectors)
        return pa.table(columns, schema=self._schema("chunks"))

    def _stored_ids(self, table: Any) -> set[str]:
        """Every ``chunk_id`` the table holds (none for an empty one: a first index reads nothing)."""
        if not table.count_rows():
            return set()
        return {
            str(cid)
            for cid in table.search().select(["chunk_id"]).limit(None).to_arrow()["chunk_id"].to_pylist()
        }

    def _needs_fts(self, table: Any) -> bool:
        try:
            return not any("body" in (getattr(i, "columns", None) or []) for i in table.list_indices())
        except (AttributeError, RuntimeError):
            return True

    def close(self) -> None:
        self._write_cache()
        self._chunks = self._cache = None


#: Bytes of one part of a column ``utf8_column`` builds (Arrow's ``string`` has 32-bit offsets)
_COLUMN_PART_BYTES = 1 << 30


def utf8_column(pa: Any, values: Sequence[bytes]) -> Any:
    """UTF-8 byte strings as one ``string`` column: each part's values joined into one buffer,
    their offsets summed by numpy (``pa.array`` converts a list of bytes object by object).
    The bytes are not checked again: ``ChunkRow.encoded``'s are orjson's, always UTF-8."""
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
    ends = np.cumsum(lengths)
    parts: list[Any] = []
    start = 0
    while start < len(values) or not parts:
        base = int(ends[start - 1]) if start else 0
        stop = max(int(np.searchsorted(ends, base + _COLUMN_PART_BYTES, side="right")), start + 1)
        stop = min(stop, len(values))
        offsets = np.zeros(stop - start + 1, dtype=np.int64)
        offsets[1:] = ends[start:stop] - base
        buffers = [pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(values[start:stop]))]
        parts.append(pa.StringArray.from_buffers(stop - start, buffers[0], buffers[1]))
        start = stop
    return pa.chunked_array(parts, pa.string())


def build_fts(table: Any) -> None:
    """(Re)build the table's BM25 index over ``body``, whole (see the module docstring: the
    incremental paths would score differently)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # create_fts_index's deprecation notice
        table.create_fts_index(
            "body", replace=True, with_position=True, remove_stop_words=False, stem=True, ascii_folding=True
        )
