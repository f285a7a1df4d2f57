"""The MCP server of ``chunkyard serve``: tools and resources over one ``IndexHandle``.

Built with the official ``mcp`` SDK (``MCPServer``): served over stdio (``serve --mcp
stdio``, what desktop clients launch) or as streamable HTTP at ``/mcp`` beside the JSON
API. The tools answer what the HTTP routes answer (``pipeline.serve.routes``), through the
same handle and limits; their descriptions are written for a model: what a citation is,
how to cite, how to verify.

Resources: ``chunkyard://documents`` (the documents, with their resource URIs) and
``chunkyard://doc/{+path}`` (one document's canonical text; only documents the chunk
folder's state lists are read, so a path cannot leave the corpus).
"""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

from pipeline._version import __version__
from pipeline.errors import PipelineError
from pipeline.serve.handle import IndexHandle
from pipeline.serve.limits import Limits, ServeError, as_serve_error

INSTRUCTIONS = """\
chunkyard answers questions about a folder of Markdown documents with citable passages.

Workflow: call `search` with the user's question in plain words; read the items' `text`;
answer only from those texts; cite each claim with the citation payload of the item it
comes from (copy the fields as they are: snippet_id, section_id, doc_id, source_url,
offsets, tokens, rev, analyzer, index_hash, and chunk_ids for a passage); then call
`check_citations` with your citations before you answer. A citation that fails tells
you why (`code`) and how to fix it (`fix`). `resolve` shows the exact source lines
behind a snippet_id; `get_chunk` returns the whole chunk record."""

_CITATION = (
    "A citation is the payload of one search item: snippet_id (the chunk_id: a stable address "
    "of the chunk that survives edits elsewhere in the document), section_id, doc_id, source_url, "
    "offsets {start, end, unit: 'char'} into the source file, tokens, rev (the revision of the "
    "document the chunk was cut from: a lock that fails when the source changed) and analyzer, plus "
    "index_hash (which index answered) and, for a passage of several chunks, chunk_ids. Copy these "
    "fields unchanged from the item you quote; never invent or edit them."
)

SEARCH_DOC = f"""Search the documents; returns the best passages for the query, best first.

Each item has `text` (the exact source text to quote), `file` and `lineSpan` (where it is),
`breadcrumb` (its headings), `score_norm` in [0, 1], and its citation payload. {_CITATION}

Args:
    query: the question or keywords, in plain words (no query syntax; at most a few hundred characters).
    k: how many passages (1-50; 5 is usually enough).
    mode: 'hybrid' (default: keywords and meaning), 'bm25' (exact words, names, error messages) or 'dense' (meaning).
    expand: a passage grows around the hit up to this many tokens (0: single chunks).
"""

GET_DOC = """Return one chunk record by any address: a snippet_id/chunk_id, an id like
'doc:guide::ch3', a chunk file name, or an old chunk_id that moved (then `redirected_from`
says so and the record is the chunk it moved to: cite its new chunk_id)."""

RESOLVE_DOC = """Show where a cited chunk is in its source right now: the citation payload
plus `text`, `file`, `lineSpan`, `source_status` ('current': the source still holds the text at
those offsets; 'moved': it holds it elsewhere; 'changed' or 'missing': re-search before citing),
and `lines`: the source lines with `context` lines either side (`inside` marks the chunk's).
Use it to verify a quote or to show the user the exact place."""

CHECK_DOC = """Verify citations before answering. Pass `answer` as {"citations": [payload, ...]}
(or {"segments": [{"text": ..., "citations": [...]}, ...]}, or a bare list of payloads),
each payload copied from a search item. Returns `ok`, `code` ('ok' or the first failure) and
`problems`, each with `code`, `where`, `message` and `fix`: e.g. rev_mismatch (the source
changed: search again), redirected_snippet (cite the new chunk_id it names),
mismatch_index_hash (the index changed since your search: search again), bad_offsets."""


def build_mcp(handle: IndexHandle, limits: Limits) -> MCPServer[Any]:
    """An ``MCPServer`` whose tools and resources answer from ``handle`` within ``limits``."""
    server: MCPServer[Any] = MCPServer(
        "chunkyard",
        instructions=INSTRUCTIONS,
        version=__version__,
        warn_on_duplicate_resources=False,
        log_level="WARNING",
    )
    read_only = ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False)

    def guarded(call: Any) -> Any:
        try:
            return call()
        except (ServeError, PipelineError) as exc:
            error = as_serve_error(exc)
            raise ToolError(f"{error.code}: {error.message}") from None

    @server.tool(name="search", description=SEARCH_DOC, annotations=read_only)
    def search(query: str, k: int = 5, mode: str = "hybrid", expand: int = -1) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            limits.check_search(query, k)
            return handle.search(query, k, mode, None if expand < 0 else expand)

        result: dict[str, Any] = guarded(run)
        return result

    @server.tool(name="get_chunk", description=GET_DOC, annotations=read_only)
    def get_chunk(id: str) -> dict[str, Any]:
        result: dict[str, Any] = guarded(lambda: handle.get(id))
        return result

    @server.tool(name="resolve", description=RESOLVE_DOC, annotations=read_only)
    def resolve(id: str, context: int = 3) -> dict[str, Any]:
        def run() -> dict[str, Any]:
            limits.check_context(context)
            return handle.resolve(id, context)

        result: dict[str, Any] = guarded(run)
        return result

    @server.tool(name="check_citations", description=CHECK_DOC, annotations=read_only)
    def check_citations(
        answer: dict[str, Any] | list[Any], allow_cross_section: bool = False
    ) -> dict[str, Any]:
        result: dict[str, Any] = guarded(
            lambda: handle.check_citations(answer, allow_cross_section=allow_cross_section)
        )
        return result

    @server.resource(
        "chunkyard://documents",
        name="documents",
        description="Every document of the corpus: its path, chunk count and resource URI (JSON).",
        mime_type="application/json",
    )
    def documents() -> list[dict[str, Any]]:
        listed: list[dict[str, Any]] = guarded(lambda: handle.documents(limits.max_documents))
        return listed

    @server.resource(
        "chunkyard://doc/{+path}",
        name="document",
        description="One document's text (canonical: UTF-8, LF line ends), by its corpus-relative path.",
        mime_type="text/markdown",
    )
    def document(path: str) -> str:
        text: str = guarded(lambda: handle.document(path))
        return text

    return server
