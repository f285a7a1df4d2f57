"""Audit: ``validate`` — 000's validator over a whole chunk store, 001-style return codes (SPEC §8).

Every document in the manifest is checked on its own (``check_document``, a pure
function of the files it reads, mapped over a process pool); what spans
documents — unique ids, stale files, redirects — is checked once at the end.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import tempfile
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import orjson
import xxhash
from blake3 import blake3

from pipeline.audit.chunk_state import ChunkStore, doc_name_of, open_store
from pipeline.errors import PipelineError
from pipeline.models import Policy, SourceDoc
from pipeline.run.discover import discover, walk
from pipeline.run.emit import fast_validator, stable_view, validator
from pipeline.run.state import STATE_DIR, STATE_FILE
from pipeline.stages.mint import chunk_file, policy_hash, text_rev
from pipeline.stages.normalize import normalize
from pipeline.stages.parse import Lines

MANIFEST_FILE = f"{STATE_DIR}/{STATE_FILE}"
REDIRECTS_FILE = f"{STATE_DIR}/{STATE_FILE}:redirects"
_SCHEMA_ERRORS_PER_FILE = 5

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
        "non-blank source text lies in no chunk (SPEC §4: nothing is lost)",
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
                    MANIFEST_FILE,
                    f"docs.{self.rel}.{key}",
                    f"{key} has {len(listed)} entries for {len(self.files)} files",
                )
        if self.entry.get("policy_hash") != self.task.policy_hash:
            self.add(
                "mixed_policy",
                MANIFEST_FILE,
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
        """Every non-blank character of the body lies in some chunk (SPEC §4)."""
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


def schema_errors(rec: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(field path, message) of the first schema errors, from the reference validator."""
    errors = sorted(validator().iter_errors(rec), key=lambda e: list(map(str, e.absolute_path)))
    if not errors:  # the two validators disagree: say so rather than pass the file
        yield "(record)", "jsonschema-rs rejects the record but python-jsonschema accepts it"
    for error in errors[:_SCHEMA_ERRORS_PER_FILE]:
        yield ".".join(map(str, error.absolute_path)) or "(record)", error.message[:300]


#: Documents handed to the pool at once: what is in flight stays bounded, whatever the corpus.
_BATCH = 512


