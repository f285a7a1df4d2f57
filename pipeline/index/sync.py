"""``chunkyard index``: apply the change feed to the store, from the cursor kept in the store.

One run:

1. **Plan.** Read the feed after the store's cursor (``pipeline.run.changes``) and fold it
   into the chunk files it touched; read each one (the file is the truth, the feed only
   says where to look). A stored id whose file was touched and no longer holds it — or a
   delete line names — is deleted; each live record is upserted unless the stored row
   equals it. With ``reconcile``, on a new index, or when the feed no longer reaches the
   cursor (``CursorLostError``), every chunk file is read and what the store holds beyond
   them is deleted.
2. **Embed** only the texts no vector is known for: the cache is keyed by (embedder name,
   digest of ``embedText``), so a moved chunk, a redirect, a renamed document or an mtime
   reset costs nothing. Computed vectors are committed to the cache batch by batch: a
   killed run keeps them, the searchable index is not touched yet.
3. **Commit** the upserts, deletes, the new cursor and ``index_hash`` in one transaction.
   Until then readers see the previous index whole; a failure anywhere leaves it as it was.

One writer per store (a lock file beside it); a second run waits, or fails at once with
``wait=False``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from pipeline.errors import UsageError
from pipeline.index.identity import (
    FORMAT,
    check_compatible,
    embedder_config,
    index_hash,
    rebuild_hint,
    summarize,
)
from pipeline.index.language import choose, embedder_for, require
from pipeline.index.store import (
    ChunkRow,
    RowState,
    Vector,
    VectorStore,
    analyzer_of,
    open_at,
    store_lock,
    store_spec,
)
from pipeline.run.changes import CursorLostError, read_changes
from pipeline.run.state import STATE_DIR

#: Texts per call to the embedder; the cache is committed after each call (a killed run
#: loses at most one batch of embedding work). ``CHUNKYARD_INDEX_BATCH`` overrides it.
EMBED_BATCH = 128
BATCH_ENV = "CHUNKYARD_INDEX_BATCH"


def _batch_size() -> int:
    raw = os.environ.get(BATCH_ENV, "")
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    if raw:
        raise UsageError(f"{BATCH_ENV}={raw!r}: expected a whole number of texts >= 1")
    return EMBED_BATCH


#: ``on_progress(stage, done, total)``: stage ``plan``, ``embed`` or ``commit``.
Progress = Callable[[str, int, int], None]


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
    analyzer: str = ""  #: the BM25 analyzer the index reads and writes with
    analyzer_reason: str = ""  #: why that one (``--lang``, the index's own, or detected)
    embedder_reason: str = ""  #: why that embedder (``--embedder``, the index's own, or the language)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


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
    lang: str | None = None,
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
        lang: ``--lang``: the corpus's language, which picks the BM25 analyzer of a new index
            (``None`` or ``auto``: the index's own, else detected; ``pipeline.index.language``).

    Raises:
        IndexMismatchError: the embedder or analyzer differs from the index's.
        UsageError: no chunk folder, another writer (with ``wait=False``), missing extras.
        StoreError: the store cannot be written (locked, full disk); nothing changed.
    """
    out = Path(out)
    if not (out / STATE_DIR).is_dir():
        raise UsageError(f"{out}: not a chunk folder (hint: run `chunkyard ingest CORPUS --out {out}` first)")
    kind, path = store_spec(out, store)
    with store_lock(path, wait=wait, on_wait=on_wait):
        if rebuild:
            return _rebuild(out, store, kind, path, embedder, on_progress, lang)
        return _run(out, store, kind, path, embedder, reconcile=reconcile, on_progress=on_progress, lang=lang)


