"""What the index keeps per chunk, and the small interface every vector store implements.

A store holds, per ``chunk_id``: the vector of the chunk's ``embedText``, the text for
BM25, and the citation payload (``ChunkRow``). It also keeps an embedding cache keyed by
(embedder name, digest of the embedded text) and a few ``meta`` strings: the feed cursor,
the index identity and ``index_hash``. ``commit`` applies one run's upserts, deletes and
meta together: in the SQLite store that is one transaction, so a reader sees the old
index or the new one, never half of each.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import blake3
import orjson

from pipeline.chunkfolder import STATE_DIR
from pipeline.errors import PipelineError, UsageError
from pipeline.run.state import flock_held

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    Vector = npt.NDArray[np.float32]
else:
    Vector = Any

#: Store kinds ``--store`` may name with a ``KIND:`` prefix; the first is the default.
STORE_KINDS = ("sqlite", "lancedb")
DEFAULT_STORE = "index.sqlite"  #: under ``CHUNKS/.chunkyard/``


def digest_text(text: str) -> str:
    """``blake3:<32 hex>`` of a text: the embedding cache's key (equal digest, equal vector)."""
    return "blake3:" + blake3.blake3(text.encode("utf-8")).hexdigest()[:32]


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
        data = asdict(self)
        data["model_tokens"] = model_tokens
        return ChunkRow(**data)

    @property
    def row_digest(self) -> str:
        """A digest of everything the row holds: equal digest, nothing to write."""
        return digest_text(orjson.dumps(asdict(self), option=orjson.OPT_SORT_KEYS).decode())

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_json(cls, data: bytes | str) -> ChunkRow:
        return cls(**orjson.loads(data))


@dataclass(frozen=True, slots=True)
class RowState:
    """What planning needs to know about a stored chunk (no texts, no vector)."""

    file: str
    hash: str
    digest: str
    row_digest: str
    model_tokens: int
    policy_hash: str = ""


class StoreError(PipelineError):
    """The store cannot be opened, read or written (locked, full disk, not an index)."""


