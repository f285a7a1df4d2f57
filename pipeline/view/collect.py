"""What a report shows, read from a chunk folder: per document its text and chunks, and the corpus stats.

Everything here is plain data (lists, dicts, numbers, strings) ready to be dumped as
JSON into the page (``page.py``); nothing is HTML yet. Offsets are the chunk files' own
``charOffsets``, into the canonical text that ``normalize`` gives for the current source,
so a band drawn at ``[charStart, charEnd)`` shows exactly the text the chunk holds — a
document whose source moved on since the ingest is flagged ``stale``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.audit.chunk_state import ChunkStore
from pipeline.chunkfolder import ChunkRecord
from pipeline.errors import PipelineError
from pipeline.models import ATOMIC_KINDS
from pipeline.run.discover import discover
from pipeline.stages.normalize import normalize, read_source

EMBED_PREFIX = 240  #: characters of ``embedText`` shown per chunk
TOP = 12  #: rows in the largest / smallest / over-budget tables
ATOMIC_TYPES = frozenset(ATOMIC_KINDS | {"table"})

#: One chunk as the page gets it (a list, not an object: 42k chunks stay small).
#: [start, end, tokens, id, chunk_id, block_type, section_id, breadcrumb, embed prefix,
#:  [[block type, start, end], ...], lineStart, lineEnd, file]
ChunkRow = list[Any]


@dataclass(slots=True)
class DocView:
    """One document of the report."""

    rel_path: str
    text: str = ""
    chunks: list[ChunkRow] = field(default_factory=list)
    outline: list[list[Any]] = field(default_factory=list)  #: [section_id, depth, title, start]
    error: str = ""  #: why the document has no view (unreadable source, failed ingest)
    stale: int = 0  #: chunks whose originalText no longer matches the source

    def as_json(self) -> dict[str, Any]:
        return {
            "path": self.rel_path,
            "text": self.text,
            "chunks": self.chunks,
            "outline": self.outline,
            "error": self.error,
            "stale": self.stale,
        }


@dataclass(slots=True)
class Report:
    """A whole report: the documents and the overview computed over them."""

    docs: list[DocView]
    overview: dict[str, Any]


def chunk_row(record: ChunkRecord, file: str) -> ChunkRow:
    """The page's row for one chunk record."""
    offsets = record.get("charOffsets") or {}
    lines = record.get("lineSpan") or {}
    blocks = [
        [str(b.get("type", "")), int(b.get("charStart", 0)), int(b.get("charEnd", 0))]
        for b in record.get("blocks") or ()
        if isinstance(b, dict)
    ]
    return [
        int(offsets.get("charStart", 0)),
        int(offsets.get("charEnd", 0)),
        int((record.get("tokenStats") or {}).get("tokens", 0)),
        str(record.get("id", "")),
        str(record.get("chunk_id", "")),
        str(record.get("block_type", "")),
        str(record.get("section_id", "")),
        str(record.get("headerBreadcrumb", "")),
        str(record.get("embedText", ""))[:EMBED_PREFIX],
        blocks,
        int(lines.get("lineStart", 0)),
        int(lines.get("lineEnd", 0)),
        file,
    ]


def outline_of(records: list[ChunkRecord]) -> list[list[Any]]:
    """Section headings in reading order: [section_id, depth, title, char offset of the heading]."""
    out: list[list[Any]] = []
    seen: set[str] = set()
    for rec in records:
        sid = str(rec.get("section_id", ""))
        if sid in seen or sid == "0":
            continue
        seen.add(sid)
        path = rec.get("headerPath") or []
        depths = rec.get("headerDepths") or []
        start = int((rec.get("charOffsets") or {}).get("charStart", 0))
        for b in rec.get("blocks") or ():
            if isinstance(b, dict) and b.get("type") == "heading":
                start = int(b.get("charStart", start))
                break
        title = str(path[-1]) if path else sid
        out.append([sid, int(depths[-1]) if depths else sid.count(".") + 1, title, start])
    return out