def _run(
    out: Path,
    store_arg: str | Path | None,
    kind: str,
    path: Path,
    embedder: Any,
    *,
    reconcile: bool,
    on_progress: Progress | None,
    lang: str | None = None,
) -> IndexReport:
    started = time.perf_counter()
    stored = _stored_meta(kind, path)
    store_hint = str(store_arg) if store_arg else None
    language = choose(out, lang, stored, analyzer_of(kind), hint=rebuild_hint(str(out), store_hint, None))
    asked = embedder if embedder is not None else stored.get("embed_spec")
    if asked is None:  # a new index, no --embedder: the language's (``language.embedder_for``)
        embedder, embedder_reason = embedder_for(language)
    else:
        embedder_reason = "the index's own" if embedder is None else "--embedder"
    embedder, spec = _embedder(embedder, stored)
    wanted = {**embedder_config(embedder), "analyzer": language.analyzer}
    hint = rebuild_hint(str(out), store_hint, spec)
    require(language.analyzer, analyzer_of(kind), where=str(path), hint=hint)
    check_compatible(stored, wanted, where=str(path), hint=hint)
    where = str(out.resolve())
    inside = path.resolve().is_relative_to(out.resolve())  # a copied chunk folder takes its index along
    if stored.get("out") and stored["out"] != where and not inside:
        raise UsageError(
            f"{path}: this index follows {stored['out']}, not {where} "
            "(hint: give each chunk folder its own --store)"
        )
    db = open_at(kind, path, dim=embedder.dim)
    db.analyzer = language.analyzer
    try:
        report = IndexReport(store=str(path), embed_model=embedder.name, max_tokens=embedder.max_tokens)
        report.analyzer, report.analyzer_reason = language.analyzer, language.reason
        report.embedder_reason = embedder_reason
        report.reconcile = reconcile
        new_index = not stored.get("chunks") or stored.get("chunks") == "0"
        plan = _plan(out, db, stored.get("cursor") or None, report, reconcile or new_index)
        if on_progress:
            on_progress("plan", len(plan.live), len(plan.live))
        upserts = _embed(db, embedder, plan.live, plan.states, report, on_progress)
        written = {row.chunk_id: _state_of(row) for row, _ in upserts}
        report.redirected = sum(
            1
            for old, new in plan.redirects
            if old in plan.doomed and (new in written or (new in plan.states and new not in plan.doomed))
        )
        report.deleted = len(plan.doomed)
        summary = summarize(
            stored,
            plan.states if plan.full else None,
            db.states,
            plan.doomed,
            plan.states,
            written,
            embedder.max_tokens - 2,  # [CLS], [SEP]
        )
        report.chunks, report.truncated = summary.chunks, summary.truncated
        meta = {
            **wanted,
            "format": FORMAT,
            "out": where,
            "embed_spec": spec,
            "generation": str(int(stored.get("generation", "0")) + 1),
            "cursor": report.cursor or "",
            "updated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **summary.meta(),
        }
        meta["index_hash"] = index_hash(db.kind, meta, summary.policies, summary.content)
        report.index_hash = meta["index_hash"]
        if not upserts and not plan.doomed and report.cursor == (stored.get("cursor") or None) and stored:
            return _done(report, started)  # nothing moved: the index stays as it is, generation too
        if on_progress:
            on_progress("commit", 0, 1)
        db.commit(upserts, plan.doomed, meta, model=embedder.name)
        if on_progress:
            on_progress("commit", 1, 1)
    finally:
        db.close()
    return _done(report, started)


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


def _embedder(embedder: Any, stored: dict[str, str]) -> tuple[Any, str]:
    """The embedder object and the spec that makes it again (kept in the index's meta)."""
    if embedder is not None and not isinstance(embedder, str):
        if stored.get("embed_model") == embedder.name and stored.get("embed_spec"):
            return embedder, stored["embed_spec"]  # the same model, made by the caller (watch keeps one)
        return embedder, str(getattr(embedder, "spec", "") or embedder.name)
    from pipeline.index.embedders import make_embedder

    spec = embedder or stored.get("embed_spec") or "default"
    return make_embedder(spec), spec


@dataclass(slots=True)
class _Plan:
    """What one run will do: the live rows of the touched chunk files, the ids to delete,
    the feed's redirects, and the stored state of every id it concerns (all ids on a full run)."""

    live: dict[str, ChunkRow]
    doomed: set[str]
    redirects: list[tuple[str, str]]
    states: dict[str, RowState]
    full: bool


def _plan(out: Path, db: VectorStore, cursor: str | None, report: IndexReport, full: bool) -> _Plan:
    """Read the feed after ``cursor``, then the chunk files it touched, then the stored rows they concern.

    A full run (reconcile, a new index, a lost cursor) reads every chunk file and every stored
    row; an incremental one only the rows of the touched files and of the ids the feed names,
    so its cost follows the change, not the size of the index.
    """
    touched: set[str] = set()
    named: set[str] = set()  #: ids a delete line names
    redirects: list[tuple[str, str]] = []
    report.reason = "reconcile" if report.reconcile else ("new index" if full else "")
    report.cursor = cursor
    try:
        for change in read_changes(out, None if full and not cursor else cursor):
            report.changes += 1
            report.cursor = change.cursor
            if change.kind in ("write", "delete") and change.file:
                touched.add(change.file)
            if change.kind == "delete" and change.chunk_id:
                named.add(change.chunk_id)
            if change.kind == "write" and change.prev_chunk_id:
                named.add(change.prev_chunk_id)
            if change.kind == "redirect" and change.old and change.chunk_id:
                redirects.append((change.old, change.chunk_id))
    except CursorLostError:
        full, report.reason = True, "the feed no longer reaches the cursor"
        report.changes, report.cursor = 0, None
        for change in read_changes(out, None):
            report.changes += 1
            report.cursor = change.cursor
    if full:
        touched = set(_chunk_files(out))
    report.full = full
    live: dict[str, ChunkRow] = {}
    for file in sorted(touched):
        record = _read(out / file)
        if record is not None and isinstance(record.get("chunk_id"), str):
            live[record["chunk_id"]] = ChunkRow.from_record(record, file)
    if full:
        states = db.states()
        doomed = set(states) - set(live)
    else:
        ids = named | set(live) | {cid for pair in redirects for cid in pair}
        states = db.states_for(touched, ids)
        doomed = {cid for cid, s in states.items() if s.file in touched and cid not in live}
        doomed |= {cid for cid in named if cid in states and cid not in live}
    if report.reconcile:
        report.fixed["extra"] = sorted(doomed)
    return _Plan(live, doomed, redirects, states, full)


