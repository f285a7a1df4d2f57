"""chunkyard's Python API: chunk in memory, ingest a corpus, read chunks and the change feed.

A consumer of its own (another vector store, a cache) follows the feed with ``plan_feed``:
from its cursor and what it holds, the chunks to upsert and the ids to delete, by the same
rule the index and the framework adapters follow.

Everything here is also importable from ``pipeline`` itself (``from pipeline import
chunk_text``), loaded on first use so that ``import pipeline`` stays cheap. The
framework adapters live in ``pipeline.adapters.langchain`` and
``pipeline.adapters.llamaindex`` (optional extras).

Example:
    >>> from pipeline import Policy, chunk_text
    >>> records = chunk_text("# Title\\n\\nSome text.\\n", policy=Policy(target_tokens=256))
    >>> records[0]["chunk_id"]
    'doc|r=...|s=1|p=000|b=000'
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.adapters.changes import Change, Cursor, read_changes
from pipeline.adapters.folder import ChunkFolder, open_chunks
from pipeline.adapters.records import chunk_records
from pipeline.errors import UsageError
from pipeline.index.feedplan import FeedPlan, plan_feed
from pipeline.models import Policy
from pipeline.run.ingest import Options, Summary

if TYPE_CHECKING:
    from pipeline.index.sync import IndexReport
    from pipeline.serve.handle import IndexHandle

__all__ = (
    "Change",
    "ChunkFolder",
    "Cursor",
    "FeedPlan",
    "Policy",
    "Summary",
    "chunk_file",
    "chunk_text",
    "ingest",
    "open_chunks",
    "open_index",
    "plan_feed",
    "read_changes",
    "search",
    "update_index",
)


def chunk_text(text: str, path: str = "doc.md", policy: Policy | None = None) -> list[dict[str, Any]]:
    """Chunk one Markdown text in memory: the records ``chunkyard ingest`` would write, nothing on disk.

    Args:
        text: the Markdown source.
        path: the corpus-relative path the text would have: it names the ids
            (``doc:<path without extension>::ch<N>``, ``chunk_id``) and ``source_url``.
        policy: the chunking policy (default ``Policy()``: 256 tokens, 64 overlap, cl100k_base).

    Returns:
        One chunk record (a dict, as in a chunk file) per chunk, in reading order.

    Raises:
        StageError: the text cannot be chunked (nesting too deep, for example).
    """
    return chunk_records(text, path, policy)


def chunk_file(
    path: Path | str, root: Path | str | None = None, policy: Policy | None = None
) -> list[dict[str, Any]]:
    """Chunk one Markdown file in memory (strict UTF-8, as ``ingest`` reads it).

    Args:
        path: the file.
        root: the corpus folder its ids are relative to (default: the file's folder).
        policy: the chunking policy (default ``Policy()``).

    Returns:
        One chunk record per chunk, in reading order.

    Raises:
        StageError: the file is unreadable, not UTF-8, binary, too big or too nested.
    """
    from pipeline.stages.normalize import read_source

    file = Path(path)
    base = Path(root) if root is not None else file.parent
    try:
        rel = file.resolve().relative_to(base.resolve()).as_posix()
    except ValueError:
        raise UsageError(
            f"{file}: not inside {base} (hint: pass the corpus folder that holds it as root)"
        ) from None
    raw = read_source(file, rel)
    return chunk_records(raw, rel, policy)


def ingest(corpus: Path | str, out: Path | str, **options: Any) -> Summary:
    """Chunk a corpus folder into a chunk folder, as ``chunkyard ingest CORPUS --out OUT`` does.

    Incremental: only documents that changed since the last run are chunked again, and
    the change feed says which chunks moved.

    Args:
        corpus: the folder of Markdown files.
        out: the chunk folder (created if needed).
        **options: ``policy`` (a ``Policy``), ``jobs`` (worker processes, default 1),
            ``full`` (re-chunk everything), ``exclude`` (globs), ``max_bytes``, ``wait``
            (for another run's lock), ``doc_timeout`` (seconds), ``doc_memory_mb``.

    Returns:
        What the run did (``summary.as_dict()`` is ``--json``'s summary); documents that
        failed are listed in ``summary.failures`` (the run goes on without them).

    Raises:
        UsageError: a bad option, a missing corpus, or an output that cannot be written.
    """
    from pipeline.run.ingest import ingest as run_ingest

    fields = set(Options.__dataclass_fields__) - {"corpus", "out"}
    unknown = sorted(set(options) - fields)
    if unknown:
        raise UsageError(
            f"ingest: unknown option(s) {', '.join(unknown)} (hint: one of {', '.join(sorted(fields))})"
        )
    if "exclude" in options:
        options["exclude"] = tuple(options["exclude"])
    return run_ingest(Options(corpus=Path(corpus), out=Path(out), **options))


def update_index(
    out: Path | str,
    store: str | Path | None = None,
    embedder: str | None = None,
    *,
    reconcile: bool = False,
    executor: str = "local",
    address: str | None = None,
    batch_size: int = 0,
    actors: int = 0,
    cpus_per_actor: int = 0,
    num_gpus: float = 0.0,
    device: str = "cpu",
) -> IndexReport:
    """Bring the search index of the chunk folder ``out`` up to date: ``chunkyard index``.

    Follows the change feed from the cursor the index holds, embedding only chunks whose
    embedded text it has never seen (extra ``index``: the SQLite store and the offline ONNX
    embedder). ``reconcile=True`` compares the whole store with the chunk files and repairs
    any difference.

    Args:
        out: the chunk folder (``ingest``'s ``out``).
        store: the index (default: ``OUT/.chunkyard/index.sqlite``; ``lancedb:PATH`` for LanceDB).
        embedder: a spec for ``pipeline.index.embedders.make_embedder`` (``None``: the index's
            own, or the offline default for a new index).
        reconcile: compare the whole store with the chunk files and repair any difference.
        executor: ``local`` (this process) or ``ray``: the texts embedded by a pool of Ray
            actors (extra ``ray``), the writes kept here; ``address``, ``batch_size``,
            ``actors``, ``cpus_per_actor`` and ``num_gpus`` as ``chunkyard index`` takes them.
        device: ``cpu``, ``cuda`` (a ``UsageError`` where no GPU can be used) or ``auto``
            (the GPU where one can be used, else the CPU, with a warning).

    Returns:
        What was added, updated, moved, deleted, redirected and embedded, and the ``index_hash``.
    """
    import warnings

    from pipeline.index.batches import EmbedExecution
    from pipeline.index.embed_ray import make_executor
    from pipeline.index.sync import index as run_index

    def on_note(message: str) -> None:
        warnings.warn(message, stacklevel=3)

    execution = EmbedExecution(executor, address, batch_size, actors, cpus_per_actor, num_gpus, device)
    remote = make_executor(execution, on_note)
    try:
        return run_index(
            out,
            store,
            embedder,
            reconcile=reconcile,
            executor=remote,
            device=device,
            batch_size=batch_size or None,
            on_note=on_note,
        )
    finally:
        if remote is not None:
            remote.close()


def search(
    out: Path | str, query: str, k: int = 10, mode: str = "hybrid", store: str | Path | None = None
) -> dict[str, Any]:
    """Ask the index of ``out``: 004's retrieval result record, like ``chunkyard search --json``.

    Args:
        out: the chunk folder whose index to ask (built by ``index``).
        query: any text (FTS5 syntax in it is taken literally).
        k: how many chunks to return.
        mode: ``hybrid`` (reciprocal rank fusion of BM25 and dense), ``dense`` or ``bm25``.
        store: the index, as for ``index``.

    Returns:
        The record; each of its ``items`` carries 001's citation payload and the chunk's text.
    """
    from pipeline.index.query import search as run_search

    return run_search(out, query, k=k, mode=mode, store=store)


def open_index(
    out: Path | str, store: str | Path | None = None, *, corpus: Path | str | None = None, workers: int = 2
) -> IndexHandle:
    """Open the index of ``out`` once for many queries: ``.search()``, ``.get()``, ``.resolve()``.

    The embedder loads once and the vectors stay in memory; each answer comes from one
    committed index (a run of ``index`` or ``watch --index`` in another process is seen at
    the next query, never half of it). Thread-safe: ``workers`` queries run at once.

    Args:
        out: the chunk folder whose index to ask (built by ``update_index``).
        store: the index, as for ``update_index``.
        corpus: the sources (default: the one the chunk folder records).
        workers: queries answered at once (each holds its own connections).

    Returns:
        An ``IndexHandle``; close it (or use ``with``) when done.
    """
    from pipeline.serve.handle import open_index as open_handle

    return open_handle(out, store, corpus=corpus, workers=workers)
