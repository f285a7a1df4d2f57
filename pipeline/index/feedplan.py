"""The one feed planner: feed lines after a cursor + what a consumer holds → upserts, deletes, redirects.

Every consumer of the change feed plans through :func:`plan_feed`: the index
(``pipeline.index.sync``), the LangChain and LlamaIndex syncs (``pipeline.adapters.sync``)
and anything built on the public API. What each does with the plan differs (the index
compares whole rows and keeps an embedding cache, a framework store compares the embedded
text only); what to upsert and what to delete does not.

The rule (``docs/spec.md``, change feed):

- The feed says *where to look*, the chunk files say *what is there*. Each write or delete
  line touches its chunk file; after reading the feed, every touched file is read, and the
  chunk it holds now (if any) is live: an upsert.
- An id the consumer holds leaves when the file it was held in was touched and no longer
  holds it, or when a line names it (a delete line's ``chunk_id``, a write line's
  ``prev_chunk_id``) and no touched file holds it. An id that moved to another file (a
  document renamed with its ``doc_id``) is live there and stays.
- Redirect lines are handed on as ``(old, new)`` pairs; the old id leaves through the
  rules above (its file was written with the new id).

One recovery rule for a lost cursor (the feed was made anew, cut, or compacted past it —
``CursorLostError``) and for a full plan asked for: read every chunk file; everything the
consumer holds beyond them is deleted. The feed is still read (from the cursor, or from its
start when the cursor is lost) only to learn the cursor to resume after.

The cost of an incremental plan follows the change: only touched files are read and only
the consumer's states for those files and the ids the feed names are asked for.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from pipeline.chunkfolder import ChunkRecord, iter_chunk_files, read_chunk_file_or_none
from pipeline.run.changes import Cursor, CursorLostError, read_changes

#: ``FeedPlan.reason`` when the feed no longer reached the cursor.
CURSOR_LOST = "the feed no longer reaches the cursor"


class HeldState(Protocol):
    """What the planner needs to know of a chunk a consumer holds: the file it came from."""

    @property
    def file(self) -> str: ...


H = TypeVar("H", bound=HeldState)
H_co = TypeVar("H_co", bound=HeldState, covariant=True)


class Holdings(Protocol[H_co]):
    """A consumer's view of what it holds, by ``chunk_id`` (the index's ``VectorStore`` is one)."""

    def states(self) -> Mapping[str, H_co]:
        """Every id held (a full plan)."""
        ...

    def states_for(self, files: Collection[str], ids: Collection[str]) -> Mapping[str, H_co]:
        """The ids held from one of ``files`` or named in ``ids`` (an incremental plan)."""
        ...


@dataclass(frozen=True, slots=True)
class LiveChunk:
    """A chunk as its file holds it now: the file (relative to the chunk folder) and its record."""

    file: str
    record: ChunkRecord


@dataclass(slots=True)
class FeedPlan(Generic[H]):
    """What a consumer must do to catch up with the chunk folder.

    Attributes:
        cursor: the cursor to save once the plan is applied (``None``: the feed is empty).
        changes: feed lines read.
        full: every chunk file was read (asked for, or the cursor was lost: ``reason``).
        reason: ``CURSOR_LOST`` when the feed no longer reached the cursor, else ``""``.
        upserts: the live chunks of the touched files (every chunk on a full plan), by
            ``chunk_id``, in file order; the consumer skips those it holds unchanged.
        deletes: held ids to remove.
        redirects: the feed's ``(old chunk_id, new chunk_id)`` pairs, in feed order.
        held: the consumer's state of every id the plan concerns (all ids on a full plan).
        stale: files whose last line read is a write of a chunk the file no longer holds
            (gone, or another chunk by now: a line not yet read will say).
    """

    cursor: Cursor | None
    changes: int = 0
    full: bool = False
    reason: str = ""
    upserts: dict[str, LiveChunk] = field(default_factory=dict)
    deletes: set[str] = field(default_factory=set)
    redirects: list[tuple[str, str]] = field(default_factory=list)
    held: dict[str, H] = field(default_factory=dict)
    stale: int = 0


def plan_feed(
    out: Path | str, cursor: Cursor | None, holdings: Holdings[H], *, full: bool = False
) -> FeedPlan[H]:
    """Plan how ``holdings`` catch up with the chunk folder ``out`` from ``cursor`` (module docstring).

    Args:
        out: the chunk folder.
        cursor: where the consumer read the feed to (``None``: never read it).
        holdings: what the consumer holds.
        full: read every chunk file and delete what the consumer holds beyond them
            (a reconcile, a new consumer); done by itself when the cursor is lost.

    Raises:
        UsageError: ``cursor`` is not one this feed ever gave.
    """
    out = Path(out)
    plan: FeedPlan[H] = FeedPlan(cursor or None, full=full)
    touched: set[str] = set()
    named: set[str] = set()  #: ids a delete line or a write's ``prev_chunk_id`` names
    last_write: dict[str, str] = {}  #: chunk file → the id its last line read wrote ("" = deleted)

    def follow(after: Cursor | None, *, lost: bool = False) -> None:
        for change in read_changes(out, after):
            plan.changes += 1
            plan.cursor = change.cursor
            if change.kind in ("write", "delete") and change.file:
                touched.add(change.file)
                last_write[change.file] = change.chunk_id if change.kind == "write" else ""
            if lost:  # every chunk file is read: the lines only give the cursor (and stale files)
                continue
            if change.kind == "delete" and change.chunk_id:
                named.add(change.chunk_id)
            if change.kind == "write" and change.prev_chunk_id:
                named.add(change.prev_chunk_id)
            if change.kind == "redirect" and change.old and change.chunk_id:
                plan.redirects.append((change.old, change.chunk_id))

    try:
        follow(cursor or None)
    except CursorLostError:
        plan = FeedPlan(None, full=True, reason=CURSOR_LOST)
        last_write.clear()
        follow(None, lost=True)
    if plan.full:
        touched = set(iter_chunk_files(out))
    holder: dict[str, str] = {}  #: chunk file → the id it holds now
    for file in sorted(touched):
        record = read_chunk_file_or_none(out / file)
        if record is not None and isinstance(record.get("chunk_id"), str):
            plan.upserts[record["chunk_id"]] = LiveChunk(file, record)
            holder[file] = record["chunk_id"]
    live = plan.upserts.keys()
    if plan.full:
        plan.held = dict(holdings.states())
        plan.deletes = set(plan.held) - live
    else:
        ids = named | set(live) | {cid for pair in plan.redirects for cid in pair}
        plan.held = dict(holdings.states_for(touched, ids))
        plan.deletes = {cid for cid, s in plan.held.items() if s.file in touched and cid not in live}
        plan.deletes |= {cid for cid in named if cid in plan.held and cid not in live}
    plan.stale = sum(1 for file, cid in last_write.items() if cid and holder.get(file) != cid)
    return plan
