"""Audit: ``check-citations`` — 001's validator for a RAG answer's citation block (docs/spec.md, "Audit").

The answer is first checked against ``schemas/answer.schema.json`` (``answer.py``), then
every citation against the chunk it names: the section, the source, the offsets, the
analyzer and the revision lock; ``index_hash`` against the live index when the caller
passes its hash (``chunkyard check-citations`` reads it from the index, when there is
one). ``embed_model`` and the scores are the loader's to check.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from pipeline.audit.answer import CitationReport, Finding, path_key, schema_findings
from pipeline.audit.chunk_state import ChunkStore
from pipeline.audit.resolve import suggest
from pipeline.chunkfolder import ChunkRecord
from pipeline.errors import PipelineError


def check_answer(
    answer: Any,
    store: ChunkStore,
    *,
    allow_cross_section: bool = False,
    name: str = "answer",
    live_index_hash: str | None = None,
) -> CitationReport:
    """001's validator: the schema first, then each citation against the chunk it names.

    ``live_index_hash``: the live index's ``index_hash`` (the caller reads it from the
    index; rule 6): a citation that carries another one fails ``mismatch_index_hash``.
    """
    report = CitationReport(name)
    if isinstance(answer, list):  # a bare citation block
        answer = {"citations": answer}
    report.problems.extend(schema_findings(answer))
    if not isinstance(answer, dict):
        return report
    segments: list[tuple[str, Any]] = []
    if "citations" in answer:
        segments.append(("", answer))
    for k, seg in enumerate(answer.get("segments") or []):
        segments.append((f"segments[{k}].", seg))
    report.segments = len(segments)
    whitelist = allow_cross_section or answer.get("allow_cross_section") is True
    records: dict[str, ChunkRecord | None] = {}
    for prefix, seg in segments:
        cits = seg.get("citations") if isinstance(seg, dict) else None
        if not isinstance(cits, list):
            continue
        report.citations += len(cits)
        fenced = not (whitelist or (isinstance(seg, dict) and seg.get("allow_cross_section") is True))
        first_section: tuple[str, str] | None = None
        for i, cit in enumerate(cits):
            if not isinstance(cit, dict):
                continue
            where = f"{prefix}citations[{i}]"
            rec = _lookup(cit, store, records, where, report)
            span = _passage_span(cit, rec, store, records, where, report)
            _check_fields(cit, rec, where, report, span)
            got = cit.get("index_hash")
            if live_index_hash is not None and isinstance(got, str) and got != live_index_hash:
                report.problems.append(
                    Finding(
                        "mismatch_index_hash",
                        where,
                        "index_hash",
                        f"is {got!r}, the live index's is {live_index_hash!r}",
                    )
                )
            section = _section_key(rec)
            if section is None or not fenced:
                continue
            if first_section is None:
                first_section = section
            elif section != first_section:
                report.problems.append(
                    Finding(
                        "cross_section_reuse",
                        where,
                        "section_id",
                        f"section {section[1]} of {section[0]}, but this segment cites "
                        f"section {first_section[1]} of {first_section[0]} first",
                    )
                )
    report.problems.sort(key=lambda p: path_key(p.where))  # stable: each citation's findings in order
    return report


def _lookup(
    cit: dict[str, Any],
    store: ChunkStore,
    records: dict[str, ChunkRecord | None],
    where: str,
    report: CitationReport,
) -> ChunkRecord | None:
    """The chunk record a citation names, or None (with a finding) when there is none."""
    snippet = cit.get("snippet_id")
    if not isinstance(snippet, str) or not snippet:
        return None
    if snippet not in records:
        loc = store.index("chunk_id").get(snippet)
        try:
            records[snippet] = store.read_record(loc.file) if loc else None
        except PipelineError as exc:
            records[snippet] = None
            report.problems.append(Finding("unreadable_chunk", where, "snippet_id", str(exc)))
            return None
        if loc is None:
            _unknown(snippet, store, where, report)
    return records[snippet]


def _unknown(snippet: str, store: ChunkStore, where: str, report: CitationReport) -> None:
    if snippet in store.redirects:
        target = store.redirects[snippet]
        report.problems.append(
            Finding("redirected_snippet", where, "snippet_id", f"{snippet!r} now lives at {target!r}")
        )
        return
    by_id = store.index("id").get(snippet)
    if by_id is not None:
        chunk_id = (store.docs[by_id.rel_path].get("chunk_ids") or [])[by_id.index]
        message = f"{snippet!r} is a chunk's id; its snippet_id is the chunk_id {chunk_id!r}"
    else:
        near = suggest(store, snippet)
        message = f"no chunk has {snippet!r}" + (f"; nearest: {', '.join(near)}" if near else "")
    report.problems.append(Finding("unknown_snippet", where, "snippet_id", message))


def _passage_span(
    cit: dict[str, Any],
    rec: ChunkRecord | None,
    store: ChunkStore,
    records: dict[str, ChunkRecord | None],
    where: str,
    report: CitationReport,
) -> tuple[int, int] | None:
    """The ``[start, end)`` a passage citation may cover: the union of its ``chunk_ids``.

    ``chunkyard search`` merges a hit with ranked neighbours of its document (across
    headings; of its section with ``passage_scope="section"``) into one passage and names
    them in ``chunk_ids``. Its offsets are valid when those chunks
    are live, of the hit's document, the hit among them, and one run of the
    document's chain (in source order each one's ``nextId`` is the next one's ``id``: no
    chunk skipped; the whitespace between two chunks belongs to the passage). ``None``: not
    a passage (no ``chunk_ids``, or only the hit), or a bad one (``bad_passage`` added).
    """
    ids = cit.get("chunk_ids")
    if ids is None or rec is None:
        return None
    snippet = cit.get("snippet_id")
    if not isinstance(ids, list) or not ids or not all(isinstance(c, str) and c for c in ids):
        report.problems.append(Finding("bad_passage", where, "chunk_ids", "is not a list of chunk ids"))
        return None
    if snippet not in ids:
        report.problems.append(Finding("bad_passage", where, "chunk_ids", f"does not list {snippet!r}"))
        return None
    members: list[ChunkRecord] = []
    for chunk_id in dict.fromkeys(ids):
        member = (
            rec if chunk_id == snippet else _lookup({"snippet_id": chunk_id}, store, records, where, report)
        )
        if member is None:
            return None  # its own finding (unknown or redirected snippet) says why
        if member["doc_id"] != rec["doc_id"]:
            report.problems.append(
                Finding(
                    "bad_passage",
                    where,
                    "chunk_ids",
                    f"{chunk_id!r} is in document {member['doc_id']}, not the cited chunk's {rec['doc_id']}",
                )
            )
            return None
        members.append(member)
    members.sort(key=lambda m: (m["charOffsets"]["charStart"], m["charOffsets"]["charEnd"]))
    for before, after in pairwise(members):
        if before.get("nextId") != after["id"]:
            report.problems.append(
                Finding(
                    "bad_passage",
                    where,
                    "chunk_ids",
                    f"not one run: the chunk after {before['chunk_id']!r} is not {after['chunk_id']!r}",
                )
            )
            return None
    if len(members) == 1:
        return None
    return members[0]["charOffsets"]["charStart"], max(m["charOffsets"]["charEnd"] for m in members)


def _check_fields(
    cit: dict[str, Any],
    rec: ChunkRecord | None,
    where: str,
    report: CitationReport,
    passage: tuple[int, int] | None = None,
) -> None:
    """Offsets on their own, then every verifiable field against the chunk (against the
    passage's span when the citation is a passage: ``_passage_span``)."""
    add = report.problems.append
    offsets = cit.get("offsets")
    start = end = None
    if (
        isinstance(offsets, dict)
        and isinstance(offsets.get("start"), int)
        and isinstance(offsets.get("end"), int)
    ):
        start, end = offsets["start"], offsets["end"]
        if start >= end:
            add(Finding("bad_offsets", where, "offsets", f"start {start} ≥ end {end}"))
            start = end = None
    if rec is None:
        return
    cs, ce = passage or (rec["charOffsets"]["charStart"], rec["charOffsets"]["charEnd"])
    if start is not None and end is not None and not (cs <= start and end <= ce):
        what = "passage's" if passage else "chunk's"
        add(
            Finding(
                "bad_offsets", where, "offsets", f"[{start}, {end}) is not inside the {what} [{cs}, {ce})"
            )
        )
    checks = (
        ("section_id", "section_mismatch", rec["section_id"]),
        ("doc_id", "doc_mismatch", rec["doc_id"]),
        ("source_url", "source_mismatch", rec["source_url"]),
        ("analyzer", "analyzer_mismatch", rec["metadata"]["analyzer"]),
        ("rev", "rev_mismatch", rec["rev"]),
    )
    for name, code, want in checks:
        got = cit.get(name)
        if isinstance(got, str) and got != want:
            add(Finding(code, where, name, f"is {got!r}, the chunk's is {want!r}"))
    tokens = cit.get("tokens")
    whole = passage is None and (start, end) == (cs, ce)
    if isinstance(tokens, int) and whole and tokens != rec["tokenStats"]["tokens"]:
        add(
            Finding(
                "tokens_mismatch",
                where,
                "tokens",
                f"is {tokens}, the chunk counts {rec['tokenStats']['tokens']} ({rec['tokenStats']['tokenizer']})",
            )
        )


def _section_key(rec: ChunkRecord | None) -> tuple[str, str] | None:
    """The section a cited chunk lies in: (document, section path), as paths repeat across documents.

    A citation whose chunk is unknown is fenced by nothing: its own finding says enough.
    """
    return (rec["doc_id"], rec["section_id"]) if rec is not None else None
