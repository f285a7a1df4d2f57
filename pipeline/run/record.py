"""Recording a sync in the state database, a document whole in one transaction (SPEC §5, §10).

``fold`` records one document's result: its rows, its change-feed lines, the removal of
the chunk files it no longer has and its redirects, all in one transaction, committed
once its files are in place. Its in-flight row stays until the sync ends: a run that dies
is re-checked whole by the next (which rewrites and announces nothing the state already
has), so what spans documents (a rename found by hash, a ``doc_uid|r`` collision) is
decided again over the same documents. ``forget`` does the same for a document that is
gone (a rename is found by hash among the chunks made now), and ``sweep`` for files no
document claims. Every corpus-wide question (who claims a file, is an id live, which
redirects point at a vanished id) is an indexed query, so recording a document costs
that document, not the corpus.

A transaction may hold several documents (``Run.record``): the first is committed alone,
and each commit lets the next transaction hold twice as many, up to ``BATCH`` documents
or ``BATCH_SECONDS``; a sync commits what it holds before it ends. A sync whose caller
hears of each document as it is recorded (``on_result``: a progress bar, ``watch``)
commits each document alone, so that what the caller hears of is in the feed. A commit writes every
page it changed to the WAL, and consecutive documents change many of the same pages (the
feed's, the chunk table's, the counters'): over the 2,251 documents of ``make bench``,
one commit per document wrote ~320,000 pages (~80,000 batched). A crash
loses no more than before: every document of the open transaction is in flight, so the
next run re-checks it against the disk and announces what the state has not recorded. A
commit that fails leaves every document of its transaction to be re-checked (``unsafe``).
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from pipeline._version import __version__
from pipeline.run import feed as feed_mod
from pipeline.run.db import StateDB
from pipeline.run.discover import walk
from pipeline.run.state import STATE_DIR, event

if TYPE_CHECKING:
    from pipeline.run.ingest import Options, Summary
    from pipeline.run.job import DocResult

_KIND = {"ingest.write": "w", "ingest.delete": "d", "ingest.redirect": "r"}
#: The most documents one transaction holds, and the longest it stays open (seconds).
BATCH = 256
BATCH_SECONDS = 1.0


@dataclass(slots=True)
class Run:
    """One sync's working state: small, whatever the corpus (no per-chunk records)."""

    opts: Options
    p_hash: str
    run_id: str
    generation: int
    summary: Summary
    db: StateDB
    recovering: set[str]  #: documents whose files the state may not describe
    processed: dict[str, str] = field(default_factory=dict)  #: recorded now → its ``doc_uid|r``
    vanished: set[str] = field(default_factory=set)  #: documents some of whose old ids went
    unsafe: set[str] = field(default_factory=set)  #: documents whose write failed half-way
    emptied: set[str] = field(default_factory=set)  #: output folders a removal may have emptied
    whole: bool = False  #: a whole-corpus sync: every output folder was checked at its start
    #: chunks "made now" (a rename's new place) are those of this generation or later: the
    #: generation of the first of the runs that died before this one finished their work
    made_since: int = 0
    #: documents the state has no row for, from their jobs until ``fold`` (which looks none up)
    unrecorded: set[str] = field(default_factory=set)
    recorded: set[str] = field(default_factory=set)  #: output folders whose mtime was recorded now
    left: bool = False  #: a stale file could not be removed
    error: Exception | None = None  #: the state could not be written
    said: list[tuple[str, str, int, bytes]] = field(default_factory=list)  #: feed rows (``feed.append``)
    #: the documents recorded in the open transaction ("" for a sweep), not committed yet
    pending: list[str] = field(default_factory=list)
    opened: float = 0.0  #: when the open transaction began (``time.monotonic``)
    #: output folders a document of the open transaction was written in (their mtimes at the commit)
    folder_mtimes: dict[str, int] = field(default_factory=dict)
    room: int = 1  #: documents the open transaction may hold: doubled at each commit, up to ``batch``
    #: the most documents in one transaction: 1 when the caller hears of each as it is recorded
    batch: int = BATCH
    #: a one-shot sync (``ingest``, not a ``watch`` save): the WAL is copied behind its commits
    copy_behind: bool = False

    def say(self, kind: str, *, text: int = 0, **fields: Any) -> None:
        """One change-feed line (the 004 envelope); written with the transaction (``flush``)."""
        line = event(kind, self.run_id, self.generation, **fields)
        self.said.append((feed_mod.key_of(line), _KIND.get(kind, "o"), text, orjson.dumps(line)))

    def flush(self) -> None:
        if self.said:
            feed_mod.append(self.db, self.said)
            self.said = []

    def record(self, rel: str, work: Any) -> bool:
        """Run ``work()`` in the open transaction with the lines it says; False when it failed.

        The transaction is committed once it holds ``room`` documents or is
        ``BATCH_SECONDS`` old (see the module docstring), else by ``settle``.
        """
        self.said.clear()
        try:
            if not self.pending:
                self.db.begin()
                self.opened = time.monotonic()
            self.pending.append(rel)
            work()
            self.flush()
        except (sqlite3.Error, OSError) as exc:
            self.said.clear()
            self._failed(exc)
            return False
        except BaseException:  # Ctrl-C, a bug: a document half recorded must not be committed
            self.said.clear()
            self._failed(None)
            raise
        if len(self.pending) >= self.room or time.monotonic() - self.opened >= BATCH_SECONDS:
            return self.settle()
        return True

    def settle(self) -> bool:
        """Commit the open transaction, if any; False when that failed (its documents are unsafe)."""
        if not self.pending:
            return True
        try:
            _stat_folders(self)
            self.db.set_folder_mtimes(self.folder_mtimes)
            self.db.set_meta(written_at_epoch=repr(time.time()))
            self.db.end()
        except (sqlite3.Error, OSError) as exc:
            self._failed(exc)
            return False
        except BaseException:
            self._failed(None)
            raise
        self.pending.clear()
        self.folder_mtimes.clear()
        self.room = min(2 * self.room, self.batch)
        if self.copy_behind:  # its next documents are recorded while the WAL is copied
            self.db.checkpoint_behind()
        return True

    def _failed(self, exc: Exception | None) -> None:
        """The open transaction is lost: its documents are re-checked by the next run."""
        self.db.abort()
        if self.error is None and exc is not None:
            self.error = exc
        self.unsafe.update(rel for rel in self.pending if rel)
        self.pending.clear()
        self.folder_mtimes.clear()


