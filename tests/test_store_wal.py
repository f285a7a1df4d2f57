"""The SQLite store's writer checkpoints its WAL once, when it closes, not at every commit.

A run commits once per returned batch; each commit used to copy the WAL back into the file
every 1,000 pages. Here the cache batches and the run's commit stay in the WAL (readers see
them there) and the writer's ``close`` copies them into the database file, even while a
reader keeps the file open (so SQLite's own checkpoint at the last close does not run).
``immutable=1`` reads the database file alone, without its WAL: what a checkpoint wrote.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np

from pipeline.index.sqlite_store import SqliteStore


def _count(path: Path, table: str, *, file_only: bool) -> int:
    """Rows of ``table``: as readers see them, or (``file_only``) in the database file alone."""
    uri = f"file:{path}?immutable=1" if file_only else f"file:{path}?mode=ro"
    conn = sqlite3.connect(uri, uri=True)
    try:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    except sqlite3.OperationalError:  # the file alone does not have the table yet
        assert file_only
        return 0
    finally:
        conn.close()


def test_cache_batches_stay_in_the_wal_until_the_writer_closes(tmp_path: Path) -> None:
    path = tmp_path / "index.sqlite"
    store = SqliteStore(path, 384)
    # a reader holding the file open: the writer's close is not the last one (SQLite's own
    # checkpoint at the last close would hide whether the store checkpoints)
    reader = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    batches, size = 30, 400  # ~18 MB of vectors: more WAL pages than SQLite's default threshold
    try:
        reader.execute("SELECT count(*) FROM meta").fetchone()
        rng = np.random.default_rng(1)
        for batch in range(batches):
            vectors = rng.standard_normal((size, 384)).astype(np.float32)
            store.put_cache("m", {f"blake3:{batch}-{i}": (vectors[i], 3) for i in range(size)})
            assert _count(path, "embed_cache", file_only=False) == (batch + 1) * size  # committed
        assert _count(path, "embed_cache", file_only=True) == 0  # all of it still in the WAL
        store.close()
        assert _count(path, "embed_cache", file_only=True) == batches * size  # the close copied it
        assert reader.execute("SELECT count(*) FROM embed_cache").fetchone()[0] == batches * size
    finally:
        store.close()
        reader.close()
