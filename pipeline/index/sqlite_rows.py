"""Writing the SQLite store's chunk rows: the ``chunks`` statements, and many new rows at once.

A new index (and any run adding many rows) writes every row three times: its ``chunks`` row
(the payload, encoded and digested in Python), its FTS5 row (the text analyzed in Python)
and its ``vec0`` vector. ``insert_fresh`` does it in parts, the Python side of the next part
made on a second thread while SQLite writes the current one: ``apsw`` lets go of the GIL
while SQLite works, so on a machine with two cores the two overlap instead of adding up.
Each part is three ``executemany`` calls in the caller's transaction; what the file holds
is the same as one part of every row would give.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np

from pipeline.index.rows import ChunkRow, Vector

#: Rows per part of ``insert_fresh``: big enough that each ``executemany`` runs long, small
#: enough that a first index's first part (made before SQLite has anything to do) is short.
PART = 2048

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
_SPLIT = _INSERTED.index("row_digest")
_before, _after = attrgetter(*_INSERTED[:_SPLIT]), attrgetter(*_INSERTED[_SPLIT + 1 :])


def inserted(row: ChunkRow) -> tuple[object, ...]:
    """The row's values for ``INSERT``: the ``_INSERTED`` columns, then the payload; the payload
    and ``row_digest`` come from one encoding of the row (``ChunkRow.encoded``)."""
    payload, row_digest = row.encoded()
    return (*_before(row), row_digest, *_after(row), payload)


def moved(row: ChunkRow) -> tuple[object, ...]:
    """The row's values for ``UPDATE``: the ``_MOVABLE`` columns, the payload, the chunk id."""
    payload, row_digest = row.encoded()
    return (*(row_digest if c == "row_digest" else getattr(row, c) for c in _MOVABLE), payload, row.chunk_id)


@dataclass(frozen=True, slots=True)
class _Part:
    """One part's bound values: ``chunks`` rows, FTS5 bodies (in the same order), vectors."""

    rows: list[tuple[object, ...]]
    bodies: list[str]
    vectors: list[tuple[str, bytes]]


def _values(rows: Sequence[tuple[ChunkRow, Vector]], analyze: Callable[[str], str]) -> _Part:
    return _Part(
        [inserted(r) for r, _ in rows],
        [analyze(r.embed_text) for r, _ in rows],
        [(r.chunk_id, np.asarray(v, dtype=np.float32).tobytes()) for r, v in rows],
    )


def insert_fresh(conn: Any, rows: Sequence[tuple[ChunkRow, Vector]], analyze: Callable[[str], str]) -> None:
    """Insert rows ``chunks`` lacks (no vector either) with their FTS5 bodies and vectors, in
    the caller's transaction; ``analyze`` is the index's analyzer (``str`` → ``str``, no state)."""
    parts = [rows[i : i + PART] for i in range(0, len(rows), PART)]
    if len(parts) == 1:
        _write(conn, _values(parts[0], analyze))
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="chunkyard-rows") as pool:
        coming = pool.submit(_values, parts[0], analyze)
        for following in [*parts[1:], None]:
            part = coming.result()
            if following is not None:
                coming = pool.submit(_values, following, analyze)
            _write(conn, part)


def _write(conn: Any, part: _Part) -> None:
    """One part: ``chunks`` rows (their rowids back), FTS5 rows by those rowids, vectors."""
    rowids = [rowid for (rowid,) in conn.executemany(INSERT + " RETURNING rowid", part.rows)]
    conn.executemany("INSERT INTO fts(rowid, body) VALUES (?, ?)", zip(rowids, part.bodies, strict=True))
    conn.executemany("INSERT INTO vectors(chunk_id, embedding) VALUES (?, ?)", part.vectors)
