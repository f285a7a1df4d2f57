"""What a sync may skip: the freshness of documents, corpus folders and output folders.

Three questions, each answered as cheaply as the state allows:

- ``unchanged_mtime``: does the state still describe this document? A stat, then its
  content's hash only when the stat is ambiguous.
- ``OutputFolders``: are a document's chunk files all still there? A stat per output
  folder whose mtime was recorded when it was last found whole, a listing otherwise.
- ``CorpusScan``: a whole-corpus walk's view, folder by folder: a folder whose listing
  has the signature recorded for it is skipped as a whole; any other is looked at
  document by document.

Everything here reads the state; nothing writes it (the session records what was seen).
"""

from __future__ import annotations

import marshal
import os
import time
from collections.abc import Callable

import xxhash

from pipeline._version import __version__
from pipeline.run.db import StateDB, folder_of
from pipeline.run.discover import Found, Listed

#: A file modified this close to the state's last write is hashed, not trusted by its stat.
RACY_SECONDS = 2.0


def unchanged_mtime(found: Found, stamp: tuple[int, int] | None, since: float, db: StateDB) -> int | None:
    """The document's mtime (to record) when the state still describes it, else None.

    ``stamp`` is the recorded ``(size, mtime_ns)`` of a row made under this policy and
    version (None otherwise); ``since`` is when the state was last written (epoch
    seconds). Trusted after a stat (the walk's own, if it took one); hashed when the
    stat is ambiguous (same size, but a new or racy mtime).
    """
    if stamp is None:
        return None
    size, mtime_ns = found.size, found.mtime_ns
    if size < 0:
        try:
            st = os.stat(found.path)
        except OSError:
            return None
        size, mtime_ns = st.st_size, st.st_mtime_ns
    if size != stamp[0]:
        return None
    if mtime_ns == stamp[1] and mtime_ns / 1e9 < since - RACY_SECONDS:
        return mtime_ns
    try:  # the stat is ambiguous: let the content decide
        with open(found.path, "rb") as fh:
            same = xxhash.xxh3_64_hexdigest(fh.read()) == db.source_hash(found.rel_path)
    except OSError:
        return None
    return mtime_ns if same else None


class OutputFolders:
    """Whether a document's chunk files are all there, at a stat per output folder.

    A folder whose mtime is the one recorded when it was last listed and found whole has
    lost no file since (a removal changes its mtime); another is listed once per sync.
    ``recorded`` is None for a sync of named paths (a save in watch): it then stats each
    chunk file of the few documents it syncs.
    """

    def __init__(self, out: str | os.PathLike[str], db: StateDB, recorded: dict[str, int] | None) -> None:
        self.out, self.db, self.recorded = os.fspath(out), db, recorded
        self.listings: dict[str, set[str] | None] = {}
        self.seen: dict[str, int] = {}  #: folder → mtime when listed now (recorded at the end)

    def whole(self, folder: str) -> bool:
        """The output folder is known to have lost no file (its recorded mtime holds)."""
        if folder not in self.listings:
            self.listings[folder] = self.listing(folder)
        return self.listings[folder] is None

    def missing(self, rel: str) -> bool:
        """Some chunk file the state lists for document ``rel`` is not on disk."""
        if self.recorded is None:
            return not all(os.path.exists(os.path.join(self.out, f)) for f in self.db.files_of(rel))
        folder = rel.rpartition("/")[0]
        if self.whole(folder):
            return False
        names = self.listings[folder] or set()  # not None: the folder is not known whole
        return any(f.rpartition("/")[2] not in names for f in self.db.files_of(rel))

    def listing(self, folder: str) -> set[str] | None:
        """The names in an output folder; None when its recorded mtime says it is whole."""
        path = os.path.join(self.out, folder) if folder else self.out
        try:
            st = os.stat(path)
        except OSError:  # gone, or unreadable: its files are as good as missing
            return set()
        if self.recorded is not None and self.recorded.get(folder) == st.st_mtime_ns:
            return None
        try:
            names = set(os.listdir(path))
        except OSError:
            return set()
        if self.recorded is not None and st.st_mtime < time.time() - RACY_SECONDS:
            self.seen[folder] = st.st_mtime_ns
        return names


