"""Vectors handed to LanceDB's ``put_cache`` and not written yet: its cache is written in groups.

Each LanceDB write is a table version and a data file, whatever its size. A run with embedders
returning many small batches (a Ray cluster) therefore writes them in groups: when ``GROUP``
vectors wait, or when the oldest has waited ``SECONDS`` (seen at the next ``put_cache``), and
always before the run's commit and at ``close``. A killed run loses at most those seconds of
embedding, never the index. The SQLite store writes each batch as it comes (its transactions
are cheap, and a run's progress shows in its file); ``Entries`` is its cache rows' shape too.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping

from pipeline.index.rows import Vector

GROUP = 4096  #: vectors that make a write due at once
SECONDS = 0.5  #: how long the oldest waiting vector may wait for the next ``put_cache``

#: (model, digest) → (vector, length in the embedder's units)
Entries = dict[tuple[str, str], tuple[Vector, int]]


class WaitingVectors:
    """The vectors of ``put_cache`` calls not written yet, and when the oldest came."""

    def __init__(self) -> None:
        self._entries: Entries = {}
        self._since = 0.0

    def add(self, model: str, entries: Mapping[str, tuple[Vector, int]]) -> bool:
        """Hold ``entries``; True when a write is due (``GROUP`` waiting, or ``SECONDS`` passed)."""
        if not self._entries:
            self._since = time.monotonic()
        self._entries.update(((model, digest), entry) for digest, entry in entries.items())
        return len(self._entries) >= GROUP or time.monotonic() - self._since >= SECONDS

    def found(self, model: str, digests: Collection[str]) -> dict[str, tuple[Vector, int]]:
        """Those of ``digests`` waiting under ``model`` (a ``cached`` call sees them too)."""
        if not self._entries:
            return {}
        return {d: self._entries[(model, d)] for d in digests if (model, d) in self._entries}

    def take(self) -> Entries:
        """Every waiting entry, now the caller's to write (a failed write is not tried again)."""
        entries, self._entries = self._entries, {}
        return entries
