"""The change feed with sequence numbers, in the state database (docs/spec.md, Runs; State and scale).

Each line is one row of ``feed`` in ``CHUNKS/.chunkyard/state.sqlite``: its ``seq`` (from
1, monotonic, never reused), and the 004 envelope as JSON (``ingest.write``,
``ingest.delete``, ``ingest.redirect``). A document's lines are committed in the same
transaction as its state, so a reader never sees a line whose chunk file is not in place,
nor misses one the state has recorded. ``read_feed(out, after_seq)`` reads them.

Retention (why the feed's size follows the live corpus, not its history): every line has
a key, the chunk file it is about (writes and deletes) or the old ``chunk_id`` (redirects).
When the feed holds more than twice as many lines as the last compaction left (and more
than twice the live chunk files), a sync ends by compacting it:

1. per key, only the last line stays (a file's last write or delete; an id's last redirect);
2. a kept write that replaces a ``text`` write says ``"change": "text"`` (a reader that had
   not read the dropped line must re-embed);
3. a redirect whose old id the redirect map no longer holds is dropped;
4. delete lines (of files that stayed deleted) stay while they are at most a quarter of
   the live chunk files; past that the oldest go, and the feed's *floor* rises to the
   newest seq dropped so.

A reader resuming after ``seq`` ≥ floor reads every line that still matters since then and
ends in the current state, as if it had read every line; after a ``seq`` below the floor
(or past the feed's end: a feed made anew) ``read_feed`` raises ``FeedGapError``: read again
from 0 (the whole current state) and drop what it no longer announces.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from pipeline.errors import PipelineError
from pipeline.run.checkpoint import reached
from pipeline.run.db import StateDB, connect, db_path

#: Compaction runs when the feed holds more than this many times its last compacted size.
GROWTH = 2
#: Delete lines kept, as a share of the live chunk files, before the oldest go.
TOMBSTONE_SHARE = 4
#: The feed is never compacted below this many lines.
MIN_COMPACT = 1000


class FeedGapError(PipelineError):
    """The feed no longer reaches ``after_seq``: compacted past it, or made anew."""


@dataclass(frozen=True, slots=True)
class FeedLine:
    """One line of the feed: its sequence number and its 004 envelope (with ``seq``)."""

    seq: int
    event: dict[str, Any]


def _state_file(out: Path) -> Path:
    from pipeline.run.state import state_dir

    return db_path(state_dir(Path(out)))


def read_feed(out: Path, after_seq: int = 0) -> Iterator[FeedLine]:
    """The lines of ``out``'s feed after ``after_seq`` (0: from the start), in order.

    Reads one consistent snapshot (lines committed meanwhile are for the next call).
    Raises ``FeedGapError`` when the feed no longer reaches ``after_seq``.
    """
    path = _state_file(out)
    if not path.exists():
        if after_seq:
            raise FeedGapError(f"{path}: no change feed here, so it does not reach seq {after_seq}")
        return
    conn = connect(path, readonly=True)
    try:
        conn.execute("BEGIN")  # one snapshot for the check and the lines
        floor, last = _bounds(conn)
        if after_seq and (after_seq < floor or after_seq > last):
            where = "was compacted past it" if after_seq < floor else f"ends at seq {last} (made anew?)"
            raise FeedGapError(
                f"{path}: the change feed {where}, so it does not reach seq {after_seq} "
                "(hint: read again from seq 0; applying the feed twice is harmless)"
            )
        try:
            cursor = conn.execute("SELECT seq, line FROM feed WHERE seq > ? ORDER BY seq", (after_seq,))
        except sqlite3.OperationalError as exc:  # a first run is creating the database right now
            if "no such table" not in str(exc):
                raise
            return  # nothing committed yet (a reader past seq 0 got FeedGapError above)
        while rows := cursor.fetchmany(512):
            for seq, line in rows:
                event = orjson.loads(line)
                event["seq"] = seq
                yield FeedLine(seq, event)
        conn.execute("COMMIT")
    finally:
        conn.close()


def _bounds(conn: sqlite3.Connection) -> tuple[int, int]:
    """The feed's floor and the last seq ever given (0 when none)."""
    try:
        row = conn.execute("SELECT value FROM meta WHERE key='feed_floor'").fetchone()
        seq = conn.execute("SELECT seq FROM sqlite_sequence WHERE name='feed'").fetchone()
    except sqlite3.OperationalError:  # an empty database: no tables yet
        return 0, 0
    return (int(row[0]) if row else 0), (int(seq[0]) if seq else 0)


