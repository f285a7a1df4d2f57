"""``chunkyard index``: apply the change feed to the store, from the cursor kept in the store.

One run:

1. **Plan** with the feed planner every consumer shares (``pipeline.index.feedplan``): the
   chunks to upsert, the ids to delete, the redirects, from the feed after the store's cursor
   and what the store holds. Each live chunk is written unless the stored row equals it. With
   ``reconcile``, on a new index, or when the feed no longer reaches the cursor, the plan is
   full: every chunk file, and what the store holds beyond them is deleted.
2. **Embed** only the texts no vector is known for (``pipeline.index.embed_step``, through an
   ``EmbedExecutor``): the cache is keyed by (embedder name, digest of ``embedText``), so a
   moved chunk, a redirect, a renamed document or an mtime reset costs nothing. The executor
   is this process (on ``device``) or a pool of Ray actors (``pipeline.index.embed_ray``).
   Computed vectors are committed to the cache batch by batch as they come back: a killed
   run keeps them, the searchable index is not touched yet.
3. **Commit** the upserts, deletes, the new cursor and ``index_hash`` in one transaction.
   Until then readers see the previous index whole; a failure anywhere leaves it as it was.

One writer per store (a lock file beside it); a second run waits, or fails at once with
``wait=False``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.chunkfolder import STATE_DIR
from pipeline.errors import UsageError
from pipeline.index.batches import Say
from pipeline.index.embed_step import EmbedExecutor, Progress
from pipeline.index.feedplan import FeedPlan, plan_feed
from pipeline.index.identity import (
    FORMAT,
    check_compatible,
    embedder_config,
    index_hash,
    rebuild_hint,
    summarize,
)
from pipeline.index.language import Choice, choose, embedder_for, hybrid_weights, require
from pipeline.index.rebuild import rebuild_beside
from pipeline.index.rows import ChunkRow, RowState, Vector
from pipeline.index.scale import scale_sync, settle_scale
from pipeline.index.sync_report import IndexReport
from pipeline.index.sync_rows import Embedding, rows_to_write, state_of
from pipeline.index.vector_store import VectorStore, analyzer_of, open_at, store_lock, store_spec

__all__ = ["IndexReport", "index", "index_embedder"]


def index(
    out: Path | str,
    store: str | Path | None = None,
    embedder: Any = None,
    *,
    reconcile: bool = False,
    rebuild: bool = False,
    wait: bool = True,
    on_progress: Progress | None = None,
    on_wait: Callable[[str], None] | None = None,
    executor: EmbedExecutor | None = None,
    device: str = "cpu",
    batch_size: int | None = None,
    on_note: Say | None = None,
    lang: str | None = None,
    dense_weight: float | None = None,
) -> IndexReport:
    """Bring the index of the chunk folder ``out`` up to date with its change feed.

    Args:
        out: the chunk folder (``ingest``'s ``--out``).
        store: ``--store`` (``None``: ``OUT/.chunkyard/index.sqlite``).
        embedder: an ``Embedder``, a ``make_embedder`` spec, or ``None`` (the index's own
            embedder, else the default offline model).
        reconcile: compare the index with every chunk file and repair what differs.
        rebuild: build a new index beside the old one (another embedder, say) and swap it in.
        wait: wait for another run holding the store's lock (else fail at once).
        executor: where texts are embedded (default: in this process, batch after batch;
            ``pipeline.index.embed_ray.make_executor`` makes the Ray one).
        device: ``cpu``, ``cuda`` or ``auto`` for a model made here (``pipeline.index.device``);
            a Ray executor resolves its own device in each actor.
        batch_size: texts per batch (``None``: ``embed_step``'s default).
        on_note: told what the user should know that is no error (``--device auto`` falling
            back to the CPU).
        lang: ``--lang``: the corpus's language, which picks the BM25 analyzer of a new index
            (``None`` or ``auto``: the index's own, else detected; ``pipeline.index.language``).
        dense_weight: ``--dense-weight``: hybrid search's dense weight against BM25's 1, kept in
            the index for every reader (``None``: the index's own, else the language's). A run
            that changes only the weight commits it (a new generation), nothing else.

    Raises:
        IndexMismatchError: the embedder or analyzer differs from the index's.
        UsageError: no chunk folder, another writer (with ``wait=False``), missing extras.
        StoreError: the store cannot be written (locked, full disk); nothing changed.
    """
    out = Path(out)
    if not (out / STATE_DIR).is_dir():
        raise UsageError(f"{out}: not a chunk folder (hint: run `chunkyard ingest CORPUS --out {out}` first)")
    kind, path = store_spec(out, store)
    how = Embedding(executor, "cpu" if executor is not None else device, batch_size, on_note)
    with store_lock(path, wait=wait, on_wait=on_wait):
        if rebuild:
            return _rebuild(out, store, kind, path, embedder, on_progress, how, lang, dense_weight)
        return _run(
            out, store, kind, path, embedder, reconcile=reconcile, on_progress=on_progress, how=how, lang=lang,
            dense_weight=dense_weight,
        )  # fmt: skip


def _run(
    out: Path,
    store_arg: str | Path | None,
    kind: str,
    path: Path,
    embedder: Any,
    *,
    reconcile: bool,
    on_progress: Progress | None,
    how: Embedding,
    lang: str | None = None,
    dense_weight: float | None = None,
) -> IndexReport:
    """One run on the store at ``path``: plan, embed what is new, commit (module docstring).
    The analyzer and, for a new index, the embedder follow the language (``pipeline.index.language``)."""
    started = time.perf_counter()
    stored = _stored_meta(kind, path)
    store_hint = str(store_arg) if store_arg else None
    language = choose(out, lang, stored, analyzer_of(kind), hint=rebuild_hint(str(out), store_hint, None))
    embedder, embedder_reason = _embedder_choice(embedder, stored, language)
    embedder, spec = _embedder(embedder, stored, how.device, how.on_note)
    wanted = {**embedder_config(embedder), "analyzer": language.analyzer}
    require(
        language.analyzer, analyzer_of(kind), where=str(path), hint=rebuild_hint(str(out), store_hint, spec)
    )
    _check_follows(out, store_arg, path, stored, wanted, spec)
    db = open_at(kind, path, dim=embedder.dim)
    db.analyzer = language.analyzer
    try:
        report = IndexReport(store=str(path), embed_model=embedder.name, max_tokens=embedder.max_tokens)
        report.analyzer, report.analyzer_reason = language.analyzer, language.reason
        report.embedder_reason = embedder_reason
        weight = _weight_meta(stored, dense_weight, wanted, report)
        report.reconcile = reconcile
        plan = _plan(out, db, stored, report)
        if on_progress:
            on_progress("plan", len(plan.upserts), len(plan.upserts))
        upserts = rows_to_write(db, embedder, plan, report, how, on_progress)
        config = {**wanted, **weight, "out": str(out.resolve()), "embed_spec": spec}
        meta = _next_meta(db, stored, config, plan, upserts, report)
        scale = scale_sync(kind, path, embedder.dim, report)
        unmoved = not upserts and not plan.deletes and report.cursor == (stored.get("cursor") or None)
        if unmoved and stored and weight.get("dense_weight") == stored.get("dense_weight"):
            if scale is not None:
                scale.settle(stored)
            return _done(report, started)  # nothing moved: the index stays as it is, generation too
        if on_progress:
            on_progress("commit", 0, 1)
        replaced = scale.before(upserts, plan.deletes) if scale is not None else {}
        db.commit(upserts, plan.deletes, meta, model=embedder.name)
        if scale is not None:  # the scale indexes follow the committed store (pipeline.index.scale)
            scale.after(replaced, upserts, meta, stored)
        if on_progress:
            on_progress("commit", 1, 1)
    finally:
        db.close()
    return _done(report, started)


def _check_follows(
    out: Path,
    store_arg: str | Path | None,
    path: Path,
    stored: dict[str, str],
    wanted: dict[str, str],
    spec: str,
) -> None:
    """Refuse a store built with another embedder or analyzer, or following another chunk folder."""
    hint = rebuild_hint(str(out), str(store_arg) if store_arg else None, spec)
    check_compatible(stored, wanted, where=str(path), hint=hint)
    where = str(out.resolve())
    inside = path.resolve().is_relative_to(out.resolve())  # a copied chunk folder takes its index along
    if stored.get("out") and stored["out"] != where and not inside:
        raise UsageError(
            f"{path}: this index follows {stored['out']}, not {where} "
            "(hint: give each chunk folder its own --store)"
        )


def _plan(out: Path, db: VectorStore, stored: dict[str, str], report: IndexReport) -> FeedPlan[RowState]:
    """The feed planner's plan for this store: full on a reconcile or a new index."""
    new_index = not stored.get("chunks") or stored.get("chunks") == "0"
    plan = plan_feed(out, stored.get("cursor") or None, db, full=report.reconcile or new_index)
    report.changes, report.cursor, report.full = plan.changes, plan.cursor, plan.full
    report.reason = plan.reason or ("reconcile" if report.reconcile else "new index" if new_index else "")
    if report.reconcile:
        report.fixed["extra"] = sorted(plan.deletes)
    report.deleted = len(plan.deletes)
    return plan


def _next_meta(
    db: VectorStore,
    stored: dict[str, str],
    config: dict[str, str],
    plan: FeedPlan[RowState],
    upserts: list[tuple[ChunkRow, Vector | None]],
    report: IndexReport,
) -> dict[str, str]:
    """The meta the commit writes: ``config`` (embedder, analyzer, chunk folder, spec), the
    cursor, the generation, the summary of the indexed chunks and ``index_hash``."""
    written = {row.chunk_id: state_of(row) for row, _ in upserts}
    report.redirected = sum(
        1
        for old, new in plan.redirects
        if old in plan.deletes and (new in written or (new in plan.held and new not in plan.deletes))
    )
    summary = summarize(
        stored,
        plan.held if plan.full else None,
        db.states,
        plan.deletes,
        plan.held,
        written,
        report.max_tokens - 2,  # [CLS], [SEP]
    )
    report.chunks, report.truncated = summary.chunks, summary.truncated
    meta = {
        **config,
        "format": FORMAT,
        "generation": str(int(stored.get("generation", "0")) + 1),
        "cursor": report.cursor or "",
        "updated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **summary.meta(),
    }
    meta["index_hash"] = index_hash(db.kind, meta, summary.policies, summary.content)
    report.index_hash = meta["index_hash"]
    return meta


def _done(report: IndexReport, started: float) -> IndexReport:
    report.seconds = round(time.perf_counter() - started, 3)
    return report


def index_embedder(out: Path | str, store: str | Path | None = None) -> Any:
    """The embedder the index of ``out`` was built with (the default for a new one), made once.

    ``watch --index`` keeps it for every run: the model and its tokenizer load once.
    """
    kind, path = store_spec(Path(out), store)
    return _embedder(None, _stored_meta(kind, path))[0]


def _stored_meta(kind: str, path: Path) -> dict[str, str]:
    """The meta of the index at ``path`` (empty when there is none yet)."""
    if not path.exists():
        return {}
    db = open_at(kind, path)
    try:
        return db.meta()
    finally:
        db.close()


def _embedder(
    embedder: Any, stored: dict[str, str], device: str = "cpu", on_note: Say | None = None
) -> tuple[Any, str]:
    """The embedder object and the spec that makes it again (kept in the index's meta).

    One made here from a spec runs on ``device`` (resolved: ``auto`` says where it fell back)
    and carries that spec as ``spec``: a remote executor makes the same model from it.
    """
    if embedder is not None and not isinstance(embedder, str):
        if stored.get("embed_model") == embedder.name and stored.get("embed_spec"):
            return embedder, stored["embed_spec"]  # the same model, made by the caller (watch keeps one)
        return embedder, str(getattr(embedder, "spec", "") or embedder.name)
    from pipeline.index.device import resolve_device
    from pipeline.index.embedders import make_embedder

    spec = embedder or stored.get("embed_spec") or "default"
    resolved = resolve_device(device, spec, on_note)
    made = make_embedder(spec, device=None if resolved == "cpu" else resolved)
    with contextlib.suppress(AttributeError):  # a class with __slots__ and no room for it
        made.spec = spec  # type: ignore[attr-defined]
    return made, spec


def _weight_meta(
    stored: dict[str, str], asked: float | None, config: dict[str, str], report: IndexReport
) -> dict[str, str]:
    """The meta that keeps hybrid search's dense weight (``dense_weight``: the one asked, else the
    index's own; none: the language's, ``language.hybrid_weights``), and the report's account of it."""
    if asked is not None and not asked >= 0:
        raise UsageError(f"--dense-weight must be 0 or more, got {asked}")
    if asked is not None:
        kept, report.dense_weight_reason = {"dense_weight": repr(float(asked))}, "--dense-weight"
    elif stored.get("dense_weight"):
        kept = {"dense_weight": stored["dense_weight"]}
        report.dense_weight_reason = "the index's own (an earlier --dense-weight)"
    else:
        kept, report.dense_weight_reason = {}, "the language's"
    report.dense_weight = hybrid_weights({**config, **kept})[1]
    return kept


def _embedder_choice(embedder: Any, stored: dict[str, str], language: Choice) -> tuple[Any, str]:
    """``embedder`` (or the index's own) and why; for a new index without one, the language's."""
    if embedder is not None:
        return embedder, "--embedder"
    if stored.get("embed_spec"):
        return None, "the index's own"
    return embedder_for(language)


def _rebuild(
    out: Path,
    store_arg: str | Path | None,
    kind: str,
    path: Path,
    embedder: Any,
    on_progress: Progress | None,
    how: Embedding,
    lang: str | None = None,
    dense_weight: float | None = None,
) -> IndexReport:
    """A fresh index built beside the old one, then swapped in: the old stays searchable until then.
    Its analyzer is chosen afresh (``lang``, else detected), as for a new index; a dense weight
    the old one kept stays unless another is asked."""
    old = _stored_meta(kind, path)
    if embedder is None:  # the same embedder as before: a rebuild from scratch
        embedder = old.get("embed_spec") or None
    if dense_weight is None and old.get("dense_weight"):
        dense_weight = float(old["dense_weight"])
    report = rebuild_beside(
        kind,
        path,
        lambda fresh: _run(
            out,
            store_arg,
            kind,
            fresh,
            embedder,
            reconcile=False,
            on_progress=on_progress,
            how=how,
            lang=lang,
            dense_weight=dense_weight,
        ),
    )
    settle_scale(kind, path, report)  # the scale indexes follow the swapped-in store
    report.store = str(path)
    report.reason = "rebuild"
    return report