def fold(result: DocResult, run: Run, rev_width: int | None = None) -> None:
    """Record one document's result (see the module docstring)."""
    summary, rel, db = run.summary, result.rel_path, run.db
    summary.processed += 1
    summary.warnings.extend(result.warnings)
    for stage, secs in result.seconds.items():
        summary.stage_seconds[stage] = summary.stage_seconds.get(stage, 0.0) + secs
    if result.error is not None:
        summary.failures.append(result.error)
        if result.unsafe or rel in run.recovering:
            run.unsafe.add(rel)  # its files may not be what the state says: re-check next time
        return  # a failed document keeps its previous chunks, which are whole
    summary.bytes += result.size
    summary.added += len(result.added)
    summary.changed += len(result.changed)
    summary.unchanged += len(result.files) - len(result.added) - len(result.changed)
    summary.written += result.written
    prev = {} if rel in run.unrecorded else db.entry(rel) or {}
    run.unrecorded.discard(rel)  # it may have a row from now on (a re-run, ``_widen_collisions``)
    if rev_width is None:
        rev_width = int(prev.get("rev_width", 8)) if prev.get("uid_rev") == result.uid_rev else 8
    entry = {
        "source_hash": result.source_hash,
        "size": result.size,
        "mtime_ns": result.mtime_ns,
        "policy_hash": run.p_hash,
        "version": __version__,
        "uid_rev": result.uid_rev,
        "rev_width": rev_width,
        "files": result.files,
        "ids": result.ids,
        "chunk_ids": result.chunk_ids,
        "hashes": result.hashes,
        "digests": result.digests,
        "embeds": result.embeds,
        "tokens": result.tokens,
    }
    live = set(result.chunk_ids)
    vanished = [c for c in prev.get("chunk_ids", ()) if c not in live]
    hashes = dict(zip(result.chunk_ids, result.hashes, strict=True))

    def work() -> None:
        db.put_doc(rel, entry, run.generation)
        _announce_writes(result, prev, run)
        now = set(result.files)
        stale = [(i, f) for i, f in enumerate(prev.get("files", ())) if f not in now]
        _remove(run, rel, prev, stale)
        _redirect(run, result.redirects, vanished, live, hashes)
        _seen_whole(run, rel)

    if run.record(rel, work):
        run.processed[rel] = result.uid_rev
        if vanished:
            run.vanished.add(rel)


