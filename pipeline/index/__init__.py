"""Index and search: keep a vector store in sync with the change feed (issue 16).

``embedders`` turns chunk texts into vectors (offline ONNX MiniLM by default); nothing
here imports numpy, onnxruntime or a store until a function that needs it is called.
"""

from pipeline.index.query import Searcher, search
from pipeline.index.sync import IndexReport, index

__all__ = ["IndexReport", "Searcher", "index", "search"]
