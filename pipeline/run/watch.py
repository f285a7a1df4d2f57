"""Watch: keep the chunk folder current while documents are saved (docs/spec.md, Watch).

A watchdog observer (inotify here, or polling with ``polling=True``) reports file-system
events; ``watch_events.EventHandler`` maps each to a corpus-relative document path, or to
a folder that was created, deleted or moved, and drops everything else (how editors'
saves become marks is told there). ``Watcher`` debounces the marks per path (a path is
ripe once it has been quiet for ``debounce`` seconds), coalesces them, and hands each
ripe batch to ``Session.sync(paths)``; that is what gives watch the guarantees of
``ingest``: atomic chunk files, stale ones removed, the change feed, the state written
last, one writer per output folder (the lock is held until ``stop``).

A batch keeps only paths that are documents now or that the state has: a file made and
deleted within one debounce, or emacs' lock link, costs no sync. A document that fails
(half-saved, invalid UTF-8 for a moment) is reported; ``Session`` keeps its previous
chunks, and the next save of it is synced again.

The first sync may use a process pool, so it runs before the observer thread exists;
a second, incremental sync then catches what was saved meanwhile.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Self

from watchdog.observers.api import BaseObserver

from pipeline.run.discover import SKIP_DIRS, discover, excluded, find_one, is_document
from pipeline.run.model import DocResult, Options, Summary
from pipeline.run.session import Session
from pipeline.run.watch_events import EventHandler, Key, is_editor_temp, start_observer
from pipeline.run.watch_report import DocChange, Done, OnSync, SyncReport, doc_change, ms_of
from pipeline.run.watchlimit import FolderPoller

DEFAULT_DEBOUNCE = 0.05
#: A path that never goes quiet (a writer streaming into it) is synced at least this often.
MAX_DELAY = 1.0
#: How often the polling observer scans the corpus.
POLL_INTERVAL = 0.25
#: A sync that would delete documents waits this long after their last event first: ``rm -rf``
#: of the whole corpus unlinks its documents before the folder, and removing their chunks
#: in between would undo "a vanished corpus keeps its chunks".
DELETE_GRACE = 0.5


@dataclass(slots=True)
class _Mark:
    first: float  #: monotonic time of the first event since the last sync
    last: float  #: and of the latest
    renamed_from: str | None = None  #: a document renamed to this one


class Watcher:
    """Sync once, then keep ``opts.out`` current with ``opts.corpus`` until ``stop()``.

    Runs in its own thread; ``on_sync`` is called from it after every sync. Use it as a
    context manager, or ``start()`` + ``wait_ready()`` ... ``stop()``.

    Args:
        opts: corpus, output, policy. ``jobs`` and ``full`` apply to the first sync only.
        debounce: seconds a path must be quiet before it is synced.
        polling: use watchdog's polling observer (network and FUSE file systems).
        on_sync: called with each ``SyncReport``.
        on_wait: called with the holder's name while waiting for the output lock.
        on_warning: called once if inotify cannot watch every folder (``watchlimit.py``).
    """

    def __init__(
        self,
        opts: Options,
        *,
        debounce: float = DEFAULT_DEBOUNCE,
        polling: bool = False,
        on_sync: OnSync | None = None,
        on_wait: Callable[[str], None] | None = None,
        on_warning: Callable[[str], None] | None = None,
    ) -> None:
        self.opts = opts
        self.on_warning = on_warning
        self.warnings: list[str] = []  #: what ``on_warning`` was told
        #: polls the folders inotify refused (past ``fs.inotify.max_user_watches``)
        self._poller: FolderPoller | None = None
        self.debounce = debounce
        self.max_delay = max(MAX_DELAY, 10 * debounce)
        self.polling = polling
        self.on_sync = on_sync
        self.failing: dict[str, str] = {}  #: documents whose last sync failed → why
        self.fatal: str | None = None  #: why watching stopped on its own, if it did
        self.ready = threading.Event()  #: set once the first sync is done and events flow
        self.done = threading.Event()  #: set when the worker thread has finished
        self._session = Session(opts, on_wait)
        self._root = opts.corpus.resolve()
        self._out_str = str(opts.out.resolve())
        self._out_inside = Path(self._out_str).is_relative_to(self._root)
        self._cond = threading.Condition()
        self._pending: dict[Key, _Mark] = {}
        self._partners: dict[Key, set[Key]] = {}
        self._stopping = False
        self._syncing = False
        self._observer: BaseObserver | None = None
        self._observer_gone = threading.Event()
        self._thread = threading.Thread(target=self._work, name="chunkyard-watch", daemon=True)

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Take the output lock (here, so lock errors reach the caller), then start the worker."""
        self._session.__enter__()
        self._thread.start()

    def wait_ready(self, timeout: float | None = None) -> bool:
        return self.ready.wait(timeout)

    def stop(self) -> None:
        """Stop cleanly: the sync under way finishes, pending saves are flushed, the lock released."""
        with self._cond:
            self._stopping = True
            observer = self._observer
            self._cond.notify_all()
        if observer is not None:
            observer.stop()
            observer.join()
        if self._poller is not None:
            self._poller.stop()
        self._observer_gone.set()
        if self._thread.is_alive():
            self._thread.join()
        self._session.__exit__(None, None, None)

    def __enter__(self) -> Self:
        self.start()
        self.wait_ready()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def pending(self) -> list[str]:
        """The paths that wait to be quiet for ``debounce`` seconds before their sync."""
        with self._cond:
            return sorted(rel for rel, _ in self._pending)

    def idle(self) -> bool:
        """Nothing pending and no sync under way (events still in the kernel aside)."""
        with self._cond:
            return not self._pending and not self._syncing

    # -- observer thread ---------------------------------------------------------------

    def relative(self, path: str, is_dir: bool) -> str | None:
        """The corpus-relative POSIX path of an event's path, or None when watch ignores it."""
        rel = os.path.relpath(path, self._root)
        if rel == ".":
            return ""
        if rel.startswith(".." + os.sep) or rel == "..":
            return None
        rel = rel.replace(os.sep, "/")
        parts = rel.split("/")
        if SKIP_DIRS.intersection(parts) or excluded(rel, self.opts.exclude):
            return None
        if self._out_inside and (path == self._out_str or path.startswith(self._out_str + os.sep)):
            return None
        if not is_dir and (not is_document(parts[-1]) or is_editor_temp(path)):
            return None
        return rel

    def mark(self, keys: list[Key], renamed_from: str | None = None) -> None:
        """Note events on ``keys``; keys marked together (a rename) are synced together."""
        if not keys:
            return
        now = time.monotonic()
        with self._cond:
            for key in keys:
                mark = self._pending.get(key)
                if mark is None:
                    mark = self._pending[key] = _Mark(now, now)
                mark.last = now
                if renamed_from is not None and key[0] != renamed_from:
                    mark.renamed_from = renamed_from
                if len(keys) > 1:
                    self._partners.setdefault(key, set()).update(k for k in keys if k != key)
            self._cond.notify_all()

    def corpus_gone(self) -> None:
        with self._cond:
            self.fatal = f"{self.opts.corpus}: the corpus folder was deleted or moved; watch stopped"
            self._cond.notify_all()

    # -- worker thread -----------------------------------------------------------------

    def _work(self) -> None:
        try:
            self._first_sync()
            while (batch := self._next_batch()) is not None:
                self._sync_batch(batch)
            self._observer_gone.wait()
            with self._cond:
                rest, self._pending, self._partners = self._pending, {}, {}
            if rest and self.fatal is None:
                self._sync_batch(rest)
        except Exception as exc:  # a bug (or on_sync failed): say so, and keep the traceback
            if not self.opts.corpus.is_dir():  # not a bug: the corpus went while a sync read it
                self.corpus_gone()
                return
            self.fatal = f"watch stopped: {exc!r}"
            raise
        finally:
            self.ready.set()
            self.done.set()

    def _first_sync(self) -> None:
        """Sync the corpus (with the pool), start the observer, then catch up on edits made meanwhile.

        The pool forks, so it runs before any observer thread exists; later syncs are small
        and run in this thread.
        """
        first = self._run_sync(None, initial=True)
        if self.fatal is not None:
            self._emit(first)
            return
        self._session.opts = replace(self.opts, jobs=1, full=False)
        with self._cond:
            if self._stopping:
                self._emit(first)
                return
            handler = EventHandler(self.relative, self.mark, self.corpus_gone)
            self._observer, self._poller = start_observer(
                str(self._root), handler, polling=self.polling, interval=POLL_INTERVAL, warn=self._warn
            )
        catch_up = self._run_sync(None, initial=False, quiet_if_idle=True)
        # the first report goes out once events flow: an edit made after it is seen by inotify
        self._emit(first)
        self._emit(catch_up)
        self.ready.set()

    def _warn(self, message: str) -> None:
        self.warnings.append(message)
        if self.on_warning is not None:
            self.on_warning(message)

    def _next_batch(self) -> dict[Key, _Mark] | None:
        """Wait for the next ripe batch: paths quiet for ``debounce``, with their rename partners."""
        with self._cond:
            while True:
                if self._stopping or self.fatal is not None:
                    return None
                now = time.monotonic()
                due = {
                    k: min(m.last + self.debounce, m.first + self.max_delay) for k, m in self._pending.items()
                }
                if any(t <= now for t in due.values()):
                    # take what is nearly due too, and what lies under a ripe folder: the events
                    # of one folder move or one editor save arrive over a few milliseconds
                    ripe = [k for k, t in due.items() if t <= now + self.debounce / 2]
                    folders = tuple(rel + "/" for rel, is_folder in ripe if is_folder)
                    ripe += [k for k in due if folders and k[0].startswith(folders) and k not in ripe]
                    self._syncing = True
                    return self._take(ripe)
                self._cond.wait(min(due.values()) - now if due else None)

    def _take(self, keys: Iterable[Key]) -> dict[Key, _Mark]:
        """Pop ``keys``' marks and their rename partners' (the caller holds ``_cond``)."""
        taken = set(keys)
        todo = list(taken)
        while todo:
            for partner in self._partners.pop(todo.pop(), ()):
                if partner not in taken:
                    taken.add(partner)
                    todo.append(partner)
        return {k: self._pending.pop(k) for k in taken if k in self._pending}

    def _arrivals(self) -> dict[Key, _Mark]:
        """Pop the marks of new documents, of other deletions and of folders: what came while a
        deletion waited out its grace may be the other half of a move, best seen in one sync."""
        db, corpus = self._session.db, self.opts.corpus
        with self._cond:
            return self._take(
                [k for k in self._pending if k[1] or db.stamp(k[0]) is None or not (corpus / k[0]).is_file()]
            )

    def _expand(self, folder: str) -> set[str]:
        """Documents the state has under ``folder``, and those there now."""
        prefix = folder + "/"
        paths = set(self._session.db.rels_under(prefix))
        top = self.opts.corpus / folder
        if top.is_dir():
            found, _ = discover(top, self.opts.out)
            paths.update(prefix + f.rel_path for f in found)
        return paths

    def _paths(self, batch: dict[Key, _Mark]) -> set[str]:
        """The documents a batch touches: its paths and its folders' documents, now or in the state."""
        db, opts = self._session.db, self.opts
        paths: set[str] = set()
        for rel, is_folder in batch:
            paths.update(self._expand(rel) if is_folder else (rel,))
        return {
            p
            for p in paths
            if db.stamp(p) is not None or find_one(opts.corpus, p, opts.out, opts.exclude) is not None
        }

    def _sync_batch(self, batch: dict[Key, _Mark]) -> None:
        try:
            opts = self.opts
            paths = self._paths(batch)
            if not paths:
                return
            if any(not (opts.corpus / p).is_file() for p in paths):
                self._grace(max(m.last for m in batch.values()) + DELETE_GRACE)
                if arrivals := self._arrivals():
                    batch = {**batch, **arrivals}
                    paths |= self._paths(arrivals)
            if self.fatal is not None:
                return
            if not opts.corpus.is_dir():  # syncing now would remove every chunk
                self.corpus_gone()
                return
            first = min(m.first for m in batch.values())
            renames = {rel: m.renamed_from for (rel, _), m in batch.items() if m.renamed_from}
            self._emit(self._run_sync(sorted(paths), initial=False, since=first, renames=renames))
        finally:
            with self._cond:
                self._syncing = False

    def _grace(self, until: float) -> None:
        """Wait until ``until`` (monotonic), or until watch stops or the corpus goes."""
        with self._cond:
            while not self._stopping and self.fatal is None and (left := until - time.monotonic()) > 0:
                self._cond.wait(left)

    def _run_sync(
        self,
        paths: list[str] | None,
        *,
        initial: bool,
        since: float | None = None,
        renames: dict[str, str] | None = None,
        quiet_if_idle: bool = False,
    ) -> SyncReport | None:
        """One ``Session.sync``, turned into a ``SyncReport`` for ``on_sync`` (the caller emits
        it; None when ``quiet_if_idle`` and there was nothing to do).

        Only what the report needs is kept of each result (never its chunk lists), and the
        state is asked about the documents synced, never the whole corpus.
        """
        db = self._session.db
        old = {p: len(db.files_of(p)) for p in paths or ()}
        results: dict[str, Done] = {}

        def keep(r: DocResult) -> None:
            results[r.rel_path] = Done(r.error, len(r.added) + len(r.changed), len(r.files), ms_of(r))

        started = time.monotonic()
        try:
            summary = self._session.sync(paths, on_result=keep)
        except Exception as exc:  # noqa: BLE001 - a bug or a full disk: report it, keep watching
            ms = (time.monotonic() - started) * 1000
            report = SyncReport(Summary(""), (), ms, 0.0, initial, f"sync failed: {exc!r}")
            if initial:
                self.fatal = report.error
            return report
        ended = time.monotonic()
        gone = self._session.gone
        names = set(results) | set(gone) if paths is None else set(paths)
        changes = tuple(
            doc_change(rel, old.get(rel, gone.get(rel, 0)), db, results.get(rel), (renames or {}).get(rel))
            for rel in sorted(names)
        )
        for change in changes:
            if change.status == "failed":
                self.failing[change.path] = change.error or "failed"
            else:
                self.failing.pop(change.path, None)
        if quiet_if_idle and not summary.processed and not summary.removed and not summary.failures:
            return None
        latency = (ended - since) * 1000 if since is not None else 0.0
        return SyncReport(summary, changes, (ended - started) * 1000, latency, initial)

    def _emit(self, report: SyncReport | None) -> None:
        if report is not None and self.on_sync is not None:
            self.on_sync(report)


__all__ = ("DEFAULT_DEBOUNCE", "DocChange", "SyncReport", "Watcher", "is_editor_temp")
