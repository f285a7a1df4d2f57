"""Watch's view of file-system events: which event types it asks for, and which paths are an editor's litter.

``EventHandler`` turns each watchdog event into marks (a corpus-relative document path,
or a folder that was created, deleted or moved) through the three callbacks it is given,
so it knows nothing of the watcher that owns it.

How editors save, and what the marks become:

- in place (truncate + write): modified/closed events on the path → one sync.
- temp file then rename over (vim, JetBrains): the temp name is not a document; the
  rename's destination is marked → one sync. vim's ``doc.md`` → ``doc.md~`` backup
  rename marks ``doc.md`` too, and the debounce lets the new file land first.
- delete then create: both events mark the same path → one sync, usually.
- a rename: source and destination are synced in one batch, so the change feed shows
  the deletes, the writes and the redirects (old ids → new) of one sync.
- a folder created, moved in, out, or deleted: every recorded document under its old
  name and every document now under its new one. (inotify pairs the two halves of a
  move for a moment, so a folder moved out of the corpus is seen that much later.)
"""

from __future__ import annotations

import errno
import os
import re
import warnings
from collections.abc import Callable

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

from pipeline.run.watchlimit import FolderPoller, limit_warning, unwatched

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
    regular file of that name (a document for ``ingest``, docs/spec.md, Runs) is still watched.
    """
    name = os.path.basename(path)
    if _EDITOR_TEMP.search(name):
        return True
    return name.startswith(".#") and os.path.islink(path)


#: A mark: (corpus-relative path, is a folder).
Key = tuple[str, bool]


class EventHandler(FileSystemEventHandler):
    """Observer thread → marks: documents and folders, nothing else.

    Args:
        relative: an event's path as a corpus-relative path, or None when watch ignores it.
        mark: note events on these keys (keys marked together, a rename, sync together).
        corpus_gone: the corpus folder itself was deleted or moved.
    """

    def __init__(
        self,
        relative: Callable[[str, bool], str | None],
        mark: Callable[..., None],
        corpus_gone: Callable[[], None],
    ) -> None:
        self.relative, self.mark, self.corpus_gone = relative, mark, corpus_gone

    def dispatch(self, event: FileSystemEvent) -> None:
        src = self.relative(os.fsdecode(event.src_path), event.is_directory)
        dest = self.relative(os.fsdecode(event.dest_path), event.is_directory) if event.dest_path else None
        if event.is_directory:
            if event.event_type in ("deleted", "moved") and src == "":
                self.corpus_gone()
            elif event.event_type in ("created", "deleted", "moved"):
                self.mark([(k, True) for k in (src, dest) if k])
            return
        self.mark([(k, False) for k in (src, dest) if k], renamed_from=src if src and dest else None)


def start_observer(
    root: str, handler: EventHandler, *, polling: bool, interval: float, warn: Callable[[str], None]
) -> tuple[BaseObserver, FolderPoller | None]:
    """inotify (or polling if asked); past the inotify limit, polling for the folders it refused.

    Returns the observer, and the poller of the refused folders if there are any; ``warn``
    hears why watch polls.
    """
    if not polling:
        from watchdog.observers import Observer

        observer: BaseObserver = Observer()
        observer.schedule(handler, root, recursive=True, event_filter=EVENT_TYPES)
        try:
            observer.start()
        except OSError as exc:  # the root refused (ENOSPC: the watch limit; EMFILE: instances)
            observer.stop()
            if exc.errno in (errno.ENOSPC, errno.EMFILE):
                warn(limit_warning(0, 0, root_refused=True) + f" [{exc.strerror or exc}]")
            else:  # not the limit (the root vanished, say): poll, and say why
                warn(f"watch: cannot watch {root} ({exc.strerror or exc}); polling instead")
        else:
            return observer, _poll_refused(root, handler, interval, warn)
    observer = PollingObserver(timeout=interval)
    observer.schedule(handler, root, recursive=True, event_filter=EVENT_TYPES)
    observer.start()
    return observer, None


def _poll_refused(
    root: str, handler: EventHandler, interval: float, warn: Callable[[str], None]
) -> FolderPoller | None:
    """Compare the folders with the watches inotify holds; poll the ones it does not."""
    found = unwatched(root, lambda path: handler.relative(path, True) is None)
    if not found or not found[0]:
        return None
    missing, total = found
    warn(limit_warning(len(missing), total))

    def changed(path: str, is_dir: bool) -> None:
        rel = handler.relative(path, is_dir)
        if rel:
            handler.mark([(rel, is_dir)])

    poller = FolderPoller(missing, interval, changed)
    poller.start()
    return poller
