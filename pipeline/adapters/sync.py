"""Apply the change feed to a framework's vector store, chunk by chunk, from a remembered cursor.

Framework-free: ``langchain.py`` and ``llamaindex.py`` each give a ``Target`` (how to
embed-and-add records, how to delete ids) and share everything else here. What to upsert
and delete comes from the feed planner every consumer shares (``pipeline.index.feedplan``);
this module decides which upserts need embedding (the embedded text changed) and keeps
the cursor file. The store is keyed by ``chunk_id``. What the store holds — per
``chunk_id``, the digest of the text it embedded and the file it came from — and the feed
cursor are kept together in one JSON file, written atomically after the store calls
succeeded; a failed call leaves the cursor where it was, so the next sync replays the same
changes and converges, embedding nothing the store already took.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import orjson

from pipeline.adapters.changes import Cursor
from pipeline.adapters.records import embed_digest
from pipeline.chunkfolder import ChunkRecord
from pipeline.errors import UsageError
from pipeline.index.feedplan import FeedPlan, plan_feed
from pipeline.run.emit import write_atomic

STATE_FORMAT = 1


class Target(Protocol):
    """A vector store as the sync drives it; ids are ``chunk_id``s."""

    def upsert(self, records: Sequence[Mapping[str, Any]], replacing: Sequence[str]) -> None:
        """Embed the records' ``embedText`` and add them, replacing any with the same id.

        ``replacing``: the records' ids the store may hold already (added by an earlier sync).
        """

    def delete(self, chunk_ids: Sequence[str]) -> None:
        """Remove these ids (given to ``upsert`` before; one the store lacks is no error)."""


@dataclass(slots=True)
class StoreSyncReport:
    """What one sync of a framework's vector store did.

    Attributes:
        cursor: the feed cursor the next sync starts after.
        changes: feed lines read.
        added: chunks new to the store (embedded).
        replaced: chunks the store held with another embedded text (embedded again).
        unchanged: written chunks whose embedded text the store already holds (not embedded).
        deleted: chunks removed from the store.
        skipped: chunk files whose last line read is a write of a chunk the file no longer
            holds (gone, or another chunk by now: a later line of the feed says what became of it).
        full: the whole feed was read again (asked for, or the feed no longer reached
            the cursor), and what it no longer writes was deleted.
    """

    cursor: Cursor | None
    changes: int = 0
    added: int = 0
    replaced: int = 0
    unchanged: int = 0
    deleted: int = 0
    skipped: int = 0
    full: bool = False  #: the whole feed was read again (asked for, or the cursor was lost)

    @property
    def embedded(self) -> int:
        """Chunks whose text was sent to the embedding model."""
        return self.added + self.replaced


@dataclass(slots=True)
class SyncState:
    """The cursor file: where the feed was read to, and what the store holds."""

    out: str
    cursor: Cursor | None = None
    #: chunk_id → [digest of the embedded text, chunk file it came from]
    chunks: dict[str, list[str]] = field(default_factory=dict)


def embedded_text_changed(known: str | None, record: Mapping[str, Any]) -> bool:
    """Whether a written chunk must be embedded (again): the one rule of the sync.

    Compares the digest of what would be embedded with the one recorded when the store
    last took this ``chunk_id``. The feed's own word (docs/spec.md, change feed: ``"change": "moved"``
    when only a chunk's position or revision moved) is not taken: it compares with the
    file's previous version, not with what this store holds, and a reader that missed
    lines (it resumed after a compaction that kept only a file's last line, or it
    follows the feed from a cursor older than the text change) would keep a stale text.

    Args:
        known: the digest recorded for this ``chunk_id``, ``None`` if the store lacks it.
        record: the chunk record as it is now.
    """
    return known is None or embed_digest(record) != known


def load_state(path: Path, out: Path) -> SyncState:
    """The cursor file at ``path`` (a fresh state when there is none)."""
    where = str(out.resolve())
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return SyncState(where)
    except (OSError, orjson.JSONDecodeError) as exc:
        raise UsageError(
            f"{path}: cannot read the sync cursor ({exc}) (hint: delete it to sync again from the start)"
        ) from None
    if not isinstance(data, dict) or data.get("format") != STATE_FORMAT:
        raise UsageError(f"{path}: not a format-{STATE_FORMAT} sync cursor (hint: delete it to start over)")
    if data.get("out") != where:
        raise UsageError(
            f"{path}: this cursor follows {data.get('out')}, not {where} "
            "(hint: give each chunk folder and store its own cursor file)"
        )
    return SyncState(where, data.get("cursor"), dict(data.get("chunks") or {}))


def save_state(path: Path, state: SyncState) -> None:
    """Write the cursor file atomically (temp file + rename)."""
    data = {"format": STATE_FORMAT, "out": state.out, "cursor": state.cursor, "chunks": state.chunks}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, orjson.dumps(data) + b"\n")


class EmbeddedChunk(NamedTuple):
    """What the cursor file says the store holds of one chunk."""

    digest: str  #: of the text embedded ("": unknown, embed it again)
    file: str  #: the chunk file it came from


class _CursorHoldings:
    """The cursor file's chunks as the planner asks for them (``Holdings``)."""

    def __init__(self, chunks: dict[str, list[str]]) -> None:
        self.chunks = chunks

    def states(self) -> dict[str, EmbeddedChunk]:
        return {cid: EmbeddedChunk(digest, file) for cid, (digest, file) in self.chunks.items()}

    def states_for(self, files: Collection[str], ids: Collection[str]) -> dict[str, EmbeddedChunk]:
        files, ids = set(files), set(ids)
        return {
            cid: EmbeddedChunk(digest, file)
            for cid, (digest, file) in self.chunks.items()
            if file in files or cid in ids
        }


