"""The state database's layout: its tables, its file and page settings, and the one format upgrade.

One SQLite file (stdlib ``sqlite3``, WAL) holds what ``manifest.json``, ``redirects.json``,
``inflight.json`` and ``changes.jsonl`` held, so that a change costs the rows it touches:

- ``docs``: one row per document (its freshness: size, mtime, source hash, policy, version);
- ``chunks``: one row per chunk file (document, number, file, chunk_id, hash, the digests of
  its content and of its ``embedText``, the generation that made it): a document's lists are
  its rows in order, and corpus-wide questions (who claims a file, is an id live, which new
  chunk has this hash) are indexed queries. A chunk's ``id`` is not stored: it is
  ``doc:<name>::ch<n>`` (docs/spec.md, The chunk file), so a lookup by ``id`` is one by document name
  (``docs_name``) and number;
- ``redirects``: old ``chunk_id`` → live ``chunk_id``;
- ``gone_ids`` and ``born_ids``: the ids of removed documents that no chunk took, and those
  of documents new to the state, with their text's hash and when, for a while
  (``record.GONE_KEPT_S``): a move whose halves two runs saw (a watch killed between the
  two) still redirects, whichever half came first;
- ``inflight``: documents a sync is touching, written before it touches any and replaced
  when it ends: what a killed run leaves is what to re-check;
- ``feed``: the change feed, one row per line with its sequence number (``feed.py``);
- ``folders``: an output folder's mtime when it was last listed and found whole, so a
  no-change run stats a folder instead of listing it;
- ``srcdirs``: a corpus folder's signature (its documents' names, sizes and mtimes, the
  policy and version) when every document in it was last found recorded and current, so a
  whole-corpus run compares a folder's listing with one value instead of reading each of
  its documents' rows; any write to a document's row drops its folder's signature;
- ``meta``: the header (format, version, policy, corpus), the generation, counters.

SQLite's atomic commit of a document's rows is what the old ``manifest.json``'s rename was.
"""

from __future__ import annotations

import sqlite3
from contextlib import suppress
from pathlib import Path
from typing import Any

import orjson

