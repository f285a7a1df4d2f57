"""The rows one ``chunkyard index`` run writes, each with its vector: kept, cached or embedded.

A row whose embedded text is unchanged keeps its stored vector (a move: no embedding); the
rest go to the embed step (``pipeline.index.embed_step``) through the run's executor, and
the report counts what was added, updated, moved, skipped, cached and embedded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.index.batches import BatchRejectedError, Say
from pipeline.index.embed_step import EmbedExecutor, Progress, embed_uncached
from pipeline.index.embedders import EmbedderError
from pipeline.index.feedplan import FeedPlan
from pipeline.index.rows import ChunkRow, RowState, Vector
from pipeline.index.sync_report import IndexReport
from pipeline.index.vector_store import VectorStore


@dataclass(frozen=True, slots=True)
class Embedding:
    """How this run embeds: the executor (``None``: here), the local device, the batch size."""

    executor: EmbedExecutor | None = None
    device: str = "cpu"
    batch_size: int | None = None
    on_note: Say | None = None


def state_of(row: ChunkRow) -> RowState:
    """The state the store keeps of ``row`` (what the planner compares with the chunk files)."""
    return RowState(row.file, row.hash, row.digest, row.row_digest, row.model_tokens, row.policy_hash)


def rows_to_write(
    db: VectorStore,
    embedder: Any,
    plan: FeedPlan[RowState],
    report: IndexReport,
    how: Embedding,
    on_progress: Progress | None,
) -> list[tuple[ChunkRow, Vector | None]]:
    """Rows to write with their vectors: cached, computed (and cached at once), or kept
    (``None``: the text did not change, the stored vector stays)."""
    todo: list[ChunkRow] = []  #: rows whose stored vector does not fit
    upserts: list[tuple[ChunkRow, Vector | None]] = []
    for cid, chunk in plan.upserts.items():
        row = ChunkRow.from_record(chunk.record, chunk.file)
        known = plan.held.get(cid)
        if known is not None and known.digest == row.digest:
            row = row.with_tokens(known.model_tokens)
            if known.row_digest == row.row_digest:
                report.skipped += 1
                continue
            report.moved += 1
            report.fixed.setdefault("stale", []).append(cid)
            upserts.append((row, None))
            continue
        if known is None:
            report.added += 1
            report.fixed.setdefault("missing", []).append(cid)
        else:
            report.updated += 1
            report.fixed.setdefault("stale", []).append(cid)
        todo.append(row)
    try:
        done = embed_uncached(
            db,
            embedder,
            [(r.digest, r.embed_text) for r in todo],
            executor=how.executor,
            batch_size=how.batch_size,
            on_progress=on_progress,
        )
    except BatchRejectedError as exc:
        raise EmbedderError(rejected_message(exc, todo)) from None
    finally:
        report.embedded_on = dict(getattr(how.executor, "summary", None) or {})
    report.cache_hits, report.embedded = done.cache_hits, done.embedded
    for r in todo:
        vector, tokens = done.vectors[r.digest]
        upserts.append((r.with_tokens(tokens), vector))
    if not report.reconcile:
        report.fixed.clear()
    return upserts


def rejected_message(exc: BatchRejectedError, todo: list[ChunkRow]) -> str:
    """The message for a batch the embedder refused: its chunk ids, the reason, what to do."""
    digests = set(exc.digests)
    ids = sorted(r.chunk_id for r in todo if r.digest in digests)
    shown = ", ".join(ids[:10]) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
    return (
        f"the embedder refused a batch of {len(ids)} chunk(s) ({shown}): {exc.reason} "
        "(hint: fix or shorten those chunks, or use another --embedder; the index is unchanged, "
        "and the vectors embedded so far are cached for the next run)"
    )
