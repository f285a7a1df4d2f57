"""An on-disk embedding cache for the retrieval bench: a text is embedded once per model, ever.

Chunkers share most of their texts (chunkyard at two budgets, a peer and its variant, the
questions asked again on every rerun), and embedding is the bench's whole cost on a small
CPU (all-MiniLM-L6-v2 int8: about 30 texts a second). ``CachedEmbed`` wraps an embedder:
rows are keyed by ``sha256(model name, NUL, text)`` in one SQLite file (default
``bench/results/embed-cache.sqlite``, never committed), looked up first, and only the
missing texts, each once, go to the model; new rows are committed batch by batch, so an
interrupted run keeps what it paid for.
"""

from __future__ import annotations

import hashlib
import sqlite3
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BATCH = 256  #: texts per model call and per commit
LOOKUP = 500  #: keys per SELECT (under SQLite's variable limit)


class CachedEmbed:
    """``texts → (n, dim) float32`` through the cache; ``model`` has ``name``, ``dim`` and ``embed``."""

    def __init__(self, model: Any, path: Path, quiet: bool = False) -> None:
        import numpy as np

        self.np = np
        self.model = model
        self.name: str = model.name  # the Embedder interface (issue 16), so the real index can use it
        self.dim: int = model.dim
        self.normalized: bool = model.normalized
        self.max_tokens: int = model.max_tokens
        self.count_tokens = model.count_tokens
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, timeout=300)  # parallel bench runs share the file
        self.db.execute("CREATE TABLE IF NOT EXISTS vectors (key BLOB PRIMARY KEY, vec BLOB NOT NULL)")
        self.quiet = quiet
        self.hits = 0
        self.misses = 0
        self.seconds = 0.0

    def key(self, text: str, side: str = "") -> bytes:
        """The row key of ``text`` under this model (``side`` ``query``: as a query, for models
        that embed queries apart, such as E5's ``query: `` prefix)."""
        name = self.name + (f"\0{side}" if side else "")
        return hashlib.sha256(name.encode() + b"\0" + text.encode()).digest()

    def embed(self, texts: Sequence[str]) -> Any:
        """The ``Embedder`` method: the same as calling the cache."""
        return self(texts)

    def embed_query(self, texts: Sequence[str]) -> Any:
        """Queries: the model's ``embed_query`` when it has one (cached apart), else ``embed``."""
        if not hasattr(self.model, "embed_query"):
            return self(texts)
        return self(texts, side="query")

    def __call__(self, texts: Sequence[str], side: str = "") -> Any:
        np = self.np
        keys = [self.key(t, side) for t in texts]
        found: dict[bytes, Any] = {}
        unique = list(dict.fromkeys(keys))
        for i in range(0, len(unique), LOOKUP):
            part = unique[i : i + LOOKUP]
            marks = ",".join("?" * len(part))
            for key, blob in self.db.execute(f"SELECT key, vec FROM vectors WHERE key IN ({marks})", part):
                found[key] = np.frombuffer(blob, dtype=np.float32)
        missing: dict[bytes, str] = {}
        for key, text in zip(keys, texts, strict=True):
            if key not in found and key not in missing:
                missing[key] = text
        self.hits += len(unique) - len(missing)
        self.misses += len(missing)
        todo = list(missing.items())
        started = time.perf_counter()
        for i in range(0, len(todo), BATCH):
            part = todo[i : i + BATCH]
            model_embed = self.model.embed_query if side == "query" else self.model.embed
            vectors = np.asarray(model_embed([t for _, t in part]), dtype=np.float32)
            rows = [(key, vec.tobytes()) for (key, _), vec in zip(part, vectors, strict=True)]
            self.db.executemany("INSERT OR REPLACE INTO vectors VALUES (?, ?)", rows)
            self.db.commit()
            for (key, _), vec in zip(part, vectors, strict=True):
                found[key] = vec
            if not self.quiet and len(todo) > BATCH:
                done = i + len(part)
                rate = done / max(1e-9, time.perf_counter() - started)
                print(f"    embedded {done}/{len(todo)} ({rate:.0f} texts/s)", file=sys.stderr, flush=True)
        self.seconds += time.perf_counter() - started
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([found[k] for k in keys])
