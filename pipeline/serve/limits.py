"""What ``chunkyard serve`` accepts, and how every refusal or failure is told: JSON with a code.

A client (a program or a model) gets ``{"ok": false, "code": ..., "error": ..., "status":
...}`` for anything that goes wrong, never a traceback: ``as_serve_error`` maps each of
chunkyard's errors to a code and an HTTP status, and anything unexpected to ``internal``
(its details go to the server's log only). A chunk file broken on disk is ``broken_chunk``
for a request about that chunk (its file and the fix in the answer and in the log); a search
that merely meets one answers without it (a warning in the record).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from pipeline.errors import PipelineError, UsageError

log = logging.getLogger("chunkyard.serve")


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on one request; the server refuses what exceeds them (status 400, 413 or 503)."""

    max_query_chars: int = 2_000
    max_k: int = 50
    max_expand: int = 4_096
    max_context: int = 50
    max_body_bytes: int = 1 << 20
    max_concurrent: int = 64  #: requests in flight; the next gets 503 ``busy``
    max_documents: int = 10_000  #: entries ``chunkyard://documents`` lists

    def check_search(self, query: str, k: int, expand: int | None = None) -> None:
        if len(query) > self.max_query_chars:
            raise ServeError(
                400,
                "query_too_long",
                f"query of {len(query):,} characters; at most {self.max_query_chars:,} "
                "(hint: ask in a sentence or a few keywords)",
            )
        if not 1 <= k <= self.max_k:
            raise ServeError(400, "bad_k", f"k must be between 1 and {self.max_k}, got {k}")
        if expand is not None and not 0 <= expand <= self.max_expand:
            raise ServeError(
                400, "bad_expand", f"expand must be between 0 and {self.max_expand}, got {expand}"
            )

    def check_context(self, context: int) -> None:
        if not 0 <= context <= self.max_context:
            raise ServeError(
                400, "bad_context", f"context must be between 0 and {self.max_context}, got {context}"
            )


@dataclass(slots=True)
class ServeError(Exception):
    """A refusal or failure as a client sees it."""

    status: int
    code: str
    message: str
    extra: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def body(self) -> dict[str, Any]:
        return {"ok": False, "code": self.code, "error": self.message, "status": self.status, **self.extra}


def as_serve_error(exc: BaseException) -> ServeError:
    """The code and status for one of chunkyard's errors (``internal`` for anything else)."""
    from pipeline.audit.broken import BrokenChunkError
    from pipeline.audit.resolve import UnknownIdError
    from pipeline.index.vector_store import IndexMismatchError
    from pipeline.serve.handle import BadIdError, NoIndexError

    if isinstance(exc, ServeError):
        return exc
    if isinstance(exc, UnknownIdError):
        return ServeError(
            404,
            "unknown_id",
            f"{exc.query}: {exc.reason}",
            {"query": exc.query, "suggestions": exc.suggestions},
        )
    if isinstance(exc, BrokenChunkError):  # the data is at fault, not the request: a 5xx, and logged
        log.warning("chunkyard serve: %s", exc)
        return ServeError(500, "broken_chunk", str(exc), {"file": exc.file})
    if isinstance(exc, BadIdError):
        return ServeError(400, "bad_id", str(exc))
    if isinstance(exc, NoIndexError):
        return ServeError(503, "no_index", str(exc))
    if isinstance(exc, IndexMismatchError):
        return ServeError(409, exc.code, str(exc))
    if isinstance(exc, UsageError):
        return ServeError(400, "bad_request", str(exc))
    if isinstance(exc, PipelineError):
        return ServeError(500, "chunk_folder_error", str(exc))
    return ServeError(500, "internal", "internal error (details in the server's log)")