def last_seq(out: Path) -> int:
    """The newest seq of ``out``'s feed (0 when empty): where a reader that is current stands."""
    path = _state_file(out)
    if not path.exists():
        return 0
    conn = connect(path, readonly=True)
    try:
        return _bounds(conn)[1]
    finally:
        conn.close()


def key_of(event: dict[str, Any]) -> str:
    """What a line is about: a chunk file, or an old ``chunk_id`` (for retention)."""
    if event.get("event") == "ingest.redirect":
        return "r\x1f" + str(event.get("old", ""))
    return file_key(str(event.get("file", "")))


def file_key(file: str) -> str:
    """``key_of`` a line about the chunk file ``file``."""
    return "f\x1f" + file


def append(db: StateDB, rows: list[tuple[str, str, int, bytes]]) -> None:
    """Add lines, each ``(key, kind, text, line)``, inside the caller's transaction (they
    commit with the state they describe)."""
    db.conn.executemany("INSERT INTO feed(key, kind, text, line) VALUES(?,?,?,?)", rows)
    db.add_meta("feed_rows", len(rows))
    reached("feed-append")  # in the transaction, not yet committed


def due(db: StateDB) -> bool:
    """Whether the feed has grown enough since its last compaction to compact it now."""
    rows = db.meta_int("feed_rows")
    base = max(db.meta_int("feed_compacted"), db.meta_int("chunks"), MIN_COMPACT)
    return rows > GROWTH * base


def compact(db: StateDB) -> int:
    """Apply the retention rule (module docstring) in one transaction; returns lines dropped."""
    conn = db.conn
    with db.transaction():
        # 2. a write that replaces a text write says text
        promoted = conn.execute(
            "SELECT f.seq, f.line FROM feed f JOIN (SELECT key, max(seq) AS last, max(text) AS any_text "
            "FROM feed GROUP BY key HAVING any_text = 1) k ON f.seq = k.last WHERE f.text = 0 AND f.kind = 'w'"
        ).fetchall()
        for seq, line in promoted:
            event = orjson.loads(line)
            event["change"] = "text"
            conn.execute("UPDATE feed SET text=1, line=? WHERE seq=?", (orjson.dumps(event), seq))
        # 1. the last line per key
        before = conn.execute("SELECT count(*) FROM feed").fetchone()[0]
        conn.execute("DELETE FROM feed WHERE seq NOT IN (SELECT max(seq) FROM feed GROUP BY key)")
        # 3. redirects the map dropped
        conn.execute("DELETE FROM feed WHERE kind='r' AND substr(key, 3) NOT IN (SELECT old FROM redirects)")
        # 4. the oldest delete lines past their share
        live = db.meta_int("chunks")
        deletes = conn.execute("SELECT count(*) FROM feed WHERE kind='d'").fetchone()[0]
        allowed = max(live // TOMBSTONE_SHARE, MIN_COMPACT // 4)
        if deletes > allowed:
            cut = conn.execute(
                "SELECT seq FROM feed WHERE kind='d' ORDER BY seq LIMIT 1 OFFSET ?", (deletes - allowed - 1,)
            ).fetchone()[0]
            conn.execute("DELETE FROM feed WHERE kind='d' AND seq <= ?", (cut,))
            db.set_meta(feed_floor=max(db.meta_int("feed_floor"), int(cut)))
        after = conn.execute("SELECT count(*) FROM feed").fetchone()[0]
        db.set_meta(feed_rows=after, feed_compacted=after)
    return int(before - after)
