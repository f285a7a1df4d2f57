"""Reading sqlite-vec's own tables behind the store's ``vectors`` table (sqlite-vec 0.1's layout).

vec0 keeps the vectors in blocks (``vectors_vector_chunks00``) and a row per id with its
block and offset (``vectors_rowids``). Reading them directly gives every vector as one
matrix (a ``Searcher`` asking many queries: one matrix product instead of vec0's scan) and
tells which ids have a vector without a KNN query. When the layout is not the expected one,
each reader says so (``None``, or every id) and the store falls back to vec0's own SQL.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.index.sqlite_db import in_batches

_BLOCKS = "SELECT rowid, vectors FROM vectors_vector_chunks00"
_WHERE = "SELECT id, chunk_id, chunk_offset FROM vectors_rowids WHERE chunk_id IS NOT NULL"

#: chunk ids in vec0's order, and their vectors as the rows of one float32 matrix
Matrix = tuple[list[str], Any]


def read_matrix(conn: Any, dim: int) -> Matrix | None:
    """Every stored vector of dimension ``dim``, with its chunk id; ``None`` when vec0's
    tables cannot be read, or do not hold one vector for each row of ``chunks``."""
    import apsw

    try:
        blocks = {int(b): blob for b, blob in conn.execute(_BLOCKS)}
        where = [(str(cid), int(block), int(offset)) for cid, block, offset in conn.execute(_WHERE)]
        count = int(next(iter(conn.execute("SELECT count(*) FROM chunks")))[0])
    except apsw.Error:
        return None
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
    return [cid for cid, _, _ in where], np.ascontiguousarray(stacked[positions])


def ids_with_vectors(conn: Any, chunk_ids: list[str]) -> set[str]:
    """Those of ``chunk_ids`` that have a vector, from vec0's id table; all of them when that
    table cannot be read (the caller then deletes each, if there)."""
    import apsw

    found: set[str] = set()
    try:
        for part in in_batches(chunk_ids):
            marks = ",".join("?" * len(part))
            found.update(
                str(cid)
                for (cid,) in conn.execute(f"SELECT id FROM vectors_rowids WHERE id IN ({marks})", part)
            )
    except apsw.Error:
        return set(chunk_ids)
    return found
