"""Index and search: keep a vector store in sync with the change feed (issue 16).

``embedders`` turns chunk texts into vectors (offline ONNX MiniLM by default); nothing
here imports numpy, onnxruntime or a store until a function that needs it is called.
The package's names load on first use (PEP 562), so importing one of its light modules
(``pipeline.index.expand`` for the CLI's defaults) does not load the query and sync code.
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
