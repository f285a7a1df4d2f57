"""The chunk folder (``--out``): the state folder's name, its chunk files and their record type.

Every reader of an output folder lists and reads chunk files here: evaluation, the index
sync, the framework syncs, the report and the audit tools. A chunk file is any ``*.json``
below the folder outside the state folder ``.chunkyard/`` (which holds the state database,
the change feed, the journal and the default index). ``ChunkRecord`` is one file's content,
field for field ``schemas/chunk.schema.json`` (``tests/test_chunkfolder.py`` checks that the
two agree); see docs/spec.md, "Chunk files".

Reading a file does not validate it: ``chunkyard validate`` does. The types say what a
chunk file written by ``chunkyard ingest`` holds.
"""

# No ``from __future__ import annotations`` here: on Python 3.11 it hides ``NotRequired`` from
# ``TypedDict`` (``frontMatter`` would count as required).
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict, cast

import orjson

from pipeline.models import BlockKind, ChunkType

#: The output folder's own folder (state database, change feed, journal, lock, default index):
#: never chunk files.
STATE_DIR = ".chunkyard"

#: A chunk file's suffix.
CHUNK_SUFFIX = ".json"


class CharOffsets(TypedDict):
    """``[charStart, charEnd)``: code-point offsets into the source's canonical text."""

    charStart: int
    charEnd: int
    totalChars: int


class LineSpan(TypedDict):
    """The 1-based source lines the chunk covers, both ends included."""

    lineStart: int
    lineEnd: int


class TokenStats(TypedDict):
    tokens: int
    estimatedTokens: int
    tokenizer: str


class BlockRef(TypedDict):
    """One Markdown block the chunk holds (or part of one), with its offsets."""

    block_id: str
    type: BlockKind
    charStart: int
    charEnd: int


class ChunkingOptions(TypedDict):
    """The effective chunking policy (``Policy.as_dict``)."""

    target_tokens: int
    overlap_tokens: int
    tokenizer: str
    context_prefix: bool
    lang: str


class PipelineInfo(TypedDict):
    version: str
    processingTimeMs: float


class ChunkMetadata(TypedDict):
    sourceFile: str
    processedAt: str
    chunkingOptions: ChunkingOptions
    chunkerVersion: Literal["md-heading-v1"]
    policyHash: str
    analyzer: str
    frontMatter: NotRequired[dict[str, Any]]
    lang: str
    pipeline: PipelineInfo


class ChunkRecord(TypedDict):
    """One chunk file, as ``schemas/chunk.schema.json`` describes it."""

    id: str
    parentId: str
    prevId: str | None
    nextId: str | None
    chunkNumber: int
    contentType: Literal["doc"]
    doc_id: str
    chunk_id: str
    section_id: str
    block_type: ChunkType
    fileTitle: str
    sectionTitle: str
    headerPath: list[str]
    headerBreadcrumb: str
    headerDepths: list[int]
    headerSlugs: list[str]
    sectionSlug: str
    originalText: str
    embedText: str
    charOffsets: CharOffsets
    lineSpan: LineSpan
    tokenStats: TokenStats
    hash: str
    anchor: str
    source_url: str
    rev: str
    blocks: list[BlockRef]
    metadata: ChunkMetadata
    schema_version: Literal["1.1.0"]


class NotAnObjectError(ValueError):
    """A chunk file that is valid JSON but not a JSON object."""


def is_chunk_file(rel: str) -> bool:
    """Whether a folder-relative POSIX path names a chunk file (a ``.json`` outside the state folder)."""
    return rel.endswith(CHUNK_SUFFIX) and STATE_DIR not in rel.split("/")[:-1]


def iter_chunk_files(out: Path) -> Iterator[str]:
    """Every chunk file below ``out``, relative and POSIX, in path order (the state folder skipped).

    Path order compares the paths part by part, as sorting ``Path`` objects does: ``a/b.json``
    comes before ``a.json``.
    """
    found: list[str] = []
    for root, dirs, files in os.walk(out):
        dirs[:] = [d for d in dirs if d != STATE_DIR]
        rel = Path(root).relative_to(out)
        found += [(rel / name).as_posix() for name in files if name.endswith(CHUNK_SUFFIX)]
    found.sort(key=lambda path: path.split("/"))
    yield from found


def read_chunk_file(path: Path) -> ChunkRecord:
    """One chunk file, parsed.

    Raises ``OSError`` when it cannot be read, ``orjson.JSONDecodeError`` when it is not JSON
    and ``NotAnObjectError`` when it is JSON but not an object (both are ``ValueError``\\ s).
    """
    record = orjson.loads(path.read_bytes())
    if not isinstance(record, dict):
        raise NotAnObjectError(f"{path}: not a JSON object")
    return cast(ChunkRecord, record)


def read_chunk_file_or_none(path: Path) -> ChunkRecord | None:
    """One chunk file, parsed; ``None`` when it is missing, unreadable, not JSON or not an object."""
    try:
        return read_chunk_file(path)
    except (OSError, ValueError):
        return None
