"""What watch reports of each sync: one line per document (``DocChange``), one report per sync (``SyncReport``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pipeline.run.db import StateDB
from pipeline.run.model import DocResult, Summary

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


@dataclass(frozen=True, slots=True)
class Done:
    """What a sync's report keeps of one document's result."""

    error: str | None
    written: int
    files: int
    ms: float


def doc_change(
    rel: str, old_files: int, db: StateDB, done: Done | None, renamed_from: str | None
) -> DocChange:
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


def ms_of(result: DocResult) -> float:
    """A document's own processing time, in milliseconds."""
    return round(sum(result.seconds.values()) * 1000, 1)
