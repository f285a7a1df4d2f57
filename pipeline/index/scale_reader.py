"""A read-only view of the SQLite store for the scale indexes: its generation stamp, rowids,
texts and vectors, and the exact cosine of a few rows (the ANN's candidates, scored again).

A connection of its own (WAL: it sees what was committed), so the scale indexes are built and
checked against what the store holds, not against what a run is about to write.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.index.bm25_exact import fts_bodies
from pipeline.index.rows import Vector

_BATCH = 500


def stamp(meta: Mapping[str, str]) -> str:
    """What a scale index records of the store it reflects: the generation and ``index_hash``
    (a store built anew by ``--rebuild`` starts its generations again; its hash differs)."""
    return f"{meta.get('generation', '0')}:{meta.get('index_hash', '')}"


def _parts(items: list[Any]) -> Iterator[list[Any]]:
    for i in range(0, len(items), _BATCH):
        yield items[i : i + _BATCH]


class StoreReader:
    """A connection of its own to the store file (WAL: it sees what was committed)."""

    def __init__(self, path: Path) -> None:
        import apsw
        import sqlite_vec

        self.path = Path(path)
        self.conn = apsw.Connection(str(self.path), flags=apsw.SQLITE_OPEN_READONLY)
        self.conn.set_busy_timeout(10_000)
        self.conn.enable_load_extension(True)
        self.conn.load_extension(sqlite_vec.loadable_path())
        self.conn.enable_load_extension(False)

    def generation(self) -> str:
        """The store's ``stamp``: its generation and ``index_hash``."""
        meta = {
            str(k): str(v)
            for k, v in self.conn.execute(
                "SELECT key, value FROM meta WHERE key IN ('generation', 'index_hash')"
            )
        }
        return stamp(meta)

    def rowids(self, chunk_ids: Collection[str]) -> dict[str, int]:
        found: dict[str, int] = {}
        for part in _parts(list(chunk_ids)):
            marks = ",".join("?" * len(part))
            for cid, rowid in self.conn.execute(
                f"SELECT chunk_id, rowid FROM chunks WHERE chunk_id IN ({marks})", part
            ):
                found[str(cid)] = int(rowid)
        return found

    def ids(self, rowids: Sequence[int]) -> dict[int, str]:
        found: dict[int, str] = {}
        for part in _parts(list(rowids)):
            marks = ",".join("?" * len(part))
            for rowid, cid in self.conn.execute(
                f"SELECT rowid, chunk_id FROM chunks WHERE rowid IN ({marks})", part
            ):
                found[int(rowid)] = str(cid)
        return found

    def cosine(self, rowids: Sequence[int], vector: Vector) -> list[tuple[str, float]]:
        """``(chunk_id, cosine similarity)`` of these rows, computed by vec0's own function on
        the stored float32 vectors, as exact search computes it.

        The vectors are read from vec0's tables directly (sqlite-vec 0.1's layout: a row per
        id with its block and offset, the block one blob): a lookup through the ``vec0``
        table reads each candidate's whole block. Another layout: through the table."""
        import apsw

        raw = np.asarray(vector, dtype=np.float32).tobytes()
        width = len(raw)
        hits: list[tuple[str, float]] = []
        try:
            for part in _parts(list(rowids)):
                marks = ",".join("?" * len(part))
                for cid, block, offset in self.conn.execute(
                    "SELECT c.chunk_id, r.chunk_id, r.chunk_offset FROM chunks c "
                    f"JOIN vectors_rowids r ON r.id = c.chunk_id WHERE c.rowid IN ({marks})",
                    part,
                ):
                    with self.conn.blob_open(
                        "main", "vectors_vector_chunks00", "vectors", int(block), False
                    ) as blob:
                        blob.seek(int(offset) * width)
                        stored = blob.read(width)
                    if len(stored) != width:
                        raise apsw.SQLError("vector block shorter than expected")
                    for (dist,) in self.conn.execute("SELECT vec_distance_cosine(?, ?)", (stored, raw)):
                        hits.append((str(cid), 1.0 - float(dist)))
        except apsw.Error:
            return self._cosine_through_vec0(rowids, raw)
        return hits

    def cosine_of(self, vectors: Mapping[int, bytes], vector: Vector) -> list[tuple[str, float]]:
        """``(chunk_id, cosine similarity)`` of the rows whose stored float32 bytes are given
        (``vectors``: rowid to bytes, read beside the store), by vec0's own function as
        ``cosine`` computes it; rows no longer in the store are left out."""
        if not vectors:
            return []
        raw = np.asarray(vector, dtype=np.float32).tobytes()
        ids = self.ids(list(vectors))
        hits: list[tuple[str, float]] = []
        for rowid, stored in vectors.items():
            if rowid in ids:
                for (dist,) in self.conn.execute("SELECT vec_distance_cosine(?, ?)", (stored, raw)):
                    hits.append((ids[rowid], 1.0 - float(dist)))
        return hits

    def _cosine_through_vec0(self, rowids: Sequence[int], raw: bytes) -> list[tuple[str, float]]:
        hits: list[tuple[str, float]] = []
        for part in _parts(list(rowids)):
            marks = ",".join("?" * len(part))
            for cid, dist in self.conn.execute(
                "SELECT c.chunk_id, vec_distance_cosine(v.embedding, ?) FROM chunks c "
                f"JOIN vectors v ON v.chunk_id = c.chunk_id WHERE c.rowid IN ({marks})",
                [raw, *part],
            ):
                hits.append((str(cid), 1.0 - float(dist)))
        return hits

    def bodies(self, rowids: Sequence[int]) -> list[tuple[int, str]]:
        """These rows' rowid and FTS5 ``body`` (``embedText`` through the index's analyzer)."""
        return fts_bodies(self.conn, list(rowids))

    def texts(self) -> Iterator[tuple[int, str]]:
        """Every row's rowid and analyzed ``embedText`` (what its FTS5 row holds)."""
        for rowid, body in self.conn.execute("SELECT rowid, body FROM fts"):
            yield int(rowid), str(body)

    def vectors(self, dim: int) -> tuple[Any, Any]:
        """Every row's rowid and vector: ``(uint64 keys, float32 matrix)``, filled in place (a
        million rows: one matrix in memory, not a list of blobs and then its copy)."""
        (count,) = next(iter(self.conn.execute("SELECT count(*) FROM chunks")))
        keys = np.empty(int(count), dtype=np.uint64)
        matrix = np.empty((int(count), dim), dtype=np.float32)
        n = 0
        for rowid, blob in self.conn.execute(
            "SELECT c.rowid, v.embedding FROM chunks c JOIN vectors v ON v.chunk_id = c.chunk_id"
        ):
            if n == len(keys):  # rows committed since the count (none while a run holds the writer)
                keys = np.resize(keys, 2 * n + 1)
                matrix = np.resize(matrix, (2 * n + 1, dim))
            keys[n] = rowid
            matrix[n] = np.frombuffer(blob, dtype=np.float32)
            n += 1
        return keys[:n], matrix[:n]

    def close(self) -> None:
        self.conn.close()
