"""The state database's rows: documents, chunks, redirects, removed ids, output and corpus folders.

``StateRows`` holds the queries and the row writes; ``db.StateDB`` adds the connection,
the transactions and the counters it builds on. Apart so that each stays readable: the
rows are what a sync asks and records, the rest is how.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from typing import Any

from pipeline.run.db_schema import COLUMNS, FOLDER_OF, folder_of


class StateRows:
    """Reads and row writes of the state database (a mixin of ``db.StateDB``)."""

    conn: sqlite3.Connection
    _in_tx: bool
    _no_redirects: bool | None

    def add_counts(self, **deltas: int) -> None:
        """Add to integer counters in ``meta`` (``db.StateDB`` implements it)."""
        raise NotImplementedError

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
        cols = ", ".join(COLUMNS)
        row = self.conn.execute(f"SELECT {cols} FROM docs WHERE rel=?", (rel,)).fetchone()
        return tuple(row) if row else None

    def entry(self, rel: str) -> dict[str, Any] | None:
        """One document's manifest entry, as ``manifest.json`` had it (plus ``embeds``)."""
        cols = ", ".join(COLUMNS)
        row = self.conn.execute(f"SELECT {cols}, name FROM docs WHERE rel=?", (rel,)).fetchone()
        if row is None:
            return None
        entry: dict[str, Any] = dict(zip(COLUMNS, row[:-1], strict=True))
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
        a state opened without it gets it back (``db_schema.SCHEMA``).
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

    # -- ids of removed documents, kept a while -------------------------------------------

    def keep_gone(self, ids: Iterable[tuple[str, str]], when: float, forget_before: float) -> None:
        """Remember removed ids with their text's hash (``when``: now); forget those gone before ``forget_before``."""
        self.conn.execute("DELETE FROM gone_ids WHERE gone_at<?", (forget_before,))
        self.conn.executemany(
            "INSERT OR REPLACE INTO gone_ids VALUES(?, ?, ?)", [(c, h, when) for c, h in ids]
        )

    def take_gone(self, hashes: Iterable[str], since: float) -> list[tuple[str, str]]:
        """The removed ids (with their hash) gone at ``since`` or later whose text has one of
        ``hashes``; they are forgotten (the caller redirects them)."""
        if self.conn.execute("SELECT 1 FROM gone_ids LIMIT 1").fetchone() is None:
            return []
        found: list[tuple[str, str]] = []
        for digest in set(hashes):
            found.extend(
                self.conn.execute(
                    "SELECT chunk_id, hash FROM gone_ids WHERE hash=? AND gone_at>=? ORDER BY chunk_id",
                    (digest, since),
                ).fetchall()
            )
        self.conn.executemany("DELETE FROM gone_ids WHERE chunk_id=?", [(c,) for c, _ in found])
        return found

    def keep_born(self, ids: Iterable[tuple[str, str]], when: float, forget_before: float) -> None:
        """Remember the ids (with their text's hash) of a document new to the state; forget older ones."""
        self.conn.execute("DELETE FROM born_ids WHERE born_at<?", (forget_before,))
        self.conn.executemany(
            "INSERT OR REPLACE INTO born_ids VALUES(?, ?, ?)", [(c, h, when) for c, h in ids]
        )

    def born_with_hash(self, digest: str, since: float) -> str | None:
        """The first live chunk (document order) with this hash of a document new at ``since`` or later."""
        row = self.conn.execute(
            "SELECT c.chunk_id FROM born_ids b JOIN chunks c ON c.chunk_id=b.chunk_id "
            "WHERE b.hash=? AND b.born_at>=? ORDER BY c.rel, c.n LIMIT 1",
            (digest, since),
        ).fetchone()
        return str(row[0]) if row else None

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
