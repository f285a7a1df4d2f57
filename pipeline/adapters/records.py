"""Chunk records for other frameworks: in-memory chunking, flat metadata, the embedded text.

Framework-free: both adapters and the public API build on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

import blake3

from pipeline.audit.chunk_state import uid_of
from pipeline.models import Policy


def chunk_records(
    text: str | bytes, path: str = "doc.md", policy: Policy | None = None
) -> list[dict[str, Any]]:
    """Chunk one Markdown text in memory: the records ``ingest`` would write, nothing on disk.

    Args:
        text: the Markdown source (bytes are decoded as ``ingest`` decodes a file: strict UTF-8).
        path: the corpus-relative path it would have (names the ids and files).
        policy: the chunking policy (default ``Policy()``).

    Returns:
        One record per chunk, in reading order, each checked against the chunk schema.

    Raises:
        StageError: the text cannot be chunked (too deeply nested, for example).
        SchemaError: a record does not match the schema (a bug: please report it).
    """
    from pipeline.run.emit import check_record  # the runner pulls in mistletoe and the schema
    from pipeline.run.state import now_iso
    from pipeline.runner import chunk_document

    rel = PurePosixPath(path).as_posix()
    _, chunks = chunk_document(
        text.encode("utf-8") if isinstance(text, str) else text,
        rel,
        policy or Policy(),
        processed_at=now_iso(),
    )
    for chunk in chunks:
        check_record(chunk.record, f"{rel}: {chunk.rel_file}")
    return [chunk.record for chunk in chunks]


def embed_prefix(record: Mapping[str, Any]) -> str:
    """What ``embedText`` adds before ``originalText`` (context line, a split table's header)."""
    embed, original = record["embedText"], record["originalText"]
    return str(embed[: len(embed) - len(original)]) if embed.endswith(original) else ""


def embed_digest(record: Mapping[str, Any]) -> str:
    """A digest of exactly what gets embedded (``embedText``): equal digest, equal vector."""
    return "blake3:" + blake3.blake3(record["embedText"].encode("utf-8")).hexdigest()[:32]


def flat_metadata(record: Mapping[str, Any]) -> dict[str, Any]:
    """The metadata a vector store keeps for a chunk: flat, scalar values only.

    001's citation fields (``doc_id``, ``section_id``, ``snippet_id``, ``source_url``,
    the offsets, ``tokens``, ``rev``, ``analyzer``) and what a reader shows or filters on.
    Flat, because many stores (Chroma, Pinecone, most LlamaIndex stores) refuse nesting.
    """
    offsets, lines = record["charOffsets"], record["lineSpan"]
    meta = record["metadata"]
    return {
        "chunk_id": record["chunk_id"],
        "id": record["id"],
        "doc_id": record.get("doc_id") or uid_of(record["chunk_id"]),
        "section_id": record["section_id"],
        "snippet_id": record["chunk_id"],
        "source_url": record["source_url"],
        "source": meta["sourceFile"],
        "char_start": offsets["charStart"],
        "char_end": offsets["charEnd"],
        "line_start": lines["lineStart"],
        "line_end": lines["lineEnd"],
        "tokens": record["tokenStats"]["tokens"],
        "rev": record["rev"],
        "analyzer": meta["analyzer"],
        "hash": record["hash"],
        "block_type": record["block_type"],
        "title": record["fileTitle"],
        "section": record["sectionTitle"],
        "breadcrumb": record["headerBreadcrumb"],
        "section_slug": record["sectionSlug"],
        "chunk_number": record["chunkNumber"],
        "parent_id": record["parentId"],
        "prev_id": record["prevId"] or "",
        "next_id": record["nextId"] or "",
    }
