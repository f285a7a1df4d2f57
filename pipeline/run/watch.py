"""Watch: keep the chunk folder current while documents are saved (SPEC §6).

A watchdog observer (inotify here, or polling with ``polling=True``) reports file-system
events. ``_Handler`` maps each to a corpus-relative document path, or to a folder that
was created, deleted or moved, and drops everything else: editors' swap, backup and lock
files, ``.git``, the output folder, excluded paths. ``Watcher`` debounces the marks per
path (a path is ripe once it has been quiet for ``debounce`` seconds), coalesces them,
and hands each ripe batch to ``Session.sync(paths)``; that is what gives watch the
guarantees of ``ingest``: atomic chunk files, stale ones removed, the change feed, the
manifest written last, one writer per output folder (the lock is held until ``stop``).

How editors save, and what the marks become:

- in place (truncate + write): modified/closed events on the path → one sync.
- temp file then rename over (vim, JetBrains): the temp name is not a document; the
  rename's destination is marked → one sync. vim's ``doc.md`` → ``doc.md~`` backup
  rename marks ``doc.md`` too, and the debounce lets the new file land first.
- delete then create: both events mark the same path → one sync, usually.
- a rename: source and destination are synced in one batch, so the change feed shows
  the deletes, the writes and the redirects (old ids → new) of one sync.
- a folder created, moved in, out, or deleted: every manifest document under its old
  name and every document now under its new one. (inotify pairs the two halves of a
  move for 0.5 s, so a folder moved out of the corpus is seen that much later.)

A batch keeps only paths that are documents now or that the manifest has: a file made
and deleted within one debounce, or emacs' lock link, costs no sync. A document that
fails (half-saved, invalid UTF-8 for a moment) is reported; ``Session`` keeps its
previous chunks, and the next save of it is synced again.

The first sync may use a process pool, so it runs before the observer thread exists;
a second, incremental sync then catches what was saved meanwhile.
"""

from __future__ import annotations

import errno
import os
import re
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, Self

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers.api import BaseObserver
from watchdog.observers.polling import PollingObserver

from pipeline.run.discover import SKIP_DIRS, discover, excluded, find_one, is_document
from pipeline.run.ingest import Options, Session, Summary
from pipeline.run.watchlimit import FolderPoller, limit_warning, unwatched
from pipeline.run.worker import DocResult

DEFAULT_DEBOUNCE = 0.05
#: A path that never goes quiet (a writer streaming into it) is synced at least this often.
MAX_DELAY = 1.0
#: How often the polling observer scans the corpus.
POLL_INTERVAL = 0.25
#: A sync that would delete documents waits this long after their last event first: ``rm -rf``
#: of the whole corpus unlinks its documents before the folder, and removing their chunks
#: in between would undo "a vanished corpus keeps its chunks".
DELETE_GRACE = 0.5

# inotify re-adds the watch of a folder moved out and back in, and says so on stderr
warnings.filterwarnings("ignore", "Callback with id", RuntimeWarning, r"watchdog\.")

#: The event types watch needs; opens and read-only closes (our own reads) never reach it.
EVENT_TYPES: list[type[FileSystemEvent]] = [
    FileCreatedEvent,
    FileModifiedEvent,
    FileClosedEvent,
    FileDeletedEvent,
    FileMovedEvent,
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
]

_EDITOR_TEMP = re.compile(
    r"""(\.sw[a-px]|~|\.tmp|\.bak|___jb_(?:tmp|old)___)$   # vim swap, backups, temp files, JetBrains
    |^(?:4913|\.~lock\..*|\#.*\#)$                      # vim's probe, LibreOffice lock, emacs autosave
    """,
    re.VERBOSE,
)


def is_editor_temp(path: str) -> bool:
    """An editor's swap, backup, lock or temp file, which watch never syncs.

    ``.#name`` is emacs' lock, a symlink to nowhere: it is dropped as such, so that a
    regular file of that name (a document for ``ingest``, SPEC §5) is still watched.
    """
    name = os.path.basename(path)
    if _EDITOR_TEMP.search(name):
        return True
    return name.startswith(".#") and os.path.islink(path)


Status = Literal["chunked", "unchanged", "removed", "failed"]


@dataclass(frozen=True, slots=True)
class DocChange:
    """What one sync did to one document's chunk files."""

    path: str
    status: Status
    written: int = 0
    unchanged: int = 0
    removed: int = 0
    ms: float = 0.0  #: the document's own processing time
    error: str | None = None
    renamed_from: str | None = None


@dataclass(frozen=True, slots=True)
class SyncReport:
    """One sync: the first (``initial``) or one debounced batch of saved paths."""

    summary: Summary
    docs: tuple[DocChange, ...]
    ms: float  #: wall time of the sync
    latency_ms: float  #: first event of the batch → output current (0 for the initial sync)
    initial: bool = False
    error: str | None = None  #: the sync itself failed (not one document): nothing was recorded


OnSync = Callable[[SyncReport], None]


@dataclass(slots=True)
class _Mark:
    first: float  #: monotonic time of the first event since the last sync
    last: float  #: and of the latest
    renamed_from: str | None = None  #: a document renamed to this one


_Key = tuple[str, bool]  # (corpus-relative path, is a folder)


