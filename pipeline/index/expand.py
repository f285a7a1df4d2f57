"""Search-time expansion: a hit plus its neighbours in its section or document, as one citation span.

A chunk is cut to fit a budget, so the answer to a question often starts in one chunk and
ends in the next, or a hit is a heading's first paragraph while the lines that answer come
after it. Only chunkyard knows which chunks sit side by side in the same section (each
chunk's ``section_id`` and its ``prev``/``next`` links), so a search can return the hit
*with* its neighbours, read as one contiguous passage of the source: one citation
``[start, end)`` that slices the source exactly, like any chunk's.

``expand`` is pure: ranked items, a chunk lookup and a token budget in, expanded items
out. Per hit, in rank order: take the neighbour after, then the one before, alternately
(with ``ranked_only``: the better-ranked of the two first), while it is in the same document
and section (``scope="section"``, the default here) or only the same document
(``scope="document"``: a passage may run across a heading, as ``chunkyard search`` merges
ranked neighbours) and the passage stays within ``budget`` tokens; a later hit already
inside an earlier passage is dropped (it would cite the same text twice). An item keeps the hit's fields (id, scores) with the passage's ``offsets``,
``tokens`` and the ``chunk_ids`` it spans, hit first.

**A shared prompt** (``prompt``): the passages are read together, in one prompt of that many
tokens, so a passage that grows crowds the places ranked after it out of the prompt. Then only
the first passage may take the whole ``budget``; each later one grows into at most half of what
the prompt has left after the passages above it, never less than half the budget
(``shared_budget``): the best-ranked hit gets its context, and the next places still fit.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

#: Default passage size in tokens: three 256-token chunks' worth, a hit and the ranked
#: neighbours around it (chosen on the gold sets: docs/benchmarks.md).
DEFAULT_BUDGET = 768
#: How far a passage may grow: within the hit's section, or anywhere in its document.
SCOPES = ("section", "document")


def shared_budget(budget: int, prompt: int, used: int) -> int:
    """A passage's budget when the passages share a prompt of ``prompt`` tokens and those above it
    hold ``used``: half of what is left, at most ``budget``, at least half of ``budget``."""
    return max(budget // 2, min(budget, (prompt - used) // 2))


@dataclass(frozen=True, slots=True)
class ChunkSpan:
    """What expansion needs to know of one chunk."""

    chunk_id: str
    source: str
    section_id: str
    start: int
    end: int
    tokens: int
    prev_id: str | None
    """The chunk before it in the same document (``None`` for the first)."""
    next_id: str | None
    line_start: int = 0
    """``lineSpan`` (1-based, inclusive); 0 when unknown."""
    line_end: int = 0


Lookup = Callable[[str], ChunkSpan | None]


Size = Callable[[Sequence[ChunkSpan]], int]


def _sum_tokens(members: Sequence[ChunkSpan]) -> int:
    return sum(m.tokens for m in members)


def _passage(
    hit: ChunkSpan,
    lookup: Lookup,
    budget: int,
    taken: set[str],
    within: Mapping[str, int] | None,
    size: Size = _sum_tokens,
    scope: str = "section",
) -> list[ChunkSpan]:
    """The hit and its neighbours in its section (or, ``scope="document"``, its document), within
    ``budget`` tokens as ``size`` counts them (a chunk already in an earlier passage is a wall,
    and so is one outside ``within``). Without ``within``, after first then before,
    alternately; with it (chunk id → rank), the better-ranked of the two next candidates first,
    so the budget goes to the neighbours the search liked best."""
    members = [hit]
    ends = {"next": hit, "prev": hit}
    open_sides = ["next", "prev"]

    def candidate(side: str) -> ChunkSpan | None:
        link = ends[side].next_id if side == "next" else ends[side].prev_id
        chunk = lookup(link) if link else None
        if (
            chunk is None
            or chunk.chunk_id in taken
            or (within is not None and chunk.chunk_id not in within)
            or chunk.source != hit.source
            or (scope == "section" and chunk.section_id != hit.section_id)
            or size([*members, chunk]) > budget
        ):
            return None
        return chunk

    while open_sides:
        if within is not None:  # ranked neighbours only: the better-ranked side grows first
            found = {side: candidate(side) for side in open_sides}
            for side, chunk in found.items():
                if chunk is None:
                    open_sides.remove(side)
            live = [(within[c.chunk_id], side, c) for side, c in found.items() if c is not None]
            if not live:
                break
            _, side, chunk = min(live, key=lambda t: (t[0], t[1] != "next"))
            members.append(chunk)
            ends[side] = chunk
            continue
        for side in list(open_sides):
            chunk = candidate(side)
            if chunk is None:
                open_sides.remove(side)
                continue
            members.append(chunk)
            ends[side] = chunk
    return members


def expand(
    items: Sequence[Mapping[str, Any]],
    lookup: Lookup,
    budget: int = DEFAULT_BUDGET,
    *,
    id_of: Callable[[Mapping[str, Any]], str] = lambda item: str(item["chunk_id"]),
    text_of: Callable[[str, int, int], str] | None = None,
    ranked_only: bool = False,
    count: Callable[[str], int] | None = None,
    scope: str = "section",
    depth: int | None = None,
    limit: int | None = None,
    prompt: int | None = None,
) -> list[dict[str, Any]]:
    """Expand ranked ``items`` (best first) into passages of at most ``budget`` tokens each.

    ``lookup(chunk_id)`` gives a chunk's ``ChunkSpan`` (``None`` when unknown: the item is
    kept as it is). A hit larger than ``budget`` stays alone. Order is kept; an item whose
    chunk lies in an earlier passage is dropped. ``tokens`` is the sum of the members'.
    The hit's own text no longer matches the passage: ``text_of(source, start, end)`` gives
    the passage's (set as ``text``); without it, ``text`` and ``originalText`` are dropped.
    With ``ranked_only``, a passage grows only into neighbours that are among ``items``
    themselves (adjacent hits merge into one passage at the better rank; an unranked
    neighbour spends no budget); with ``depth`` too, only among the first ``depth`` items (so
    the hits ranked lower stay chunks: their ranked neighbours have passages of their own).

    With ``count`` (and ``text_of``), a passage's size is ``count`` of its own text (chunks
    overlap, so the sum of their tokens overstates it): the budget holds for ``tokens``
    exactly. Without, the size is the sum of the members' ``tokens``.

    ``scope`` (one of ``SCOPES``): ``section`` keeps a passage inside the hit's section;
    ``document`` lets it cross headings within the hit's document (still one run of the
    document's chunks, so still one span).

    ``prompt`` (tokens; ``None``: none): the passages share a prompt of that size, and each
    passage's budget is ``shared_budget(budget, prompt, tokens of the passages before it)``.
    """
    if scope not in SCOPES:
        raise ValueError(f"unknown passage scope {scope!r} (hint: one of {', '.join(SCOPES)})")
    if depth is not None and depth < 1:
        raise ValueError(f"depth must be 1 or more, got {depth}")
    if prompt is not None and prompt < 0:
        raise ValueError(f"prompt must be 0 or more tokens, got {prompt}")
    ranked = items[:depth] if depth is not None else items
    within = {id_of(item): r for r, item in enumerate(ranked)} if ranked_only else None
    size: Size = _sum_tokens
    if count is not None and text_of is not None:
        measure, read = count, text_of

        def size(members: Sequence[ChunkSpan]) -> int:
            if len(members) == 1:
                return members[0].tokens
            start, end = min(m.start for m in members), max(m.end for m in members)
            return measure(read(members[0].source, start, end))

    covered: set[str] = set()
    out: list[dict[str, Any]] = []
    used = 0  # tokens of the passages so far (a shared prompt's)
    for item in items:
        if limit is not None and len(out) >= limit:
            break
        chunk_id = id_of(item)
        if chunk_id in covered:
            continue
        hit = lookup(chunk_id)
        if hit is None:
            covered.add(chunk_id)
            out.append(dict(item))
            continue
        own = budget if prompt is None else shared_budget(budget, prompt, used)
        members = _passage(hit, lookup, own, covered, within, size, scope)
        covered.update(m.chunk_id for m in members)
        start = min(m.start for m in members)
        end = max(m.end for m in members)
        passage = {k: v for k, v in item.items() if k not in ("text", "originalText")}
        passage["offsets"] = {"start": start, "end": end, "unit": "char"}
        passage["tokens"] = size(members)
        used += passage["tokens"]
        if "lineSpan" in item and all(m.line_start for m in members):
            passage["lineSpan"] = {
                "lineStart": min(m.line_start for m in members),
                "lineEnd": max(m.line_end for m in members),
            }
        passage["chunk_ids"] = [hit.chunk_id] + [
            m.chunk_id for m in sorted(members[1:], key=lambda m: m.start)
        ]
        if text_of is not None:
            passage["text"] = text_of(hit.source, start, end)
        out.append(passage)
    return out


def chunk_spans(records: Iterable[Mapping[str, Any]]) -> dict[str, ChunkSpan]:
    """``ChunkSpan`` per ``chunk_id`` from chunk file records (docs/spec.md, chunk files): ``prevId``/``nextId``
    name a chunk's ``id``, translated here to the neighbour's ``chunk_id``."""
    rows = list(records)
    by_id = {str(r["id"]): str(r["chunk_id"]) for r in rows}
    spans = {}
    for r in rows:
        prev_id, next_id = r.get("prevId"), r.get("nextId")
        spans[str(r["chunk_id"])] = ChunkSpan(
            chunk_id=str(r["chunk_id"]),
            source=str(r["metadata"]["sourceFile"]),
            section_id=str(r["section_id"]),
            start=int(r["charOffsets"]["charStart"]),
            end=int(r["charOffsets"]["charEnd"]),
            tokens=int(r["tokenStats"]["tokens"]),
            prev_id=by_id.get(str(prev_id)) if prev_id else None,
            next_id=by_id.get(str(next_id)) if next_id else None,
            **_lines(r),
        )
    return spans


def _lines(record: Mapping[str, Any]) -> dict[str, int]:
    """A chunk record's ``lineSpan`` as ``ChunkSpan`` fields (zeros when it has none)."""
    lines = record.get("lineSpan") or {}
    return {"line_start": int(lines.get("lineStart", 0)), "line_end": int(lines.get("lineEnd", 0))}


