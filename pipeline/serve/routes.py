"""The HTTP JSON API of ``chunkyard serve`` (FastAPI routes; the OpenAPI document is ``/openapi.json``).

Every answer is JSON. A search answers what ``chunkyard search --json`` prints (004's
retrieval record, 001's citation payload in each item) with the same options and
defaults; ``/v1/chunk`` and ``/v1/resolve`` what ``chunkyard resolve`` finds;
``/v1/check-citations`` what ``chunkyard check-citations --json`` reports.
The routes are plain functions: FastAPI runs them in its thread pool, and the handle
lets ``workers`` of them query at once.
"""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Body, Query, Response
from pydantic import BaseModel, Field

from pipeline._version import __version__
from pipeline.serve.handle import IndexHandle
from pipeline.serve.limits import Limits
from pipeline.serve.metrics import CONTENT_TYPE, Metrics
from pipeline.serve.watching import WriterView

Mode = Literal["hybrid", "dense", "bm25"]
#: What the search routes answer, for the OpenAPI document (they send the bytes themselves).
SEARCH_ANSWER: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "004's retrieval record (schemas/search.schema.json)",
        "content": {"application/json": {"schema": {"type": "object"}}},
    }
}


class SearchBody(BaseModel):
    """``POST /v1/search``: the options of ``chunkyard search``."""

    query: str = Field(description="What to look for (any text; no query syntax).")
    k: int = Field(10, description="How many passages (or chunks) to return.")
    mode: Mode = Field("hybrid", description="hybrid (BM25 + dense, fused by z-score), dense or bm25.")
    expand: int | None = Field(
        None,
        description="Passage budget in tokens (0: plain chunks; absent: the index language's, as the CLI's).",
    )
    no_expand: bool = Field(False, description="Plain chunks, no passages (= expand 0).")


def build_router(
    handle: IndexHandle, limits: Limits, metrics: Metrics, writer: WriterView | None
) -> APIRouter:
    """The ``/v1`` routes, ``/metrics``, over one handle."""
    router = APIRouter()

    def search(query: str, k: int, mode: str, expand: int | None, no_expand: bool) -> Response:
        budget = 0 if no_expand else expand
        limits.check_search(query, k, budget)
        # the record is plain JSON data: serialised as it is, not walked again by FastAPI's encoder
        return Response(orjson.dumps(handle.search(query, k, mode, budget)), media_type="application/json")

    @router.get("/v1/search", tags=["search"], summary="Search (query in the URL)", responses=SEARCH_ANSWER)
    def search_get(
        q: Annotated[str, Query(description="What to look for.")],
        k: Annotated[int, Query(description="How many passages.")] = 10,
        mode: Annotated[Mode, Query(description="hybrid, dense or bm25.")] = "hybrid",
        expand: Annotated[
            int | None,
            Query(description="Passage budget in tokens (0: chunks; absent: the index language's)."),
        ] = None,
        no_expand: Annotated[bool, Query(description="Plain chunks (= expand 0).")] = False,
    ) -> Response:
        """004's retrieval record; each item carries 001's citation payload and its text."""
        return search(q, k, mode, expand, no_expand)

    @router.post(
        "/v1/search", tags=["search"], summary="Search (options in a JSON body)", responses=SEARCH_ANSWER
    )
    def search_post(body: SearchBody) -> Response:
        """The same record as ``GET /v1/search``, for long queries or clients that prefer JSON."""
        return search(body.query, body.k, body.mode, body.expand, body.no_expand)

    @router.get("/v1/chunk", tags=["chunks"], summary="A chunk by any id")
    def chunk(
        id: Annotated[
            str, Query(description="A chunk_id, an id doc:NAME::chN, a chunk file, or a redirected chunk_id.")
        ],
    ) -> dict[str, Any]:
        """The chunk record (as in its chunk file), ``chunk_file``, and ``redirected_from``: the
        stale id asked for when the redirect map sent it to this chunk."""
        return handle.get(id)

    @router.get("/v1/resolve", tags=["chunks"], summary="The source span behind a chunk")
    def resolve(
        id: Annotated[str, Query(description="Any chunk address, as for /v1/chunk.")],
        context: Annotated[int, Query(description="Lines of context before and after.")] = 3,
    ) -> dict[str, Any]:
        """``chunkyard resolve --json``: 001's payload, text, file, lineSpan, source_status, and
        ``lines`` (the chunk's source lines with context; ``inside`` marks the chunk's own)."""
        limits.check_context(context)
        return handle.resolve(id, context)

    @router.post("/v1/check-citations", tags=["citations"], summary="Check an answer's citations")
    def check_citations(
        answer: Annotated[
            dict[str, Any] | list[Any],
            Body(description='The answer: {"citations": [...]}, {"segments": [...]}, or a bare list.'),
        ],
        allow_cross_section: Annotated[
            bool, Query(description="Let one segment cite several sections.")
        ] = False,
    ) -> dict[str, Any]:
        """``chunkyard check-citations --json``: ``ok``, 001's ``code``, and each problem with its fix.
        A failed check is still a 200: the report is the answer."""
        return handle.check_citations(answer, allow_cross_section=allow_cross_section)

    @router.get("/v1/documents", tags=["chunks"], summary="The documents")
    def documents() -> list[dict[str, Any]]:
        """Each document: its corpus-relative path, chunk count and MCP resource URI."""
        return handle.documents(limits.max_documents)

    @router.get("/v1/health", tags=["service"], summary="Is it up, and which index does it serve")
    def health() -> dict[str, Any]:
        """``ok`` while the server answers; the live index's identity; the writer's state
        (``--watch``); ``process``: the id of the server process that answered (``--processes``)."""
        return {
            "ok": True,
            "version": __version__,
            "process": os.getpid(),
            "index": handle.status(),
            "writer": writer.state() if writer is not None else None,
        }

    @router.get("/metrics", tags=["service"], summary="Prometheus metrics")
    def prometheus() -> Response:
        return Response(metrics.text(), media_type=CONTENT_TYPE)

    return router
