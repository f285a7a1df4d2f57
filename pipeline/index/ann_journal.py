"""The HNSW graph's journal: the keys removed and the vectors added since the graph was saved.

Saving a usearch graph writes the whole file (every vector and every edge): at a million
chunks that is hundreds of megabytes for an edit of ten. So ``pipeline.index.ann`` saves the
graph only when it is built or compacted, and a run's changes are appended here instead:

- **Layout**: blocks, one per run, each ``MAGIC``, three little-endian ``uint32`` (keys
  removed, keys added, dimensions), the removed keys (``uint64``), the added keys
  (``uint64``) and their vectors (``float32``, row by row).
- **Length**: the graph's state records how many bytes of the journal are valid; a reader
  reads that many and no more. A writer first cuts the file back to that length (what a
  killed run appended past it is dropped), appends, syncs, and only then records the new
  length with the new generation (``ann.HnswIndex``). A SIGKILL before that leaves the state
  naming the previous length and generation: the previous index, whole.
- **Meaning** (``Delta``, replayed in order): a removed key leaves the delta and hides the
  graph's node of that key; an added key hides the graph's node of that key too (a rowid
  SQLite gave again) and puts its float32 vector in the delta. A search asks the graph for
  enough candidates to cover the hidden nodes and scores the delta's vectors exactly.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pipeline.index.vector_store import StoreError

if TYPE_CHECKING:
    import numpy.typing as npt

MAGIC = b"CYJ1"
_HEADER = struct.Struct("<4sIII")


def append(
    path: Path,
    valid: int,
    removed: npt.NDArray[np.uint64],
    keys: npt.NDArray[np.uint64],
    vectors: npt.NDArray[np.float32],
) -> int:
    """Append one block to the journal at ``path`` after its first ``valid`` bytes (anything
    past them is a killed run's and is cut); synced. Returns the journal's new valid length."""
    dim = int(vectors.shape[1]) if vectors.ndim == 2 else 0
    block = b"".join(
        (
            _HEADER.pack(MAGIC, len(removed), len(keys), dim),
            np.ascontiguousarray(removed, dtype="<u8").tobytes(),
            np.ascontiguousarray(keys, dtype="<u8").tobytes(),
            np.ascontiguousarray(vectors, dtype="<f4").tobytes(),
        )
    )
    with open(path, "r+b" if path.exists() else "w+b") as fh:
        fh.truncate(valid)
        fh.seek(valid)
        fh.write(block)
        fh.flush()
        os.fsync(fh.fileno())
    return valid + len(block)


def blocks(
    path: Path, valid: int
) -> Iterator[tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64], npt.NDArray[np.float32]]]:
    """The journal's blocks in order, as ``(removed keys, added keys, added vectors)``.

    Raises:
        StoreError: the file is shorter than ``valid`` or a block is malformed.
    """
    if valid <= 0:
        return
    with open(path, "rb") as fh:
        data = fh.read(valid)
    if len(data) != valid:
        raise StoreError(f"{path}: {len(data)} bytes, the state says {valid} (hint: run `chunkyard index`)")
    at = 0
    while at < valid:
        if valid - at < _HEADER.size:
            raise StoreError(f"{path}: a block cut at byte {at} (hint: run `chunkyard index`)")
        magic, n_removed, n_added, dim = _HEADER.unpack_from(data, at)
        at += _HEADER.size
        end = at + 8 * (n_removed + n_added) + 4 * n_added * dim
        if magic != MAGIC or end > valid:
            raise StoreError(
                f"{path}: no journal block at byte {at - _HEADER.size} (hint: run `chunkyard index`)"
            )
        removed = np.frombuffer(data, dtype="<u8", count=n_removed, offset=at).astype(np.uint64)
        at += 8 * n_removed
        keys = np.frombuffer(data, dtype="<u8", count=n_added, offset=at).astype(np.uint64)
        at += 8 * n_added
        vectors = np.frombuffer(data, dtype="<f4", count=n_added * dim, offset=at).astype(np.float32)
        at = end
        yield removed, keys, vectors.reshape(n_added, dim)


class Delta:
    """The journal replayed: the graph's hidden keys and the live added vectors."""

    def __init__(self, dim: int) -> None:
        self.dim = int(dim)
        self.hidden: set[int] = set()  #: keys whose graph node no longer answers
        self.added: dict[int, npt.NDArray[np.float32]] = {}  #: live keys added since the graph was saved
        self._matrix: tuple[npt.NDArray[np.uint64], npt.NDArray[np.float32]] | None = None

    @classmethod
    def read(cls, path: Path, valid: int, dim: int) -> Delta:
        delta = cls(dim)
        for removed, keys, vectors in blocks(path, valid):
            delta.apply(removed, keys, vectors)
        return delta

    def apply(
        self, removed: npt.NDArray[np.uint64], keys: npt.NDArray[np.uint64], vectors: npt.NDArray[np.float32]
    ) -> None:
        for key in removed.tolist():
            self.hidden.add(key)
            self.added.pop(key, None)
        for key, vector in zip(keys.tolist(), vectors, strict=True):
            self.hidden.add(key)
            self.added[key] = vector
        self._matrix = None

    def nearest(self, vector: npt.NDArray[np.float32], k: int) -> list[tuple[int, float]]:
        """``(key, cosine distance)`` of the ``k`` nearest added vectors (exact), nearest first."""
        if not self.added or k <= 0:
            return []
        if self._matrix is None:
            ids = np.fromiter(self.added, dtype=np.uint64, count=len(self.added))
            stacked = np.stack([self.added[int(key)] for key in ids]).astype(np.float32)
            norms = np.linalg.norm(stacked, axis=1, keepdims=True)
            self._matrix = ids, (stacked / np.where(norms == 0, 1, norms)).astype(np.float32)
        keys, matrix = self._matrix
        query = np.asarray(vector, dtype=np.float32)
        query = query / (float(np.linalg.norm(query)) or 1.0)
        distances = 1.0 - matrix @ query
        order = np.argsort(distances, kind="stable")[:k]
        return [(int(keys[i]), float(distances[i])) for i in order]