def _announce_writes(result: DocResult, prev: dict[str, Any], run: Run) -> None:
    """One ``ingest.write`` per chunk file whose content moved: ``text`` or ``moved``.

    ``text``: the chunk's embedded text (``embedText``) is not one the document had
    before, so a loader must embed it; ``moved``: the document had that text before
    (here or at another place) and only the record moved (position, ``rev``, links).
    """
    before = dict(zip(prev.get("files", ()), prev.get("chunk_ids", ()), strict=False))
    known = set(prev.get("embeds") or ())  # empty for an entry from before (a migration): all text
    added = set(result.added)
    moved = added | set(result.changed)
    # the envelope up to its last field, mem_hash, serialized once: each line adds its own
    # fields from mem_hash on (the bytes ``orjson.dumps({**envelope, **fields})`` would give)
    envelope = event("ingest.write", run.run_id, run.generation)
    del envelope["mem_hash"]
    lead = orjson.dumps(envelope)[:-1] + b","
    for i, file in enumerate(result.files):
        if file not in moved:
            continue
        chunk_id, digest = result.chunk_ids[i], result.hashes[i]
        text = result.embeds[i] not in known
        fields = {
            "mem_hash": digest,
            "file": file,
            "id": result.ids[i],
            "chunk_id": chunk_id,
            "hash": digest,
            "source": result.rel_path,
            "change": "text" if text else "moved",
        }
        if before.get(file, chunk_id) != chunk_id:
            fields["prev_chunk_id"] = before[file]  # for a loader keyed by chunk_id
        run.said.append((feed_mod.file_key(file), "w", int(text), lead + orjson.dumps(fields)[1:]))


def _seen_whole(run: Run, rel: str) -> None:
    """Note the document's output folder, now that its files are as the state says.

    Its mtime is taken when the transaction commits (``Run.settle``), once for all the
    documents of that folder in it: a later run that finds the folder with that mtime
    knows no file of it went since (``_Folders``). Files that other documents' workers add
    meanwhile move the mtime again: the next run then lists the folder, which is safe.
    """
    folder = rel.rpartition("/")[0]
    if not run.whole:  # a save in watch: the folder was not checked, so it is not known whole
        run.folder_mtimes.pop(folder, None)
        run.db.forget_folders([folder])
        return
    run.recorded.add(folder)
    run.folder_mtimes[folder] = 0  # stat at the commit


def _stat_folders(run: Run) -> None:
    """The mtimes of the output folders the open transaction's documents were recorded in."""
    gone = []
    for folder in run.folder_mtimes:
        try:
            run.folder_mtimes[folder] = os.stat(run.opts.out / folder if folder else run.opts.out).st_mtime_ns
        except OSError:
            gone.append(folder)
    for folder in gone:
        del run.folder_mtimes[folder]
    if gone:
        run.db.forget_folders(gone)


def _remove(run: Run, rel: str, prev: dict[str, Any], stale: list[tuple[int, str]]) -> None:
    """Delete the chunk files ``rel`` no longer has (unless another document claims them)."""
    out = run.opts.out
    for i, file in stale:
        if run.db.file_owner(file, other_than=rel) is not None:
            continue
        try:
            os.unlink(out / file)
        except FileNotFoundError:
            pass
        except OSError:
            run.left = True
            continue
        run.summary.removed += 1
        run.emptied.add(file.rpartition("/")[0])
        ref, chunk_id, digest = (_at(prev.get(k, ()), i) for k in ("ids", "chunk_ids", "hashes"))
        run.say("ingest.delete", file=file, id=ref, chunk_id=chunk_id, hash=digest, source=rel)


def _at(values: Any, i: int) -> str:
    return str(values[i]) if i < len(values) else ""