def read_doc(store: ChunkStore, rel_path: str, entry: dict[str, Any]) -> DocView:
    """One document: its canonical source text and its chunk records, in manifest order."""
    view = DocView(rel_path)
    try:
        view.text = normalize(read_source(store.corpus / rel_path, rel_path), rel_path).text
    except PipelineError as exc:
        view.error = f"source unreadable now: {exc}"
    records: list[ChunkRecord] = []
    for file in entry.get("files") or ():
        try:
            rec = store.read_record(file)
        except PipelineError as exc:
            view.error = str(exc)
            continue
        records.append(rec)
        view.chunks.append(chunk_row(rec, file))
        s, e = view.chunks[-1][0], view.chunks[-1][1]
        if view.text and view.text[s:e] != rec.get("originalText"):
            view.stale += 1
    view.outline = outline_of(records)
    return view


def _failures(store: ChunkStore, known: set[str]) -> list[list[str]]:
    """Corpus documents without a manifest entry, each with the reason the source gives now."""
    if not store.corpus.is_dir():
        return []
    try:
        found, problems = discover(store.corpus, store.out)
    except (OSError, PipelineError):
        return []
    out = [[p.split(": ", 1)[0], p] for p in problems]
    for f in found:
        if f.rel_path in known:
            continue
        try:
            normalize(read_source(Path(f.path), f.rel_path), f.rel_path)
            reason = "no chunks in the manifest: the last ingest failed or has not seen it"
        except PipelineError as exc:
            reason = str(exc)
        out.append([f.rel_path, reason])
    return out


def histogram(tokens: list[int], target: int, per_target: int = 10) -> dict[str, Any]:
    """Token counts in bins of a tenth of the target up to twice the target, and one bin above.

    Bin ``k`` holds ``k * target / 10 < tokens <= (k + 1) * target / 10`` (bin 0 also holds
    0): the target is always a bin edge, so the bins past it are exactly the chunks over
    the budget.
    """
    target = max(target, 1)
    top = 2 * per_target
    counts = [0] * (top + 1)
    for t in tokens:
        counts[min(max(-(-t * per_target // target) - 1, 0), top)] += 1
    edges = [k * target // per_target for k in range(top + 1)]
    return {"edges": edges, "counts": counts, "target": target, "target_bin": per_target}


def overview(docs: list[DocView], policy: dict[str, Any], failures: list[list[str]]) -> dict[str, Any]:
    """The corpus overview: counts, histogram, block types, extremes, over-budget atomic blocks."""
    target = int(policy.get("target_tokens") or 256)
    rows: list[tuple[int, int, int]] = []  # (tokens, doc index, chunk index)
    chunk_types: Counter[str] = Counter()
    block_types: Counter[str] = Counter()
    over: list[list[Any]] = []
    for d, doc in enumerate(docs):
        for c, ch in enumerate(doc.chunks):
            rows.append((ch[2], d, c))
            chunk_types[ch[5]] += 1
            kinds = [b[0] for b in ch[9]]
            block_types.update(kinds)
            if ch[2] > target:
                atomic = sorted({k for k in kinds if k in ATOMIC_TYPES})
                over.append([ch[2], d, c, ch[3], ",".join(atomic) or ch[5]])
    rows.sort()
    over.sort(key=lambda r: (-r[0], r[1], r[2]))

    def pick(sel: list[tuple[int, int, int]]) -> list[list[Any]]:
        return [[t, d, c, docs[d].chunks[c][3]] for t, d, c in sel]

    return {
        "documents": len(docs),
        "chunks": len(rows),
        "tokens": sum(r[0] for r in rows),
        "policy": policy,
        "histogram": histogram([r[0] for r in rows], target),
        "chunk_types": chunk_types.most_common(),
        "block_types": block_types.most_common(),
        "largest": pick(rows[-TOP:][::-1]),
        "smallest": pick(rows[:TOP]),
        "over_budget": over[:200],
        "over_budget_total": len(over),
        "failures": failures,
        "table": [
            [doc.rel_path, len(doc.chunks), sum(ch[2] for ch in doc.chunks), doc.stale, doc.error]
            for doc in docs
        ],
    }


def collect(store: ChunkStore, only: list[str] | None = None) -> Report:
    """The report over every document of the store (or the manifest keys in ``only``)."""
    entries = store.docs
    names = sorted(entries) if only is None else only
    docs = [read_doc(store, rel, entries.get(rel) or {}) for rel in names]
    failures = _failures(store, set(entries)) if only is None else []
    return Report(docs, overview(docs, dict(store.manifest.get("policy") or {}), failures))
