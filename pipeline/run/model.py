"""The plain types of a run: ``Options`` and ``Summary`` for the caller, ``Job`` and ``DocResult`` for a worker.

Plain data, imported by every other module of ``run/`` and importing none of them: the
session, the planner, the executors and the state writes all speak these types, so
nothing needs to import upward, and the parent can make jobs and read results without
loading the chunker (the parser, the splitter, the schema check).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.models import DEFAULT_MAX_BYTES, Policy

__all__ = ["DEFAULT_DOC_MEMORY_MB", "DEFAULT_DOC_TIMEOUT", "DocResult", "Job", "Options", "Summary"]

#: Seconds a document may take before it is stopped (``--doc-timeout``; 0 = no limit).
DEFAULT_DOC_TIMEOUT = 30.0
#: Address space a worker may add, in MiB (``--doc-memory``; 0 = no limit). A legitimate
#: document at the default size limit peaks well under this; it leaves room for that.
DEFAULT_DOC_MEMORY_MB = 2048


@dataclass(slots=True)
class Options:
    """How to run: the policy and everything else the CLI can set."""

    corpus: Path
    out: Path
    policy: Policy = field(default_factory=Policy)
    jobs: int = 1
    full: bool = False
    exclude: tuple[str, ...] = ()
    max_bytes: int = DEFAULT_MAX_BYTES
    wait: bool = True
    doc_timeout: float = DEFAULT_DOC_TIMEOUT  #: seconds per document, 0 = no limit (guard.py)
    doc_memory_mb: int = DEFAULT_DOC_MEMORY_MB  #: MiB a worker may add, 0 = no limit (guard.py)
    executor: str = "local"  #: "local" (a process pool on this machine) or "ray" (ray_executor.py)
    address: str | None = None  #: the Ray cluster (``ray.init``'s address); None: Ray's default
    batch: int = 0  #: documents per Ray task, 0 = chosen from the cluster's CPUs

    @property
    def guarded(self) -> bool:
        """Documents go to the local guard pool: the local executor with a time or memory limit on."""
        return self.executor == "local" and (self.doc_timeout > 0 or self.doc_memory_mb > 0)


@dataclass(slots=True)
class Summary:
    """What a run did, for the summary table and ``--json``."""

    run_id: str
    documents: int = 0
    processed: int = 0
    skipped: int = 0
    chunks: int = 0
    tokens: int = 0
    bytes: int = 0
    added: int = 0
    changed: int = 0
    unchanged: int = 0
    removed: int = 0
    written: int = 0  #: chunk files actually written
    redirects: int = 0  #: redirects added or re-pointed
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    #: chunkyard's own state could not be written (a full disk): exit code 2
    state_error: bool = False
    warnings: list[str] = field(default_factory=list)
    stage_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """0 when all went well, 1 when a document failed, 2 when the state could not be written."""
        return 2 if self.state_error else 1 if self.failures else 0

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "documents": self.documents,
            "processed": self.processed,
            "skipped": self.skipped,
            "chunks": self.chunks,
            "tokens": self.tokens,
            "bytes": self.bytes,
            "added": self.added,
            "changed": self.changed,
            "unchanged": self.unchanged,
            "removed": self.removed,
            "written": self.written,
            "redirects": self.redirects,
            "seconds": round(self.seconds, 3),
            "mb_per_s": round(self.mb_per_s, 3),
            "failed": len(self.failures),
            "failures": self.failures,
            "warnings": self.warnings,
            "stage_seconds": {k: round(v, 3) for k, v in self.stage_seconds.items()},
        }


@dataclass(slots=True)
class Job:
    """One document for a worker: where it is, where its chunks go, what the state had of it."""

    path: str
    rel_path: str
    out: str
    policy: Policy
    processed_at: str
    old_files: tuple[str, ...] = ()
    max_bytes: int = DEFAULT_MAX_BYTES
    rev_width: int = 8
    #: The state's last word on this document, index-aligned with ``old_files``.
    old_chunk_ids: tuple[str, ...] = ()
    old_hashes: tuple[str, ...] = ()
    old_digests: tuple[str, ...] = ()
    #: The files on disk are what the state says (no crash since, no ``--full``):
    #: a file whose digest is unchanged is then neither read nor written.
    trusted: bool = False
    #: The output held no chunk file when this run began, and a run writes each file
    #: once: no target exists yet, so none is looked for.
    output_was_empty: bool = False


@dataclass(slots=True)
class DocResult:
    """What processing one document did; small, so it crosses process boundaries cheaply."""

    rel_path: str
    size: int = 0
    mtime_ns: int = 0  #: the source's mtime when it was read (what the state keeps)
    source_hash: str = ""
    files: list[str] = field(default_factory=list)
    chunk_ids: list[str] = field(default_factory=list)
    hashes: list[str] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)
    #: xxh3 of each chunk's ``embedText``: the feed says ``text`` when it is new to the document
    embeds: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)  #: files new since the state's last record
    changed: list[str] = field(default_factory=list)  #: files whose content moved since then
    written: int = 0  #: files actually written (a repair after a crash can need fewer)
    unsafe: bool = False  #: a write failed half-way: the files may be neither old nor new
    #: old chunk_id → (new chunk_id, how) for the old ids this version no longer has
    redirects: dict[str, tuple[str, str]] = field(default_factory=dict)
    tokens: int = 0
    uid_rev: str = ""
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
