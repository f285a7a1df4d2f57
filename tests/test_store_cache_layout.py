"""The SQLite store's embedding cache: an index file of the first layout (``WITHOUT ROWID``)
is converted by its first write, and keeps every vector it cached.

A real store file, made with the first layout's schema by hand, then driven by the store.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.index.sqlite_db import open_database
from pipeline.index.sqlite_store import SqliteStore

_FIRST_LAYOUT = (
    "DROP TABLE embed_cache;"
    "CREATE TABLE embed_cache(model TEXT NOT NULL, digest TEXT NOT NULL,"
    " vector BLOB NOT NULL, tokens INTEGER NOT NULL, used INTEGER NOT NULL,"
    " PRIMARY KEY(model, digest)) WITHOUT ROWID;"
    "CREATE INDEX IF NOT EXISTS embed_cache_used ON embed_cache(used);"
)


def _layout(path: Path) -> str:
    conn = open_database(path)
    try:
        return str(next(iter(conn.execute("SELECT sql FROM sqlite_master WHERE name = 'embed_cache'")))[0])
    finally:
        conn.close()


def test_first_layout_is_converted_by_the_first_write_and_keeps_its_vectors(tmp_path: Path) -> None:
    path = tmp_path / "index.sqlite"
    old = np.arange(8, dtype=np.float32) / 10
    conn = open_database(path)
    conn.execute(_FIRST_LAYOUT)
    conn.execute(
        "INSERT INTO embed_cache(model, digest, vector, tokens, used) VALUES (?, ?, ?, ?, ?)",
        ("m", "blake3:old", old.tobytes(), 7, 0),
    )
    conn.close()
    assert "WITHOUT ROWID" in _layout(path)

    store = SqliteStore(path, 8)
    try:
        assert np.array_equal(
            store.cached("m", ["blake3:old"])["blake3:old"][0], old
        )  # a reader converts nothing
        assert "WITHOUT ROWID" in _layout(path)
        new = np.ones(8, dtype=np.float32)
        store.put_cache("m", {"blake3:new": (new, 3), "blake3:old": (old, 7)})
        got = store.cached("m", ["blake3:old", "blake3:new", "blake3:none"])
    finally:
        store.close()
    assert "WITHOUT ROWID" not in _layout(path)
    assert sorted(got) == ["blake3:new", "blake3:old"]
    assert np.array_equal(got["blake3:old"][0], old) and got["blake3:old"][1] == 7
    assert np.array_equal(got["blake3:new"][0], new) and got["blake3:new"][1] == 3
    conn = open_database(path)
    try:  # one row per (model, digest): a replaced entry is not doubled
        assert next(iter(conn.execute("SELECT count(*) FROM embed_cache")))[0] == 2
        assert {
            r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE tbl_name = 'embed_cache'")
        } >= {
            "embed_cache",
            "embed_cache_used",
        }
    finally:
        conn.close()


def test_an_earlier_files_unused_chunk_indexes_go_at_its_first_write(tmp_path: Path) -> None:
    """Files of an earlier version index ``chunks`` by doc_id and source_file, which no query
    reads: the first write drops both (every index slows each row written); reads keep them."""
    path = tmp_path / "index.sqlite"
    conn = open_database(path)
    conn.execute(
        "CREATE INDEX chunks_doc ON chunks(doc_id); CREATE INDEX chunks_source ON chunks(source_file);"
    )
    conn.close()

    def indexes() -> set[str]:
        conn = open_database(path)
        try:
            return {
                str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE tbl_name = 'chunks'")
            }
        finally:
            conn.close()

    store = SqliteStore(path, 8)
    try:
        store.cached("m", ["blake3:none"])
        assert {"chunks_doc", "chunks_source"} <= indexes()
        store.put_cache("m", {"blake3:new": (np.ones(8, dtype=np.float32), 3)})
    finally:
        store.close()
    assert not {"chunks_doc", "chunks_source"} & indexes()
    assert {"chunks_file", "chunks_digest"} <= indexes()