def sync(
    out: Path | str, target: Target, cursor_path: Path | str, *, full: bool = False, batch_size: int = 128
) -> StoreSyncReport:
    """Bring ``target`` up to date with the chunk folder ``out``, from the cursor in ``cursor_path``.

    Args:
        out: the chunk folder.
        target: the store to drive.
        cursor_path: the JSON file that remembers the cursor (created on the first sync).
        full: read every chunk file and also delete what the store holds beyond them
            (done by itself when the feed no longer reaches the cursor).
        batch_size: chunks per store call.

    Returns:
        What was done; ``report.cursor`` is also saved in ``cursor_path``.

    Raises:
        Whatever the store raises; the cursor is then left where it was.
    """
    out, cursor_path = Path(out), Path(cursor_path)
    state = load_state(cursor_path, out)
    plan = plan_feed(out, state.cursor, _CursorHoldings(state.chunks), full=full)
    report = StoreSyncReport(plan.cursor, changes=plan.changes, skipped=plan.stale, full=plan.full)
    if not report.changes and not report.full:
        return report
    try:
        _upsert(target, state, plan, report, batch_size)
        doomed = [cid for cid in sorted(plan.deletes) if cid in state.chunks]
        for i in range(0, len(doomed), batch_size):
            ids = doomed[i : i + batch_size]
            target.delete(ids)
            for cid in ids:
                del state.chunks[cid]
            report.deleted += len(ids)
    except BaseException:
        save_state(cursor_path, state)  # what the store took is recorded; the cursor stays
        raise
    state.cursor = report.cursor
    save_state(cursor_path, state)
    return report


def _upsert(
    target: Target, state: SyncState, plan: FeedPlan[EmbeddedChunk], report: StoreSyncReport, batch_size: int
) -> None:
    """Embed and add the planned upserts whose embedded text is new to the store."""
    pending: list[tuple[ChunkRecord, str, str]] = []

    def flush() -> None:
        if not pending:
            return
        records = [rec for rec, _, _ in pending]
        try:
            target.upsert(records, [r["chunk_id"] for r in records if r["chunk_id"] in state.chunks])
        except BaseException:
            for rec, _, file in pending:  # some may have gone in: next time they are replaced, not doubled
                state.chunks.setdefault(rec["chunk_id"], ["", file])
            raise
        for rec, digest, file in pending:
            cid = rec["chunk_id"]
            if cid in state.chunks:
                report.replaced += 1
            else:
                report.added += 1
            state.chunks[cid] = [digest, file]
        pending.clear()

    for cid, chunk in plan.upserts.items():
        known = state.chunks.get(cid)
        if not embedded_text_changed(known[0] if known else None, chunk.record):
            report.unchanged += 1
            if known is not None:
                known[1] = chunk.file
            continue
        pending.append((chunk.record, embed_digest(chunk.record), chunk.file))
        if len(pending) >= batch_size:
            flush()
    flush()