def _redirect(
    run: Run, fresh: dict[str, tuple[str, str]], vanished: list[str], live: set[str], hashes: dict[str, str]
) -> None:
    """Fold this document's redirects into the map, chains collapsed (``redirects.collapse``, per document).

    ``fresh``: old id → (new id, how) found now; ``vanished``: its old ids that went;
    ``live``: its ids now. An old id live again leaves the map; an entry that pointed at a
    vanished id follows it to its new place, or leaves when its text went.
    """
    db = run.db
    db.drop_redirects(live)
    for old, target in db.redirects_to(vanished):
        nxt = fresh.get(target)
        if nxt is None or nxt[0] == old:
            db.drop_redirects([old])
            continue
        db.set_redirect(old, nxt[0])
        run.summary.redirects += 1
        run.say(
            "ingest.redirect",
            old=old,
            new=nxt[0],
            chunk_id=nxt[0],
            hash=hashes.get(nxt[0], ""),
            match="chain",
        )
    for old, (new, how) in sorted(fresh.items()):
        if old == new or old in live or db.is_live(old) or db.redirect(old) == new:
            continue
        db.set_redirect(old, new)
        run.summary.redirects += 1
        digest = hashes.get(new) or db.hash_of(new)
        run.say("ingest.redirect", old=old, new=new, chunk_id=new, hash=digest, match=how)


def forget(run: Run, rel: str) -> None:
    """Record a document that is gone: its files go, its ids redirect to chunks made now with equal text."""
    db = run.db
    entry = db.entry(rel)
    if entry is None:
        return
    cids, hashes = entry.get("chunk_ids", []), entry.get("hashes", [])

    def work() -> None:
        db.drop_doc(rel)  # first: its own ids are not live any more
        fresh: dict[str, tuple[str, str]] = {}
        for cid, digest in zip(cids, hashes, strict=False):
            if db.is_live(cid):
                continue
            found = db.made_with_hash(digest, run.made_since or run.generation)
            if found is not None and found[0] != cid:
                fresh[cid] = (found[0], "rename")
        _remove(run, rel, entry, list(enumerate(entry.get("files", ()))))
        targets = {new for new, _ in fresh.values()}
        _redirect(run, fresh, list(cids), set(), {t: db.hash_of(t) for t in targets})
        _seen_whole(run, rel)

    if run.record(rel, work):
        run.vanished.add(rel)


def sweep(run: Run) -> None:
    """Remove chunk files and temp files under the output that no document claims (one transaction)."""
    out, db = run.opts.out, run.db

    def work() -> None:
        for rel_file in list(_orphans(out, db)):
            name = rel_file.rsplit("/", 1)[-1]
            is_tmp = name.startswith(".") and name.endswith(".tmp")
            info = None if is_tmp else _describe(out / rel_file)
            try:
                os.unlink(out / rel_file)
            except FileNotFoundError:
                pass
            except OSError:
                run.left = True
                continue
            run.emptied.add(rel_file.rpartition("/")[0])
            if is_tmp:
                continue
            run.summary.removed += 1
            src, chunk_ref, chunk_id, digest = info or ("", "", "", "")
            run.say("ingest.delete", file=rel_file, id=chunk_ref, chunk_id=chunk_id, hash=digest, source=src)

    run.record("", work)
    run.record("", lambda: run.db.forget_folders(run.emptied))


def prune_folders(out: Path, folders: set[str]) -> None:
    """Remove output folders that removals left empty (deepest first)."""
    for folder in sorted(folders, key=len, reverse=True):
        path = out / folder
        while folder not in ("", ".") and path != out:
            try:
                path.rmdir()  # only succeeds when empty
            except OSError:
                break
            path = path.parent


def _describe(path: Path) -> tuple[str, str, str, str] | None:
    """``(source, id, chunk_id, hash)`` of an orphan chunk file, for its delete event."""
    try:
        rec = orjson.loads(path.read_bytes())
        meta = rec.get("metadata") or {}
        return (str(meta.get("sourceFile", "")), str(rec["id"]), str(rec["chunk_id"]), str(rec["hash"]))
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        return None


def _orphans(out: Path, db: StateDB) -> list[str]:
    """Chunk files and temp files under ``out`` that no document claims."""
    found: list[str] = []
    for dirpath, dirnames, filenames in walk(out):  # not os.walk: it recurses per level
        dirnames[:] = [d for d in dirnames if d != STATE_DIR]
        rel_dir = os.path.relpath(dirpath, out).replace(os.sep, "/")
        for name in filenames:
            rel_file = name if rel_dir == "." else f"{rel_dir}/{name}"
            is_tmp = name.startswith(".") and name.endswith(".tmp")
            if is_tmp or (
                name.startswith("doc_") and name.endswith(".json") and db.file_owner(rel_file) is None
            ):
                found.append(rel_file)
    return sorted(found)
