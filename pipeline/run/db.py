"""chunkyard's state database, ``CHUNKS/.chunkyard/state.sqlite`` (SPEC §5, §10).

One SQLite file (stdlib ``sqlite3``, WAL) holds what ``manifest.json``, ``redirects.json``,
``inflight.json`` and ``changes.jsonl`` held, so that a change costs the rows it touches:

- ``docs``: one row per document (its freshness: size, mtime, source hash, policy, version);
- ``chunks``: one row per chunk file (document, number, file, chunk_id, hash, the digests of
  its content and of its ``embedText``, the generation that made it): a document's lists are
  its rows in order, and corpus-wide questions (who claims a file, is an id live, which new
  chunk has this hash) are indexed queries. A chunk's ``id`` is not stored: it is
  ``doc:<name>::ch<n>`` (SPEC 002), so a lookup by ``id`` is one by document name
  (``docs_name``) and number;
- ``redirects``: old ``chunk_id`` → live ``chunk_id``;
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

Each document is recorded whole in one transaction (its rows, its feed lines, its redirects,
its stale files' deletes; a big sync puts several documents in one, ``record.Run``): SQLite's
atomic commit is what the manifest's rename was. Only the parent process opens the database for writing; workers never see it.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import orjson

from pipeline.run.checkpoint import reached

FILE = "state.sqlite"
FORMAT = 3  #: the manifest was format 1; format 2 kept each document's lists twice (``_migrate``)

_SCHEMA = """
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
_COLUMNS = ("size", "mtime_ns", "source_hash", "policy_hash", "version", "rev_width", "tokens", "uid_rev")


#: Bytes per page of a new database (SQLite's default is 4,096): a big sync mostly appends
#: rows, and writes half as many pages (headers, WAL frames, checksums) at 8 KiB; the
#: parent's replay of ``make bench``'s 31,214 chunks: 0.43 -> 0.36-0.42 CPU s in SQLite
#: (16 KiB: 0.35-0.40, but a commit then needs ~80 KB of WAL where 64 KB of free disk held
#: one before, see tests/test_bad_input.py's full disk).
PAGE_SIZE = 8192
#: Pages the WAL may hold before a commit copies them into the database (SQLite's default is
#: 1,000): each copy ends in two ``fsync`` calls that the parent waits for, and a first run
#: of ``make bench`` (80 MB of state, 4 KiB pages) made 33 of them; at 64 MB it makes a few.
WAL_PAGES = 64 * 1024 * 1024 // PAGE_SIZE


#: A WAL smaller than this is left to ``close`` (``checkpoint_behind``): a small sync starts no thread.
BEHIND_BYTES = 4 * 1024 * 1024


def _checkpoint(path: Path) -> None:
    """One PASSIVE checkpoint on a connection of its own (never blocks the writer)."""
    with suppress(sqlite3.Error):
        conn = sqlite3.connect(path, isolation_level=None, timeout=0, check_same_thread=False)
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        finally:
            conn.close()


class StateError(Exception):
    """The state database cannot be opened or written (wraps ``sqlite3.Error``)."""


def db_path(state_dir: Path) -> Path:
    return state_dir / FILE


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


