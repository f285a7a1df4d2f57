"""The scale indexes of the SQLite store: BM25 on Tantivy and HNSW for dense, kept in step.

Both are derived from the store (``pipeline.index.bm25_tantivy``, ``pipeline.index.ann``)
and used only above a size: BM25 where FTS5 starts to cost a query more CPU than the rest of a
search, dense where the brute-force product stops meeting the latency goal; below them exact
search is as fast and exactly right.

- **When**: ``CHUNKYARD_SCALE`` = ``auto`` (the default: each index from its threshold on,
  ``BM25_MIN_CHUNKS`` / ``ANN_MIN_CHUNKS`` indexed chunks, when the extra ``scale`` is
  installed), ``on`` (both, at any size: the extra is then required) or ``off`` (neither;
  existing ones are removed by the next ``chunkyard index``).
- **Sync** (``ScaleSync``, called by ``chunkyard index`` around the store's commit): before
  it, the rowids of the rows the run replaces or deletes are read; after it, those rows
  leave each index and the new rows go in, and the index records the store's new
  ``generation``. An index whose generation is not the one the store had before the run
  (a run killed between the two commits, a new index, a threshold just crossed) is rebuilt
  from the store instead.
- **Search** (``ScaleSearch``): an index answers only while its generation equals the
  store's; otherwise the store's exact ranker does (still right, only slower) and the
  record's ``warnings`` say so.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import UsageError
from pipeline.index.rows import ChunkRow, Vector
from pipeline.index.scale_reader import StoreReader, stamp
from pipeline.index.vector_store import TIE_MARGIN, StoreError, best_first

SCALE_ENV = "CHUNKYARD_SCALE"
MODES = ("auto", "on", "off")
#: From this many chunks on, BM25 runs on Tantivy (``auto``): from about here FTS5's ``bm25()``,
#: which scores every chunk holding any word of the question, costs a query more CPU than the
#: rest of a hybrid search, and CPU a query bounds what many clients of ``serve`` get
#: (docs/index.md, docs/benchmarks.md).
BM25_MIN_CHUNKS = 10_000
#: Past this many chunks without the extra ``scale``, ``chunkyard index`` suggests it (below,
#: exact search still meets the one-query latency goal).
EXTRA_HINT_CHUNKS = 50_000
#: From this many chunks on, dense search runs on the HNSW graph (``auto``).
ANN_MIN_CHUNKS = 100_000
#: The graph is asked for this many times ``k + TIE_MARGIN`` candidates; they are scored
#: again with the stored float32 vectors and cut at k (more did not raise recall: the
#: search's ``ef`` does).
ANN_OVERFETCH = 1


def scale_mode() -> str:
    mode = os.environ.get(SCALE_ENV, "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise UsageError(f"{SCALE_ENV}={mode!r}: expected one of {', '.join(MODES)}")
    return mode


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def wanted(chunks: int) -> tuple[bool, bool]:
    """(BM25 on Tantivy, HNSW) for an index of ``chunks`` chunks under ``CHUNKYARD_SCALE``.

    Raises:
        UsageError: ``on`` without the extra.
    """
    mode = scale_mode()
    if mode == "off":
        return False, False
    if mode == "on":
        for module in ("tantivy", "usearch"):
            if not _importable(module):
                raise UsageError(
                    f"{SCALE_ENV}=on needs {module} (hint: pip install 'chunkyard[scale]', or unset {SCALE_ENV})"
                )
        return True, True
    return (
        chunks >= BM25_MIN_CHUNKS and _importable("tantivy"),
        chunks >= ANN_MIN_CHUNKS and _importable("usearch"),
    )


#: The largest index each store was measured at (``make bench-search-scale``,
#: docs/benchmarks.md): past it ``chunkyard index`` warns.
MEASURED_MAX = {"sqlite-vec+scale": 1_000_000, "lancedb": 42_354}


def range_warning(kind: str, chunks: int) -> str | None:
    """What ``chunkyard index`` says when the store has passed the size it was measured at."""
    if kind == "lancedb" and chunks > MEASURED_MAX["lancedb"]:
        return (
            f"{chunks} chunks: the LanceDB store was measured up to {MEASURED_MAX['lancedb']} "
            "(hint: the default SQLite store with the extra 'scale' holds more; docs/index.md)"
        )
    if kind == "sqlite-vec":
        missing = missing_extra(chunks)
        if missing is not None:
            return missing
        if chunks > MEASURED_MAX["sqlite-vec+scale"]:
            return (
                f"{chunks} chunks: past the largest index measured with the scale indexes "
                f"({MEASURED_MAX['sqlite-vec+scale']}; docs/index.md): search may be slower than documented"
            )
    return None


def missing_extra(chunks: int) -> str | None:
    """A warning when the index is past a threshold but the extra is not installed."""
    if scale_mode() != "auto" or chunks < EXTRA_HINT_CHUNKS:
        return None
    if _importable("tantivy") and (chunks < ANN_MIN_CHUNKS or _importable("usearch")):
        return None
    return (
        f"{chunks} chunks: past the size where exact BM25 and dense search stay fast "
        "(hint: pip install 'chunkyard[scale]' for the pruning BM25 and the HNSW index)"
    )


def scale_sync(kind: str, path: Path, dim: int, report: Any) -> ScaleSync | None:
    """The sync of the scale indexes for a run on the store ``kind`` at ``path`` (``None`` for
    LanceDB, which has its own FTS); a store past its measured range adds a warning to ``report``."""
    if kind != "sqlite":
        warning = range_warning(kind, int(report.chunks))
        if warning is not None:
            report.warnings.append(warning)
        return None
    if path.name.endswith(".rebuild"):  # ``--rebuild``'s fresh store: they follow it once swapped in
        return None
    from pipeline.index import ann, bm25_tantivy

    exists = bm25_tantivy.folder_for(path).exists() or ann.state_path(path).exists()
    if not exists and wanted(int(report.chunks)) == (False, False):
        warning = range_warning("sqlite-vec", int(report.chunks))
        if warning is not None:
            report.warnings.append(warning)
        return None  # nothing to keep in step: no cost for an index below the thresholds
    return ScaleSync(path, dim, report)


def settle_scale(kind: str, path: Path, report: Any) -> None:
    """After ``--rebuild`` swapped a fresh store in: build its scale indexes (the old ones
    name another store's stamp, so search ignores them until then)."""
    if kind != "sqlite" or not path.exists():
        return
    reader = StoreReader(path)
    try:
        meta = {str(k): str(v) for k, v in reader.conn.execute("SELECT key, value FROM meta")}
    finally:
        reader.close()
    sync = scale_sync(kind, path, int(meta.get("dim", "0") or 0), report)
    if sync is not None and meta.get("dim"):
        sync.settle(meta)


class ScaleSync:
    """``chunkyard index``'s side: ``before`` the store's commit, ``after`` it (or ``settle``
    when the run had nothing to commit)."""

    def __init__(self, store_path: Path, dim: int, report: Any = None) -> None:
        self.store_path = Path(store_path)
        self.dim = int(dim)
        self.report = report  #: an ``IndexReport``: its ``warnings`` get the range warning
        self.rebuilt: list[str] = []  #: which indexes this run rebuilt
        self.seconds: dict[str, float] = {}  #: each index's apply or rebuild wall time (for benchmarks)

    def before(
        self, upserts: Sequence[tuple[ChunkRow, Vector | None]], deletes: Collection[str]
    ) -> dict[str, int]:
        """The rowids of the rows this commit replaces (a new text) or deletes."""
        if not self.store_path.exists():
            return {}
        replaced = {row.chunk_id for row, vector in upserts if vector is not None} | set(deletes)
        reader = StoreReader(self.store_path)
        try:
            return reader.rowids(replaced)
        finally:
            reader.close()

    def after(
        self,
        old: Mapping[str, int],
        upserts: Sequence[tuple[ChunkRow, Vector | None]],
        meta: Mapping[str, str],
        stored: Mapping[str, str],
    ) -> None:
        """Bring both indexes to the store's new ``meta``: the run's changes when an index
        reflects ``stored`` (the store's meta before the run), else a rebuild."""
        previous = stamp(stored)
        changed = [(row, vector) for row, vector in upserts if vector is not None]
        reader = StoreReader(self.store_path)
        try:
            new = reader.rowids([row.chunk_id for row, _ in changed])
            self._sync(reader, meta, previous, old, changed, new)
        finally:
            reader.close()

    def settle(self, meta: Mapping[str, str]) -> None:
        """A run with nothing to commit: rebuild a stale index, remove an unwanted one."""
        reader = StoreReader(self.store_path)
        try:
            self._sync(reader, meta, None, {}, [], {}, current=stamp(meta))
        finally:
            reader.close()

    def _sync(
        self,
        reader: StoreReader,
        meta: Mapping[str, str],
        previous: str | None,
        old: Mapping[str, int],
        changed: Sequence[tuple[ChunkRow, Vector | None]],
        new: Mapping[str, int],
        current: str | None = None,
    ) -> None:
        from pipeline.index import ann, bm25_tantivy

        generation = stamp(meta)
        chunks = int(meta.get("chunks", "0") or 0)
        use_bm25, use_ann = wanted(chunks)
        warning = range_warning("sqlite-vec", chunks)
        if warning is not None and self.report is not None:
            self.report.warnings.append(warning)
        folder = bm25_tantivy.folder_for(self.store_path)
        if not use_bm25:
            bm25_tantivy.remove(folder)
        else:
            lexical = bm25_tantivy.TantivyBm25(folder)
            try:
                have = lexical.generation()
                if current is not None and have == current:
                    pass
                elif previous is not None and have == previous and not lexical.worn():
                    started = time.perf_counter()
                    added = reader.bodies([new[row.chunk_id] for row, _ in changed if row.chunk_id in new])
                    lexical.apply(old.values(), added, generation, chunks=chunks)
                    self.seconds["bm25_apply"] = time.perf_counter() - started
                else:
                    started = time.perf_counter()
                    lexical.rebuild(reader.texts(), generation, chunks=chunks)
                    self.rebuilt.append("bm25")
                    self.seconds["bm25_rebuild"] = time.perf_counter() - started
            finally:
                lexical.close()
        if not use_ann:
            ann.remove(self.store_path)
            return
        graph = ann.HnswIndex(self.store_path, self.dim)
        have = graph.generation()
        if current is not None and have == current:
            if not graph.state().get("vectors"):  # an index saved before graphs had vectors files
                graph.attach_vectors(*reader.vectors(self.dim))
            return
        started = time.perf_counter()
        if previous is not None and have == previous and not graph.worn():
            rows = [(new[row.chunk_id], vector) for row, vector in changed if row.chunk_id in new]
            keys = np.asarray([k for k, _ in rows], dtype=np.uint64)
            vectors = np.asarray([v for _, v in rows], dtype=np.float32).reshape(len(rows), self.dim)
            graph.apply(old.values(), (keys, vectors), generation)
            self.seconds["ann_apply"] = time.perf_counter() - started
        else:
            keys, vectors = reader.vectors(self.dim)
            graph.rebuild(keys, vectors, generation)
            self.rebuilt.append("ann")
            self.seconds["ann_rebuild"] = time.perf_counter() - started


def open_scale_search(kind: str, store_path: Path, dim: int) -> ScaleSearch | None:
    """The scale indexes of a SQLite store for a ``Searcher`` (``None``: there are none)."""
    from pipeline.index import ann, bm25_tantivy

    if kind != "sqlite-vec":
        return None
    if (
        not (bm25_tantivy.folder_for(store_path) / bm25_tantivy.STATE).exists()
        and not ann.state_path(store_path).exists()
    ):
        return None
    return ScaleSearch(store_path, dim)


class ScaleSearch:
    """``Searcher``'s side: BM25 and dense through the scale indexes while they are current.

    ``lexical`` / ``dense`` return ``None`` when the index is absent or behind the store
    (the caller then asks the store) and set ``stale`` when it is behind.
    """

    def __init__(self, store_path: Path, dim: int) -> None:
        from pipeline.index import ann, bm25_tantivy

        self.store_path = Path(store_path)
        # dense's; BM25 may run in another thread. Not memory-mapped: the candidates' vectors
        # come from the graph's vectors file, and a mapped store's pages would stay resident
        self.reader = StoreReader(self.store_path)
        self.lexical_reader = StoreReader(self.store_path)  # apsw connections are not shared across threads
        self.stale: set[str] = set()
        folder = bm25_tantivy.folder_for(self.store_path)
        self._bm25 = bm25_tantivy.TantivyBm25(folder) if (folder / bm25_tantivy.STATE).exists() else None
        state = ann.state_path(self.store_path)
        self._ann = ann.HnswIndex(self.store_path, dim) if state.exists() and dim else None

    @property
    def active(self) -> bool:
        return self._bm25 is not None or self._ann is not None

    def _current(self, have: str | None, name: str, reader: StoreReader) -> bool:
        if have is not None and have == reader.generation():
            return True
        self.stale.add(name)
        return False

    def lexical(self, terms: Sequence[str], k: int) -> list[tuple[str, float]] | None:
        """FTS5's BM25 of Tantivy's candidates (``TantivyBm25.exact``), read from the store in
        one snapshot: its generation, statistics, rows and ids."""
        if self._bm25 is None:
            return None
        with self.lexical_reader.conn:
            found = self._lexical(self._bm25, terms, k)
        return found

    def _lexical(self, bm25: Any, terms: Sequence[str], k: int) -> list[tuple[str, float]] | None:
        reader = self.lexical_reader
        have = bm25.generation()
        if not self._current(have, "bm25", reader):
            return None
        hits = bm25.exact(reader.conn, terms, k + TIE_MARGIN, str(have))
        if hits is None:
            self.stale.add("bm25")
            return None
        ids = reader.ids([rowid for rowid, _ in hits])
        return best_first([(ids[r], s) for r, s in hits if r in ids], k)

    def counts(self, phrase: tuple[str, ...]) -> int | None:
        """Rows holding ``phrase``, counted by the BM25 index while it is at the store's
        generation (FTS5's count, without reading every match); ``None`` otherwise."""
        if self._bm25 is None:
            return None
        have = self._bm25.generation()
        if have is None or have != self.lexical_reader.generation():
            return None
        return self._bm25.frequency(phrase)

    def dense(self, vector: Vector, k: int) -> list[tuple[str, float]] | None:
        if self._ann is None or not self._current(self._ann.generation(), "ann", self.reader):
            return None
        try:
            keys = self._ann.search(vector, ANN_OVERFETCH * (k + TIE_MARGIN))
        except StoreError:  # a journal the state does not describe: the store answers
            self.stale.add("ann")
            return None
        exact = self._ann.exact(keys)
        scored = self.reader.cosine_of(exact, vector)
        rest = [key for key in keys if key not in exact]  # journalled keys: read from the store
        return best_first(scored + (self.reader.cosine(rest, vector) if rest else []), k)

    def warnings(self) -> list[str]:
        """What the last query's ``stale`` means for the user (and ``stale`` cleared)."""
        names = {"bm25": "the BM25 index (Tantivy)", "ann": "the ANN index (HNSW)"}
        stale, self.stale = self.stale, set()
        return [
            f"{names[n]} is behind the store (a run is updating it, or was interrupted): exact search answered "
            "(hint: run `chunkyard index` to bring it up to date)"
            for n in sorted(stale)
        ]

    def close(self) -> None:
        if self._bm25 is not None:
            self._bm25.close()
        if self._ann is not None:
            self._ann.close()
        self.reader.close()
        self.lexical_reader.close()
