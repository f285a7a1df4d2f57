"""Query embedding for a long-lived index handle: concurrent callers, repeated questions.

A ``Searcher`` embeds each query with its embedder's ``embed_query`` (else ``embed``).
In a server answering several queries at once, two things cost more than they need to:

- the default ONNX embedder serialises its calls (one tokenizer per embedder) and runs each
  on a pool of intra-op threads: concurrent queries queue for it, and its threads compete
  with the other queries' Python work for the same cores. ``QueryEmbedder`` keeps one
  embedder per worker instead, each on one thread (they share one ONNX session, built once
  per process and thread cap): one query's embedding runs per core, with no pool to wake.
  Embedders that are not cheap to copy (a sentence-transformers model, a remote API) are
  made once and shared, as before.
- agents and applications ask the same questions again (a retry, the next page, the same
  tool call from another conversation). The vector of a query depends on its text and the
  model only, so the last ``cache_size`` queries' vectors are kept (least recently used
  out); a hit skips the model and returns the same numbers bit for bit.

It passes for the embedder it wraps (``name``, ``dim``, ``normalized``, ``max_tokens``,
``count_tokens``, ``embed``), so the index's identity check sees the model the index was
built with.
"""

from __future__ import annotations

import queue
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

#: Query vectors kept by default (384 floats each for the default model: 1.5 KiB).
DEFAULT_CACHE_SIZE = 4096
#: Thread cap of each worker's embedder: one query's embedding per core.
WORKER_THREADS = 1


class QueryEmbedder:
    """Embedders for ``workers`` concurrent queries, with an LRU of query vectors.

    Args:
        embedders: one or more embedders of the same model; a caller takes a free one.
        cache_size: query vectors kept (0: no cache).
    """

    def __init__(self, embedders: Sequence[Any], cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        if not embedders:
            raise ValueError("QueryEmbedder needs at least one embedder")
        first = embedders[0]
        self._inner = first
        self._free: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for embedder in embedders:
            self._free.put(embedder)
        self.cache_size = cache_size
        self._cache: OrderedDict[str, Any] = OrderedDict()
        self._cache_lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.name = first.name
        self.dim = first.dim
        self.normalized = first.normalized
        self.max_tokens = first.max_tokens

    def count_tokens(self, text: str) -> int:
        count: int = self._inner.count_tokens(text)
        return count

    def embed(self, texts: Sequence[str]) -> Any:
        """Passage vectors (as the wrapped embedder's ``embed``), never cached."""
        return self._with_embedder(lambda e: e.embed(texts))

    def embed_query(self, texts: Sequence[str]) -> Any:
        """Query vectors (the wrapped embedder's ``embed_query`` when it has one), the
        recently asked ones from the cache; rows in the order of ``texts``."""
        import numpy as np

        found: dict[str, Any] = {}
        with self._cache_lock:
            for text in texts:
                vector = self._cache.get(text)
                if vector is not None:
                    self._cache.move_to_end(text)
                    found[text] = vector
            self.hits += sum(1 for text in texts if text in found)
        missing = list(dict.fromkeys(t for t in texts if t not in found))
        if missing:
            fresh = self._with_embedder(lambda e: getattr(e, "embed_query", e.embed)(missing))
            with self._cache_lock:
                self.misses += len(missing)
                for text, row in zip(missing, fresh, strict=True):
                    vector = np.array(row, dtype=np.float32)
                    vector.setflags(write=False)  # shared by every caller that asks again
                    found[text] = vector
                    if self.cache_size:
                        self._cache[text] = vector
                        self._cache.move_to_end(text)
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        return np.stack([found[t] for t in texts]) if texts else np.zeros((0, self.dim), np.float32)

    def warm(self) -> None:
        """Run each embedder once (a tokenizer, a session is made on the first call)."""
        taken = [self._free.get() for _ in range(self._free.qsize())]
        try:
            for embedder in taken:
                getattr(embedder, "embed_query", embedder.embed)(["warm up"])
        finally:
            for embedder in taken:
                self._free.put(embedder)

    def _with_embedder(self, call: Callable[[Any], Any]) -> Any:
        embedder = self._free.get()
        try:
            return call(embedder)
        finally:
            self._free.put(embedder)


def query_embedder(embedder: Any, workers: int, cache_size: int = DEFAULT_CACHE_SIZE) -> QueryEmbedder:
    """A ``QueryEmbedder`` for ``embedder`` (an object, or a spec of ``pipeline.index.embedders``).

    A spec naming the default ONNX embedder gets ``workers`` copies on one thread each (a
    copy is a tokenizer; the session is shared per process); any other embedder is made
    once and shared, with its own thread cap."""
    if not isinstance(embedder, str):
        return QueryEmbedder([embedder], cache_size)
    from pipeline.index.embed_onnx import OnnxEmbedder
    from pipeline.index.embedders import make_embedder

    first = make_embedder(embedder)
    if not isinstance(first, OnnxEmbedder):
        return QueryEmbedder([first], cache_size)
    copies = [make_embedder(embedder, threads=WORKER_THREADS) for _ in range(workers)]
    return QueryEmbedder(copies, cache_size)


__all__ = ("DEFAULT_CACHE_SIZE", "QueryEmbedder", "query_embedder")
