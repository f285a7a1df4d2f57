"""The SQLite store's writer checkpoints its WAL once, when it closes, not at every commit,
and never at the run's commit (searchable without waiting for the WAL's copy).

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
import pytest

from pipeline.index import sqlite_db
from pipeline.index.rows import ChunkRow, digest_text
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


def _row(i: int) -> ChunkRow:
    text = f"chunk {i} about write ahead logs and checkpoints " * 8
    return ChunkRow(
        chunk_id=f"d|s=s{i}|c=0", file=f"d{i}.json", id=f"doc:{i}", hash=digest_text(f"h{i}"),
        digest=digest_text(text), doc_id="d", section_id=f"s{i}", source_url="d.md", source_file="d.md",
        start=0, end=len(text), line_start=1, line_end=1, tokens=len(text.split()), rev="0123abcd",
        analyzer="verbatim", policy_hash="p", title="T", breadcrumb="T", text=text, embed_text=text,
    )  # fmt: skip


def test_the_run_commit_is_not_held_by_a_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a small bound (64 pages of 16 KiB): the cache batches cross it and are checkpointed as
    # they go; the run's commit crosses it too, and stays in the WAL until the next write or
    # the close
    monkeypatch.setattr(sqlite_db, "WRITER_CHECKPOINT_PAGES", 64)
    path = tmp_path / "index.sqlite"
    store = SqliteStore(path, 384)
    reader = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = [_row(i) for i in range(2000)]
    vectors = np.random.default_rng(2).standard_normal((len(rows), 384)).astype(np.float32)
    try:
        reader.execute("SELECT count(*) FROM meta").fetchone()
        for start in range(0, len(rows), 400):
            part = range(start, start + 400)
            store.put_cache("m", {rows[i].digest: (vectors[i], 3) for i in part})
        assert _count(path, "embed_cache", file_only=True) > 0  # the bound still holds between commits
        meta = {"embed_model": "m", "dim": "384", "generation": "1", "chunks": str(len(rows))}
        store.commit(list(zip(rows, vectors, strict=True)), set(), meta, model="m")
        assert _count(path, "chunks", file_only=False) == len(rows)  # committed: searchable
        assert _count(path, "chunks", file_only=True) == 0  # not copied at the commit
        assert int(store._conn.execute("PRAGMA wal_autocheckpoint").fetchall()[0][0]) == 64  # reset
        store.close()
        assert _count(path, "chunks", file_only=True) == len(rows)  # the close copied it
    finally:
        store.close()
        reader.close()