def _outcomes(tasks: Iterator[DocTask], count: int, jobs: int) -> Iterator[DocOutcome]:
    """Check the documents in order, ``_BATCH`` at a time (memory does not grow with the corpus)."""
    if jobs <= 1 or count < 64:
        yield from map(check_document, tasks)
        return
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("fork")) as pool:
        while batch := list(itertools.islice(tasks, _BATCH)):
            yield from pool.map(check_document, batch, chunksize=max(1, min(32, len(batch) // (jobs * 4))))


class _Keys:
    """Every chunk file's (file, id, chunk_id), in a temp SQLite file: the corpus-wide checks
    (unique ids, live redirect targets) are queries, and memory does not grow with the chunks."""

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="chunkyard-validate-")
        self.conn = sqlite3.connect(os.path.join(self._dir.name, "keys.sqlite"), isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=OFF")
        self.conn.execute("PRAGMA synchronous=OFF")
        self.conn.execute("CREATE TABLE keys(file TEXT, id TEXT, chunk_id TEXT)")
        self.conn.execute("BEGIN")

    def add(self, keys: Iterable[tuple[str, str, str]]) -> None:
        self.conn.executemany("INSERT INTO keys VALUES(?,?,?)", keys)

    def seal(self) -> None:
        self.conn.execute("COMMIT")
        self.conn.execute("CREATE INDEX keys_id ON keys(id)")
        self.conn.execute("CREATE INDEX keys_chunk_id ON keys(chunk_id)")

    def duplicates(self, column: str) -> Iterator[tuple[str, str, str]]:
        """``(file, value, first file)`` for each file whose value an earlier file (in file order) has."""
        assert column in ("id", "chunk_id")
        yield from self.conn.execute(
            f"SELECT k.file, k.{column}, d.first FROM keys k JOIN (SELECT {column} AS v, min(file) AS first "
            f"FROM keys GROUP BY {column} HAVING count(*) > 1) d ON k.{column} = d.v "
            "WHERE k.file <> d.first ORDER BY k.file"
        )

    def has_chunk_id(self, chunk_id: str) -> bool:
        return (
            self.conn.execute("SELECT 1 FROM keys WHERE chunk_id=? LIMIT 1", (chunk_id,)).fetchone()
            is not None
        )

    def close(self) -> None:
        self.conn.close()
        self._dir.cleanup()


def validate(
    out: Path,
    corpus: Path | None = None,
    *,
    reingest: bool = False,
    jobs: int = 0,
    on_start: Callable[[int], None] | None = None,
    on_doc: Callable[[], None] | None = None,
) -> Report:
    """Check a whole output folder; ``UsageError`` when it is not one (no folder, no manifest)."""
    started = time.perf_counter()
    store = open_store(out, corpus, need_corpus=True)
    report = Report(str(out), str(store.corpus), documents=len(store.docs), reingest=reingest)
    if store.db is not None and store.db.inflight() is not None:
        report.problems.append(Problem("interrupted_run", STATE_FILE, "inflight", "a sync has not finished"))
    manifest_policy: dict[str, Any] = store.manifest.get("policy") or {}
    p_hash = str(store.manifest.get("policy_hash", ""))
    try:
        if policy_hash(Policy(**manifest_policy)) != p_hash:
            report.problems.append(
                Problem(
                    "manifest_mismatch", MANIFEST_FILE, "policy_hash", "does not hash the manifest's policy"
                )
            )
    except TypeError as exc:
        report.problems.append(Problem("manifest_mismatch", MANIFEST_FILE, "policy", str(exc)))
        reingest = False
    count = len(store.docs)
    tasks = (
        DocTask(str(out), str(store.corpus), rel, entry, p_hash, manifest_policy if reingest else None)
        for rel, entry in store.docs.items()  # in path order, one entry at a time
    )
    fast_validator()  # compile the schema once, before any fork
    if reingest:
        from pipeline.runner import counter

        counter(str(manifest_policy.get("tokenizer")))  # load the vocabulary once, before any fork
    if on_start is not None:
        on_start(count)
    keys = _Keys()
    try:
        _check_all(store, report, keys, _outcomes(tasks, count, jobs or os.cpu_count() or 1), on_doc)
    finally:
        keys.close()
    report.seconds = time.perf_counter() - started
    return report


def _check_all(
    store: ChunkStore,
    report: Report,
    keys: _Keys,
    outcomes: Iterator[DocOutcome],
    on_doc: Callable[[], None] | None,
) -> None:
    for outcome in outcomes:
        report.problems.extend(outcome.problems)
        keys.add(outcome.keys)
        if on_doc is not None:
            on_doc()
    report.files = store.db.count_chunks() if store.db is not None else 0
    keys.add(_check_stale(store, report))
    keys.seal()
    _check_unique(keys, store, report)
    _check_redirects(store, keys, report)
    _check_unindexed(store, report)


def _check_stale(store: ChunkStore, report: Report) -> Iterator[tuple[str, str, str]]:
    """Files under the output that no document lists; yields their keys for the duplicate check.

    One indexed query per file (``chunks.file``), not a set of every listed file.
    """
    listed = store.index("file")
    for dirpath, dirnames, filenames in walk(store.out):  # not os.walk: it recurses per level
        dirnames[:] = sorted(d for d in dirnames if d != STATE_DIR)
        rel_dir = os.path.relpath(dirpath, store.out).replace(os.sep, "/")
        for name in sorted(filenames):
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if rel in listed:
                continue
            if name.startswith(".") and name.endswith(".tmp"):
                report.problems.append(
                    Problem("stale_file", rel, "(file)", "a temp file left by a killed run")
                )
                continue
            if not name.endswith(".json"):
                continue
            report.problems.append(
                Problem("stale_file", rel, "(file)", "no document in the manifest lists it")
            )
            try:
                rec = orjson.loads((store.out / rel).read_bytes())
            except (OSError, orjson.JSONDecodeError):
                continue
            if (
                isinstance(rec, dict)
                and isinstance(rec.get("id"), str)
                and isinstance(rec.get("chunk_id"), str)
            ):
                yield rel, rec["id"], rec["chunk_id"]


def _check_unique(keys: _Keys, store: ChunkStore, report: Report) -> None:
    """Ids and chunk_ids unique over every chunk file a loader would see; doc_uid|r unique too."""
    for code, fld in (("duplicate_id", "id"), ("duplicate_chunk_id", "chunk_id")):
        for f, value, first in keys.duplicates(fld):
            report.problems.append(Problem(code, f, fld, f"{value!r} is also in {first}"))
    owners: dict[str, str] = {}
    for rel, uid_rev in store.db.iter_uid_revs() if store.db is not None else ():
        if uid_rev and uid_rev in owners:
            report.problems.append(
                Problem(
                    "uid_collision",
                    MANIFEST_FILE,
                    f"docs.{rel}.uid_rev",
                    f"{uid_rev!r} is also {owners[uid_rev]}'s",
                    rel,
                )
            )
        owners.setdefault(uid_rev, rel)


def _check_redirects(store: ChunkStore, live: _Keys, report: Report) -> None:
    """Every redirect lands on a live chunk_id, in one hop."""
    if store.db is None:
        return
    db = store.db
    for old, new in db.iter_redirects():
        nxt = db.redirect(new)
        if nxt is not None:
            report.problems.append(
                Problem("redirect_chain", REDIRECTS_FILE, f"redirects.{old}", f"→ {new!r} → {nxt!r}")
            )
        elif not live.has_chunk_id(new) and not db.is_live(new):
            report.problems.append(
                Problem(
                    "dangling_redirect", REDIRECTS_FILE, f"redirects.{old}", f"→ {new!r}, which no chunk has"
                )
            )


def _check_unindexed(store: ChunkStore, report: Report) -> None:
    """Source documents without a manifest entry (only a warning: ``--exclude`` is not recorded)."""
    found, _ = discover(store.corpus, store.out)
    for f in found:
        if f.rel_path not in store.docs:
            report.problems.append(
                Problem(
                    "not_ingested", "", "metadata.sourceFile", "the manifest has no entry for it", f.rel_path
                )
            )
