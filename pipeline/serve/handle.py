"""``open_index``: one chunk folder's index held open for many queries, in one process.

``pipeline.search()`` opens the index, loads the embedder and reads every vector again
on each call; an application, ``chunkyard serve`` or an agent's tool asks hundreds of
times. An ``IndexHandle`` loads the embedder once and keeps a few ``Searcher``s open
(one per concurrent caller, each with its own SQLite connections), each keeping its
in-memory matrix of vectors across queries. Queries are embedded by a ``QueryEmbedder``
(``pipeline.serve.query_embedder``): one default embedder per worker on one thread each,
and the vectors of recently asked queries kept.

It follows the index while another process writes it (``chunkyard index``, ``watch
--index``, ``serve --watch``): the writer commits a run in one transaction and bumps the
index's ``generation``; a query reads ``generation`` before and after it runs and is run
again when a commit came in between (a sequence lock), so every answer comes from one
committed index, with that index's ``index_hash``, and the writer never waits for
readers (WAL). An index replaced as a file (``index --rebuild`` swaps a new one in) is
seen by its inode and reopened.

``get``, ``resolve`` and ``check_citations`` read the chunk folder as ``chunkyard
resolve`` and ``check-citations`` do: only the chunk files and sources the state names.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from pipeline.audit.chunk_state import ChunkStore
from pipeline.audit.chunk_state import open_store as open_chunk_store
from pipeline.audit.resolve import UnknownIdError, find, resolve
from pipeline.errors import PipelineError, UsageError
from pipeline.index.fusion import MODES
from pipeline.index.query import Searcher
from pipeline.index.vector_store import open_store, store_spec
from pipeline.serve.query_embedder import DEFAULT_CACHE_SIZE, QueryEmbedder, query_embedder

#: A query is run again at most this many times when commits keep landing under it (each
#: run takes milliseconds, a commit comes at most once per save).
MAX_RETRIES = 8
#: Longest id or address ``get`` / ``resolve`` accept (a chunk_id is about 60-200 characters).
MAX_ID_CHARS = 1024


class BadIdError(PipelineError):
    """An address that cannot name a chunk: too long, control characters, ``..`` or an absolute path."""

    code = "bad_id"


class NoIndexError(PipelineError):
    """The chunk folder has no index yet (``serve --watch`` builds it on its first sync)."""

    code = "no_index"


@dataclass(slots=True)
class _Slot:
    """What one concurrent caller uses: a ``Searcher`` and a chunk store, never shared at once."""

    searcher: Searcher | None = None
    inode: int = -1
    chunks: ChunkStore | None = None


def check_address(address: str) -> str:
    """``address`` stripped, or ``BadIdError``: nothing an address names lies outside the chunk
    folder (ids are looked up in the state; files only among the chunk files it lists), and
    these are refused before any lookup so that a client learns why."""
    text = address.strip()
    if not text:
        raise BadIdError("empty id (hint: pass a chunk_id, an id doc:NAME::chN, or a chunk file)")
    if len(text) > MAX_ID_CHARS:
        raise BadIdError(f"id of {len(text)} characters; at most {MAX_ID_CHARS}")
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise BadIdError("id with control characters (hint: pass the chunk_id as search returned it)")
    posix = text.replace("\\", "/")
    if posix.startswith("/") or (len(posix) > 1 and posix[1] == ":") or ".." in posix.split("/"):
        raise BadIdError(
            f"{text[:80]!r}: absolute paths and '..' are not addresses "
            "(hint: a chunk_id, an id doc:NAME::chN, or a chunk file relative to the chunk folder)"
        )
    return text


class IndexHandle:
    """An open index for many queries; thread-safe (up to ``workers`` queries at once).

    Args:
        out: the chunk folder.
        store: the index (``None``: ``OUT/.chunkyard/index.sqlite``; ``lancedb:PATH``).
        corpus: the sources (``None``: the one the chunk folder's state records).
        embedder: an embedder object or spec (``None``: the index's own, made once).
        workers: queries answered at once; a caller beyond waits for a free one.
        expand_tokens: the default passage budget (``chunkyard search --expand``; ``None``: the
            index language's, as the CLI's).
        query_cache: vectors of this many recent queries kept (0: every query is embedded).
        dense_weight: hybrid search's dense weight against BM25's 1 (``chunkyard search
            --dense-weight``; ``None``: the index's, ``language.hybrid_weights``).
    """

    def __init__(
        self,
        out: Path | str,
        store: str | Path | None = None,
        *,
        corpus: Path | str | None = None,
        embedder: Any = None,
        workers: int = 2,
        expand_tokens: int | None = None,
        query_cache: int = DEFAULT_CACHE_SIZE,
        dense_weight: float | None = None,
    ) -> None:
        if workers < 1:
            raise UsageError(f"workers must be at least 1, got {workers}")
        if query_cache < 0:
            raise UsageError(f"query_cache must be 0 (off) or more, got {query_cache}")
        self.out = Path(out)
        self.store = store
        self.corpus = Path(corpus) if corpus is not None else None
        self.expand_tokens = expand_tokens
        self.weights = None if dense_weight is None else (1.0, dense_weight)
        self.kind, self.path = store_spec(self.out, store)
        self._embedder = embedder
        self._query_embedder: QueryEmbedder | None = None
        self._query_cache = query_cache
        self._workers = workers
        self._embedder_lock = threading.Lock()
        self._free: queue.LifoQueue[_Slot] = queue.LifoQueue()
        for _ in range(workers):
            self._free.put(_Slot())
        self._slots = workers
        self._closed = False

    # --- lifecycle -----------------------------------------------------------------------

    def close(self) -> None:
        """Close every searcher (waiting for the queries under way)."""
        self._closed = True
        for _ in range(self._slots):
            slot = self._free.get()
            if slot.searcher is not None:
                slot.searcher.close()
                slot.searcher = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- queries -------------------------------------------------------------------------

    def search(
        self, query: str, k: int = 10, mode: str = "hybrid", expand_tokens: int | None = None
    ) -> dict[str, Any]:
        """004's retrieval record, as ``chunkyard search --json`` prints it, from one committed index.

        Raises:
            UsageError: an unknown mode, ``k`` < 1, a negative budget.
            NoIndexError: there is no index yet.
            IndexMismatchError: the index was built with another embedder or analyzer.
        """
        if mode not in MODES:
            raise UsageError(f"unknown search mode {mode!r} (hint: one of {', '.join(MODES)})")
        if k < 1:
            raise UsageError(f"k must be at least 1, got {k}")
        budget = self.expand_tokens if expand_tokens is None else expand_tokens  # None: the index language's
        if budget is not None and budget < 0:
            raise UsageError(f"expand_tokens must be 0 (off) or more, got {budget}")
        with self._slot() as slot:
            searcher = self._searcher(slot)
            for _ in range(MAX_RETRIES):
                meta = searcher.db.meta()
                searcher.use_meta(meta)
                record = searcher.record(query, k, mode, budget)
                if searcher.db.meta().get("generation") == meta.get("generation"):
                    return record
            return record

    def warm(self) -> bool:
        """Open every worker's searcher and load what its queries read (the vectors, the
        embedders), so that no client waits for it; ``False`` when there is no index yet."""
        taken = [self._free.get() for _ in range(self._slots)]
        try:
            for slot in taken:
                searcher = self._searcher(slot)
                for _ in range(2):  # the store reads its matrix of vectors on a second query
                    searcher.record("warm up", 1, "dense", 0)
        except PipelineError:
            return False
        finally:
            for slot in taken:
                self._free.put(slot)
        if self._query_embedder is not None:
            self._query_embedder.warm()
        return True

    def status(self) -> dict[str, Any]:
        """The live index: ``index_hash``, ``generation``, ``cursor``, chunk count, when it was
        last written, its size on disk (``exists`` false before the first index run)."""
        if not self.path.exists():
            return {"exists": False, "store": str(self.path)}
        try:
            with self._slot() as slot:
                meta = self._searcher(slot).db.meta()
        except NoIndexError:  # the file is there, its first commit is not (serve --watch's first sync)
            return {"exists": False, "store": str(self.path)}
        return {
            "exists": True,
            "store": str(self.path),
            "kind": self.kind,
            "index_hash": meta.get("index_hash", ""),
            "generation": int(meta.get("generation", "0") or 0),
            "cursor": meta.get("cursor", ""),
            "chunks": int(meta.get("chunks", "0") or 0),
            "embed_model": meta.get("embed_model", ""),
            "updated_at": meta.get("updated_at", ""),
            "bytes": _size_on_disk(self.path),
        }

    def index_hash(self) -> str | None:
        """The live index's ``index_hash`` (``None`` before the first index run)."""
        if not self.path.exists():
            return None
        return self.status().get("index_hash") or None

    def get(self, address: str) -> dict[str, Any]:
        """The chunk record an address names (a chunk_id, an id ``doc:NAME::chN``, a chunk file,
        or a stale chunk_id the redirect map sends on), plus ``redirected_from`` (the stale id
        or ``None``) and ``chunk_file``.

        Raises:
            BadIdError: the address cannot name a chunk (``check_address``).
            UnknownIdError: no chunk answers to it (``suggestions`` holds the nearest).
        """
        text = check_address(address)
        with self._slot() as slot:
            chunks = self._chunks(slot)
            location, redirected_from = find(chunks, text)
            record = chunks.read_record(location.file)
        return {"record": record, "chunk_file": location.file, "redirected_from": redirected_from}

    def resolve(self, address: str, context: int = 3) -> dict[str, Any]:
        """``chunkyard resolve --json``: 001's payload plus text, file, lineSpan and the source's
        status, and ``lines``: the chunk's source lines with ``context`` lines either side."""
        text = check_address(address)
        if context < 0:
            raise UsageError(f"context must be 0 or more, got {context}")
        with self._slot() as slot:
            found = resolve(self._chunks(slot), text)
        payload = found.payload()
        payload["lines"] = [
            {"number": r.number, "text": r.text, "inside": r.inside, "mark": [r.mark_start, r.mark_end]}
            for r in found.rows(context)
        ]
        return payload

    def check_citations(self, answer: Any, *, allow_cross_section: bool = False) -> dict[str, Any]:
        """``chunkyard check-citations --json`` for an answer already parsed (a dict with
        ``citations`` or ``segments``, or a bare list of citations)."""
        from pipeline.audit.citations import check_answer

        live = self.index_hash()
        with self._slot() as slot:
            report = check_answer(
                answer,
                self._chunks(slot),
                allow_cross_section=allow_cross_section,
                name="answer",
                live_index_hash=live,
            )
        return report.as_dict()

    def documents(self, limit: int = 10_000) -> list[dict[str, Any]]:
        """The documents the chunk folder holds (at most ``limit``, by path): path, chunk count, resource URI."""
        with self._slot() as slot:
            docs = self._chunks(slot).docs
            found = []
            for rel in sorted(docs)[:limit]:
                entry = docs.get(rel) or {}
                found.append(
                    {"path": rel, "chunks": len(entry.get("files") or []), "uri": f"chunkyard://doc/{rel}"}
                )
        return found

    def document(self, path: str) -> str:
        """The canonical text of a document the chunk folder lists (``UnknownIdError`` otherwise)."""
        rel = check_address(path)
        with self._slot() as slot:
            store = self._chunks(slot)
            if rel not in store.docs:
                raise UnknownIdError(rel, [], "no document has this path (hint: list chunkyard://documents)")
            doc = store.source(rel)
        if doc is None:
            raise UnknownIdError(rel, [], "the document's source is gone or unreadable")
        text: str = doc.text
        return text

    # --- inside --------------------------------------------------------------------------

    @contextmanager
    def _slot(self) -> Iterator[_Slot]:
        if self._closed:
            raise UsageError("the index handle is closed")
        slot = self._free.get()
        try:
            yield slot
        finally:
            self._free.put(slot)

    def _embedder_for(self, meta: Mapping[str, str]) -> QueryEmbedder:
        """One query embedder for every searcher (the model loads once), made from the given
        embedder or the index's spec."""
        with self._embedder_lock:
            if self._query_embedder is None:
                made = self._embedder or meta.get("embed_spec") or "default"
                self._query_embedder = query_embedder(made, self._workers, self._query_cache)
            return self._query_embedder

    def _searcher(self, slot: _Slot) -> Searcher:
        """The slot's searcher, (re)opened when there is none or the index file was replaced."""
        try:
            inode = os.stat(self.path).st_ino
        except OSError:
            inode = -1
        if slot.searcher is not None and inode == slot.inode:
            return slot.searcher
        if slot.searcher is not None:
            slot.searcher.close()
            slot.searcher = None
        if inode == -1:
            raise NoIndexError(
                f"{self.path}: no index yet (hint: `chunkyard index --out {self.out}`, "
                "or wait for serve --watch's first sync)"
            )
        db = open_store(self.out, self.store)
        try:
            meta = db.meta()
        finally:
            db.close()
        if not meta.get("embed_model"):
            raise NoIndexError(f"{self.path}: the index is empty (hint: `chunkyard index --out {self.out}`)")
        embedder = self._embedder_for(meta)
        slot.searcher = Searcher(
            self.out,
            self.store,
            embedder,
            expand_tokens=self.expand_tokens,
            corpus=self.corpus,
            weights=self.weights,
            overlap_lexical=self._slots == 1,  # with more workers, queries fill the cores
        )
        slot.inode = inode
        return slot.searcher

    def _chunks(self, slot: _Slot) -> ChunkStore:
        if slot.chunks is None:
            slot.chunks = open_chunk_store(self.out, self.corpus)
        return slot.chunks


def _size_on_disk(path: Path) -> int:
    """Bytes of the index: the SQLite file and its WAL, or every file of a LanceDB folder."""
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    total = 0
    for part in (path, path.with_name(path.name + "-wal")):
        with suppress(OSError):
            total += part.stat().st_size
    return total


def open_index(out: Path | str, store: str | Path | None = None, **options: Any) -> IndexHandle:
    """Open the index of ``out`` for many queries: ``IndexHandle(out, store, **options)``."""
    return IndexHandle(out, store, **options)


__all__ = ("BadIdError", "IndexHandle", "NoIndexError", "UnknownIdError", "check_address", "open_index")
