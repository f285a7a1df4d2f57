"""The runner: the one place that knows the stage order (SPEC §1).

``chunk_document`` is the pure function a process pool maps over:
read → normalize → parse → sections → split → mint. ``process_document``
adds the two I/O ends for one file (read, then schema check and emit), and
``ingest`` drives a whole corpus: discovery, the pool, stale files, manifest.

Each stage takes the previous stage's value and returns a new one; only
``read_source`` and ``emit`` touch the disk.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import xxhash

from . import __version__
from .emit import check_record, dumps, unchanged, write_atomic
from .errors import PipelineError, SchemaError, StageError
from .mint import doc_uid, mint, sha1_8
from .models import Chunk, Policy, SourceDoc
from .normalize import DEFAULT_MAX_BYTES, normalize, read_source
from .parse import parse
from .sections import build_sections, file_title, outline
from .split import Splitter
from .tokens import Counter

STAGES = ("read", "normalize", "parse", "sections", "split", "mint", "schema", "write")


@dataclass(slots=True)
class Timer:
    """Seconds spent per stage, summed over documents (for ``make bench``)."""

    seconds: dict[str, float] = field(default_factory=dict)
    _last: float = field(default_factory=time.perf_counter)

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + now - self._last
        self._last = now


def chunk_document(
    raw: bytes,
    rel_path: str,
    policy: Policy,
    *,
    processed_at: str = "1970-01-01T00:00:00Z",
    rev_width: int = 8,
    timer: Timer | None = None,
) -> tuple[SourceDoc, list[Chunk]]:
    """Bytes of one Markdown file → its chunks. Pure: same input, same output."""
    t0 = time.perf_counter()
    timer = timer or Timer()
    doc = normalize(raw, rel_path)
    timer.lap("normalize")
    blocks = parse(doc)
    timer.lap("parse")
    sections = build_sections(blocks)
    title = file_title(doc, blocks)
    timer.lap("sections")
    splitter = Splitter(doc.text, title, policy, counter(policy.tokenizer))
    drafts = list(splitter.split(sections))
    timer.lap("split")
    chunks = mint(
        doc,
        drafts,
        title=title,
        outline_hash=sha1_8(outline(blocks), rev_width),
        policy=policy,
        uid=doc_uid(doc),
        processed_at=processed_at,
        processing_ms=round((time.perf_counter() - t0) * 1000, 3),
        version=__version__,
    )
    timer.lap("mint")
    return doc, chunks


_COUNTERS: dict[str, Counter] = {}


def counter(name: str) -> Counter:
    """One token counter per tokenizer per process (loading a vocabulary takes ~0.2 s)."""
    if name not in _COUNTERS:
        _COUNTERS[name] = Counter(name)
    return _COUNTERS[name]


@dataclass(slots=True)
class Job:
    """One document to process: where it is, where its chunks go, what it had before."""

    path: str
    rel_path: str
    out: str
    policy: Policy
    processed_at: str
    old_files: tuple[str, ...] = ()
    max_bytes: int = DEFAULT_MAX_BYTES
    rev_width: int = 8


@dataclass(slots=True)
class DocResult:
    """What processing one document did; small, so it crosses process boundaries cheaply."""

    rel_path: str
    size: int = 0
    source_hash: str = ""
    files: list[str] = field(default_factory=list)
    chunk_ids: list[str] = field(default_factory=list)
    hashes: list[str] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    tokens: int = 0
    uid_rev: str = ""
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)


def process_document(job: Job) -> DocResult:
    """Read, chunk, check and write one document. Never raises for bad input."""
    result = DocResult(job.rel_path)
    timer = Timer()
    try:
        raw = read_source(Path(job.path), job.rel_path, job.max_bytes)
        result.size = len(raw)
        result.source_hash = xxhash.xxh3_64_hexdigest(raw)
        timer.lap("read")
        doc, chunks = chunk_document(
            raw,
            job.rel_path,
            job.policy,
            processed_at=job.processed_at,
            rev_width=job.rev_width,
            timer=timer,
        )
        result.warnings.extend(doc.warnings)
        for chunk in chunks:  # check them all before writing any: a document is all or nothing
            check_record(chunk.record, f"{job.rel_path}: {chunk.rel_file}")
        timer.lap("schema")
        out = Path(job.out)
        for chunk in chunks:
            rec = chunk.record
            target = out / chunk.rel_file
            existed = target.exists()
            if not (existed and unchanged(target, rec)):
                write_atomic(target, dumps(rec))
                (result.changed if existed else result.added).append(chunk.rel_file)
            result.files.append(chunk.rel_file)
            result.ids.append(rec["id"])
            result.chunk_ids.append(rec["chunk_id"])
            result.hashes.append(rec["hash"])
            result.tokens += rec["tokenStats"]["tokens"]
        if chunks:
            result.uid_rev = chunks[0].record["chunk_id"].split("|s=", 1)[0]
        timer.lap("write")
    except (StageError, SchemaError) as exc:
        result.error = str(exc)
    except RecursionError:
        result.error = f"{job.rel_path}: parse: nesting too deep (hint: flatten nested quotes or lists)"
    except OSError as exc:
        result.error = f"{job.rel_path}: write: {exc.strerror or exc} (hint: check the output folder)"
    except PipelineError as exc:
        result.error = str(exc)
    result.seconds = timer.seconds
    return result
