"""Index and search: keep a vector store in sync with the change feed, and ask it.

Where things go:

- ``feedplan``: the one feed planner (``plan_feed``) every consumer of the change feed uses:
  this package's sync, the framework syncs of ``pipeline.adapters``, a user's own.
- ``sync``: ``chunkyard index``: plan → drop texts the cache holds and embed the rest
  (``embed_step``, through an ``EmbedExecutor``) → commit rows, cursor and ``index_hash`` in
  one transaction; ``sync_rows`` picks the rows to write and embeds what is new,
  ``sync_report`` is the run's ``IndexReport``. ``rebuild``: a fresh index beside the old
  one, swapped in.
- ``embedders``: the ``Embedder`` protocol and the table of embedders (``register_embedder``);
  ``embed_onnx`` (the offline default), ``embed_st``, ``embed_openai`` implement it.
- ``vector_store``: the ``VectorStore`` protocol and the table of store kinds
  (``register_store``); ``sqlite_store`` (over ``sqlite_db``: the file, its schema and
  transactions, and ``sqlite_vectors``: vec0's tables read as one matrix) and ``lance_store``
  implement it. ``rows``: the row
  and state types they share. ``identity``: what ``index_hash`` covers. ``registry``: the
  table both tables are.
- ``query``: ``chunkyard search`` (``Searcher``); ``fusion`` ranks and normalises scores,
  ``passages`` and ``expand`` merge hits into passages, ``analyzer`` is the BM25 side's.
- ``scale`` (extra ``scale``): indexes derived from the SQLite store for large indexes,
  kept in step at each commit: ``bm25_tantivy`` (pruning BM25, with ``fts_tokens``: FTS5's
  own terms, and ``bm25_exact``: FTS5's scores of its candidates) and ``ann`` (HNSW).

Nothing here imports numpy, onnxruntime or a store until a function that needs it is
called. The package's names load on first use (PEP 562), so importing one of its light
modules (``pipeline.index.expand`` for the CLI's defaults) does not load the query and sync code.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.index.query import Searcher, search
    from pipeline.index.sync import IndexReport, index

__all__ = ["IndexReport", "Searcher", "index", "search"]

_HOME = {"Searcher": "query", "search": "query", "IndexReport": "sync", "index": "sync"}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{_HOME[name]}"), name)
    globals()[name] = value
    return value
