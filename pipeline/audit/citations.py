"""Audit: ``check-citations`` — 001's validator for a RAG answer's citation block (SPEC §8).

The answer is first checked against ``schemas/answer.schema.json`` (shape, required
fields, offsets), then every citation against the chunk it names: the section, the
source, the offsets, the analyzer and the revision lock; ``index_hash`` against the live
index when the caller passes its hash (``chunkyard check-citations`` reads it from the
index, when there is one). ``embed_model`` and the scores are the loader's to check.
"""

from __future__ import annotations

import json
from collections import Counter as Tally
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import pairwise
from pathlib import Path
from typing import Any

import jsonschema

from pipeline.audit.chunk_state import ChunkStore
from pipeline.audit.resolve import suggest
from pipeline.chunkfolder import ChunkRecord
from pipeline.errors import PipelineError, UsageError

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "schemas" / "answer.schema.json"
_PACKAGED_SCHEMA = Path(__file__).resolve().parent / "answer.schema.json"
#: 001's payload fields the chunk store verifies; a citation without one fails ``missing_<field>``.
REQUIRED = ("snippet_id", "section_id", "source_url", "offsets", "tokens", "rev", "analyzer")
#: 001's fields that describe the loader's index and read path: optional here, only type-checked.
LOADER_SIDE = ("index_hash", "embed_model", "score_raw", "score_norm", "k_pos", "k_final")

_REBUILD = "copy the field from the chunk (`chunkyard resolve SNIPPET --json`)"
#: Return code → (what it means, the next step); 001's codes plus those the chunk store adds.
CODES: dict[str, tuple[str, str]] = {
    "ok": ("every citation checks out against the chunk store", "nothing to do"),
    "invalid_json": ("the answer file is not JSON", "emit the answer as one JSON object"),
    "schema_invalid": ("the answer does not match schemas/answer.schema.json", "fix the field's type"),
    "empty_citations": ("the model skipped the citation block", "enforce cite-first in the prompt contract"),
    "bad_offsets": (
        "span math is broken: start ≥ end, a unit other than char, or outside the chunk's charOffsets",
        "cite character offsets inside the chunk: " + _REBUILD,
    ),
    "cross_section_reuse": (
        "one segment cites several sections",
        "split the segment, or whitelist it with --allow-cross-section",
    ),
    "analyzer_mismatch": ("the analyzer differs from the chunk's (read path ≠ write path)", _REBUILD),
    "rev_mismatch": (
        "revision lock: rev is not the revision that produced the chunk",
        "re-retrieve against the current index, or re-ingest so the chunk matches its source",
    ),
    "unknown_snippet": ("no chunk has this snippet_id", "cite a live chunk_id (see the suggestions)"),
    "redirected_snippet": (
        "the snippet_id is stale: the redirect map sends it to a new chunk_id",
        "cite the new chunk_id and re-check its text",
    ),
    "section_mismatch": ("section_id is not the chunk's section_id", _REBUILD),
    "doc_mismatch": ("doc_id is not the doc_uid of the chunk", _REBUILD),
    "source_mismatch": ("source_url is not the chunk's source_url", _REBUILD),
    "tokens_mismatch": ("tokens differs from the chunk's count for the whole chunk", _REBUILD),
    "bad_passage": (
        "chunk_ids does not name one run of chunks of the cited chunk's document, snippet_id among them",
        "copy the passage from `chunkyard search --json` (chunk_ids, offsets and tokens together)",
    ),
    "unreadable_chunk": ("the chunk file behind the snippet cannot be read", "run `chunkyard validate`"),
    "mismatch_index_hash": (
        "index_hash is not the live index's: the citation came from another index (model or chunks)",
        "search again against the live index (`chunkyard search ... --json`), or rebuild the index",
    ),
}
for _f in REQUIRED:
    CODES[f"missing_{_f}"] = (f"the citation has no {_f}", "enforce required fields at the chain boundary")


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem with one citation (or with the answer as a whole)."""

    code: str
    where: str  #: a JSON path: ``citations[2]``, ``segments[1].citations[0]``, or ``(answer)``
    field: str
    message: str

    @property
    def fix(self) -> str:
        return CODES[self.code][1]

    def as_dict(self) -> dict[str, str]:
        return {
            "code": self.code,
            "where": self.where,
            "field": self.field,
            "message": self.message,
            "fix": self.fix,
        }


@dataclass(slots=True)
class CitationReport:
    """What ``check-citations`` found; ``code`` is 001's single return code (the first failure)."""

    answer: str
    segments: int = 0
    citations: int = 0
    problems: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def code(self) -> str:
        return self.problems[0].code if self.problems else "ok"

    def counts(self) -> dict[str, int]:
        return dict(Tally(p.code for p in self.problems).most_common())

    def as_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "ok": self.ok,
            "answer": self.answer,
            "segments": self.segments,
            "citations": self.citations,
            "counts": self.counts(),
            "problems": [p.as_dict() for p in self.problems],
        }


