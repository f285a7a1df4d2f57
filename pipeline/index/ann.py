"""Approximate dense search: an HNSW graph (usearch) beside the SQLite store (extra ``scale``).

Above a size the brute-force product over every vector costs more than a query should
(and holds every vector in memory); an HNSW graph visits a few thousand of them. The
store stays the truth, and this index is derived from it:

- **Keys** are the store's ``chunks`` rowids (a changed text gets a new row, hence a new
  key; a moved chunk keeps its row and its key). Vectors are kept as int8 in the graph
  (a quarter of float32); the candidates are then scored again with the stored float32
  vectors and vec0's own cosine, so the scores (and the order of what is found) equal
  exact search's; only what is *not* found differs (recall, measured in
  ``docs/benchmarks.md``). Those float32 vectors are read from a copy beside the graph
  (``pipeline.index.ann_vectors``, one ``pread`` each: nothing of the store is mapped into
  the searcher), written with each graph file; a graph without one (an older index) gets it
  from the next ``chunkyard index`` and meanwhile reads them from the store.
- **Updates** follow the feed without rewriting the graph: a run's removed keys (the rows it
  replaced or deleted) and added vectors are appended to the graph's journal
  (``pipeline.index.ann_journal``), synced, and only then is ``<store>.hnsw.json`` (the
  state: which graph file, how many journal bytes are valid, which store generation)
  replaced in one rename. Past ``JOURNAL_MAX_KEYS`` journalled keys a run compacts: the
  graph is loaded, the journal and the run applied to it, and it is saved to a new file
  (``<store>.hnsw-<generation>``, synced) named by the next state.
  A reader uses the graph only when the state's generation equals the store's; a SIGKILL
  anywhere leaves the state naming a whole graph and a whole journal prefix, at worst an
  older generation, which readers then ignore (the exact path answers) and the next
  ``chunkyard index`` rebuilds.
- **Late vectors** (a compaction's) are inserted at ``EXPANSION_ADD_EXISTING``, far wider than
  a fresh build's ``EXPANSION_ADD``: a vector inserted into a graph of near-duplicate clusters
  at the fresh build's breadth finds mostly one cluster's members, whose full edge lists drop
  it, and searches rarely reach it (``docs/benchmarks.md``). The wider search costs several
  times more a vector; a compaction inserts about ``JOURNAL_MAX_KEYS`` of them, a fresh build
  every vector, so only the compaction pays it and a fresh build keeps its breadth.
- **Readers** map the file (``view``): pages are read as the search touches them. The
  journal's removed keys hide their nodes (the graph is asked for that many more
  candidates) and its added vectors are scored exactly beside the graph's candidates.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from pipeline.errors import UsageError
from pipeline.index import ann_journal, ann_vectors

if TYPE_CHECKING:
    import numpy.typing as npt

STATE_SUFFIX = ".hnsw.json"
CONNECTIVITY = 16  #: edges per node (usearch's M)
EXPANSION_ADD = 128  #: candidate list while a fresh graph is built (efConstruction)
#: Candidate list while a compaction inserts the journal's vectors into an existing graph: wider
#: than a near-duplicate cluster of that graph, so that a late vector's search gets past it to
#: the neighbours that will link back to it (``EXPANSION_ADD`` leaves many unreachable).
EXPANSION_ADD_EXISTING = 2048
EXPANSION_SEARCH = 8192  #: candidate list while searching (ef): recall against latency (docs/benchmarks.md)
DTYPE = "i8"
#: Keys removed since the last build, as a share of the graph, past which a run rebuilds it
#: (removed nodes stay in the graph as tombstones that searches step over).
REBUILD_RATIO = 0.1
#: Keys journalled since the graph was saved (removed plus added) past which a run compacts:
#: a reader hides and scores that many beside the graph, a compaction rewrites the file.
JOURNAL_MAX_KEYS = 4096


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
        self._delta: ann_journal.Delta | None = None
        self._delta_at: tuple[str, int] | None = None
        self._exact: ann_vectors.ExactVectors | None = None
        self._exact_file: str | None = None

    # --- state ----------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        try:
            data = orjson.loads(state_path(self.store_path).read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return {}
        if not isinstance(data, dict) or not (self.store_path.parent / str(data.get("file", ""))).is_file():
            return {}
        if data.get("journal"):  # its valid bytes must all be there (the file may hold more)
            try:
                size = (self.store_path.parent / str(data["journal"])).stat().st_size
            except OSError:
                return {}
            if size < int(data.get("journal_bytes", 0)):
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

    def _journal(self, state: dict[str, Any]) -> ann_journal.Delta:
        """The state's journal replayed (kept while the state names the same bytes)."""
        name, valid = str(state.get("journal", "")), int(state.get("journal_bytes", 0))
        if self._delta is None or self._delta_at != (name, valid):
            path = self.store_path.parent / name
            self._delta = (
                ann_journal.Delta.read(path, valid, self.dim) if name else ann_journal.Delta(self.dim)
            )
            self._delta_at = (name, valid)
        return self._delta

    def search(self, vector: npt.NDArray[np.float32], k: int) -> list[int]:
        """The keys (rowids) of about the ``k`` nearest vectors (the graph's and the journal's
        candidates: up to ``2 k``), nearest first by their (int8 or exact) distance."""
        state = self.state()
        if not state or k <= 0:
            return []
        if self._view is None or self._view_file != state["file"]:
            self._view = self._usearch.Index.restore(str(self.store_path.parent / state["file"]), view=True)
            self._view.expansion_search = max(EXPANSION_SEARCH, k)
            self._view_file = state["file"]
        delta = self._journal(state)
        query = np.asarray(vector, dtype=np.float32)
        found = delta.nearest(query, k)
        if len(self._view):
            # every hidden node could rank above the live ones: ask for that many more
            count = min(k + len(delta.hidden), len(self._view))
            matches = self._view.search(query, count)
            live = [
                (int(key), float(d))
                for key, d in zip(matches.keys, matches.distances, strict=True)
                if int(key) not in delta.hidden
            ]
            found += live[:k]
        return [key for key, _ in sorted(found, key=lambda hit: hit[1])]

    def exact(self, keys: list[int]) -> dict[int, bytes]:
        """The stored float32 bytes of those of ``keys`` the graph's vectors file answers for
        (not those the journal hides: a removed key or a rowid given again); the others'
        are the store's to read."""
        state = self.state()
        name = str(state.get("vectors", ""))
        if not name or not (self.store_path.parent / name).is_file():
            return {}
        if self._exact is None or self._exact_file != name:
            self.close_exact()
            self._exact = ann_vectors.ExactVectors(self.store_path.parent / name)
            self._exact_file = name
        hidden = self._journal(state).hidden
        return self._exact.read([key for key in keys if key not in hidden])

    def close_exact(self) -> None:
        if self._exact is not None:
            self._exact.close()
        self._exact, self._exact_file = None, None

    def keys(self) -> set[int]:
        """Every live key: the graph's, less those the journal hides, plus those it adds."""
        state = self.state()
        if not state:
            return set()
        graph = self._usearch.Index.restore(str(self.store_path.parent / state["file"]), view=True)
        delta = self._journal(state)
        return ({int(key) for key in graph.keys} - delta.hidden) | set(delta.added)

    # --- writing --------------------------------------------------------------------------

    def apply(
        self,
        removed: Iterable[int],
        added: tuple[npt.NDArray[np.uint64], npt.NDArray[np.float32]],
        generation: str,
    ) -> None:
        """Remove the keys ``removed``, add ``added`` (keys, vectors): appended to the journal,
        or, past ``JOURNAL_MAX_KEYS``, the graph compacted into the next file."""
        state = self.state()
        gone = np.fromiter((int(k) for k in removed), dtype=np.uint64)
        keys, vectors = added
        vectors = np.asarray(vectors, dtype=np.float32).reshape(len(keys), self.dim)
        journalled = int(state.get("journal_keys", 0)) + len(gone) + len(keys)
        dropped = int(state.get("removed", 0)) + len(gone)
        if journalled > JOURNAL_MAX_KEYS:
            self._compact(state, gone, keys, vectors, generation, dropped)
            return
        name = str(state.get("journal") or state["file"] + ".journal")
        valid = ann_journal.append(
            self.store_path.parent / name, int(state.get("journal_bytes", 0)), gone, keys, vectors
        )
        self._write_state(
            {**state, "generation": generation, "removed": dropped, "journal": name,
             "journal_bytes": valid, "journal_keys": journalled}
        )  # fmt: skip

    def _compact(
        self,
        state: dict[str, Any],
        gone: npt.NDArray[np.uint64],
        keys: npt.NDArray[np.uint64],
        vectors: npt.NDArray[np.float32],
        generation: str,
        dropped: int,
    ) -> None:
        """The graph loaded, the journal and this run applied, saved to the next file."""
        delta = self._journal(state)
        delta.apply(gone, keys, vectors)
        graph = self._usearch.Index.restore(str(self.store_path.parent / state["file"]))
        graph.expansion_add = EXPANSION_ADD_EXISTING
        hidden = np.fromiter(delta.hidden, dtype=np.uint64, count=len(delta.hidden))
        if len(hidden):
            present = hidden[np.asarray(graph.contains(hidden), dtype=bool).reshape(-1)]
            if len(present):
                graph.remove(present)
        if delta.added:
            new_keys = np.fromiter(delta.added, dtype=np.uint64, count=len(delta.added))
            graph.add(new_keys, np.stack([delta.added[int(k)] for k in new_keys]), threads=0)
        name = self._file_name(generation)
        exact_file = ""
        if state.get("vectors") and (self.store_path.parent / str(state["vectors"])).is_file():
            exact_file = name + ann_vectors.SUFFIX
            ann_vectors.merge(
                self.store_path.parent / str(state["vectors"]), self.store_path.parent / exact_file,
                delta.hidden, delta.added, self.dim,
            )  # fmt: skip
        self._publish(graph, generation, removed=dropped, vectors=exact_file)

    def rebuild(
        self, keys: npt.NDArray[np.uint64], vectors: npt.NDArray[np.float32], generation: str
    ) -> None:
        """A new graph of every stored vector (``chunkyard index`` after a stale state), added
        in one batch on every core."""
        graph = self._new()
        if len(keys):
            graph.add(keys, vectors, threads=0)
        name = self._file_name(generation) + ann_vectors.SUFFIX
        ann_vectors.write(self.store_path.parent / name, keys, vectors)
        self._publish(graph, generation, vectors=name)

    def attach_vectors(self, keys: npt.NDArray[np.uint64], vectors: npt.NDArray[np.float32]) -> None:
        """Give a graph saved without its vectors file (an older index) one: ``keys`` and
        ``vectors`` are every stored row's (the journal's keys among them do no harm: a
        reader does not ask the file for a key the journal hides)."""
        state = self.state()
        if not state or state.get("vectors"):
            return
        name = str(state["file"]) + ann_vectors.SUFFIX
        ann_vectors.write(self.store_path.parent / name, keys, vectors)
        self._write_state({**state, "vectors": name})

    def _file_name(self, generation: str) -> str:
        return f"{self.store_path.name}.hnsw-{generation.replace(':', '-')}"  # no colon: Windows

    def _publish(self, graph: Any, generation: str, removed: int = 0, vectors: str = "") -> None:
        """Save ``graph`` to the generation's file and name it in the state (journal empty),
        with its vectors file (``vectors``, already written; empty: none)."""
        old = self.state()
        name = self._file_name(generation)
        path = self.store_path.parent / name
        tmp = path.with_name(name + ".tmp")
        graph.save(str(tmp))
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        (path.parent / (name + ".journal")).unlink(missing_ok=True)  # a killed run's, past no state
        self._write_state(
            {"file": name, "generation": generation, "count": len(graph), "dtype": DTYPE, "removed": removed,
             "journal": "", "journal_bytes": 0, "journal_keys": 0, "vectors": vectors}
        )  # fmt: skip
        self._view = None
        self._delta, self._delta_at = None, None  # a compaction folded (and changed) the replayed journal
        self.close_exact()
        for leftover in (old.get("file"), old.get("journal"), old.get("vectors")):
            if leftover and leftover not in (name, vectors):
                (self.store_path.parent / str(leftover)).unlink(missing_ok=True)

    def _write_state(self, state: dict[str, Any]) -> None:
        target = state_path(self.store_path)
        with open(target.with_name(target.name + ".tmp"), "wb") as fh:
            fh.write(orjson.dumps(state))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(target.with_name(target.name + ".tmp"), target)

    def remove(self) -> None:
        """Delete the graph and its state."""
        self.close_exact()
        remove(self.store_path)
        self._view = None

    def close(self) -> None:
        self._view = None
        self.close_exact()


def remove(store_path: Path) -> None:
    """Delete the graph of the store at ``store_path`` and its state (no usearch needed)."""
    target = state_path(store_path)
    try:
        name = str(orjson.loads(target.read_bytes()).get("file", ""))
    except (OSError, orjson.JSONDecodeError, AttributeError):
        name = ""
    target.unlink(missing_ok=True)
    if name:
        for suffix in ("", ".journal", ann_vectors.SUFFIX):
            (store_path.parent / (name + suffix)).unlink(missing_ok=True)
