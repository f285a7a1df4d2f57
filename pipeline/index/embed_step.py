"""The index's embed step: drop texts the vector cache holds, embed the rest in batches, cache each.

Embedding is the costly part of ``chunkyard index``; where it runs is an ``EmbedExecutor``:
given the embedder and the batches, it yields each batch embedded, in any order, as soon as
it is done. ``LocalEmbedExecutor`` runs them one after the other in this process; another
(Ray actors, a GPU) only has to implement ``run``. Whatever the executor, each yielded batch
is committed to the cache before the next is taken, so a killed run keeps the vectors it
computed and the searchable index is not touched yet.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from pipeline.errors import UsageError
from pipeline.index.embedders import Embedder
from pipeline.index.rows import Vector

if TYPE_CHECKING:
    import numpy

#: Texts per batch; the cache is committed after each (a killed run loses at most one
#: batch of embedding work). ``CHUNKYARD_INDEX_BATCH`` overrides it.
EMBED_BATCH = 128
BATCH_ENV = "CHUNKYARD_INDEX_BATCH"

#: ``on_progress(stage, done, total)``: stage ``plan``, ``embed`` or ``commit``.
Progress = Callable[[str, int, int], None]


def batch_size_from_env() -> int:
    """``CHUNKYARD_INDEX_BATCH``, else ``EMBED_BATCH``.

    Raises:
        UsageError: the variable is set to something other than a whole number >= 1.
    """
    raw = os.environ.get(BATCH_ENV, "")
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    if raw:
        raise UsageError(f"{BATCH_ENV}={raw!r}: expected a whole number of texts >= 1")
    return EMBED_BATCH


@dataclass(frozen=True, slots=True)
class EmbedBatch:
    """Texts to embed, each with the digest of its text (the cache key), in the same order."""

    digests: tuple[str, ...]
    texts: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class EmbeddedBatch:
    """An ``EmbedBatch`` done: ``vectors[i]`` and ``tokens[i]`` (``count_tokens``) for ``digests[i]``."""

    digests: tuple[str, ...]
    vectors: numpy.ndarray
    tokens: tuple[int, ...]


class EmbedExecutor(Protocol):
    """Where the embed step runs: embeds batches with an embedder (or one made alike elsewhere)."""

    def run(self, embedder: Embedder, batches: Sequence[EmbedBatch]) -> Iterator[EmbeddedBatch]:
        """Embed every batch; yield each one done, in any order, as soon as it is.

        An executor that runs the model elsewhere makes it from ``embedder``'s spec
        (``getattr(embedder, "spec", embedder.name)``); its vectors must equal the local ones.
        Raising stops the step: batches yielded before are cached, the index is untouched.
        """
        ...


class LocalEmbedExecutor:
    """The batches one after the other, in this process."""

    def run(self, embedder: Embedder, batches: Sequence[EmbedBatch]) -> Iterator[EmbeddedBatch]:
        for batch in batches:
            vectors = embedder.embed(list(batch.texts))
            tokens = tuple(int(embedder.count_tokens(text)) for text in batch.texts)
            yield EmbeddedBatch(batch.digests, vectors, tokens)


class EmbedCache(Protocol):
    """The store's embedding cache, keyed by (embedder name, digest of the embedded text)."""

    def cached(self, model: str, digests: Collection[str]) -> dict[str, tuple[Vector, int]]: ...

    def put_cache(self, model: str, entries: Mapping[str, tuple[Vector, int]]) -> None: ...


@dataclass(slots=True)
class Embedded:
    """What the step gives back.

    Attributes:
        vectors: digest → (vector, length in the embedder's units), for every digest asked.
        cache_hits: texts asked for (one per row) whose vector the cache held.
        embedded: distinct texts sent to the embedder.
    """

    vectors: dict[str, tuple[Vector, int]] = field(default_factory=dict)
    cache_hits: int = 0
    embedded: int = 0


def embed_uncached(
    cache: EmbedCache,
    embedder: Embedder,
    texts: Sequence[tuple[str, str]],
    *,
    executor: EmbedExecutor | None = None,
    batch_size: int | None = None,
    on_progress: Progress | None = None,
) -> Embedded:
    """Vectors for ``texts`` (``(digest, text)`` pairs, one per row): from the cache, or embedded.

    The texts the cache lacks are embedded once each, shortest first (a batch pads to near
    its own longest text), in batches of ``batch_size`` (default ``batch_size_from_env()``).
    """
    model = embedder.name
    result = Embedded(cache.cached(model, {digest for digest, _ in texts}))
    result.cache_hits = sum(1 for digest, _ in texts if digest in result.vectors)
    missing: dict[str, str] = {}
    for digest, text in texts:
        if digest not in result.vectors:
            missing.setdefault(digest, text)
    ordered = sorted(missing.items(), key=lambda item: len(item[1]))
    size = batch_size or batch_size_from_env()
    batches = [
        EmbedBatch(tuple(d for d, _ in part), tuple(t for _, t in part))
        for part in (ordered[i : i + size] for i in range(0, len(ordered), size))
    ]
    if on_progress:
        on_progress("embed", 0, len(ordered))
    for done in (executor or LocalEmbedExecutor()).run(embedder, batches):
        entries = {digest: (done.vectors[j], done.tokens[j]) for j, digest in enumerate(done.digests)}
        cache.put_cache(model, entries)
        result.vectors.update(entries)
        result.embedded += len(done.digests)
        if on_progress:
            on_progress("embed", result.embedded, len(ordered))
    return result
