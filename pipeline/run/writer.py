"""One sync's writes to the state: documents recorded a batch to a transaction, with their feed lines.

A document is recorded whole (its rows, its change-feed lines, its stale files' removal,
its redirects) inside one transaction, committed once its chunk files are in place. A
transaction may hold several documents: the first is committed alone, and each commit
lets the next transaction hold twice as many, up to ``BATCH`` documents or
``BATCH_SECONDS``; a sync commits what it holds before it ends. Consecutive documents
change many of the same pages (the feed's, the chunk table's, the counters'), so fewer
commits write far fewer pages. A sync whose caller hears of each document as it is
recorded (a progress bar, ``watch``) commits each document alone, so that what the caller
hears of is in the feed.

A crash loses no more than a commit per document would: every document of the open
transaction is in flight, so the next run re-checks it against the disk and announces
what the state has not recorded. A commit that fails leaves every document of its
transaction to be re-checked (``unsafe``).
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from pipeline.run import feed
from pipeline.run.db import StateDB
from pipeline.run.model import Options, Summary
from pipeline.run.state import event

#: The feed's ``kind`` column of each event (``o``: other).
_KIND = {"ingest.write": "w", "ingest.delete": "d", "ingest.redirect": "r"}
#: The most documents one transaction holds, and the longest it stays open (seconds).
BATCH = 256
BATCH_SECONDS = 1.0

#: A feed row as ``feed.append`` takes it: (key, kind, is a text change, the line's JSON).
FeedRow = tuple[str, str, int, bytes]


@dataclass(slots=True)
class StateWriter:
    """One sync's writes: the open transaction, its feed lines, and what the sync did so far.

    Small whatever the corpus: it holds per-document facts, never per-chunk records.
    """

    opts: Options
    policy_hash: str
    run_id: str
    generation: int
    summary: Summary
    db: StateDB
    recovering: set[str]  #: documents whose files the state may not describe
    whole: bool = False  #: a whole-corpus sync: every output folder was checked at its start
    #: a one-shot sync (``ingest``, not a ``watch`` save): the WAL is copied behind its commits
    copy_behind: bool = False
    #: the most documents in one transaction: 1 when the caller hears of each as it is recorded
    max_docs_per_commit: int = BATCH
    #: documents the state has no row for, from their jobs until recorded (none is looked up)
    unrecorded: set[str] = field(default_factory=set)
    #: chunks "made now" (a rename's new place) are those of this generation or later: the
    #: generation of the first of the runs that died before this one finished their work
    made_since: int = 0
    #: remember the chunks of documents new to the state for a while (``record.GONE_KEPT_S``):
    #: not in a first run, where every document is new
    keep_births: bool = True
    uid_revs: dict[str, str] = field(default_factory=dict)  #: documents recorded now → their ``doc_uid|r``
    with_vanished_ids: set[str] = field(default_factory=set)  #: documents some of whose old ids went
    unsafe: set[str] = field(default_factory=set)  #: documents whose write failed half-way
    maybe_emptied: set[str] = field(default_factory=set)  #: output folders a removal may have emptied
    folders_stamped: set[str] = field(default_factory=set)  #: output folders whose mtime was recorded now
    removal_failed: bool = False  #: a stale file could not be removed
    error: Exception | None = None  #: the state could not be written
    feed_lines: list[FeedRow] = field(default_factory=list)  #: lines of the document being recorded
    #: the documents recorded in the open transaction ("" for a sweep), not committed yet
    open_docs: list[str] = field(default_factory=list)
    opened: float = 0.0  #: when the open transaction began (``time.monotonic``)
    #: output folders a document of the open transaction was written in (their mtimes at the commit)
    folder_mtimes: dict[str, int] = field(default_factory=dict)
    docs_per_commit: int = 1  #: documents the open transaction may hold: doubled at each commit

    def add_feed_line(self, kind: str, **fields: Any) -> None:
        """One change-feed line (the 004 envelope); written with the document's transaction."""
        line = event(kind, self.run_id, self.generation, **fields)
        self.feed_lines.append((feed.key_of(line), _KIND.get(kind, "o"), 0, orjson.dumps(line)))

    def write(self, rel: str, work: Callable[[], None]) -> bool:
        """Run ``work()`` (one document's writes) in the open transaction, with the feed lines
        it adds; False when that failed (the document is then re-checked by the next run).

        The transaction is committed once it holds ``docs_per_commit`` documents or is
        ``BATCH_SECONDS`` old, else by ``commit``.
        """
        self.feed_lines.clear()
        try:
            if not self.open_docs:
                self.db.begin()
                self.opened = time.monotonic()
            self.open_docs.append(rel)
            work()
            if self.feed_lines:
                feed.append(self.db, self.feed_lines)
                self.feed_lines = []
        except (sqlite3.Error, OSError) as exc:
            self.feed_lines.clear()
            self._lost(exc)
            return False
        except BaseException:  # Ctrl-C, a bug: a document half recorded must not be committed
            self.feed_lines.clear()
            self._lost(None)
            raise
        if len(self.open_docs) >= self.docs_per_commit or time.monotonic() - self.opened >= BATCH_SECONDS:
            return self.commit()
        return True

    def commit(self) -> bool:
        """Commit the open transaction, if any; False when that failed (its documents are unsafe)."""
        if not self.open_docs:
            return True
        try:
            self._stat_folders()
            self.db.set_folder_mtimes(self.folder_mtimes)
            self.db.set_meta(written_at_epoch=repr(time.time()))
            self.db.end()
        except (sqlite3.Error, OSError) as exc:
            self._lost(exc)
            return False
        except BaseException:
            self._lost(None)
            raise
        self.open_docs.clear()
        self.folder_mtimes.clear()
        self.docs_per_commit = min(2 * self.docs_per_commit, self.max_docs_per_commit)
        if self.copy_behind:  # its next documents are recorded while the WAL is copied
            self.db.checkpoint_behind()
        return True

    def folder_whole(self, rel: str) -> None:
        """Note document ``rel``'s output folder, now that its files are as the state says.

        Its mtime is taken when the transaction commits, once for all the documents of that
        folder in it: a later run that finds the folder with that mtime knows no file of it
        went since (``scan.OutputFolders``). Files that other documents' workers add
        meanwhile move the mtime again: the next run then lists the folder, which is safe.
        """
        folder = rel.rpartition("/")[0]
        if not self.whole:  # a save in watch: the folder was not checked, so it is not known whole
            self.folder_mtimes.pop(folder, None)
            self.db.forget_folders([folder])
            return
        self.folders_stamped.add(folder)
        self.folder_mtimes[folder] = 0  # stat at the commit

    def _stat_folders(self) -> None:
        """The mtimes of the output folders the open transaction's documents were recorded in."""
        gone = []
        for folder in self.folder_mtimes:
            try:
                self.folder_mtimes[folder] = os.stat(
                    self.opts.out / folder if folder else self.opts.out
                ).st_mtime_ns
            except OSError:
                gone.append(folder)
        for folder in gone:
            del self.folder_mtimes[folder]
        if gone:
            self.db.forget_folders(gone)

    def _lost(self, exc: Exception | None) -> None:
        """The open transaction is lost: its documents are re-checked by the next run."""
        self.db.abort()
        if self.error is None and exc is not None:
            self.error = exc
        self.unsafe.update(rel for rel in self.open_docs if rel)
        self.open_docs.clear()
        self.folder_mtimes.clear()
