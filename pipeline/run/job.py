"""What a worker is given and what it hands back: ``Job`` in, ``DocResult`` out (SPEC §5).

Apart from ``worker.py`` so that the parent can make jobs and read results without
importing the chunker (the parser, the splitter, the schema check): a run that finds one
changed document hands it to a worker that loads those itself (``GuardPool.warm``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.models import DEFAULT_MAX_BYTES, Policy

__all__ = ["DocResult", "Job"]


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
    #: The manifest's last word on this document, index-aligned with ``old_files``.
    old_chunk_ids: tuple[str, ...] = ()
    old_hashes: tuple[str, ...] = ()
    old_digests: tuple[str, ...] = ()
    #: The files on disk are what the manifest says (no crash since, no ``--full``):
    #: a file whose digest is unchanged is then neither read nor written.
    trusted: bool = False
    #: The output held no chunk file when this run began, and a run writes each file
    #: once: no target exists yet, so none is looked for.
    fresh: bool = False


@dataclass(slots=True)
class DocResult:
    """What processing one document did; small, so it crosses process boundaries cheaply."""

    rel_path: str
    size: int = 0
    mtime_ns: int = 0  #: the source's mtime when it was read (what the manifest keeps)
    source_hash: str = ""
    files: list[str] = field(default_factory=list)
    chunk_ids: list[str] = field(default_factory=list)
    hashes: list[str] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)
    #: xxh3 of each chunk's ``embedText``: the feed says ``text`` when it is new to the document
    embeds: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)  #: files new since the manifest
    changed: list[str] = field(default_factory=list)  #: files whose content moved since the manifest
    written: int = 0  #: files actually written (a repair after a crash can need fewer)
    unsafe: bool = False  #: a write failed half-way: the files may be neither old nor new
    #: old chunk_id → (new chunk_id, how) for the old ids this version no longer has
    redirects: dict[str, tuple[str, str]] = field(default_factory=dict)
    tokens: int = 0
    uid_rev: str = ""
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