_CHUNK_NUMBER = re.compile(r"::ch(\d+)$")
_FILE_NUMBER = re.compile(r"__ch\d+\.json$")


def read_chunk_file(path: Path) -> dict[str, Any] | None:
    """A chunk file's record (``None`` when it is gone or not JSON)."""
    try:
        rec: dict[str, Any] = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return rec


class ChunkFiles:
    """A lazy ``Lookup`` over a chunk folder: reads only the chunk files a passage touches.

    A hit is found by the chunk file the search item names (``chunk_file``, relative to the
    folder: ``remember``); a neighbour by the chunk files' naming (docs/spec.md), ``doc_<stem>__ch<N>.json``
    beside it, with ``N`` from the ``prevId``/``nextId`` it is linked by. So expanding ten
    hits reads a few dozen small files, not the folder.
    """

    def __init__(
        self,
        out: Path,
        ids: Mapping[str, str] | None = None,
        read: Callable[[Path], dict[str, Any] | None] | None = None,
    ) -> None:
        """``ids`` (a record ``id`` → its ``chunk_id``, for the chunks a search ranked): when
        given, a neighbour is resolved from it without reading its file, and a neighbour not
        in it is none (only ranked neighbours can join a passage then, and a query reads far
        fewer chunk files). ``read``: how a chunk file is read (``None`` when it cannot be;
        default: from disk each time; a long-lived searcher passes a cache)."""
        self.out = out
        self.ids = ids
        self.read = read or read_chunk_file
        self.paths: dict[str, Path] = {}
        self.spans: dict[str, ChunkSpan | None] = {}
        self._files: dict[str, str] = {}  # remembered, made a path when first looked up

    def remember(self, chunk_id: str, chunk_file: str) -> None:
        """Where ``chunk_id``'s file is (a search item's ``chunk_file``)."""
        self._files.setdefault(chunk_id, chunk_file)

    def _path(self, chunk_id: str) -> Path | None:
        path = self.paths.get(chunk_id)
        if path is None and chunk_id in self._files:
            path = self.paths[chunk_id] = self.out / self._files[chunk_id]
        return path

    def _read(self, path: Path) -> dict[str, Any] | None:
        return self.read(path)

    def _neighbour(self, path: Path, link: Any) -> str | None:
        if self.ids is not None:
            return self.ids.get(str(link)) if link else None
        found = _CHUNK_NUMBER.search(str(link or ""))
        if found is None:
            return None
        other = path.with_name(_FILE_NUMBER.sub(f"__ch{found.group(1)}.json", path.name))
        rec = self._read(other)
        if rec is None or rec.get("id") != link:
            return None
        self.paths.setdefault(str(rec["chunk_id"]), other)
        return str(rec["chunk_id"])

    def __call__(self, chunk_id: str) -> ChunkSpan | None:
        if chunk_id in self.spans:
            return self.spans[chunk_id]
        path = self._path(chunk_id)
        rec = self._read(path) if path is not None else None
        span = None
        if path is not None and rec is not None and rec.get("chunk_id") == chunk_id:
            span = ChunkSpan(
                chunk_id=chunk_id,
                source=str(rec["metadata"]["sourceFile"]),
                section_id=str(rec["section_id"]),
                start=int(rec["charOffsets"]["charStart"]),
                end=int(rec["charOffsets"]["charEnd"]),
                tokens=int(rec["tokenStats"]["tokens"]),
                prev_id=self._neighbour(path, rec.get("prevId")),
                next_id=self._neighbour(path, rec.get("nextId")),
                **_lines(rec),
            )
        self.spans[chunk_id] = span
        return span