class IndexMismatchError(PipelineError):
    """A run or a query with another embedder or analyzer than the index was built with.

    Attributes:
        code: 001's return code: ``mismatch_index_hash`` (embedder, dimension,
            normalisation) or ``analyzer_mismatch`` (the BM25 analyzer).
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class VectorStore(Protocol):
    """A vector store as the index drives it; ids are ``chunk_id``s."""

    kind: str  #: ``sqlite-vec`` or ``lancedb``: the prefix of ``index_hash``
    analyzer: str  #: the BM25 side's analyzer (``pipeline.index.analyzer``)
    path: Path

    def meta(self) -> dict[str, str]:
        """Every meta string (cursor, identity, ``index_hash``); empty for a new store."""
        ...

    def states(self) -> dict[str, RowState]:
        """Every stored ``chunk_id`` with what planning compares."""
        ...

    def states_for(self, files: Collection[str], ids: Collection[str]) -> dict[str, RowState]:
        """The stored rows kept for one of ``files`` or named in ``ids`` (an incremental run's
        view: its cost follows the change, not the index)."""
        ...

    def cached(self, model: str, digests: Collection[str]) -> dict[str, tuple[Vector, int]]:
        """Vectors (and token counts) the cache holds for these digests under ``model``."""
        ...

    def put_cache(self, model: str, entries: Mapping[str, tuple[Vector, int]]) -> None:
        """Add computed vectors to the cache and make them durable (the index is untouched)."""
        ...

    def commit(
        self,
        upserts: Sequence[tuple[ChunkRow, Vector | None]],
        deletes: Collection[str],
        meta: Mapping[str, str],
        *,
        model: str,
    ) -> None:
        """Apply one run: replace or add rows (vector ``None``: the stored vector stays, the
        text did not change), drop ``deletes``, set ``meta``; all or nothing where the store
        can. Cache entries no live row uses are pruned when older than a few runs."""
        ...

    def dense(self, vector: Vector, k: int) -> list[tuple[str, float]]:
        """The ``k`` nearest chunks: ``(chunk_id, cosine similarity)``, best first."""
        ...

    def lexical(self, terms: Sequence[str], k: int) -> list[tuple[str, float]]:
        """BM25 over the analyzed terms (any one may match): ``(chunk_id, score > 0)``, best first."""
        ...

    def substring(self, needle: str, k: int) -> list[tuple[str, float]]:
        """Chunks whose text contains ``needle`` (for queries with no BM25 term): (id, count)."""
        ...

    def rows(self, chunk_ids: Collection[str]) -> dict[str, ChunkRow]:
        """The stored rows of these ids (absent ids are left out)."""
        ...

    def close(self) -> None: ...


def store_spec(out: Path, store: str | Path | None) -> tuple[str, Path]:
    """``(kind, path)`` for ``--store``: ``None`` → the SQLite file in the chunk folder's state.

    ``lancedb:PATH`` (or a path ending in ``.lance``) names a LanceDB folder; ``sqlite:PATH``
    or any other path a SQLite file.
    """
    if store is None or str(store) == "":
        return "sqlite", Path(out) / STATE_DIR / DEFAULT_STORE
    text = str(store)
    for kind in STORE_KINDS:
        if text.startswith(kind + ":"):
            return kind, Path(text[len(kind) + 1 :])
    return ("lancedb" if text.endswith(".lance") else "sqlite"), Path(text)


def open_store(
    out: Path, store: str | Path | None = None, *, dim: int | None = None, create: bool = False
) -> VectorStore:
    """Open (or, with ``create``, make) the store ``--store`` names for the chunk folder ``out``.

    Raises:
        UsageError: there is no index there and ``create`` is off, or an extra is missing.
    """
    kind, path = store_spec(out, store)
    if not create and not path.exists():
        raise UsageError(
            f"{path}: no index there (hint: build it with `chunkyard index --out {out}"
            + (f" --store {store}" if store else "")
            + "`)"
        )
    return open_at(kind, path, dim=dim)


def analyzer_of(kind: str) -> str:
    """The BM25 analyzer the store of ``kind`` reads and writes with."""
    from pipeline.index.analyzer import ANALYZER, LANCE_ANALYZER

    return LANCE_ANALYZER if kind == "lancedb" else ANALYZER


def open_at(kind: str, path: Path, *, dim: int | None = None) -> VectorStore:
    """Open (creating when absent) the store of ``kind`` at ``path``."""
    if kind == "lancedb":
        from pipeline.index.lance_store import LanceStore

        lance: VectorStore = LanceStore(path, dim=dim)
        return lance
    from pipeline.index.sqlite_store import SqliteStore

    return SqliteStore(path, dim=dim)


#: Rankers fetch this many hits beyond k and cut after ``best_first``, so that equal scores
#: across the cut resolve by chunk id, not by the store's internal order.
TIE_MARGIN = 16


def best_first(hits: list[tuple[str, float]], k: int | None = None) -> list[tuple[str, float]]:
    """``(chunk_id, score)`` pairs by score desc, then chunk id asc (deterministic ties); the first ``k``."""
    hits.sort(key=lambda h: (-h[1], h[0]))
    return hits if k is None else hits[:k]


@contextmanager
def store_lock(
    path: Path, *, wait: bool = True, on_wait: Callable[[str], None] | None = None
) -> Iterator[None]:
    """One writer per store: ``flock`` on ``<store>.lock``; it dies with its holder."""
    lock = path.with_name(path.name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with flock_held(
        open(lock, "a+"),
        lambda: f"pid {os.getpid()}",
        lambda holder: f"{path} is being indexed by {holder}; wait for it, or drop --no-wait",
        wait=wait,
        on_wait=on_wait,
    ):
        yield