class CorpusScan:
    """A whole-corpus sync's view of the walk, folder by folder (``discover``'s ``on_folder``).

    A folder whose documents (names, sizes, mtimes) are those its recorded signature was made
    from, under this policy and version, and whose output folder is known whole, is done with
    as a whole: its documents are counted, not looked up one by one. Any other folder is
    *listed*: its documents' rows are read (one indexed query) and compared one by one, and
    the first that looks changed calls ``on_first_change`` (the session forks a worker that
    loads the chunker meanwhile). So a run's cost is a ``stat`` per document plus work per
    folder, and per document only in folders that moved.

    Args:
        db: the state.
        out: the output folder.
        policy_hash: the run's policy hash.
        full: ``--full``: no signature is trusted.
        recovering: documents a run that died was working on.
        on_first_change: called once, at the first document that looks changed; None: never.
    """

    def __init__(
        self,
        db: StateDB,
        out: str | os.PathLike[str],
        policy_hash: str,
        *,
        full: bool,
        recovering: set[str],
        on_first_change: Callable[[], None] | None,
    ) -> None:
        self.db, self.p_hash, self.version = db, policy_hash, __version__
        self.full, self.recovering = full, recovering
        self.on_first_change = on_first_change
        self.recorded = {} if full else db.signatures()
        self.out_folders = OutputFolders(out, db, db.folder_mtimes())
        self.recovering_folders = {folder_of(rel) for rel in recovering}
        self.stamps: dict[str, tuple[int, int]] = {}  #: rel → (size, mtime) in listed folders
        self.outdated: set[str] = set()  #: rows of listed folders made under another policy or version
        self.listed: dict[str, list[Listed]] = {}
        self.sigs: dict[str, bytes] = {}
        self.walked: set[str] = set()
        self.skipped = 0  #: documents of folders skipped as a whole

    def signature(self, listed: list[Listed]) -> bytes:
        # (name, size, mtime_ns) in the order the folder listed them: unsorted, because a
        # listing in another order only costs that folder a look row by row, never a wrong skip
        return xxhash.xxh3_128_digest(marshal.dumps((self.p_hash, self.version, listed)))

    def folder(self, prefix: str, listed: list[Listed]) -> bool:
        """Whether the walk should keep a folder's documents (listed one by one) or drop them."""
        if not listed:  # its recorded documents, if any, are gone (``gone_folders``)
            return False
        self.walked.add(prefix)
        sig = self.sigs[prefix] = self.signature(listed)
        if (
            self.recorded.get(prefix) == sig
            and prefix not in self.recovering_folders
            and self.out_folders.whole(prefix[:-1])
        ):
            self.skipped += len(listed)
            return False
        for rel, (size, mtime, current) in self.db.folder_stamps(prefix, self.p_hash, self.version).items():
            self.stamps[rel] = (size, mtime)
            if not current:
                self.outdated.add(rel)
        self.listed[prefix] = listed
        if self.on_first_change is not None and any(
            self._looks_changed(prefix + name, size, mtime) for name, size, mtime in listed
        ):
            call = self.on_first_change
            self.on_first_change = None  # one worker is all this is for
            call()
        return True

    def _looks_changed(self, rel: str, size: int, mtime: int) -> bool:
        """A guess from the stat alone (the sync decides for real): a no-change run forks nothing."""
        return (
            self.full
            or rel in self.outdated
            or rel in self.recovering
            or self.stamps.get(rel) != (size, mtime)
        )

    def under_unreadable(self, unreadable: list[str]) -> set[str]:
        """Recorded documents under folders the walk could not list: unknown, not deleted."""
        rels: set[str] = set()
        for folder in unreadable:
            rels.update(self.db.rels_under(folder + "/") if folder else self.db.rels())
        return rels

    def gone_folders(self, unreadable: list[str]) -> set[str]:
        """Recorded documents of folders the walk did not find a document in (and could list)."""
        rels: set[str] = set()
        for folder in self.db.doc_folders() - self.walked:
            if not any(not u or folder.startswith(u + "/") for u in unreadable):
                rels.update(self.db.folder_stamps(folder, self.p_hash, self.version))
        return rels

    def signatures(self, recovering: set[str]) -> dict[str, bytes]:
        """The listed folders to sign now: every document recorded as the walk saw it, under
        this policy and version, none left to recover, none with an mtime too recent to trust."""
        limit = time.time_ns() - int(RACY_SECONDS * 1e9)
        signed: dict[str, bytes] = {}
        for prefix, listed in self.listed.items():
            if any(size < 0 or mtime >= limit or prefix + name in recovering for name, size, mtime in listed):
                continue
            rows = self.db.folder_stamps(prefix, self.p_hash, self.version)
            if len(rows) == len(listed) and all(
                rows.get(prefix + name) == (size, mtime, True) for name, size, mtime in listed
            ):
                signed[prefix] = self.sigs[prefix]
        return signed
