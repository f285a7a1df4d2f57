"""``validate``'s checks of one document: its source, files, schema, text, offsets, chain and order.

``check_document`` is a pure function of the files it reads, so ``validate`` maps it over a
process pool; what spans documents (unique ids, stale files, redirects) is checked there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import xxhash
from blake3 import blake3

from pipeline.audit.chunk_state import doc_name_of
from pipeline.audit.problems import STATE_DB_FILE, Problem
from pipeline.errors import PipelineError
from pipeline.models import Policy, SourceDoc
from pipeline.run.emit import fast_validator, schema_errors, stable_view
from pipeline.stages.mint import chunk_file, text_rev
from pipeline.stages.normalize import normalize
from pipeline.stages.parse import Lines


@dataclass(frozen=True, slots=True)
class DocTask:
    """One document to check; plain data, so it crosses process boundaries cheaply."""

    out: str
    corpus: str
    rel_path: str
    entry: dict[str, Any]
    policy_hash: str
    policy: dict[str, Any] | None = None  #: set to re-chunk the source (``--reingest``)


@dataclass(slots=True)
class DocOutcome:
    """The problems of one document, and its (file, id, chunk_id) keys for the global checks."""

    problems: list[Problem] = field(default_factory=list)
    keys: list[tuple[str, str, str]] = field(default_factory=list)


def check_document(task: DocTask) -> DocOutcome:
    """Every per-document check: source, files, schema, text, offsets, chain, order, manifest."""
    return _DocCheck(task).run()


class _DocCheck:
    """The checks of one document, sharing its source text and records."""

    def __init__(self, task: DocTask) -> None:
        self.task = task
        self.rel = task.rel_path
        self.entry = task.entry
        self.name = doc_name_of(task.rel_path)
        self.files: list[str] = list(task.entry.get("files") or [])
        self.outcome = DocOutcome()
        self.raw: bytes | None = None
        self.doc: SourceDoc | None = None
        self.lines: Lines | None = None
        self.rev = ""
        self.records: list[dict[str, Any] | None] = []

    def add(self, code: str, file: str, fld: str, message: str) -> None:
        self.outcome.problems.append(Problem(code, file, fld, message, self.rel))

    def run(self) -> DocOutcome:
        self.check_entry()
        changed = self.load_source()
        for i, f in enumerate(self.files):
            self.records.append(self.check_file(i, f))
        self.check_order()
        if self.doc is not None and not changed and all(r is not None for r in self.records):
            self.check_coverage(self.doc)
        if self.task.policy is not None and self.raw is not None and not changed:
            self.check_reingest(self.raw, self.task.policy)
        return self.outcome

    def check_entry(self) -> None:
        for key in ("ids", "chunk_ids", "hashes"):
            listed = self.entry.get(key) or []
            if len(listed) != len(self.files):
                self.add(
                    "manifest_mismatch",
                    STATE_DB_FILE,
                    f"docs.{self.rel}.{key}",
                    f"{key} has {len(listed)} entries for {len(self.files)} files",
                )
        if self.entry.get("policy_hash") != self.task.policy_hash:
            self.add(
                "mixed_policy",
                STATE_DB_FILE,
                f"docs.{self.rel}.policy_hash",
                f"chunked with policy {self.entry.get('policy_hash')}, the manifest's is {self.task.policy_hash}",
            )

    def load_source(self) -> bool:
        """Read and normalize the source; True when it changed since it was chunked."""
        path = Path(self.task.corpus) / self.rel
        try:
            raw = path.read_bytes()  # no size limit: that was ingest's business
        except OSError as exc:
            if not os.path.lexists(path):
                self.add("source_missing", "", "metadata.sourceFile", f"{path} does not exist")
            else:
                self.add("source_unreadable", "", "metadata.sourceFile", f"{path}: {exc.strerror or exc}")
            return False
        changed = xxhash.xxh3_64_hexdigest(raw) != self.entry.get("source_hash")
        if changed:
            self.add(
                "source_changed",
                "",
                "metadata.sourceFile",
                "the source's content hash differs from the manifest's",
            )
        try:
            self.doc = normalize(raw, self.rel)
        except PipelineError as exc:
            self.add("source_unreadable", "", "metadata.sourceFile", str(exc))
            return changed
        self.raw = raw
        self.lines = Lines(self.doc.text)
        self.rev = text_rev(self.doc.text)
        return changed

    def check_file(self, i: int, f: str) -> dict[str, Any] | None:
        """Load one listed file and check it; its record, or None when it cannot be trusted."""
        try:
            with open(os.path.join(self.task.out, f), "rb") as fh:  # no pathlib: 42k files
                rec = orjson.loads(fh.read())
        except FileNotFoundError:
            self.add("missing_file", f, "(file)", f"chunk {i} of {self.rel} is listed but absent")
            return None
        except (OSError, orjson.JSONDecodeError) as exc:
            self.add("bad_json", f, "(file)", str(exc))
            return None
        if not isinstance(rec, dict):
            self.add("bad_json", f, "(file)", f"a JSON {type(rec).__name__}, not an object")
            return None
        ident, chunk_id = rec.get("id"), rec.get("chunk_id")
        if isinstance(ident, str) and isinstance(chunk_id, str):
            self.outcome.keys.append((f, ident, chunk_id))
        if not fast_validator().is_valid(rec):
            for where, message in schema_errors(rec):
                self.add("schema_invalid", f, where, message)
            return None
        self.check_chain(i, f, rec)
        self.check_fields(i, f, rec)
        self.check_text(f, rec)
        return rec

    def check_chain(self, i: int, f: str, rec: dict[str, Any]) -> None:
        """Contiguous numbering and whole prev/next links: ch0 … chN, nothing missing."""
        name, last = self.name, len(self.files) - 1
        want: dict[str, Any] = {
            "chunkNumber": i,
            "id": f"doc:{name}::ch{i}",
            "parentId": f"doc:{name}",
            "prevId": f"doc:{name}::ch{i - 1}" if i else None,
            "nextId": f"doc:{name}::ch{i + 1}" if i < last else None,
        }
        for key, value in want.items():
            if rec[key] != value:
                self.add(
                    "broken_chain", f, key, f"is {rec[key]!r}, expected {value!r} (chunk {i} of 0…{last})"
                )
        if f != chunk_file(name, i):
            self.add("broken_chain", f, "(file)", f"chunk {i} of {self.rel} should be {chunk_file(name, i)}")

    def check_fields(self, i: int, f: str, rec: dict[str, Any]) -> None:
        """The file against the manifest, its chunk_id against section_id, its hash against its text."""
        entry = self.entry
        for fld, key in (("id", "ids"), ("chunk_id", "chunk_ids"), ("hash", "hashes")):
            listed = entry.get(key) or []
            if i < len(listed) and listed[i] != rec[fld]:
                self.add("manifest_mismatch", f, fld, f"is {rec[fld]!r}, the manifest says {listed[i]!r}")
        meta = rec["metadata"]
        if meta["sourceFile"] != self.rel:
            self.add(
                "manifest_mismatch",
                f,
                "metadata.sourceFile",
                f"is {meta['sourceFile']!r}, the manifest files it under {self.rel!r}",
            )
        if meta["policyHash"] != entry.get("policy_hash"):
            self.add(
                "manifest_mismatch",
                f,
                "metadata.policyHash",
                f"is {meta['policyHash']}, the manifest says {entry.get('policy_hash')}",
            )
        uid_rev = entry.get("uid_rev")
        if uid_rev and rec["chunk_id"].split("|s=", 1)[0] != uid_rev:
            self.add(
                "manifest_mismatch",
                f,
                "chunk_id",
                f"{rec['chunk_id']!r} does not start with the document's {uid_rev!r}",
            )
        sect = rec["chunk_id"].split("|s=", 1)[1].split("|", 1)[0]
        if sect != rec["section_id"]:
            self.add("bad_chunk_id", f, "section_id", f"is {rec['section_id']!r}, the chunk_id says s={sect}")
        digest = "blake3:" + blake3(rec["originalText"].encode("utf-8")).hexdigest()
        if rec["hash"] != digest:
            self.add(
                "hash_mismatch", f, "hash", f"is {rec['hash'][:23]}…, originalText hashes to {digest[:23]}…"
            )

    def check_text(self, f: str, rec: dict[str, Any]) -> None:
        """Offsets, the verbatim slice, the line span, block provenance and ``rev`` against the source."""
        offs = rec["charOffsets"]
        start, end = offs["charStart"], offs["charEnd"]
        if offs["totalChars"] != end - start:
            self.add(
                "bad_offsets",
                f,
                "charOffsets.totalChars",
                f"is {offs['totalChars']}, charEnd − charStart is {end - start}",
            )
        if start >= end:
            self.add("bad_offsets", f, "charOffsets", f"charStart {start} ≥ charEnd {end}")
            return
        if self.doc is None or self.lines is None:
            return
        text = self.doc.text
        if rec["rev"] != self.rev:
            self.add("rev_mismatch", f, "rev", f"is {rec['rev']}, the current source's is {self.rev}")
        if end > len(text):
            self.add("bad_offsets", f, "charOffsets.charEnd", f"{end} is past the source's end ({len(text)})")
            return
        if start < self.doc.body_start:
            self.add(
                "bad_offsets",
                f,
                "charOffsets.charStart",
                f"{start} lies in the front matter (the body starts at {self.doc.body_start})",
            )
        if rec["originalText"] != text[start:end]:
            self.add(
                "text_mismatch", f, "originalText", _first_difference(rec["originalText"], text[start:end])
            )
            return
        span = rec["lineSpan"]
        lines = (self.lines.line_of(start), self.lines.line_of(end - 1))
        if (span["lineStart"], span["lineEnd"]) != lines:
            self.add(
                "bad_line_span",
                f,
                "lineSpan",
                f"is {span['lineStart']}-{span['lineEnd']}, charOffsets cover lines {lines[0]}-{lines[1]}",
            )
        cursor = start
        for n, b in enumerate(rec["blocks"]):
            if not (cursor <= b["charStart"] < b["charEnd"] <= end):
                self.add(
                    "bad_blocks",
                    f,
                    f"blocks.{n}",
                    f"[{b['charStart']}, {b['charEnd']}) is not inside [{cursor}, {end}) in order",
                )
                break
            cursor = b["charStart"]

    def check_order(self) -> None:
        """Within each section, sorting by chunk_id must give reading order (000)."""
        sections: dict[str, list[tuple[str, str]]] = {}
        for f, rec in zip(self.files, self.records, strict=False):
            if rec is not None:
                sections.setdefault(rec["section_id"], []).append((rec["chunk_id"], f))
        for sect, seq in sections.items():
            ids = [c for c, _ in seq]
            ordered = sorted(ids)
            if ids == ordered:
                continue
            k = next(n for n, (a, b) in enumerate(zip(ids, ordered, strict=True)) if a != b)
            self.add(
                "bad_order",
                seq[k][1],
                "chunk_id",
                f"section {sect}: {ids[k]!r} comes {k + 1}. in reading order, {ordered[k]!r} sorts there",
            )

    def check_coverage(self, doc: SourceDoc) -> None:
        """Every non-blank character of the body lies in some chunk (docs/spec.md, Splitting)."""
        text, cursor = doc.text, doc.body_start
        spans = sorted(
            (r["charOffsets"]["charStart"], r["charOffsets"]["charEnd"]) for r in self.records if r
        )
        for start, end in [*spans, (len(text), len(text))]:
            if start > cursor and text[cursor:start].strip():
                line = self.lines.line_of(cursor) if self.lines else 0
                self.add(
                    "uncovered_text",
                    "",
                    "charOffsets",
                    f"chars [{cursor}, {start}) from line {line} are in no chunk: "
                    f"{text[cursor:start].strip()[:60]!r}",
                )
            cursor = max(cursor, end)

    def check_reingest(self, raw: bytes, policy: dict[str, Any]) -> None:
        """Re-chunk the unchanged source in memory: the same files, chunk_ids and records (000)."""
        from pipeline.runner import chunk_document  # the splitter and tokenizer, only for --reingest

        try:
            _, chunks = chunk_document(
                raw, self.rel, Policy(**policy), rev_width=int(self.entry.get("rev_width", 8))
            )
        except (PipelineError, RecursionError) as exc:
            self.add("source_unreadable", "", "metadata.sourceFile", f"re-chunking failed: {exc}")
            return
        fresh = [c.rel_file for c in chunks]
        if fresh != self.files:
            self.add(
                "unstable_id",
                "",
                "files",
                f"re-chunking gives {len(fresh)} files, the manifest lists {len(self.files)}",
            )
        for chunk, f, rec in zip(chunks, self.files, self.records, strict=False):
            if rec is None:
                continue
            new = chunk.record
            if new["chunk_id"] != rec["chunk_id"]:
                self.add(
                    "unstable_id",
                    f,
                    "chunk_id",
                    f"is {rec['chunk_id']!r}, re-chunking gives {new['chunk_id']!r}",
                )
                continue
            old_view, new_view = stable_view(rec), stable_view(new)
            if old_view != new_view:
                diff = next((k for k in new_view if old_view.get(k) != new_view[k]), "(record)")
                self.add("stale_content", f, diff, "differs from a fresh chunking of the same source")


def _first_difference(got: str, want: str) -> str:
    """Where two texts part, shown briefly."""
    n = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
    return (
        f"differs from the source slice at char {n}: the file has {got[n : n + 30]!r}, "
        f"the source {want[n : n + 30]!r} (lengths {len(got)} / {len(want)})"
    )