class StateDB:
    """The parent's handle on the state database: reads, and per-document transactions."""

    def __init__(self, path: Path, *, readonly: bool = False) -> None:
        self.path = path
        self._in_tx = False
        self._counts: dict[str, int] = {}
        self._no_redirects: bool | None = None
        self._checkpointer: threading.Thread | None = None
        self.conn = self._open_reader() if readonly else self._open_writer()

    @classmethod
    def reader(cls, path: Path) -> StateDB:
        """A read-only handle (the audit tools, beside a running ``ingest`` or ``watch``)."""
        return cls(path, readonly=True)

    def _open_writer(self) -> sqlite3.Connection:
        """The database, created or converted to the current format."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = connect(self.path)
            conn.executescript(_SCHEMA)
            if _has_table(conn, "entries"):
                _migrate(conn)
        except sqlite3.Error as exc:
            raise StateError(f"{self.path}: cannot open chunkyard's state ({exc})") from exc
        return conn

    def _open_reader(self) -> sqlite3.Connection:
        """The database as it is; one in an older format is refused with the way out."""
        try:
            conn = connect(self.path, readonly=True)
            conn.execute("SELECT 1 FROM meta LIMIT 1")
            old = _has_table(conn, "entries")
        except sqlite3.Error as exc:
            raise StateError(f"{self.path}: cannot read chunkyard's state ({exc})") from exc
        if old:
            conn.close()
            raise StateError(
                f"{self.path}: chunkyard's state is in an older format (2) "
                "(hint: run chunkyard ingest once: it converts it, without re-chunking anything)"
            )
        return conn

    def close(self) -> None:
        self._await_checkpoint()
        self.conn.close()

    # -- checkpoints -------------------------------------------------------------------

    def _wal_bytes(self) -> int:
        with suppress(OSError):
            return os.stat(f"{self.path}-wal").st_size
        return 0

    def checkpoint_behind(self) -> None:
        """Copy the WAL's committed pages into the database on a thread of its own (PASSIVE).

        Called after each commit of an ``ingest`` (not of a ``watch`` save): unless a copy is
        still under way, or the WAL is smaller than ``BEHIND_BYTES``, one begins on its own
        connection (SQLite releases the GIL while it copies and syncs), and the writer goes
        on meanwhile. What the last copy left is all that ``close`` copies: a big sync
        otherwise ended on the whole WAL's copy and its two ``fsync`` calls, every worker
        done by then.
        """
        worker = self._checkpointer
        if (worker is not None and worker.is_alive()) or self._wal_bytes() < BEHIND_BYTES:
            return
        self._checkpointer = threading.Thread(target=_checkpoint, args=(self.path,), daemon=True)
        self._checkpointer.start()

    def _await_checkpoint(self) -> None:
        worker, self._checkpointer = self._checkpointer, None
        if worker is not None:
            worker.join()

    # -- transactions ------------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` … ``COMMIT``; rolled back on any exception (re-raised)."""
        if self._in_tx:
            yield self.conn
            return
        self.conn.execute("BEGIN IMMEDIATE")
        self._in_tx = True
        try:
            yield self.conn
        except BaseException:
            self._in_tx = False
            self._rolled_back()
            with suppress(sqlite3.Error):
                self.conn.execute("ROLLBACK")
            raise
        self._in_tx = False
        self.commit()

    def begin(self) -> None:
        """Open a transaction that ``end`` commits: ``transaction`` blocks meanwhile join it.

        For ``record.Run``, which records several documents in one transaction.
        """
        self.conn.execute("BEGIN IMMEDIATE")
        self._in_tx = True

    def end(self) -> None:
        """Commit the transaction ``begin`` opened (rolled back if the commit fails; re-raised)."""
        self._in_tx = False
        self.commit()

    def abort(self) -> None:
        """Roll back the transaction ``begin`` opened, if it is still open."""
        self._in_tx = False
        self._rolled_back()
        with suppress(sqlite3.Error):
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")

    def commit(self) -> None:
        """The one place a transaction becomes true (tests inject a full disk here)."""
        try:
            self._write_counts()
            reached("state-commit")
            self.conn.execute("COMMIT")
        except BaseException:
            self._rolled_back()
            with suppress(sqlite3.Error):
                self.conn.execute("ROLLBACK")
            raise

    def _rolled_back(self) -> None:
        """What the handle remembers of an open transaction goes with it."""
        self._counts.clear()
        self._no_redirects = None

    # -- meta --------------------------------------------------------------------------

    def meta(self, key: str, default: str = "") -> str:
        if self._counts:
            self._write_counts()
        row = self.conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return str(row[0]) if row else default

    def meta_int(self, key: str, default: int = 0) -> int:
        value = self.meta(key)
        return int(value) if value.lstrip("-").isdigit() else default

    def set_meta(self, **values: object) -> None:
        self.conn.executemany(
            "INSERT INTO meta(key, value) VALUES(?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
            [(k, str(v)) for k, v in values.items()],
        )

    def add_meta(self, key: str, delta: int) -> None:
        self.add_counts(**{key: delta})

    def add_counts(self, **deltas: int) -> None:
        """Add to integer counters in ``meta``.

        Inside a transaction the deltas are summed in memory and written once, just before
        it commits (a read and a write per document cost more than its rows in a big sync);
        ``meta`` writes them first when it is asked meanwhile.
        """
        deltas = {k: d for k, d in deltas.items() if d}
        if not deltas:
            return
        if self._in_tx:
            for key, delta in deltas.items():
                self._counts[key] = self._counts.get(key, 0) + delta
            return
        self._add_counts(deltas)

    def _write_counts(self) -> None:
        deltas, self._counts = self._counts, {}
        self._add_counts({k: d for k, d in deltas.items() if d})

    def _add_counts(self, deltas: dict[str, int]) -> None:
        if not deltas:
            return
        marks = ",".join("?" * len(deltas))
        now = dict(self.conn.execute(f"SELECT key, value FROM meta WHERE key IN ({marks})", list(deltas)))
        values = {}
        for key, delta in deltas.items():
            value = str(now.get(key, ""))
            values[key] = (int(value) if value.lstrip("-").isdigit() else 0) + delta
        self.set_meta(**values)

    def header(self) -> dict[str, Any]:
        """The manifest's header fields as they were: format, version, policy_hash, policy, corpus."""
        if self._counts:
            self._write_counts()
        rows = dict(self.conn.execute("SELECT key, value FROM meta").fetchall())
        out: dict[str, Any] = {k: v for k, v in rows.items() if k not in ("policy",)}
        out["format"] = FORMAT
        out["policy"] = orjson.loads(rows["policy"]) if rows.get("policy") else {}
        for key in ("generation", "chunks", "tokens", "feed_rows", "feed_floor", "sweep"):
            if key in out:
                out[key] = int(out[key])
        if "written_at_epoch" in out:
            out["written_at_epoch"] = float(out["written_at_epoch"])
        return out

    # -- documents ---------------------------------------------------------------------

    def has_docs(self) -> bool:
        return self.conn.execute("SELECT 1 FROM docs LIMIT 1").fetchone() is not None

    def count_docs(self) -> int:
        return int(self.conn.execute("SELECT count(*) FROM docs").fetchone()[0])

    def rels(self) -> set[str]:
        return {r for (r,) in self.conn.execute("SELECT rel FROM docs")}

    def iter_rels(self) -> Iterator[str]:
        for (rel,) in self.conn.execute("SELECT rel FROM docs ORDER BY rel").fetchall():
            yield rel

    def iter_uid_revs(self) -> Iterator[tuple[str, str]]:
        """``(rel, doc_uid|r)`` of every document, in path order, streamed."""
        cursor = self.conn.execute("SELECT rel, uid_rev FROM docs ORDER BY rel")
        while rows := cursor.fetchmany(4096):
            yield from rows

    def rels_under(self, prefix: str) -> list[str]:
        """Documents whose path starts with ``prefix`` (a folder and its ``/``)."""
        hi = prefix + "\U0010ffff"
        return [
            r for (r,) in self.conn.execute("SELECT rel FROM docs WHERE rel >= ? AND rel < ?", (prefix, hi))
        ]

    def rels_named(self, name: str) -> list[str]:
        return [r for (r,) in self.conn.execute("SELECT rel FROM docs WHERE name=?", (name,))]

    def rels_with_uid_rev(self, uid_rev: str) -> list[tuple[str, int]]:
        rows = self.conn.execute("SELECT rel, rev_width FROM docs WHERE uid_rev=? ORDER BY rel", (uid_rev,))
        return [(r, int(w)) for r, w in rows]

    def uid_revs_held_twice(self, keys: list[str]) -> set[str]:
        """The ``doc_uid|r`` values among ``keys`` that more than one document has."""
        held: set[str] = set()
        for i in range(0, len(keys), 500):
            part = keys[i : i + 500]
            marks = ",".join("?" * len(part))
            held.update(
                key
                for (key,) in self.conn.execute(
                    f"SELECT uid_rev FROM docs WHERE uid_rev IN ({marks}) GROUP BY uid_rev HAVING count(*) > 1",
                    part,
                )
            )
        return held

    def source_hash(self, rel: str) -> str | None:
        row = self.conn.execute("SELECT source_hash FROM docs WHERE rel=?", (rel,)).fetchone()
        return str(row[0]) if row else None

    def stamp(self, rel: str) -> tuple[Any, ...] | None:
        cols = ", ".join(_COLUMNS)
        row = self.conn.execute(f"SELECT {cols} FROM docs WHERE rel=?", (rel,)).fetchone()
        return tuple(row) if row else None

    def entry(self, rel: str) -> dict[str, Any] | None:
        """One document's manifest entry, as ``manifest.json`` had it (plus ``embeds``)."""
        cols = ", ".join(_COLUMNS)
        row = self.conn.execute(f"SELECT {cols}, name FROM docs WHERE rel=?", (rel,)).fetchone()
        if row is None:
            return None
        entry: dict[str, Any] = dict(zip(_COLUMNS, row[:-1], strict=True))
        lead = f"doc:{row[-1]}::ch"
        rows = self.conn.execute(
            "SELECT n, file, chunk_id, hash, digest, embed FROM chunks WHERE rel=? ORDER BY n", (rel,)
        ).fetchall()
        entry["files"] = [r[1] for r in rows]
        entry["ids"] = [f"{lead}{r[0]}" for r in rows]
        entry["chunk_ids"] = [r[2] for r in rows]
        entry["hashes"] = [r[3] for r in rows]
        # "" where the state never knew it (a migrated manifest): none of the document's
        entry["digests"] = [r[4] for r in rows] if any(r[4] for r in rows) else []
        entry["embeds"] = [r[5] for r in rows] if any(r[5] for r in rows) else []
        return entry

    def files_of(self, rel: str) -> list[str]:
        return [f for (f,) in self.conn.execute("SELECT file FROM chunks WHERE rel=? ORDER BY n", (rel,))]

    def put_doc(self, rel: str, entry: dict[str, Any], gen: int) -> None:
        """Replace a document's rows (inside a transaction)."""
        old = self.conn.execute("SELECT nfiles, tokens FROM docs WHERE rel=?", (rel,)).fetchone()
        self._unsign(rel)
        files = entry["files"]
        name = rel.rsplit(".", 1)[0]
        self.conn.execute(
            "INSERT OR REPLACE INTO docs VALUES(?,?,?,?,?,?,?,?,?,?,?)",
            (
                rel,
                name,
                entry.get("uid_rev", ""),
                entry["size"],
                entry["mtime_ns"],
                entry["source_hash"],
                entry["policy_hash"],
                entry["version"],
                int(entry.get("rev_width", 8)),
                len(files),
                int(entry.get("tokens", 0)),
            ),
        )
        if old is not None:
            self.conn.execute("DELETE FROM chunks WHERE rel=?", (rel,))
        cids, hashes = entry["chunk_ids"], entry["hashes"]
        digests, embeds = entry.get("digests") or (), entry.get("embeds") or ()
        if len(digests) < len(files) or len(embeds) < len(files):  # unknown: "" (a migrated manifest)
            digests = [*digests, *[""] * (len(files) - len(digests))]
            embeds = [*embeds, *[""] * (len(files) - len(embeds))]
        self.conn.executemany(
            "INSERT INTO chunks VALUES(?,?,?,?,?,?,?,?)",
            [(rel, i, f, cids[i], hashes[i], digests[i], embeds[i], gen) for i, f in enumerate(files)],
        )
        self.add_counts(
            chunks=len(files) - (old[0] if old else 0),
            tokens=int(entry.get("tokens", 0)) - (old[1] if old else 0),
        )

    def touch_doc(self, rel: str, mtime_ns: int) -> None:
        """A document hashed and found unchanged: only its mtime moves."""
        self._unsign(rel)
        self.conn.execute("UPDATE docs SET mtime_ns=? WHERE rel=?", (mtime_ns, rel))

    def drop_doc(self, rel: str) -> None:
        old = self.conn.execute("SELECT nfiles, tokens FROM docs WHERE rel=?", (rel,)).fetchone()
        if old is None:
            return
        self._unsign(rel)
        for table in ("docs", "chunks"):
            self.conn.execute(f"DELETE FROM {table} WHERE rel=?", (rel,))
        self.add_counts(chunks=-old[0], tokens=-old[1])

    # -- chunks ------------------------------------------------------------------------

    def file_owner(self, file: str, other_than: str = "") -> str | None:
        row = self.conn.execute("SELECT rel FROM chunks WHERE file=? AND rel<>? LIMIT 1", (file, other_than))
        found = row.fetchone()
        return str(found[0]) if found else None

    def is_live(self, chunk_id: str) -> bool:
        return (
            self.conn.execute("SELECT 1 FROM chunks WHERE chunk_id=? LIMIT 1", (chunk_id,)).fetchone()
            is not None
        )

    def drop_hash_index(self) -> None:
        """For a sync into an empty state: ``index_hashes`` makes it again once at its end.

        Nothing of such a sync asks it meanwhile (no document of it had chunks to rename), and
        a state opened without it gets it back (``_SCHEMA``).
        """
        self.conn.execute("DROP INDEX IF EXISTS chunks_hash")

    def index_hashes(self) -> None:
        """The chunks' hash index (``made_with_hash``), sorted once if it is missing."""
        self.conn.execute("CREATE INDEX IF NOT EXISTS chunks_hash ON chunks(hash, gen)")

    def made_with_hash(self, digest: str, since: int) -> tuple[str, str] | None:
        """The first chunk (document order) with this hash made in generation ``since`` or later."""
        row = self.conn.execute(
            "SELECT chunk_id, hash FROM chunks WHERE hash=? AND gen>=? ORDER BY rel, n LIMIT 1",
            (digest, since),
        ).fetchone()
        return (str(row[0]), str(row[1])) if row else None

    def hash_of(self, chunk_id: str) -> str:
        row = self.conn.execute("SELECT hash FROM chunks WHERE chunk_id=? LIMIT 1", (chunk_id,)).fetchone()
        return str(row[0]) if row else ""

    # -- redirects ---------------------------------------------------------------------

    def redirect(self, old: str) -> str | None:
        row = self.conn.execute("SELECT new FROM redirects WHERE old=?", (old,)).fetchone()
        return str(row[0]) if row else None

    def redirects_to(self, targets: Iterable[str]) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if self.no_redirects():
            return out
        for target in targets:
            out.extend(self.conn.execute("SELECT old, new FROM redirects WHERE new=?", (target,)).fetchall())
        return out

    def set_redirect(self, old: str, new: str) -> None:
        self.conn.execute("INSERT OR REPLACE INTO redirects VALUES(?, ?)", (old, new))
        self._no_redirects = False

    def no_redirects(self) -> bool:
        """The redirect map is empty (asked once per transaction while it stays so)."""
        if self._no_redirects is None or not self._in_tx:
            self._no_redirects = self.conn.execute("SELECT 1 FROM redirects LIMIT 1").fetchone() is None
        return self._no_redirects

    def drop_redirects(self, olds: Iterable[str]) -> int:
        if self.no_redirects():  # a first run: a lookup per live id would find nothing
            return 0
        cursor = self.conn.executemany("DELETE FROM redirects WHERE old=?", [(old,) for old in olds])
        return max(cursor.rowcount, 0)

    def all_redirects(self) -> dict[str, str]:
        return dict(self.conn.execute("SELECT old, new FROM redirects ORDER BY old").fetchall())

    def iter_redirects(self) -> Iterator[tuple[str, str]]:
        cursor = self.conn.execute("SELECT old, new FROM redirects ORDER BY old")
        while rows := cursor.fetchmany(1024):
            yield from rows

    def count_redirects(self) -> int:
        return int(self.conn.execute("SELECT count(*) FROM redirects").fetchone()[0])

    def locate(self, column: str, value: str) -> tuple[str, int, str] | None:
        """``(rel, n, file)`` of the first chunk whose ``column`` (chunk_id, id, file) is ``value``."""
        assert column in ("chunk_id", "id", "file")
        if column == "id":  # doc:<name>::ch<n>: the document by name, then the chunk by number
            name, sep, number = value.removeprefix("doc:").rpartition("::ch")
            if not value.startswith("doc:") or not sep or not number.isdigit() or str(int(number)) != number:
                return None
            row = self.conn.execute(
                "SELECT c.rel, c.n, c.file FROM docs d JOIN chunks c ON c.rel = d.rel AND c.n = ? "
                "WHERE d.name = ? ORDER BY c.rel LIMIT 1",
                (int(number), name),
            ).fetchone()
        else:
            row = self.conn.execute(
                f"SELECT rel, n, file FROM chunks WHERE {column}=? ORDER BY rel, n LIMIT 1", (value,)
            ).fetchone()
        return (str(row[0]), int(row[1]), str(row[2])) if row else None

    def iter_column(self, column: str) -> Iterator[str]:
        """Every chunk's ``column`` (chunk_id, id, file), in order, streamed."""
        assert column in ("chunk_id", "id", "file")
        if column == "id":  # not stored: SQLite sorts what it builds (on disk, past its cache)
            sql = "SELECT 'doc:' || d.name || '::ch' || c.n AS v FROM chunks c JOIN docs d USING(rel) ORDER BY v"
        else:
            sql = f"SELECT {column} FROM chunks ORDER BY {column}"
        cursor = self.conn.execute(sql)
        while rows := cursor.fetchmany(4096):
            for (value,) in rows:
                yield value

    def count_chunks(self) -> int:
        return int(self.conn.execute("SELECT count(*) FROM chunks").fetchone()[0])

    # -- in-flight record --------------------------------------------------------------

    def inflight(self) -> tuple[set[str], bool] | None:
        """What a run left to recover: its documents, and whether to sweep; None when clean."""
        rels = {r for (r,) in self.conn.execute("SELECT rel FROM inflight")}
        sweep = self.meta_int("sweep") != 0
        return (rels, sweep) if rels or sweep else None

    def set_inflight(self, rels: Iterable[str], *, sweep: bool) -> None:
        self.conn.execute("DELETE FROM inflight")
        self.conn.executemany("INSERT OR IGNORE INTO inflight VALUES(?)", [(r,) for r in rels])
        self.set_meta(sweep=int(sweep))

    def done(self, rel: str) -> None:
        self.conn.execute("DELETE FROM inflight WHERE rel=?", (rel,))

    # -- output folders ----------------------------------------------------------------

    def folder_mtimes(self) -> dict[str, int]:
        return dict(self.conn.execute("SELECT folder, mtime_ns FROM folders").fetchall())

    def set_folder_mtimes(self, mtimes: dict[str, int]) -> None:
        self.conn.executemany("INSERT OR REPLACE INTO folders VALUES(?, ?)", list(mtimes.items()))

    def forget_folders(self, folders: Iterable[str]) -> None:
        self.conn.executemany("DELETE FROM folders WHERE folder=?", [(f,) for f in folders])

    # -- corpus folders ----------------------------------------------------------------

    def signatures(self) -> dict[str, bytes]:
        """Every corpus folder's recorded signature (a row per folder, not per document)."""
        return dict(self.conn.execute("SELECT folder, sig FROM srcdirs").fetchall())

    def sign(self, signatures: dict[str, bytes]) -> None:
        self.conn.executemany("INSERT OR REPLACE INTO srcdirs VALUES(?, ?)", list(signatures.items()))

    def _unsign(self, rel: str) -> None:
        """A document's row changes: its folder's signature no longer vouches for it."""
        self.conn.execute("DELETE FROM srcdirs WHERE folder=?", (folder_of(rel),))

    def doc_folders(self) -> set[str]:
        """The folders (``a/b/``, ``""``) that hold a recorded document: one pass over an index."""
        return {f for (f,) in self.conn.execute(f"SELECT DISTINCT {FOLDER_OF} FROM docs")}

    def folder_stamps(self, folder: str, policy_hash: str, version: str) -> dict[str, tuple[int, int, bool]]:
        """The documents directly in ``folder``: ``rel`` → (size, mtime, made under this policy and version)."""
        rows = self.conn.execute(
            f"SELECT rel, size, mtime_ns, policy_hash=? AND version=? FROM docs WHERE {FOLDER_OF}=?",
            (policy_hash, version, folder),
        )
        return {rel: (size, mtime, bool(current)) for rel, size, mtime, current in rows}


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    return (
        conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (name,)).fetchone()
        is not None
    )


