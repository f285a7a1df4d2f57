"""Recording a sync's results in the state: one document whole in one transaction (docs/spec.md, Runs).

``record_result`` records one document's result: its rows, its change-feed lines, the
removal of the chunk files it no longer has and its redirects, inside the writer's open
transaction (``writer.StateWriter``), once its files are in place. Its in-flight row stays
until the sync ends: a run that dies is re-checked whole by the next (which rewrites and
announces nothing the state already has), so what spans documents (a rename found by
hash, a ``doc_uid|r`` collision) is decided again over the same documents.
``record_gone`` does the same for a document that is gone (a rename is found by hash
among the chunks made now, or of a document new a moment ago; ids no chunk took are kept
a while, ``GONE_KEPT_S``, and a document recorded later that holds their text takes them:
a move whose halves two runs saw), and ``sweep_orphans`` for files no document claims. Every
corpus-wide question (who claims a file, is an id live, which redirects point at a
vanished id) is an indexed query, so recording a document costs that document, not the
corpus.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from pipeline._version import __version__
from pipeline.run import feed
from pipeline.run.db import StateDB
from pipeline.run.discover import walk
from pipeline.run.model import DocResult
from pipeline.run.state import STATE_DIR, event
from pipeline.run.writer import StateWriter

#: Seconds a removed document's ids wait for their text to come back elsewhere, and a new
#: document's ids are a removed one's possible new place: a move whose halves two runs saw
#: (a watch killed between the two).
GONE_KEPT_S = 60.0


def record_result(result: DocResult, writer: StateWriter, rev_width: int | None = None) -> None:
    """Record one document's result (see the module docstring); ``rev_width`` forces its ``r=`` width."""
    summary, rel, db = writer.summary, result.rel_path, writer.db
    summary.processed += 1
    summary.warnings.extend(result.warnings)
    for stage, secs in result.seconds.items():
        summary.stage_seconds[stage] = summary.stage_seconds.get(stage, 0.0) + secs
    if result.error is not None:
        summary.failures.append(result.error)
        if result.unsafe or rel in writer.recovering:
            writer.unsafe.add(rel)  # its files may not be what the state says: re-check next time
        return  # a failed document keeps its previous chunks, which are whole
    summary.bytes += result.size
    summary.added += len(result.added)
    summary.changed += len(result.changed)
    summary.unchanged += len(result.files) - len(result.added) - len(result.changed)
    summary.written += result.written
    prev = {} if rel in writer.unrecorded else db.entry(rel) or {}
    writer.unrecorded.discard(rel)  # it may have a row from now on (a re-writer, ``widen_collisions``)
    if rev_width is None:
        rev_width = int(prev.get("rev_width", 8)) if prev.get("uid_rev") == result.uid_rev else 8
    entry = {
        "source_hash": result.source_hash,
        "size": result.size,
        "mtime_ns": result.mtime_ns,
        "policy_hash": writer.policy_hash,
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
        db.put_doc(rel, entry, writer.generation)
        _announce_writes(result, prev, writer)
        now = set(result.files)
        stale = [(i, f) for i, f in enumerate(prev.get("files", ())) if f not in now]
        _remove(writer, rel, prev, stale)
        _redirect(writer, result.redirects, vanished, live, hashes)
        _redirect_gone(writer, result.chunk_ids, result.hashes)
        if not prev and writer.keep_births:  # new to the state: the other half of a move, perhaps
            born = time.time()
            db.keep_born(zip(result.chunk_ids, result.hashes, strict=True), born, born - GONE_KEPT_S)
        writer.folder_whole(rel)

    if writer.write(rel, work):
        writer.uid_revs[rel] = result.uid_rev
        if vanished:
            writer.with_vanished_ids.add(rel)


def _announce_writes(result: DocResult, prev: dict[str, Any], writer: StateWriter) -> None:
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
    envelope = event("ingest.write", writer.run_id, writer.generation)
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
        writer.feed_lines.append((feed.file_key(file), "w", int(text), lead + orjson.dumps(fields)[1:]))


def _remove(writer: StateWriter, rel: str, prev: dict[str, Any], stale: list[tuple[int, str]]) -> None:
    """Delete the chunk files ``rel`` no longer has (unless another document claims them)."""
    out = writer.opts.out
    for i, file in stale:
        if writer.db.file_owner(file, other_than=rel) is not None:
            continue
        try:
            os.unlink(out / file)
        except FileNotFoundError:
            pass
        except OSError:
            writer.removal_failed = True
            continue
        writer.summary.removed += 1
        writer.maybe_emptied.add(file.rpartition("/")[0])
        ref, chunk_id, digest = (_at(prev.get(k, ()), i) for k in ("ids", "chunk_ids", "hashes"))
        writer.add_feed_line("ingest.delete", file=file, id=ref, chunk_id=chunk_id, hash=digest, source=rel)


def _at(values: Any, i: int) -> str:
    return str(values[i]) if i < len(values) else ""


def _redirect(
    writer: StateWriter,
    found: dict[str, tuple[str, str]],
    vanished: list[str],
    live: set[str],
    hashes: dict[str, str],
) -> None:
    """Merge this document's redirects into the map, chains collapsed (``redirects.collapse``, per document).

    ``found``: old id → (new id, how) found now; ``vanished``: its old ids that went;
    ``live``: its ids now. An old id live again leaves the map; an entry that pointed at a
    vanished id follows it to its new place, or leaves when its text went.
    """
    db = writer.db
    db.drop_redirects(live)
    for old, target in db.redirects_to(vanished):
        nxt = found.get(target)
        if nxt is None or nxt[0] == old:
            db.drop_redirects([old])
            continue
        db.set_redirect(old, nxt[0])
        writer.summary.redirects += 1
        writer.add_feed_line(
            "ingest.redirect",
            old=old,
            new=nxt[0],
            chunk_id=nxt[0],
            hash=hashes.get(nxt[0], ""),
            match="chain",
        )
    for old, (new, how) in sorted(found.items()):
        if old == new or old in live or db.is_live(old) or db.redirect(old) == new:
            continue
        db.set_redirect(old, new)
        writer.summary.redirects += 1
        digest = hashes.get(new) or db.hash_of(new)
        writer.add_feed_line("ingest.redirect", old=old, new=new, chunk_id=new, hash=digest, match=how)


def _redirect_gone(writer: StateWriter, chunk_ids: Sequence[str], hashes: Sequence[str]) -> None:
    """Ids of a document removed a moment ago whose text this document now holds: the other
    half of its move, which an earlier run saw; each goes to the first chunk with its text."""
    db = writer.db
    found = db.take_gone(hashes, time.time() - GONE_KEPT_S)
    if not found:
        return
    first: dict[str, str] = {}
    for chunk_id, digest in zip(chunk_ids, hashes, strict=True):
        first.setdefault(digest, chunk_id)
    for old, digest in found:
        new = first[digest]
        if old == new or db.is_live(old) or db.redirect(old) == new:
            continue
        db.set_redirect(old, new)
        writer.summary.redirects += 1
        writer.add_feed_line("ingest.redirect", old=old, new=new, chunk_id=new, hash=digest, match="rename")


def record_gone(writer: StateWriter, rel: str) -> None:
    """Record a document that is gone: its files go, its ids redirect to chunks made now with equal text."""
    db = writer.db
    entry = db.entry(rel)
    if entry is None:
        return
    cids, hashes = entry.get("chunk_ids", []), entry.get("hashes", [])

    def work() -> None:
        db.drop_doc(rel)  # first: its own ids are not live any more
        renamed: dict[str, tuple[str, str]] = {}
        kept: dict[str, str] = {}  # id → hash: no chunk has its text now
        for cid, digest in zip(cids, hashes, strict=False):
            if db.is_live(cid):
                continue
            made = db.made_with_hash(digest, writer.made_since or writer.generation)
            if made is None:  # the move's other half, recorded by a run a moment before
                born = db.born_with_hash(digest, time.time() - GONE_KEPT_S)
                made = (born, digest) if born is not None else None
            if made is not None and made[0] != cid:
                renamed[cid] = (made[0], "rename")
            elif made is None:
                kept[cid] = digest
        if kept:  # with the ids redirected to them, whose redirects go below
            chains = [(old, kept[target]) for old, target in db.redirects_to(kept)]
            now = time.time()
            db.keep_gone([*kept.items(), *chains], now, now - GONE_KEPT_S)
        _remove(writer, rel, entry, list(enumerate(entry.get("files", ()))))
        targets = {new for new, _ in renamed.values()}
        _redirect(writer, renamed, list(cids), set(), {t: db.hash_of(t) for t in targets})
        writer.folder_whole(rel)

    if writer.write(rel, work):
        writer.with_vanished_ids.add(rel)


def sweep_orphans(writer: StateWriter) -> None:
    """Remove chunk files and temp files under the output that no document claims (one transaction)."""
    out, db = writer.opts.out, writer.db

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
                writer.removal_failed = True
                continue
            writer.maybe_emptied.add(rel_file.rpartition("/")[0])
            if is_tmp:
                continue
            writer.summary.removed += 1
            src, chunk_ref, chunk_id, digest = info or ("", "", "", "")
            writer.add_feed_line(
                "ingest.delete", file=rel_file, id=chunk_ref, chunk_id=chunk_id, hash=digest, source=src
            )

    writer.write("", work)
    writer.write("", lambda: writer.db.forget_folders(writer.maybe_emptied))


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
