"""Approximate dense search: an HNSW graph (usearch) beside the SQLite store (extra ``scale``).

Above a size the brute-force product over every vector costs more than a query should
(and holds every vector in memory); an HNSW graph visits a few thousand of them. The
store stays the truth, and this index is derived from it:

- **Keys** are the store's ``chunks`` rowids (a changed text gets a new row, hence a new
  key; a moved chunk keeps its row and its key). Vectors are kept as int8 in the graph
  (a quarter of float32); the candidates are then scored again with the stored float32
  vectors and vec0's own cosine, so the scores (and the order of what is found) equal
  exact search's; only what is *not* found differs (recall, measured in
  ``docs/benchmarks.md``).
- **Updates** follow the feed: a run removes the keys of the rows it replaced or deleted
  and adds the new ones (no rebuild), then writes the graph to a new file
  (``<store>.hnsw-<generation>``), syncs it, and only then replaces ``<store>.hnsw.json``
  (the state: which file, which store generation) in one rename. A reader uses the graph
  only when that generation equals the store's; a SIGKILL anywhere leaves the state
  naming a whole file, at worst an older one, which readers then ignore (the exact path
  answers) and the next ``chunkyard index`` rebuilds from the store.
- **Readers** map the file (``view``): pages are read as the search touches them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from pipeline.errors import UsageError

if TYPE_CHECKING:
    import numpy.typing as npt

STATE_SUFFIX = ".hnsw.json"
CONNECTIVITY = 16  #: edges per node (usearch's M)
EXPANSION_ADD = 128  #: candidate list while inserting (efConstruction)
EXPANSION_SEARCH = 512  #: candidate list while searching (ef): recall against latency (docs/benchmarks.md)
DTYPE = "i8"
#: Keys removed since the last build, as a share of the graph, past which a run rebuilds it
#: (removed nodes stay in the graph as tombstones that searches step over).
REBUILD_RATIO = 0.1


def _usearch() -> Any:
    try:
        from usearch import index
    except ImportError:
        raise UsageError("the ANN index needs usearch (hint: pip install 'chunkyard[scale]')") from None
    return index


def state_path(store_path: Path) -> Path:
    return store_path.with_name(store_path.name + STATE_SUFFIX)


class HnswIndex:
    """The HNSW graph of the store at ``store_path``: ``apply`` / ``rebuild`` write, ``search`` reads."""

    def __init__(self, store_path: Path, dim: int) -> None:
        self.store_path = Path(store_path)
        self.dim = int(dim)
        self._usearch = _usearch()
        self._view: Any = None
        self._view_file: str | None = None

    # --- state ----------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        try:
            data = orjson.loads(state_path(self.store_path).read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return {}
        if not isinstance(data, dict) or not (self.store_path.parent / str(data.get("file", ""))).is_file():
            return {}
        return data

    def worn(self) -> bool:
        """More keys removed since the last build than ``REBUILD_RATIO`` of the graph."""
        state = self.state()
        return int(state.get("removed", 0)) > REBUILD_RATIO * max(1, int(state.get("count", 0)))

    def generation(self) -> str | None:
        """The store generation the graph reflects (``None``: there is none)."""
        value = self.state().get("generation")
        return None if value is None else str(value)

    def _new(self) -> Any:
        return self._usearch.Index(
            ndim=self.dim,
            metric="cos",
            dtype=DTYPE,
            connectivity=CONNECTIVITY,
            expansion_add=EXPANSION_ADD,
            expansion_search=EXPANSION_SEARCH,
        )

    # --- reading --------------------------------------------------------------------------

    def search(self, vector: npt.NDArray[np.float32], k: int) -> list[int]:
        """The keys (rowids) of about the ``k`` nearest vectors, nearest first."""
        state = self.state()
        if not state or k <= 0:
            return []
        if self._view is None or self._view_file != state["file"]:
            self._view = self._usearch.Index.restore(str(self.store_path.parent / state["file"]), view=True)
            self._view.expansion_search = max(EXPANSION_SEARCH, k)
            self._view_file = state["file"]
        if len(self._view) == 0:
            return []
        found = self._view.search(np.asarray(vector, dtype=np.float32), min(k, len(self._view)))
        return [int(key) for key in found.keys]

    # --- writing --------------------------------------------------------------------------

    def apply(
        self,
        removed: Iterable[int],
        added: tuple[npt.NDArray[np.uint64], npt.NDArray[np.float32]],
        generation: str,
    ) -> None:
        """Remove the keys ``removed``, add ``added`` (keys, vectors), write the next file."""
        state = self.state()
        graph = self._usearch.Index.restore(str(self.store_path.parent / state["file"]))
        graph.expansion_add = EXPANSION_ADD
        gone = np.fromiter((int(k) for k in removed), dtype=np.uint64)
        dropped = int(state.get("removed", 0))
        if len(gone):
            present = gone[np.asarray(graph.contains(gone), dtype=bool).reshape(-1)]
            if len(present):
                graph.remove(present)
                dropped += len(present)
        keys, vectors = added
        if len(keys):
            again = keys[np.asarray(graph.contains(keys), dtype=bool).reshape(-1)]
            if len(again):  # a rowid SQLite gave again (the last row deleted, then an insert)
                graph.remove(again)
            graph.add(keys, vectors, threads=1)
        self._publish(graph, generation, removed=dropped)

    def rebuild(
        self, keys: npt.NDArray[np.uint64], vectors: npt.NDArray[np.float32], generation: str
    ) -> None:
        """A new graph of every stored vector (``chunkyard index`` after a stale state)."""
        graph = self._new()
        if len(keys):
            graph.add(keys, vectors, threads=0)
        self._publish(graph, generation)

    def _publish(self, graph: Any, generation: str, removed: int = 0) -> None:
        old = self.state().get("file")
        name = f"{self.store_path.name}.hnsw-{generation.replace(':', '-')}"  # no colon: Windows
        path = self.store_path.parent / name
        tmp = path.with_name(name + ".tmp")
        graph.save(str(tmp))
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        state = {
            "file": name,
            "generation": generation,
            "count": len(graph),
            "dtype": DTYPE,
            "removed": removed,
        }
        target = state_path(self.store_path)
        with open(target.with_name(target.name + ".tmp"), "wb") as fh:
            fh.write(orjson.dumps(state))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(target.with_name(target.name + ".tmp"), target)
        self._view = None
        if old and old != name:
            (self.store_path.parent / old).unlink(missing_ok=True)

    def remove(self) -> None:
        """Delete the graph and its state."""
        remove(self.store_path)
        self._view = None

    def close(self) -> None:
        self._view = None


def remove(store_path: Path) -> None:
    """Delete the graph of the store at ``store_path`` and its state (no usearch needed)."""
    target = state_path(store_path)
    try:
        name = str(orjson.loads(target.read_bytes()).get("file", ""))
    except (OSError, orjson.JSONDecodeError, AttributeError):
        name = ""
    target.unlink(missing_ok=True)
    if name:
        (store_path.parent / name).unlink(missing_ok=True)