def _migrate(conn: sqlite3.Connection) -> None:
    """Format 2 → 3 in one transaction, nothing re-chunked: each chunk's row takes its digests
    from the document's ``entries`` blob, which goes, with the ``id`` column and its index.

    Format 2 kept every document's lists twice (the blob, and the ``chunks`` rows) and indexed
    the chunks four ways: a first run of ``make bench`` wrote 80 MB of state for 31,214 chunks.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        if _has_table(conn, "entries"):  # not done meanwhile by another session
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


def now_epoch() -> float:
    return time.time()


def size_on_disk(path: Path) -> int:
    """The database and its WAL, in bytes (for the benchmark and the summary)."""
    total = 0
    for suffix in ("", "-wal"):
        with suppress(OSError):
            total += os.stat(f"{path}{suffix}").st_size
    return total


def dump_state(out: Path) -> dict[str, Any]:
    """The whole state as ``manifest.json`` held it, plus ``redirects`` and ``inflight``.

    Reads every row: for tests, debugging and small outputs, never on a run's path.
    """
    from pipeline.run.state import state_dir

    db = StateDB.reader(db_path(state_dir(out)))
    try:
        header = db.header()
        docs = {rel: db.entry(rel) for rel in db.iter_rels()}
        inflight = db.inflight()
        return {
            **header,
            "docs": docs,
            "redirects": db.all_redirects(),
            "inflight": None if inflight is None else {"docs": sorted(inflight[0]), "sweep": inflight[1]},
        }
    finally:
        db.close()
