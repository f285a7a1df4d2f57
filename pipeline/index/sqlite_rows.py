"""Writing the SQLite store's chunk rows: the ``chunks`` statements, and many new rows at once.

A new index (and any run adding many rows) writes every row three times: its ``chunks`` row
(the payload, encoded and digested in Python), its FTS5 row (the text analyzed in Python)
and its ``vec0`` vector: ``insert_fresh`` makes it three ``executemany`` calls in all, the
rowids given rather than returned. (The Python side made on a second thread while SQLite
wrote was tried: apsw takes the GIL back after each row, so the two threads mostly waited
on each other; no faster.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any

import numpy as np

from pipeline.index.rows import ChunkRow, Vector

#: The ``chunks`` columns a row's move may change while its embedded text (``digest``) stays;
#: each is a ``ChunkRow`` attribute of the same name (``payload`` is ``row.to_json()``).
_MOVABLE = (
    "file", "hash", "row_digest", "model_tokens", "policy_hash", "doc_id", "section_id", "source_file", "text",
)  # fmt: skip
UPDATE = f"UPDATE chunks SET {', '.join(f'{c} = ?' for c in _MOVABLE)}, payload = ? WHERE chunk_id = ?"
_INSERTED = ("chunk_id", "digest", *_MOVABLE)
INSERT = (
    f"INSERT INTO chunks({', '.join(_INSERTED)}, payload) VALUES ({', '.join('?' * (len(_INSERTED) + 1))})"
)
#: ``INSERT`` with the rowid given (``insert_fresh``: the FTS5 rows need it, and asking SQLite
#: for each one with ``RETURNING`` cost more than writing the row)
_INSERT_AT = (
    f"INSERT INTO chunks(rowid, {', '.join(_INSERTED)}, payload) "
    f"VALUES ({', '.join('?' * (len(_INSERTED) + 2))})"
)
_SPLIT = _INSERTED.index("row_digest")
_before, _after = attrgetter(*_INSERTED[:_SPLIT]), attrgetter(*_INSERTED[_SPLIT + 1 :])


def inserted(row: ChunkRow) -> tuple[object, ...]:
    """The row's values for ``INSERT``: the ``_INSERTED`` columns, then the payload; the payload
    and ``row_digest`` come from one encoding of the row (``ChunkRow.encoded``)."""
    payload, row_digest = row.encoded()
    return (*_before(row), row_digest, *_after(row), payload)


def _inserted_at(rowid: int, row: ChunkRow) -> tuple[object, ...]:
    """``inserted(row)`` with the rowid first: the values for ``_INSERT_AT``."""
    payload, row_digest = row.encoded()
    return (rowid, *_before(row), row_digest, *_after(row), payload)


def moved(row: ChunkRow) -> tuple[object, ...]:
    """The row's values for ``UPDATE``: the ``_MOVABLE`` columns, the payload, the chunk id."""
    payload, row_digest = row.encoded()
    return (*(row_digest if c == "row_digest" else getattr(row, c) for c in _MOVABLE), payload, row.chunk_id)


def insert_fresh(conn: Any, rows: Sequence[tuple[ChunkRow, Vector]], analyze: Callable[[str], str]) -> None:
    """Insert rows ``chunks`` lacks (no vector either) with their FTS5 bodies and vectors, in
    the caller's transaction; ``analyze`` is the index's analyzer. The rows get the rowids
    SQLite would have given them one by one (one past the largest, in order), given here."""
    (largest,) = next(iter(conn.execute("SELECT coalesce(max(rowid), 0) FROM chunks")))
    rowids = range(int(largest) + 1, int(largest) + 1 + len(rows))
    conn.executemany(_INSERT_AT, [_inserted_at(rowid, r) for rowid, (r, _) in zip(rowids, rows, strict=True)])
    conn.executemany(
        "INSERT INTO fts(rowid, body) VALUES (?, ?)",
        [(rowid, analyze(r.embed_text)) for rowid, (r, _) in zip(rowids, rows, strict=True)],
    )
    conn.executemany(
        "INSERT INTO vectors(chunk_id, embedding) VALUES (?, ?)",
        [(r.chunk_id, np.asarray(v, dtype=np.float32).tobytes()) for r, v in rows],
    )
