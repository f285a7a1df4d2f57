"""Audit: ``resolve`` — any chunk address → the exact span of its source, without embeddings.

The contract: docs/spec.md, "Audit".

An address is a ``chunk_id``, an ``id`` (``doc:<name>::chN``), a chunk file (name
or path), or a stale ``chunk_id`` that the redirect map sends to a live one.
"""

from __future__ import annotations

import contextlib
import difflib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from pipeline.audit.chunk_state import ChunkStore, Location, doc_name_of, uid_of
from pipeline.chunkfolder import ChunkRecord
from pipeline.errors import PipelineError
from pipeline.stages.parse import Lines

#: A redirect map is collapsed by ingest; a longer walk than this is a loop.
MAX_HOPS = 16


class UnknownIdError(PipelineError):
    """No chunk answers to the address; ``suggestions`` holds the nearest ones."""

    def __init__(self, query: str, suggestions: list[str], reason: str = "") -> None:
        hint = (
            "did you mean: " + ", ".join(suggestions)
            if suggestions
            else "list the ids with `sqlite3 .chunkyard/state.sqlite 'select chunk_id from chunks'`"
        )
        super().__init__(f"{query}: {reason or 'no chunk has this id'} (hint: {hint})")
        self.query = query
        self.suggestions = suggestions
        self.reason = reason or "no chunk has this id"


@dataclass(frozen=True, slots=True)
class Row:
    """One source line to show: its number, its text, and the part of it the chunk covers."""

    number: int
    text: str
    mark_start: int  #: start of the chunk's part of this line (chars), == mark_end when none
    mark_end: int
    inside: bool = True  #: the line lies in the chunk's line span (blank lines too)


@dataclass(frozen=True, slots=True)
class Resolved:
    """A chunk found, with where its text is in the source now."""

    query: str
    location: Location
    record: ChunkRecord
    source_path: Path
    #: ``current``: the source still holds the text at the chunk's offsets; ``moved``: it holds
    #: it elsewhere; ``changed``: it no longer holds it; ``missing``: there is no source.
    source_status: str
    start: int  #: the span in the current source (the chunk's own offsets unless ``moved``)
    end: int
    redirected_from: str | None = None
    text: str | None = None  #: the current canonical source text, when there is one

    @property
    def line_span(self) -> tuple[int, int]:
        if self.text is None or self.source_status == "changed":
            span = self.record["lineSpan"]
            return span["lineStart"], span["lineEnd"]
        lines = Lines(self.text)
        return lines.line_of(self.start), lines.line_of(self.end - 1)

    def rows(self, context: int = 3) -> list[Row]:
        """The chunk's lines with ``context`` lines either side (from the chunk alone if the source moved on)."""
        if self.text is None or self.source_status == "changed":
            first = self.record["lineSpan"]["lineStart"]
            return [
                Row(first + k, t, 0, len(t)) for k, t in enumerate(self.record["originalText"].split("\n"))
            ]
        lines = Lines(self.text)
        first, last = self.line_span
        rows = []
        for n in range(max(1, first - context), min(lines.count, last + context) + 1):
            ls, le = lines.start(n), lines.end(n)
            a, b = max(self.start, ls), min(self.end, le)
            inside = first <= n <= last
            rows.append(Row(n, self.text[ls:le], a - ls if a < b else 0, b - ls if a < b else 0, inside))
        return rows

    def payload(self) -> dict[str, Any]:
        """001's citation payload for this chunk, plus its text and where it lives."""
        rec = self.record
        return {
            "doc_id": rec["doc_id"],
            "section_id": rec["section_id"],
            "snippet_id": rec["chunk_id"],
            "source_url": rec["source_url"],
            "offsets": {
                "start": rec["charOffsets"]["charStart"],
                "end": rec["charOffsets"]["charEnd"],
                "unit": "char",
            },
            "tokens": rec["tokenStats"]["tokens"],
            "rev": rec["rev"],
            "analyzer": rec["metadata"]["analyzer"],
            "id": rec["id"],
            "text": rec["originalText"],
            "file": self.location.file,
            "source_file": rec["metadata"]["sourceFile"],
            "lineSpan": dict(rec["lineSpan"]),
            "source_status": self.source_status,
            "redirected_from": self.redirected_from,
        }


