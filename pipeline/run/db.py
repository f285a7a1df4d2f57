"""chunkyard's state database, ``CHUNKS/.chunkyard/state.sqlite``: the parent's handle on it (docs/spec.md, State and scale).

The tables and their meaning are in ``db_schema.py``, the row queries in ``db_rows.py``;
this module opens the database, runs transactions, keeps the counters and the header, and
copies the WAL behind a big sync. Each document is recorded whole in one transaction (its
rows, its feed lines, its redirects, its stale files' deletes; a big sync puts several
documents in one, ``writer.StateWriter``). Only the parent process opens the database for
writing; workers never see it.
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
from pipeline.run.db_rows import StateRows
from pipeline.run.db_schema import FILE, FORMAT, SCHEMA, connect, folder_of, has_table, upgrade_format

__all__ = [
    "FILE",
    "FORMAT",
    "StateDB",
    "StateError",
    "connect",
    "db_path",
    "dump_state",
    "folder_of",
    "size_on_disk",
]


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


class StateDB(StateRows):
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
            conn.executescript(SCHEMA)
            if has_table(conn, "entries"):
                upgrade_format(conn)
        except sqlite3.Error as exc:
            raise StateError(f"{self.path}: cannot open chunkyard's state ({exc})") from exc
        return conn

    def _open_reader(self) -> sqlite3.Connection:
        """The database as it is; one in an older format is refused with the way out."""
        try:
            conn = connect(self.path, readonly=True)
            conn.execute("SELECT 1 FROM meta LIMIT 1")
            old = has_table(conn, "entries")
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
        """The header, with the fields ``manifest.json`` had: format, version, policy_hash, policy, corpus."""
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