@lru_cache(maxsize=1)
def answer_validator() -> jsonschema.protocols.Validator:
    """``schemas/answer.schema.json``, compiled once."""
    path = SCHEMA_PATH if SCHEMA_PATH.exists() else _PACKAGED_SCHEMA
    schema = json.loads(path.read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def load_answer(path: Path) -> tuple[Any, CitationReport | None]:
    """The parsed answer, or a failed report when it is not JSON; ``UsageError`` when there is no file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{path}: no such answer file (hint: pass the JSON the model returned)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read the answer ({exc})") from None
    try:
        return json.loads(text), None  # json keeps key order, orjson too; json names the line
    except json.JSONDecodeError as exc:
        report = CitationReport(str(path))
        report.problems.append(Finding("invalid_json", "(answer)", "(file)", f"line {exc.lineno}: {exc.msg}"))
        return None, report


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
    report.problems.extend(_schema_findings(answer))
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
    report.problems.sort(key=lambda p: _path_key(p.where))  # stable: each citation's findings in order
    return report


def _path_key(where: str) -> tuple[int, ...]:
    """Sort findings by citation position: ``segments[1].citations[2]`` → (1, 2)."""
    digits = "".join(c if c.isdigit() else " " for c in where).split()
    return tuple(int(d) for d in digits) if digits else (-1,)


def _schema_findings(answer: Any) -> list[Finding]:
    """Schema errors as 001 codes: ``empty_citations``, ``missing_<field>``, ``bad_offsets``."""
    found: list[Finding] = []
    for error in sorted(
        answer_validator().iter_errors(answer), key=lambda e: list(map(str, e.absolute_path))
    ):
        path = list(error.absolute_path)
        where, depth = _where(path), _citation_depth(path)
        rest = [str(p) for p in path[depth:]] if depth else []
        instance = error.instance if isinstance(error.instance, dict) else {}
        if (
            (error.validator == "anyOf" and not path)
            or (error.validator == "minItems" and path and path[-1] == "citations")
            or (error.validator == "required" and not depth and "citations" not in instance)
        ):
            found.append(
                Finding("empty_citations", where, "citations", "no citations: cite first, then explain")
            )
        elif error.validator == "required" and depth and depth == len(path):
            found.extend(
                Finding(f"missing_{name}", where, name, f"the citation has no {name}")
                for name in error.validator_value
                if name not in instance
            )
        elif rest and rest[0] == "offsets":
            found.append(Finding("bad_offsets", where, ".".join(rest), error.message))
        else:
            fld = ".".join(rest) if rest else ".".join(map(str, path)) or "(answer)"
            found.append(Finding("schema_invalid", where, fld, error.message[:300]))
    return found


def _citation_depth(path: list[Any]) -> int:
    """How many path steps lead to a citation object (0 when the path is not inside one)."""
    if len(path) >= 2 and path[0] == "citations" and isinstance(path[1], int):
        return 2
    if len(path) >= 4 and path[0] == "segments" and path[2] == "citations" and isinstance(path[3], int):
        return 4
    return 0


def _where(path: list[Any]) -> str:
    depth = _citation_depth(path)
    head = path[:depth] if depth else path
    out = ""
    for step in head:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else str(step))
    return out or "(answer)"


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