class _Handler(FileSystemEventHandler):
    """Observer thread → marks on the watcher: documents and folders, nothing else."""

    def __init__(self, watcher: Watcher) -> None:
        self.w = watcher

    def dispatch(self, event: FileSystemEvent) -> None:
        src = self.w.relative(os.fsdecode(event.src_path), event.is_directory)
        dest = self.w.relative(os.fsdecode(event.dest_path), event.is_directory) if event.dest_path else None
        if event.is_directory:
            if event.event_type in ("deleted", "moved") and src == "":
                self.w.corpus_gone()
            elif event.event_type in ("created", "deleted", "moved"):
                self.w.mark([(k, True) for k in (src, dest) if k])
            return
        self.w.mark([(k, False) for k in (src, dest) if k], renamed_from=src if src and dest else None)


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
        self._pending: dict[_Key, _Mark] = {}
        self._partners: dict[_Key, set[_Key]] = {}
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

    def mark(self, keys: list[_Key], renamed_from: str | None = None) -> None:
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
            self._observer = self._start_observer()
        catch_up = self._run_sync(None, initial=False, quiet_if_idle=True)
        # the first report goes out once events flow: an edit made after it is seen by inotify
        self._emit(first)
        self._emit(catch_up)
        self.ready.set()

    def _start_observer(self) -> BaseObserver:
        """inotify (or polling if asked); past the inotify limit, polling for what it refused."""
        handler = _Handler(self)
        if not self.polling:
            from watchdog.observers import Observer

            observer: BaseObserver = Observer()
            observer.schedule(handler, str(self._root), recursive=True, event_filter=EVENT_TYPES)
            try:
                observer.start()
            except OSError as exc:  # the root refused (ENOSPC: the watch limit; EMFILE: instances)
                observer.stop()
                if exc.errno in (errno.ENOSPC, errno.EMFILE):
                    self._warn(limit_warning(0, 0, root_refused=True) + f" [{exc.strerror or exc}]")
                else:  # not the limit (the root vanished, say): poll, and say why
                    self._warn(f"watch: cannot watch {self._root} ({exc.strerror or exc}); polling instead")
            else:
                self._poll_refused()
                return observer
        observer = PollingObserver(timeout=POLL_INTERVAL)
        observer.schedule(handler, str(self._root), recursive=True, event_filter=EVENT_TYPES)
        observer.start()
        return observer

    def _poll_refused(self) -> None:
        """Compare the folders with the watches inotify holds; poll the ones it does not."""
        found = unwatched(str(self._root), lambda path: self.relative(path, True) is None)
        if not found or not found[0]:
            return
        missing, total = found
        self._warn(limit_warning(len(missing), total))

        def changed(path: str, is_dir: bool) -> None:
            rel = self.relative(path, is_dir)
            if rel:
                self.mark([(rel, is_dir)])

        self._poller = FolderPoller(missing, POLL_INTERVAL, changed)
        self._poller.start()

    def _warn(self, message: str) -> None:
        self.warnings.append(message)
        if self.on_warning is not None:
            self.on_warning(message)

    def _next_batch(self) -> dict[_Key, _Mark] | None:
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
                    keys = set(ripe)
                    todo = list(ripe)
                    while todo:
                        for partner in self._partners.pop(todo.pop(), ()):
                            if partner not in keys:
                                keys.add(partner)
                                todo.append(partner)
                    self._syncing = True
                    return {k: self._pending.pop(k) for k in keys if k in self._pending}
                self._cond.wait(min(due.values()) - now if due else None)

    def _expand(self, folder: str) -> set[str]:
        """Documents the state has under ``folder``, and those there now."""
        prefix = folder + "/"
        paths = set(self._session.db.rels_under(prefix))
        top = self.opts.corpus / folder
        if top.is_dir():
            found, _ = discover(top, self.opts.out)
            paths.update(prefix + f.rel_path for f in found)
        return paths

    def _sync_batch(self, batch: dict[_Key, _Mark]) -> None:
        try:
            db = self._session.db
            paths: set[str] = set()
            for rel, is_folder in batch:
                paths.update(self._expand(rel) if is_folder else (rel,))
            opts = self.opts
            paths = {
                p
                for p in paths
                if db.stamp(p) is not None or find_one(opts.corpus, p, opts.out, opts.exclude) is not None
            }
            if not paths:
                return
            deleted = [p for p in paths if not (opts.corpus / p).is_file()]
            if deleted:
                self._grace(max(m.last for m in batch.values()) + DELETE_GRACE)
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
        results: dict[str, _Done] = {}

        def keep(r: DocResult) -> None:
            results[r.rel_path] = _Done(r.error, len(r.added) + len(r.changed), len(r.files), _ms(r))

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
            _change(rel, old.get(rel, gone.get(rel, 0)), db, results.get(rel), (renames or {}).get(rel))
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


@dataclass(frozen=True, slots=True)
class _Done:
    """What a sync's report keeps of one document's result."""

    error: str | None
    written: int
    files: int
    ms: float


def _change(rel: str, old_files: int, db: Any, done: _Done | None, renamed_from: str | None) -> DocChange:
    """One document's line: files written, unchanged and removed by the sync."""
    stamp = db.stamp(rel)
    new_files = len(db.files_of(rel)) if stamp is not None else 0
    if done is not None and done.error is not None:
        return DocChange(rel, "failed", unchanged=new_files, ms=done.ms, error=done.error)
    if done is not None:
        removed = max(0, old_files - done.files)
        return DocChange(
            rel, "chunked", done.written, done.files - done.written, removed, done.ms, None, renamed_from
        )
    if stamp is None:
        return DocChange(rel, "removed", removed=old_files)
    return DocChange(rel, "unchanged", unchanged=new_files)


def _ms(result: DocResult) -> float:
    return round(sum(result.seconds.values()) * 1000, 1)


__all__ = ("DEFAULT_DEBOUNCE", "DocChange", "SyncReport", "Watcher", "is_editor_temp")
