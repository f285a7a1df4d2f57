"""The exact float32 vectors of an HNSW graph's keys, in a file beside the graph, read by ``pread``.

The graph holds int8 vectors; its candidates are scored again with the stored float32
vectors, so that their scores equal exact search's (``pipeline.index.ann``). In the store a
vector sits inside a vec0 block of about a thousand vectors, one blob spread over hundreds of
overflow pages: reaching one vector walks that page chain. Through a memory map the walk is
cheap but every page it touches stays resident in the searcher, whose RSS then grows toward
the whole vector table; through read calls it costs hundreds of reads a candidate. Here a
vector is one ``pread`` at a known offset and nothing is mapped: the searcher's memory holds
the keys alone (8 bytes a vector), and the vectors read stay in the shared page cache.

- **Layout**: ``MAGIC``, two little-endian ``uint32`` (dimensions, zero) and a ``uint64``
  (vectors); the keys (``uint64``, ascending); the vectors (``float32``, row by row, in the
  keys' order). The bytes of each vector are the store's, copied.
- **Writing**: to a temporary name, synced, renamed; ``ann.HnswIndex`` names the file in the
  graph's state only after that, so a state never names a partial file.
- **Meaning**: the file holds the vectors of the keys the graph was saved with. A key the
  journal hides (removed, or a rowid given again) is not answered from here: its vector, if
  it is live, comes from the journal or the store.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pipeline.index.vector_store import StoreError

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping, Sequence

    import numpy.typing as npt

MAGIC = b"CYV1"
SUFFIX = ".f32"
_HEADER = struct.Struct("<4sIIQ")
_ROWS = 65_536  #: vectors copied at a time while a file is written


def _sync_rename(tmp: Path, path: Path) -> None:
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write(path: Path, keys: npt.NDArray[np.uint64], vectors: npt.NDArray[np.float32]) -> None:
    """The file of ``keys`` and their ``vectors`` (any order; written in key order), synced."""
    keys = np.asarray(keys, dtype=np.uint64)
    order = np.argsort(keys, kind="stable")
    dim = int(vectors.shape[1]) if len(keys) else 0
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(_HEADER.pack(MAGIC, dim, 0, len(keys)))
        fh.write(np.ascontiguousarray(keys[order], dtype="<u8").tobytes())
        fh.writelines(
            np.ascontiguousarray(vectors[order[at : at + _ROWS]], dtype="<f4").tobytes()
            for at in range(0, len(order), _ROWS)
        )
    _sync_rename(tmp, path)


def merge(
    old: Path, path: Path, hidden: Collection[int], added: Mapping[int, npt.NDArray[np.float32]], dim: int
) -> None:
    """The file at ``path``: ``old``'s vectors less the ``hidden`` keys, plus ``added`` (a
    compaction: the graph's journal folded in), streamed (the old vectors are never all in memory)."""
    before = ExactVectors(old)
    try:
        if before.dim not in (0, dim):
            raise StoreError(f"{old}: vectors of {before.dim} dimensions, the index has {dim}")
        gone = np.fromiter(hidden, dtype=np.uint64, count=len(hidden))
        kept = np.flatnonzero(~np.isin(before.keys, gone))
        new_keys = np.fromiter(added, dtype=np.uint64, count=len(added))
        keys = np.concatenate([before.keys[kept], new_keys])
        source = np.concatenate([kept.astype(np.int64), -1 - np.arange(len(new_keys), dtype=np.int64)])
        order = np.argsort(keys, kind="stable")
        fresh = np.stack([added[int(k)] for k in new_keys]).astype("<f4") if len(new_keys) else None
        old_rows = (
            np.memmap(old, dtype="<f4", mode="r", offset=before.data_at, shape=(len(before.keys), dim))
            if len(before.keys)
            else None
        )
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as fh:
            fh.write(_HEADER.pack(MAGIC, dim, 0, len(keys)))
            fh.write(np.ascontiguousarray(keys[order], dtype="<u8").tobytes())
            for at in range(0, len(order), _ROWS):
                picked = source[order[at : at + _ROWS]]
                rows = np.empty((len(picked), dim), dtype="<f4")
                from_old = picked >= 0
                if old_rows is not None and from_old.any():
                    rows[from_old] = old_rows[picked[from_old]]
                if fresh is not None and (~from_old).any():
                    rows[~from_old] = fresh[-1 - picked[~from_old]]
                fh.write(rows.tobytes())
        del old_rows
    finally:
        before.close()
    _sync_rename(tmp, path)


class ExactVectors:
    """A vectors file opened for reading: its keys in memory, each vector read on demand."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        try:
            head = os.pread(self._fd, _HEADER.size, 0)
            if len(head) != _HEADER.size:
                raise StoreError(f"{self.path}: no vectors header (hint: run `chunkyard index`)")
            magic, self.dim, _, count = _HEADER.unpack(head)
            if magic != MAGIC:
                raise StoreError(f"{self.path}: not a vectors file (hint: run `chunkyard index`)")
            self.data_at = _HEADER.size + 8 * count
            if os.fstat(self._fd).st_size != self.data_at + 4 * self.dim * count:
                raise StoreError(f"{self.path}: cut short (hint: run `chunkyard index`)")
            raw = os.pread(self._fd, 8 * count, _HEADER.size)
            self.keys: npt.NDArray[np.uint64] = np.frombuffer(raw, dtype="<u8").astype(np.uint64)
        except BaseException:
            os.close(self._fd)
            raise

    def read(self, keys: Sequence[int]) -> dict[int, bytes]:
        """The stored bytes of each of ``keys`` the file holds."""
        if not len(self.keys) or not keys:
            return {}
        wanted = np.asarray(keys, dtype=np.uint64)
        at = np.minimum(np.searchsorted(self.keys, wanted), len(self.keys) - 1)
        width = 4 * self.dim
        return {
            int(key): os.pread(self._fd, width, self.data_at + int(i) * width)
            for key, i in zip(wanted.tolist(), at.tolist(), strict=True)
            if int(self.keys[i]) == key
        }

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
