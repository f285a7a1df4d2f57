"""What the index keeps per chunk: the row (citation payload and texts) and what planning compares.

Plain types shared by the sync, the query side and every store implementation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import blake3
import orjson

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    Vector = npt.NDArray[np.float32]
else:
    Vector = Any


def digest_text(text: str) -> str:
    """``blake3:<32 hex>`` of a text: the embedding cache's key (equal digest, equal vector)."""
    return digest_bytes(text.encode("utf-8"))


def digest_bytes(data: bytes) -> str:
    """``digest_text`` of the text whose UTF-8 encoding is ``data`` (no decoding round trip)."""
    return "blake3:" + blake3.blake3(data).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class ChunkRow:
    """One chunk as the index keeps it: the citation payload, the texts, where it came from.

    Attributes:
        chunk_id: the key (001's ``snippet_id``).
        file: the chunk file, relative to the chunk folder.
        hash: the chunk's ``hash`` (``blake3:`` of ``originalText``).
        digest: ``digest_text(embedText)``: what the vector was computed from.
        model_tokens: ``embedText``'s length in the embedder's own units (−1: not counted).
        text: ``originalText``; ``embed_text``: what is embedded and indexed for BM25.
    """

    chunk_id: str
    file: str
    id: str
    hash: str
    digest: str
    doc_id: str
    section_id: str
    source_url: str
    source_file: str
    start: int
    end: int
    line_start: int
    line_end: int
    tokens: int
    rev: str
    analyzer: str
    policy_hash: str
    title: str
    breadcrumb: str
    text: str
    embed_text: str
    model_tokens: int = -1

    @classmethod
    def from_record(cls, record: Mapping[str, Any], file: str, model_tokens: int = -1) -> ChunkRow:
        """The row for a chunk file's record (schema ``chunk.schema.json``)."""
        meta, offsets, lines = record["metadata"], record["charOffsets"], record["lineSpan"]
        chunk_id = str(record["chunk_id"])
        return cls(
            chunk_id=chunk_id,
            file=file,
            id=str(record["id"]),
            hash=str(record["hash"]),
            digest=digest_text(record["embedText"]),
            doc_id=str(record.get("doc_id") or chunk_id.split("|r=", 1)[0]),
            section_id=str(record["section_id"]),
            source_url=str(record["source_url"]),
            source_file=str(meta["sourceFile"]),
            start=int(offsets["charStart"]),
            end=int(offsets["charEnd"]),
            line_start=int(lines["lineStart"]),
            line_end=int(lines["lineEnd"]),
            tokens=int(record["tokenStats"]["tokens"]),
            rev=str(record["rev"]),
            analyzer=str(meta["analyzer"]),
            policy_hash=str(meta.get("policyHash", "")),
            title=str(record["fileTitle"]),
            breadcrumb=str(record["headerBreadcrumb"]),
            text=str(record["originalText"]),
            embed_text=str(record["embedText"]),
            model_tokens=model_tokens,
        )

    def with_tokens(self, model_tokens: int) -> ChunkRow:
        """The same row with its length in the embedder's units."""
        data = self._fields()
        data["model_tokens"] = model_tokens
        return ChunkRow(**data)

    @property
    def row_digest(self) -> str:
        """A digest of everything the row holds: equal digest, nothing to write."""
        return digest_bytes(self.to_json())

    def to_json(self) -> bytes:
        """The row as JSON, keys sorted: the stored payload, and what ``row_digest`` digests
        (``encoded`` gives both from one encoding). ``_fields`` is already in key order, so
        orjson need not sort each row's keys (the same bytes, for a fraction of the cost)."""
        return orjson.dumps(self._fields())

    def encoded(self) -> tuple[bytes, str]:
        """``(to_json(), row_digest)`` from one encoding: a store writes both for every row."""
        payload = self.to_json()
        return payload, digest_bytes(payload)

    def _fields(self) -> dict[str, Any]:
        """The fields by name, sorted by name: ``asdict`` without its deep copies (every field
        is a str or an int), which were most of the parent's cost per row written."""
        return dict(zip(_ROW_FIELDS, _row_values(self), strict=True))

    @classmethod
    def from_json(cls, data: bytes | str) -> ChunkRow:
        return cls(**orjson.loads(data))


#: field names in sorted order (ASCII: byte order, as orjson's ``OPT_SORT_KEYS`` sorts)
_ROW_FIELDS = tuple(sorted(f.name for f in fields(ChunkRow)))
_row_values = attrgetter(*_ROW_FIELDS)


@dataclass(frozen=True, slots=True)
class RowState:
    """What planning needs to know about a stored chunk (no texts, no vector)."""

    file: str
    hash: str
    digest: str
    row_digest: str
    model_tokens: int
    policy_hash: str = ""
