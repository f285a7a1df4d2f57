"""The vector store interface, the table of store kinds, and how ``--store`` picks one.

A store holds, per ``chunk_id``, the vector of the chunk's ``embedText``, the text for
BM25 and the citation payload (``pipeline.index.rows.ChunkRow``). It also keeps an
embedding cache keyed by (embedder name, digest of the embedded text) and a few ``meta``
strings: the feed cursor, the index identity and ``index_hash``. ``commit`` applies one
run's upserts, deletes and meta together: in the SQLite store that is one transaction, so a
reader sees the old index or the new one, never half of each.

Store kinds are registered in ``STORES`` (``register_store``): the built-in ones by
``"module:Class"`` path, so this module never imports them (they import it) and LanceDB
loads only when a LanceDB store is opened. A new engine (another ANN index, a BM25 engine)
implements ``VectorStore`` and registers a ``StoreKind``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pipeline.chunkfolder import STATE_DIR
from pipeline.errors import PipelineError, UsageError
from pipeline.index.analyzer import ANALYZER, LANCE_ANALYZER
from pipeline.index.registry import Registry, resolve
from pipeline.index.rows import ChunkRow, RowState, Vector
from pipeline.run.state import flock_held

DEFAULT_STORE = "index.sqlite"  #: under ``CHUNKS/.chunkyard/``


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
        """Add computed vectors to the cache (the index is untouched); ``cached`` sees them at
        once, the file at once (SQLite) or in groups, by the next commit or ``close`` at the latest
        (LanceDB: ``pipeline.index.cache_group``)."""
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


#: Opens (creating when absent) a store at a path; ``dim`` is the vector length (``None``:
#: the store's own, for reading).
StoreOpener = Callable[[Path, int | None], VectorStore]


@dataclass(frozen=True, slots=True)
class StoreKind:
    """One kind of store ``--store`` may name.

    Attributes:
        name: the ``KIND:`` prefix of ``--store`` (``sqlite``, ``lancedb``).
        opener: a ``StoreOpener``, or its ``"module:attribute"`` path (imported on first use).
        analyzer: the BM25 analyzer the store reads and writes with (part of the index's
            identity, checked before the store is opened).
        suffix: a path ending in it names this kind without a prefix (``.lance``).
    """

    name: str
    opener: str | StoreOpener
    analyzer: str
    suffix: str = ""

    def open(self, path: Path, dim: int | None = None) -> VectorStore:
        opener: StoreOpener = resolve(self.opener) if isinstance(self.opener, str) else self.opener
        return opener(path, dim)


#: Store kinds by ``--store`` prefix; the first registered is the default.
STORES: Registry[StoreKind] = Registry("store kind")


def register_store(kind: StoreKind, *, replace: bool = False) -> None:
    """Make ``kind`` available to ``--store KIND:PATH`` (and to its ``suffix``)."""
    STORES.add(kind.name, kind, replace=replace)


register_store(StoreKind("sqlite", "pipeline.index.sqlite_store:SqliteStore", ANALYZER))
register_store(StoreKind("lancedb", "pipeline.index.lance_store:LanceStore", LANCE_ANALYZER, ".lance"))


def store_spec(out: Path, store: str | Path | None) -> tuple[str, Path]:
    """``(kind, path)`` for ``--store``: ``None`` → the SQLite file in the chunk folder's state.

    ``KIND:PATH`` names a registered kind (``lancedb:PATH``, ``sqlite:PATH``); a path ending
    in a kind's suffix (``.lance``) names that kind; any other path a SQLite file.
    """
    default = STORES.names()[0]
    if store is None or str(store) == "":
        return default, Path(out) / STATE_DIR / DEFAULT_STORE
    text = str(store)
    for name in STORES:
        if text.startswith(name + ":"):
            return name, Path(text[len(name) + 1 :])
    for name in STORES:
        suffix = STORES.get(name).suffix
        if suffix and text.endswith(suffix):
            return name, Path(text)
    return default, Path(text)


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
    return STORES.get(kind).analyzer


def open_at(kind: str, path: Path, *, dim: int | None = None) -> VectorStore:
    """Open (creating when absent) the store of ``kind`` at ``path``."""
    return STORES.get(kind).open(path, dim)


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
