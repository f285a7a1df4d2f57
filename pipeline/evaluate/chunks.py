"""Chunk lists for evaluation: chunkyard's own chunk files, or any chunker's (source, offsets, text).

Everything evaluation compares is a chunk with a corpus-relative ``source``, character
offsets ``[start, end)`` into that source's canonical text, and its ``text``; ``embed``
is what a retriever should embed and index (chunkyard: ``embedText``, with the breadcrumb;
a peer: its own text). The index and search of issue 16 take these lists whatever made them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ..chunkfolder import ChunkRecord, NotAnObjectError, iter_chunk_files, read_chunk_file
from ..errors import UsageError


@dataclass(frozen=True, slots=True)
class EvalChunk:
    """One chunk of one source document, as the metrics and the exports see it."""

    chunk_id: str
    source: str
    start: int
    end: int
    text: str
    """The source's text at ``[start, end)`` (``originalText``)."""
    embed: str
    """What to embed and index (``embedText``; the text itself for chunkers without one)."""
    tokens: int | None = None
    rev: str | None = None
    """The source's ``rev`` when the chunk was made (chunk files carry it; peers do not)."""

    def as_item(self) -> dict[str, Any]:
        """A retrieved-item mapping for ``metrics.retrieved_from``."""
        return {
            "chunk_id": self.chunk_id,
            "source": self.source,
            "offsets": {"start": self.start, "end": self.end},
            "tokens": self.tokens,
            "originalText": self.text,
            "rev": self.rev,
        }


def chunk_from_record(rec: ChunkRecord, where: str, embed_original: bool = False) -> EvalChunk:
    """An ``EvalChunk`` from a chunk file record (docs/spec.md, "Chunk files")."""
    try:
        offsets = rec["charOffsets"]
        return EvalChunk(
            chunk_id=rec["chunk_id"],
            source=rec["metadata"]["sourceFile"],
            start=offsets["charStart"],
            end=offsets["charEnd"],
            text=rec["originalText"],
            embed=rec["originalText"] if embed_original else rec["embedText"],
            tokens=rec["tokenStats"]["tokens"],
            rev=rec.get("rev"),
        )
    except (KeyError, TypeError) as exc:
        raise UsageError(
            f"{where}: not a chunk file (missing {exc}) (hint: point --out at a chunkyard output folder)"
        ) from None


def load_chunk_files(out: Path, embed_original: bool = False) -> list[EvalChunk]:
    """Read every chunk file of an output folder (``embed_original``: embed the text, no breadcrumb)."""
    if not out.is_dir():
        raise UsageError(f"{out}: no such output folder (hint: run `chunkyard ingest` first)")
    chunks = []
    for rel in iter_chunk_files(out):
        path = out / rel
        try:
            rec = read_chunk_file(path)
        except NotAnObjectError:
            raise UsageError(
                f"{path}: not a chunk file (not a JSON object) (hint: point --out at a chunkyard output folder)"
            ) from None
        except orjson.JSONDecodeError as exc:
            raise UsageError(f"{path}: not valid JSON ({exc}) (hint: re-run `chunkyard ingest`)") from None
        chunks.append(chunk_from_record(rec, str(path), embed_original))
    return chunks
