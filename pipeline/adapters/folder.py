"""A chunk folder opened for reading: iterate its records, look one up by any of its ids."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from pipeline.audit.chunk_state import ChunkStore, open_store
from pipeline.audit.resolve import MAX_HOPS
from pipeline.chunkfolder import ChunkRecord


class ChunkFolder:
    """The chunks of one output folder, as the last completed ``ingest`` left them.

    Read-only; opened on the state of the moment (open it again after another ingest).

    Example:
        >>> folder = open_chunks("chunks")            # doctest: +SKIP
        >>> for record in folder:                     # doctest: +SKIP
        ...     print(record["chunk_id"], record["embedText"][:40])
    """

    def __init__(self, store: ChunkStore) -> None:
        self._store = store

    @property
    def out(self) -> Path:
        """The chunk folder."""
        return self._store.out

    @property
    def sources(self) -> list[str]:
        """The corpus-relative paths of the documents, sorted."""
        return sorted(self._store.docs)

    def __len__(self) -> int:
        return sum(len(entry.get("files") or ()) for entry in self._store.docs.values())

    def __iter__(self) -> Iterator[ChunkRecord]:
        return self.records()

    def records(self, source: str | None = None) -> Iterator[ChunkRecord]:
        """Every chunk record, document by document (sorted by path), in reading order.

        Args:
            source: only this document's chunks (a corpus-relative path).
        """
        docs = self._store.docs
        for rel in [source] if source is not None else sorted(docs):
            for file in (docs.get(rel) or {}).get("files") or ():
                yield self._store.read_record(file)

    def get(self, key: str) -> ChunkRecord | None:
        """The record a ``chunk_id``, an ``id`` or a chunk file names; ``None`` if none does.

        A ``chunk_id`` an edit retired is followed through the redirect map.
        """
        for kind in ("chunk_id", "id", "file"):
            loc = self._store.index(kind).get(key)
            if loc is not None:
                return self._store.read_record(loc.file)
        target, hops = key, 0
        while target in self._store.redirects and hops < MAX_HOPS:
            target, hops = self._store.redirects[target], hops + 1
        loc = self._store.index("chunk_id").get(target) if hops else None
        return self._store.read_record(loc.file) if loc is not None else None

    def __getitem__(self, key: str) -> ChunkRecord:
        record = self.get(key)
        if record is None:
            raise KeyError(key)
        return record

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key) is not None


def open_chunks(out: Path | str) -> ChunkFolder:
    """Open the chunk folder ``out`` (``ingest``'s ``--out``) for reading.

    Args:
        out: the chunk folder.

    Raises:
        UsageError: ``out`` is not a chunk folder (no manifest: run ``ingest`` first).
    """
    return ChunkFolder(open_store(Path(out)))
