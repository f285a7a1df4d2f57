"""What ``validate`` reports: the problem codes with their meaning and fix, one ``Problem``, the ``Report``."""

from __future__ import annotations

from collections import Counter as Tally
from dataclasses import dataclass, field
from typing import Any

from pipeline.run.state import STATE_DIR, STATE_FILE

#: Where a finding about the state database points: the file, and its redirect map.
STATE_DB_FILE = f"{STATE_DIR}/{STATE_FILE}"
STATE_REDIRECTS = f"{STATE_DIR}/{STATE_FILE}:redirects"

_INGEST_FULL = "run `chunkyard ingest --full` to rewrite the chunks from the source"
#: Return code → (what it means, the next step). ``ok`` is the only passing code.
CODES: dict[str, tuple[str, str]] = {
    "ok": ("every check passed", "nothing to do"),
    "schema_invalid": ("the file does not match schemas/chunk.schema.json", _INGEST_FULL),
    "bad_json": ("the chunk file is not a readable JSON object", _INGEST_FULL),
    "duplicate_id": ("two chunk files carry the same id", "delete the stray copy, then " + _INGEST_FULL),
    "duplicate_chunk_id": (
        "two chunk files carry the same chunk_id",
        "give colliding documents distinct doc_id front matter; delete stray copies; " + _INGEST_FULL,
    ),
    "uid_collision": (
        "two documents share doc_uid|r=, so their chunk_ids can collide",
        "give each document a unique doc_id in its front matter, then run `chunkyard ingest`",
    ),
    "bad_order": (
        "sorting the section's chunk_ids does not give its reading order",
        "b= must grow with reading order (zero-padded): " + _INGEST_FULL + "; report it if it persists",
    ),
    "bad_chunk_id": ("chunk_id disagrees with section_id", _INGEST_FULL),
    "bad_offsets": (
        (
            "charOffsets are impossible: start ≥ end, past the end of the source, in the front matter, "
            "or totalChars ≠ end − start"
        ),
        _INGEST_FULL,
    ),
    "text_mismatch": (
        "originalText is not the canonical source slice at charOffsets",
        "if the source changed, run `chunkyard ingest`; if the chunk file was edited, " + _INGEST_FULL,
    ),
    "bad_line_span": ("lineSpan does not hold the characters at charOffsets", _INGEST_FULL),
    "bad_blocks": ("a blocks[] span is empty, lies outside the chunk, or is out of order", _INGEST_FULL),
    "broken_chain": (
        "id, parentId, chunkNumber, prevId/nextId or the file name break the chain ch0 … chN",
        _INGEST_FULL,
    ),
    "hash_mismatch": ("hash is not blake3 of originalText", _INGEST_FULL),
    "rev_mismatch": (
        "rev is not the revision of the current source (001's revision lock fails)",
        "run `chunkyard ingest` to re-chunk the edited source",
    ),
    "manifest_mismatch": (
        "the manifest and the chunk file disagree (ids, chunk_ids, hashes, source, policy)",
        _INGEST_FULL,
    ),
    "mixed_policy": (
        "documents chunked under different policies share one output",
        "run `chunkyard ingest --full` with one policy",
    ),
    "stale_file": (
        "a chunk file the manifest does not list: a loader globbing CHUNKS/**/*.json still loads it",
        "run `chunkyard ingest` (it sweeps orphans), or delete the file",
    ),
    "missing_file": ("the manifest lists a chunk file that is not there", _INGEST_FULL),
    "source_missing": (
        "the manifest lists a document whose source is gone",
        "restore the source, or run `chunkyard ingest` to remove its chunks",
    ),
    "source_unreadable": (
        "the source can no longer be read, decoded or chunked",
        "fix the file (UTF-8, readable), then run `chunkyard ingest`",
    ),
    "source_changed": (
        "the source changed after it was chunked: the chunks describe an older text",
        "run `chunkyard ingest`",
    ),
    "uncovered_text": (
        "non-blank source text lies in no chunk (docs/spec.md, Splitting: nothing is lost)",
        "run `chunkyard ingest --full`; if it persists, report a chunkyard bug with the source file",
    ),
    "unstable_id": (
        "re-chunking the unchanged source gives another chunk_id or file set",
        (
            "ids must be deterministic: if the pipeline version changed run `chunkyard ingest --full`, "
            "else report a chunkyard bug"
        ),
    ),
    "stale_content": (
        "re-chunking the unchanged source gives a different record (volatile fields aside)",
        _INGEST_FULL,
    ),
    "bad_redirects": ("the redirect map cannot be read", "run `chunkyard ingest --full`"),
    "dangling_redirect": (
        "a redirect points to a chunk_id no chunk has",
        "run `chunkyard ingest` (it rewrites the redirect map)",
    ),
    "redirect_chain": (
        "a redirect points to an id that is itself redirected (chains must be collapsed)",
        "run `chunkyard ingest` (it rewrites the redirect map)",
    ),
    "interrupted_run": (
        "an ingest is running now, or one died mid-run: the manifest may lag the files (a warning)",
        "wait for the running ingest, or run `chunkyard ingest` to finish the repair",
    ),
    "not_ingested": (
        "a source document has no chunks: never ingested, failed, or excluded (a warning)",
        "run `chunkyard ingest` and read its failures; ignore it if the file is excluded on purpose",
    ),
}
WARNINGS = frozenset({"not_ingested", "interrupted_run"})


@dataclass(frozen=True, slots=True)
class Problem:
    """One finding: its code, where (chunk file and/or source) and which field, and the fix."""

    code: str
    file: str  #: output-relative chunk file (or state file); "" for a document-level finding
    field: str
    message: str
    source: str = ""  #: corpus-relative source path, when one is concerned

    @property
    def severity(self) -> str:
        return "warning" if self.code in WARNINGS else "error"

    @property
    def fix(self) -> str:
        return CODES[self.code][1]

    def as_dict(self) -> dict[str, str]:
        return {
            "code": self.code,
            "severity": self.severity,
            "file": self.file,
            "source": self.source,
            "field": self.field,
            "message": self.message,
            "fix": self.fix,
        }


@dataclass(slots=True)
class Report:
    """What ``validate`` found over one output folder."""

    out: str
    corpus: str
    documents: int = 0
    files: int = 0
    reingest: bool = False
    seconds: float = 0.0
    problems: list[Problem] = field(default_factory=list)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def code(self) -> str:
        """001-style single return code: ``ok``, else the most frequent error's code."""
        errors = Tally(p.code for p in self.errors)
        return errors.most_common(1)[0][0] if errors else "ok"

    def counts(self) -> dict[str, int]:
        """Problems per code, most frequent first."""
        return dict(Tally(p.code for p in self.problems).most_common())

    def as_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "ok": self.ok,
            "out": self.out,
            "corpus": self.corpus,
            "documents": self.documents,
            "files": self.files,
            "reingest": self.reingest,
            "seconds": round(self.seconds, 3),
            "counts": self.counts(),
            "problems": [p.as_dict() for p in self.problems],
        }
