"""chunkyard's Python API: chunk in memory, ingest a corpus, read chunks and the change feed.

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
from typing import Any

from pipeline.adapters.changes import Change, Cursor, read_changes
from pipeline.adapters.folder import ChunkFolder, open_chunks
from pipeline.adapters.records import chunk_records
from pipeline.errors import UsageError
from pipeline.models import Policy
from pipeline.run.ingest import Options, Summary

__all__ = (
    "Change",
    "ChunkFolder",
    "Cursor",
    "Policy",
    "Summary",
    "chunk_file",
    "chunk_text",
    "ingest",
    "open_chunks",
    "read_changes",
)


def chunk_text(text: str, path: str = "doc.md", policy: Policy | None = None) -> list[dict[str, Any]]:
    """Chunk one Markdown text in memory: the records ``chunkyard ingest`` would write, nothing on disk.

    Args:
        text: the Markdown source.
        path: the corpus-relative path the text would have: it names the ids
            (``doc:<path without extension>::ch<N>``, ``chunk_id``) and ``source_url``.
        policy: the chunking policy (default ``Policy()``: 512 tokens, 64 overlap, cl100k_base).

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