FILE = "state.sqlite"
FORMAT = 3  #: ``manifest.json`` was format 1; format 2 kept each document's lists twice (``upgrade_format``)

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS docs(
    rel TEXT PRIMARY KEY, name TEXT NOT NULL, uid_rev TEXT NOT NULL, size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL, source_hash TEXT NOT NULL, policy_hash TEXT NOT NULL,
    version TEXT NOT NULL, rev_width INTEGER NOT NULL, nfiles INTEGER NOT NULL,
    tokens INTEGER NOT NULL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS docs_name ON docs(name);
CREATE INDEX IF NOT EXISTS docs_uid_rev ON docs(uid_rev);
CREATE TABLE IF NOT EXISTS chunks(
    rel TEXT NOT NULL, n INTEGER NOT NULL, file TEXT NOT NULL, chunk_id TEXT NOT NULL,
    hash TEXT NOT NULL, digest TEXT NOT NULL, embed TEXT NOT NULL, gen INTEGER NOT NULL,
    PRIMARY KEY(rel, n)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS chunks_file ON chunks(file);
CREATE INDEX IF NOT EXISTS chunks_chunk_id ON chunks(chunk_id);
CREATE INDEX IF NOT EXISTS chunks_hash ON chunks(hash, gen);
CREATE TABLE IF NOT EXISTS redirects(old TEXT PRIMARY KEY, new TEXT NOT NULL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS redirects_new ON redirects(new);
CREATE TABLE IF NOT EXISTS gone_ids(chunk_id TEXT PRIMARY KEY, hash TEXT NOT NULL, gone_at REAL NOT NULL)
    WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS gone_ids_hash ON gone_ids(hash);
CREATE INDEX IF NOT EXISTS gone_ids_at ON gone_ids(gone_at);
CREATE TABLE IF NOT EXISTS born_ids(chunk_id TEXT PRIMARY KEY, hash TEXT NOT NULL, born_at REAL NOT NULL)
    WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS born_ids_hash ON born_ids(hash);
CREATE INDEX IF NOT EXISTS born_ids_at ON born_ids(born_at);
CREATE TABLE IF NOT EXISTS inflight(rel TEXT PRIMARY KEY) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS folders(folder TEXT PRIMARY KEY, mtime_ns INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS srcdirs(folder TEXT PRIMARY KEY, sig BLOB NOT NULL) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS docs_folder ON docs(rtrim(rel, replace(rel, '/', '')));
CREATE TABLE IF NOT EXISTS feed(
    seq INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL, kind TEXT NOT NULL,
    text INTEGER NOT NULL, line BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS feed_key ON feed(key, seq);
"""

#: A document's folder as SQL (``a/b/`` of ``a/b/c.md``, ``""`` at the root): the indexed
#: expression ``docs_folder``, so a folder's rows are an index lookup, not a prefix range
#: that would hold its subfolders' documents too.
FOLDER_OF = "rtrim(rel, replace(rel, '/', ''))"

#: A document's lists in its entry (index-aligned with ``files``): its ``chunks`` rows.
LISTS = ("files", "ids", "chunk_ids", "hashes", "digests", "embeds")
COLUMNS = ("size", "mtime_ns", "source_hash", "policy_hash", "version", "rev_width", "tokens", "uid_rev")

#: Bytes per page of a new database (SQLite's default is 4,096): a big sync mostly appends
#: rows, and writes fewer pages (headers, WAL frames, checksums) with bigger ones; bigger
#: still would need more free disk per commit (see tests/test_bad_input.py's full disk).
PAGE_SIZE = 8192
#: Pages the WAL may hold before a commit copies them into the database (SQLite's default is
#: 1,000): each copy ends in two ``fsync`` calls that the parent waits for, so a big first
#: run makes a few of them instead of dozens.
WAL_PAGES = 64 * 1024 * 1024 // PAGE_SIZE


def connect(path: Path, *, readonly: bool = False) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit), WAL, foreign keys off."""
    if readonly:
        conn = sqlite3.connect(
            f"file:{path}?mode=ro", uri=True, isolation_level=None, timeout=30, check_same_thread=False
        )
    else:
        conn = sqlite3.connect(path, isolation_level=None, timeout=30, check_same_thread=False)
        conn.execute(f"PRAGMA page_size={PAGE_SIZE}")  # a new database only: a no-op after
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")  # WAL: a commit survives a crash of the process
        conn.execute(f"PRAGMA wal_autocheckpoint={WAL_PAGES}")
    conn.execute("PRAGMA cache_size=-16000")  # 16 MB: the parent's memory stays flat
    return conn


def has_table(conn: sqlite3.Connection, name: str) -> bool:
    return (
        conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (name,)).fetchone()
        is not None
    )


def upgrade_format(conn: sqlite3.Connection) -> None:
    """Format 2 → 3 in one transaction, nothing re-chunked: each chunk's row takes its digests
    from the document's ``entries`` blob, which goes, with the ``id`` column and its index.

    Format 2 kept every document's lists twice (the blob, and the ``chunks`` rows) and indexed
    the chunks four ways, which made the state several times bigger than it needs to be.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        if has_table(conn, "entries"):  # not done meanwhile by another session
            conn.execute(
                "CREATE TABLE chunks3(rel TEXT NOT NULL, n INTEGER NOT NULL, file TEXT NOT NULL, "
                "chunk_id TEXT NOT NULL, hash TEXT NOT NULL, digest TEXT NOT NULL, embed TEXT NOT NULL, "
                "gen INTEGER NOT NULL, PRIMARY KEY(rel, n)) WITHOUT ROWID"
            )
            cursor = conn.execute(
                "SELECT c.rel, c.n, c.file, c.chunk_id, c.hash, c.gen, e.lists "
                "FROM chunks c LEFT JOIN entries e USING(rel) ORDER BY c.rel, c.n"
            )
            lists: dict[str, Any] = {}
            last = None
            while rows := cursor.fetchmany(4096):
                out = []
                for rel, n, file, chunk_id, hash_, gen, blob in rows:
                    if rel != last:
                        lists, last = (orjson.loads(blob) if blob else {}), rel
                    digests, embeds = lists.get("digests") or (), lists.get("embeds") or ()
                    d = str(digests[n]) if n < len(digests) else ""
                    e = str(embeds[n]) if n < len(embeds) else ""
                    out.append((rel, n, file, chunk_id, hash_, d, e, gen))
                conn.executemany("INSERT INTO chunks3 VALUES(?,?,?,?,?,?,?,?)", out)
            conn.execute("DROP TABLE chunks")
            conn.execute("DROP TABLE entries")
            conn.execute("ALTER TABLE chunks3 RENAME TO chunks")
            conn.execute("CREATE INDEX chunks_file ON chunks(file)")
            conn.execute("CREATE INDEX chunks_chunk_id ON chunks(chunk_id)")
            conn.execute("CREATE INDEX chunks_hash ON chunks(hash, gen)")
            conn.execute(
                "INSERT INTO meta(key, value) VALUES('format', ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                (str(FORMAT),),
            )
        conn.execute("COMMIT")
    except BaseException:
        with suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise


def folder_of(rel: str) -> str:
    """A document's folder as ``srcdirs`` and ``FOLDER_OF`` name it: ``a/b/`` of ``a/b/c.md``, ``""`` at the root."""
    return rel[: rel.rfind("/") + 1]
