"""chunkyard: Markdown → one validated JSON file per chunk, for retrieval-augmented generation.

The Python API (``pipeline.api``), importable from here::

    from pipeline import Policy, chunk_text, chunk_file, ingest, open_chunks, open_index, read_changes, search, update_index

Its names are loaded on first use (PEP 562), so ``import pipeline`` costs next to
nothing and never imports an optional framework (LangChain, LlamaIndex: see
``pipeline.adapters``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline._version import __version__

if TYPE_CHECKING:
    from pipeline.api import (
        Change,
        ChunkFolder,
        Cursor,
        FeedPlan,
        Policy,
        Summary,
        chunk_file,
        chunk_text,
        ingest,
        open_chunks,
        open_index,
        plan_feed,
        read_changes,
        search,
        update_index,
    )

_API = frozenset(
    {
        "Change",
        "ChunkFolder",
        "Cursor",
        "FeedPlan",
        "Policy",
        "Summary",
        "chunk_file",
        "chunk_text",
        "ingest",
        "open_chunks",
        "open_index",
        "plan_feed",
        "read_changes",
        "search",
        "update_index",
    }
)

__all__ = (
    "Change",
    "ChunkFolder",
    "Cursor",
    "FeedPlan",
    "Policy",
    "Summary",
    "__version__",
    "chunk_file",
    "chunk_text",
    "ingest",
    "open_chunks",
    "open_index",
    "plan_feed",
    "read_changes",
    "search",
    "update_index",
)


def __getattr__(name: str) -> Any:
    if name in _API:
        from pipeline import api

        value = getattr(api, name)
        globals()[name] = value  # once loaded, a plain attribute
        return value
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})