def find(store: ChunkStore, query: str) -> tuple[Location, str | None]:
    """The chunk an address names, and the stale id it was redirected from (if it was)."""
    q = query.strip()
    for kind in ("chunk_id", "id", "file"):
        loc = store.index(kind).get(q)
        if loc is not None:
            return loc, None
    if q in store.redirects:
        target, hops = q, 0
        while target in store.redirects and hops < MAX_HOPS:
            target, hops = store.redirects[target], hops + 1
        loc = store.index("chunk_id").get(target)
        if loc is None:
            raise UnknownIdError(q, suggest(store, target), f"redirected to {target!r}, which no chunk has")
        return loc, q
    files = store.index("file")
    for candidate in _as_files(store.out, q):
        if candidate in files:
            return files[candidate], None
    name = PurePosixPath(q).name
    name = name if name.endswith(".json") else f"{name}.json"
    named = sorted(f for f in files if f.rsplit("/", 1)[-1] == name)
    if len(named) == 1:
        return files[named[0]], None
    if named:
        raise UnknownIdError(q, named[:8], f"{len(named)} chunk files are named {name}; give the path")
    reason = ""
    if q.startswith("doc:"):
        rel = next((r for r in store.docs if f"doc:{doc_name_of(r)}" == q.partition("::ch")[0]), None)
        if rel is not None:
            count = len(store.docs[rel].get("files") or [])
            reason = f"{rel} has {count} chunks, ch0 … ch{count - 1}" if count else f"{rel} has no chunks"
    raise UnknownIdError(q, suggest(store, q), reason)


def _as_files(out: Path, q: str) -> list[str]:
    """Ways a path on the command line can name a file under ``out``."""
    found = [q.removeprefix("./")]
    with contextlib.suppress(ValueError, OSError):
        found.append(Path(q).resolve().relative_to(out.resolve()).as_posix())
    return found


def suggest(store: ChunkStore, query: str, n: int = 5) -> list[str]:
    """The nearest live addresses: same document and section first, then by string likeness."""
    q = query.strip()
    if "|r=" in q:
        uid = uid_of(q)
        pool = sorted(c for c in store.index("chunk_id") if uid_of(c) == uid)
        tail = q.partition("|s=")[2]
        same_place = [c for c in pool if tail and c.endswith(f"|s={tail}")]
        if pool:
            close = difflib.get_close_matches(q, pool, n, cutoff=0.0)
            return list(dict.fromkeys(same_place + close))[:n]
        pool = list(store.index("chunk_id"))
    elif q.startswith("doc:"):
        name = q[4:].partition("::ch")[0]
        pool = sorted(i for i in store.index("id") if i.startswith(f"doc:{name}::ch"))
        if pool:
            return difflib.get_close_matches(q, pool, n, cutoff=0.0)
        pool = list(store.index("id"))
    else:
        pool = [f.rsplit("/", 1)[-1] for f in store.index("file")]
        q = PurePosixPath(q).name
    return difflib.get_close_matches(q, pool, n, cutoff=0.6)


def resolve(store: ChunkStore, query: str) -> Resolved:
    """Find the chunk an address names and place it in the current source."""
    loc, redirected_from = find(store, query)
    record = store.read_record(loc.file)
    source_path = store.corpus / loc.rel_path
    start, end = record["charOffsets"]["charStart"], record["charOffsets"]["charEnd"]
    doc = store.source(loc.rel_path)
    if doc is None:
        return Resolved(query, loc, record, source_path, "missing", start, end, redirected_from)
    original = record["originalText"]
    status = "current"
    if doc.text[start:end] != original:
        moved = doc.text.find(original)
        status = "moved" if moved >= 0 else "changed"
        if moved >= 0:
            start, end = moved, moved + len(original)
    return Resolved(query, loc, record, source_path, status, start, end, redirected_from, doc.text)
