"""The change feed as a reader sees it: ``read_changes(out, after=cursor)`` (docs/spec.md, Runs; State and scale).

In the ``run`` layer so that every consumer above it (the index, the adapters) reads the
feed through this one reader; ``pipeline.adapters.changes`` re-exports it.

This module is the one place that knows how the feed is stored. Two forms exist:

- ``CHUNKS/.chunkyard/changes.jsonl``, JSON lines; a cursor is ``"bytes:<offset>"``.
- the feed with sequence numbers in the state database (docs/spec.md, State and scale), read through
  ``pipeline.run.feed.read_feed(out, after_seq)``; a cursor is ``"seq:<n>"``. Used
  whenever this build has that module; a cursor of the other form is then lost
  (``CursorLostError``), and a sync reads the feed again from the start.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson

from pipeline.errors import PipelineError, UsageError
from pipeline.run.state import FEED, STATE_DIR

#: A position in the change feed, to resume reading after. Opaque: store it, hand it
#: back, never compute with it. ``"bytes:<offset>"`` (the byte just after a whole line
#: of ``changes.jsonl``), or ``"seq:<n>"`` for the feed with sequence numbers. ``None``
#: (or ``""``) is the feed's beginning.
Cursor = str

ChangeKind = Literal["write", "delete", "redirect", "other"]

_BYTES = "bytes:"
_SEQ = "seq:"
_KINDS: dict[str, ChangeKind] = {
    "ingest.write": "write",
    "ingest.delete": "delete",
    "ingest.redirect": "redirect",
}


@dataclass(frozen=True, slots=True)
class Change:
    """One line of the change feed.

    Attributes:
        kind: ``write`` (a chunk file added or changed), ``delete`` (a chunk file
            removed) or ``redirect`` (an old ``chunk_id`` now answered by ``new``).
        cursor: where to resume to read the changes after this one.
        file: the chunk file, relative to the output folder (``""`` for a redirect).
        id: the chunk's file-based ``id`` (``doc:<docName>::ch<N>``).
        chunk_id: the chunk's address (for a redirect: the new one).
        hash: ``blake3:`` of the chunk's ``originalText``.
        source: the corpus-relative source document.
        change: for a write, what moved: ``added`` / ``changed`` today; ``text`` /
            ``moved`` once the feed says whether the embedded text changed.
        prev_chunk_id: for a write, the ``chunk_id`` the file held before, when another.
        old: for a redirect, the old ``chunk_id``.
        run_id: the run that wrote the line (the 004 envelope's ``trace_id``).
        seq: the line's sequence number, once the feed has them (else ``None``).
        raw: the line as written, for fields not listed here.
    """

    kind: ChangeKind
    cursor: Cursor
    file: str = ""
    id: str = ""
    chunk_id: str = ""
    hash: str = ""
    source: str = ""
    change: str = ""
    prev_chunk_id: str = ""
    old: str = ""
    run_id: str = ""
    seq: int | None = None
    raw: dict[str, Any] | None = None


def feed_path(out: Path) -> Path:
    """Where the change feed of the output folder ``out`` lives."""
    return Path(out) / STATE_DIR / FEED


def read_changes(out: Path | str, after: Cursor | None = None) -> Iterator[Change]:
    """The changes written to the output folder ``out`` after the cursor ``after``.

    Only whole lines are read: a line a run is appending right now is left for the
    next call. Delivery is at least once (a run that repairs a crashed one says again
    what the crashed one wrote), so apply changes idempotently.

    Args:
        out: the chunk folder (``ingest``'s ``--out``).
        after: a cursor from an earlier ``Change.cursor``; ``None`` reads from the start.

    Yields:
        Each change in feed order; ``change.cursor`` resumes after it.

    Raises:
        UsageError: the cursor is not one this feed ever gave.
        CursorLostError: the feed no longer reaches the cursor (it was replaced).
    """
    seq_feed = _seq_feed()
    if seq_feed is not None:
        yield from _read_seq(Path(out), after, *seq_feed)
        return
    path = feed_path(Path(out))
    offset = _offset(after, path)
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed in the finally below (a generator)
    except FileNotFoundError:
        if offset:
            raise _replaced(path, after) from None
        return
    try:
        size = os.fstat(fh.fileno()).st_size
        if offset > size:
            raise _replaced(path, after)
        if offset:
            fh.seek(offset - 1)
            if fh.read(1) != b"\n":
                raise _replaced(path, after)
        for line in fh:
            if not line.endswith(b"\n"):
                break  # a run is appending it right now
            offset += len(line)
            if line.strip():
                yield _change(orjson.loads(line), f"{_BYTES}{offset}")
    finally:
        fh.close()


def _seq_feed() -> tuple[Callable[[Path, int], Iterator[Any]], type[Exception]] | None:
    """``pipeline.run.feed``'s ``read_feed`` and its gap error, when this build has them (docs/spec.md, State and scale)."""
    try:
        module = importlib.import_module("pipeline.run.feed")
    except ImportError:
        return None
    reader = getattr(module, "read_feed", None)
    gap = getattr(module, "FeedGapError", None)
    if reader is None or not (isinstance(gap, type) and issubclass(gap, Exception)):
        return None
    return reader, gap


def _read_seq(
    out: Path, after: Cursor | None, reader: Callable[[Path, int], Iterator[Any]], gap: type[Exception]
) -> Iterator[Change]:
    """The feed with sequence numbers: each line's cursor is ``seq:<its seq>``."""
    if after and after.startswith(_BYTES) and after[len(_BYTES) :].isdigit():
        raise _replaced(feed_path(out), after)  # a cursor into the JSON-lines feed this one replaced
    seq = _number(after, _SEQ)
    try:
        for line in reader(out, seq):
            yield _change(line.event, f"{_SEQ}{line.seq}")
    except gap as exc:
        raise CursorLostError(f"{out}: {exc}") from exc


def _offset(cursor: Cursor | None, path: Path) -> int:
    if cursor and cursor.startswith(_SEQ) and cursor[len(_SEQ) :].isdigit():
        raise _replaced(path, cursor)  # a cursor into a feed with sequence numbers
    return _number(cursor, _BYTES)


def _number(cursor: Cursor | None, prefix: str) -> int:
    if not cursor:
        return 0
    if cursor.startswith(prefix) and cursor[len(prefix) :].isdigit():
        return int(cursor[len(prefix) :])
    raise UsageError(
        f"change-feed cursor {cursor!r}: not a cursor this chunkyard gave "
        "(hint: pass a Change.cursor you stored, or None to read from the start)"
    )


class CursorLostError(PipelineError):
    """The feed no longer reaches a cursor (it was replaced, cut, or compacted past it).

    Read it again from the start (cursor ``None``) and drop what it no longer writes:
    ``sync(..., full=True)`` does.
    """


def _replaced(path: Path, cursor: Cursor | None) -> CursorLostError:
    return CursorLostError(
        f"{path}: the change feed does not reach cursor {cursor!r}: it was replaced or cut "
        "(hint: read again from the start (cursor None); applying the feed twice is harmless)"
    )


def _change(line: dict[str, Any], cursor: Cursor) -> Change:
    event = str(line.get("event", ""))
    kind = _KINDS.get(event, "other")
    seq = line.get("seq")
    return Change(
        kind=kind,
        cursor=cursor,
        file=str(line.get("file", "")),
        id=str(line.get("id", "")),
        chunk_id=str(line.get("chunk_id", "")),
        hash=str(line.get("hash", "")),
        source=str(line.get("source", "")),
        change=str(line.get("change", "")),
        prev_chunk_id=str(line.get("prev_chunk_id", "")),
        old=str(line.get("old", "")),
        run_id=str(line.get("trace_id", "")),
        seq=seq if isinstance(seq, int) else None,
        raw=line,
    )
