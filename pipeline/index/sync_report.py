"""What one ``chunkyard index`` run did: the report ``pipeline.index.sync.index`` returns."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(slots=True)
class IndexReport:
    """What one ``index`` run did (``schemas/index.schema.json``).

    Attributes:
        added: chunk ids new to the index. ``updated``: ids whose embedded text changed.
        moved: ids whose text is the same but whose place, revision or file moved (no embedding).
        deleted: ids removed. ``redirected``: feed redirects applied (old id gone, new id in).
        embedded: texts sent to the embedder; ``cache_hits``: vectors taken from the cache.
        skipped: touched chunks the index already held exactly.
        truncated: indexed chunks longer than the embedder's window (``max_tokens``):
            only their first ``max_tokens`` wordpieces are embedded.
        full: every chunk file was read (reconcile, a new index, or a lost cursor: ``reason``).
        embedded_on: where the texts were embedded, from the executor's ``summary`` (Ray:
            actors, batches, batches re-sent after a lost actor, texts and device per node);
            empty for a local run.
    """

    store: str
    embed_model: str
    index_hash: str = ""
    cursor: str | None = None
    changes: int = 0
    added: int = 0
    updated: int = 0
    moved: int = 0
    deleted: int = 0
    redirected: int = 0
    embedded: int = 0
    cache_hits: int = 0
    skipped: int = 0
    chunks: int = 0
    truncated: int = 0
    max_tokens: int = 0
    full: bool = False
    reason: str = ""
    reconcile: bool = False
    fixed: dict[str, list[str]] = field(default_factory=dict)
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)
    embedded_on: dict[str, Any] = field(default_factory=dict)
    analyzer: str = ""  #: the BM25 analyzer the index reads and writes with
    analyzer_reason: str = ""  #: why that one (``--lang``, the index's own, or detected)
    embedder_reason: str = ""  #: why that embedder (``--embedder``, the index's own, or the language)
    dense_weight: float = 1.0  #: the dense list's weight against BM25's 1 in the index's hybrid search
    dense_weight_reason: str = ""  #: why that weight (``--dense-weight``, the index's own, or the language's)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