def _state_of(row: ChunkRow) -> RowState:
    return RowState(row.file, row.hash, row.digest, row.row_digest, row.model_tokens, row.policy_hash)


def _embed(
    db: VectorStore,
    embedder: Any,
    live: dict[str, ChunkRow],
    states: dict[str, RowState],
    report: IndexReport,
    on_progress: Progress | None,
) -> list[tuple[ChunkRow, Vector | None]]:
    """Rows to write with their vectors: cached, computed (and cached at once), or kept."""
    model = embedder.name
    todo: list[ChunkRow] = []  #: rows whose stored vector does not fit
    upserts: list[tuple[ChunkRow, Vector | None]] = []
    for cid, row in live.items():
        known = states.get(cid)
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
    vectors = db.cached(model, {r.digest for r in todo})
    report.cache_hits = sum(1 for r in todo if r.digest in vectors)
    missing: dict[str, str] = {}
    for r in todo:
        if r.digest not in vectors:
            missing.setdefault(r.digest, r.embed_text)
    ordered = sorted(missing.items(), key=lambda item: len(item[1]))
    if on_progress:
        on_progress("embed", 0, len(ordered))
    size = _batch_size()
    for i in range(0, len(ordered), size):
        batch = ordered[i : i + size]
        computed = embedder.embed([text for _, text in batch])
        entries = {
            digest: (computed[j], int(embedder.count_tokens(text))) for j, (digest, text) in enumerate(batch)
        }
        db.put_cache(model, entries)
        vectors.update(entries)
        report.embedded += len(batch)
        if on_progress:
            on_progress("embed", report.embedded, len(ordered))
    for r in todo:
        vector, tokens = vectors[r.digest]
        upserts.append((r.with_tokens(tokens), vector))
    if not report.reconcile:
        report.fixed.clear()
    return upserts


def _chunk_files(out: Path) -> Iterator[str]:
    """Every chunk file under ``out`` (``*.json`` outside ``.chunkyard/``), relative, POSIX."""
    for root, dirs, files in os.walk(out):
        dirs[:] = sorted(d for d in dirs if d != STATE_DIR)
        rel = Path(root).relative_to(out)
        for name in sorted(files):
            if name.endswith(".json"):
                yield (rel / name).as_posix()


def _read(path: Path) -> dict[str, Any] | None:
    try:
        record = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return record if isinstance(record, dict) else None


def _rebuild(
    out: Path,
    store_arg: str | Path | None,
    kind: str,
    path: Path,
    embedder: Any,
    on_progress: Progress | None,
    lang: str | None = None,
) -> IndexReport:
    """Build a fresh index beside the old one, then swap it in: the old stays searchable until then.
    Its analyzer is chosen afresh (``lang``, else detected), as for a new index."""
    import shutil

    fresh = path.with_name(path.name + ".rebuild")
    _remove(fresh)
    if embedder is None:  # the same embedder as before: a rebuild from scratch
        embedder = _stored_meta(kind, path).get("embed_spec") or None
    report = _run(out, store_arg, kind, fresh, embedder, reconcile=False, on_progress=on_progress, lang=lang)
    if fresh.is_dir():  # LanceDB: a folder cannot be swapped in one step; the old one goes last
        old = path.with_name(path.name + ".old")
        _remove(old)
        if path.exists():
            os.replace(path, old)
        os.replace(fresh, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        if path.exists():  # the old file's WAL emptied into it first: its WAL never meets the new file
            db = open_at(kind, path)
            try:
                getattr(db, "checkpoint", lambda: None)()
            finally:
                db.close()
        os.replace(fresh, path)  # one atomic step: readers see the old index or the new one
        for suffix in ("-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)
    report.store = str(path)
    report.reason = "rebuild"
    return report


def _remove(path: Path) -> None:
    import shutil

    if path.is_dir():
        shutil.rmtree(path)
    for p in (path, Path(str(path) + "-wal"), Path(str(path) + "-shm")):
        if p.is_file():
            p.unlink()
