"""A whole-corpus run: discovery, the process pool, stale files, manifest, change feed (SPEC §5)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import orjson
import xxhash

from pipeline._version import __version__
from pipeline.errors import UsageError
from pipeline.models import Policy
from pipeline.run.checkpoint import reached
from pipeline.run.discover import Found, discover, find_one, walk
from pipeline.run.guard import DEFAULT_DOC_MEMORY_MB, DEFAULT_DOC_TIMEOUT
from pipeline.run.redirects import changes, collapse, match_by_hash
from pipeline.run.state import (
    MANIFEST_FORMAT,
    STATE_DIR,
    Feed,
    clear_inflight,
    clear_journals,
    event,
    load_inflight,
    load_manifest,
    load_redirects,
    new_run_id,
    now_iso,
    output_lock,
    save_inflight,
    save_manifest,
    save_redirects,
)
from pipeline.stages.mint import policy_hash
from pipeline.stages.normalize import DEFAULT_MAX_BYTES

if TYPE_CHECKING:  # the runner pulls in mistletoe and the schema: only a run with work to do loads it
    from pipeline.run.pool import GuardPool
    from pipeline.run.ray_executor import RayExecutor
    from pipeline.run.worker import DocResult, Job

#: A file modified this close to the last manifest write is hashed, not trusted by its stat.
_RACY_SECONDS = 2.0


@dataclass(slots=True)
class Options:
    """How to run: the policy and everything else the CLI can set."""

    corpus: Path
    out: Path
    policy: Policy = field(default_factory=Policy)
    jobs: int = 1
    full: bool = False
    exclude: tuple[str, ...] = ()
    max_bytes: int = DEFAULT_MAX_BYTES
    wait: bool = True
    doc_timeout: float = DEFAULT_DOC_TIMEOUT  #: seconds per document, 0 = no limit (guard.py)
    doc_memory_mb: int = DEFAULT_DOC_MEMORY_MB  #: MiB a worker may add, 0 = no limit (guard.py)
    executor: str = "local"  #: "local" (the process pool) or "ray" (ray_executor.py)
    address: str | None = None  #: the Ray cluster (``ray.init``'s address); None: Ray's default
    batch: int = 0  #: documents per Ray task, 0 = chosen from the cluster's CPUs


@dataclass(slots=True)
class Summary:
    """What a run did, for the summary table and ``--json``."""

    run_id: str
    documents: int = 0
    processed: int = 0
    skipped: int = 0
    chunks: int = 0
    tokens: int = 0
    bytes: int = 0
    added: int = 0
    changed: int = 0
    unchanged: int = 0
    removed: int = 0
    written: int = 0  #: chunk files actually written
    redirects: int = 0  #: redirects added or re-pointed
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    #: chunkyard's own state could not be written (a full disk): exit code 2
    state_error: bool = False
    warnings: list[str] = field(default_factory=list)
    stage_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """0 when all went well, 1 when a document failed, 2 when the state could not be written."""
        return 2 if self.state_error else 1 if self.failures else 0

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "documents": self.documents,
            "processed": self.processed,
            "skipped": self.skipped,
            "chunks": self.chunks,
            "tokens": self.tokens,
            "bytes": self.bytes,
            "added": self.added,
            "changed": self.changed,
            "unchanged": self.unchanged,
            "removed": self.removed,
            "written": self.written,
            "redirects": self.redirects,
            "seconds": round(self.seconds, 3),
            "mb_per_s": round(self.mb_per_s, 3),
            "failed": len(self.failures),
            "failures": self.failures,
            "warnings": self.warnings,
            "stage_seconds": {k: round(v, 3) for k, v in self.stage_seconds.items()},
        }


def _fresh(found: Found, entry: dict[str, Any] | None, p_hash: str, since: float) -> dict[str, Any] | None:
    """The manifest entry if it still describes this file (same bytes, policy, version), else None.

    Trusted after a stat; hashed when the stat is ambiguous (same size, but a new or
    racy mtime), in which case the entry comes back as a new dict with the new mtime.
    """
    if not entry or entry.get("policy_hash") != p_hash or entry.get("version") != __version__:
        return None
    try:
        st = os.stat(found.path)
    except OSError:
        return None
    if st.st_size != entry.get("size"):
        return None
    if st.st_mtime_ns == entry.get("mtime_ns") and st.st_mtime < since - _RACY_SECONDS:
        return entry
    try:  # the stat is ambiguous: let the content decide
        with open(found.path, "rb") as fh:
            same = xxhash.xxh3_64_hexdigest(fh.read()) == entry.get("source_hash")
    except OSError:
        return None
    return {**entry, "mtime_ns": st.st_mtime_ns} if same else None


def _files_missing(out: Path, entry: dict[str, Any] | None, listings: dict[str, set[str]]) -> bool:
    """True when a chunk file the manifest lists is gone: the next run puts it back.

    ``listings``: the names in each output folder, listed once per sync and kept there
    (a stat per chunk file cost a no-op run over 31,000 chunks most of its time).
    """
    for rel_file in (entry or {}).get("files", ()):
        folder, _, name = rel_file.rpartition("/")
        names = listings.get(folder)
        if names is None:
            try:
                names = set(os.listdir(out / folder if folder else out))
            except OSError:  # gone, or unreadable: its files are as good as missing
                names = set()
            listings[folder] = names
        if name not in names:
            return True
    return False


def _drop_name_clashes(found: list[Found], others: dict[str, Any], summary: Summary) -> list[Found]:
    """``a.md`` and ``a.markdown`` would write the same chunk files: keep the first, report the rest.

    ``others`` are the documents this sync leaves as they are; their names are taken.
    """
    mine = {f.rel_path for f in found}
    owners = {rel.rsplit(".", 1)[0]: rel for rel in others if rel not in mine}
    kept: list[Found] = []
    for f in found:
        name = f.rel_path.rsplit(".", 1)[0]
        if name in owners:
            summary.failures.append(
                f"{f.rel_path}: discover: its chunk files would be those of {owners[name]} "
                f"(both are doc_{name.rsplit('/', 1)[-1]}) (hint: rename one of them, or --exclude it)"
            )
            continue
        owners[name] = f.rel_path
        kept.append(f)
    return kept


def _results(jobs: list[Job], workers: int) -> Iterator[DocResult]:
    if not jobs:
        return
    from pipeline.run.worker import process_document

    if workers <= 1 or len(jobs) <= 1:
        yield from map(process_document, jobs)
        return
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    ctx = get_context("fork")  # children inherit the loaded tokenizer
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=ctx) as pool:
        yield from pool.map(process_document, jobs, chunksize=4)


def ingest(
    opts: Options,
    on_start: Callable[[int], None] | None = None,
    on_result: Callable[[DocResult], None] | None = None,
    on_wait: Callable[[str], None] | None = None,
) -> Summary:
    """Chunk a corpus into ``opts.out``; incremental unless ``opts.full``."""
    with Session(opts, on_wait) as session:
        return session.sync(None, on_start, on_result)


def _state_error(out: Path, exc: OSError, *, started: bool = False) -> UsageError:
    done = "the next run repairs what this one began" if started else "nothing was changed"
    return UsageError(
        f"{out / STATE_DIR}: cannot write chunkyard's state ({exc.strerror or exc}); {done} "
        "(hint: make the output folder writable, or free some space)"
    )


class Session:
    """Holds the output lock and the manifest across syncs (one ``ingest``, or a whole ``watch``).

    Crash safety (SPEC §5): before a sync touches a chunk file it records the documents
    it is about to touch in ``inflight.json``; the manifest is written last and the
    record removed after it. A session that finds the record left by a run that died
    re-checks those documents against the disk (untrusted), sweeps the output for
    orphans and temp files, and announces in the change feed everything the manifest
    has not seen: the next run converges to what a clean run produces.
    """

    def __init__(self, opts: Options, on_wait: Callable[[str], None] | None = None) -> None:
        if not opts.corpus.is_dir():
            raise UsageError(f"{opts.corpus}: corpus folder not found; pass the folder of Markdown to chunk")
        if opts.executor not in ("local", "ray"):
            raise UsageError(f"executor {opts.executor!r}: not one of local, ray")
        self.opts = opts
        self.on_wait = on_wait
        self.p_hash = policy_hash(opts.policy)
        self.manifest: dict[str, Any] = {}
        #: documents a run that died was working on: re-checked against the disk
        self.recovering: set[str] = set()
        #: the output may hold orphans or temp files: sweep it on the next whole-corpus sync
        self.sweep_due = False
        self._redirects: dict[str, str] | None = None
        self._lock: Any = None
        self._pool: GuardPool | RayExecutor | None = None
        #: the output held no chunk file when the session began (until its first sync)
        self._empty_out = False

    def __enter__(self) -> Self:
        self._lock = output_lock(self.opts.out, self.opts.wait, self.on_wait)
        self._lock.__enter__()
        try:
            self.manifest = load_manifest(self.opts.out)
            inflight = load_inflight(self.opts.out)
        except BaseException:
            self._lock.__exit__(None, None, None)
            raise
        self.recovering, sweep = inflight or (set(), False)
        self.sweep_due = sweep or not self.manifest.get("docs")
        self._empty_out = _holds_nothing(self.opts.out)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:  # first: a live worker holds a copy of the lock
            self._pool.close()
            self._pool = None
        self._lock.__exit__(*exc)

    def results(self, jobs: list[Job]) -> Iterator[DocResult]:
        """Process ``jobs`` under the per-document guard (time and memory), in order.

        The worker processes live as long as the session, so ``watch`` pays no process
        start per save. With both limits off (0), the unguarded path runs instead.
        """
        opts = self.opts
        if not jobs:
            return iter(())
        from pipeline.run.worker import prepare

        prepare(opts.policy)  # before any worker forks: none ever imports mid-run
        if opts.executor == "ray":  # the cluster's tasks run this same guarded worker code
            if self._pool is None:
                from pipeline.run.ray_executor import RayExecutor

                self._pool = RayExecutor(
                    opts.out, opts.corpus, opts.address, opts.doc_timeout, opts.doc_memory_mb, opts.batch
                )
            return self._pool.run(jobs)
        if opts.doc_timeout <= 0 and opts.doc_memory_mb <= 0:
            return _results(jobs, opts.jobs)
        if self._pool is None:
            from pipeline.run.pool import GuardPool

            self._pool = GuardPool(opts.jobs, opts.doc_timeout, opts.doc_memory_mb)
        return self._pool.run(jobs)

    @property
    def redirects(self) -> dict[str, str]:
        """The redirect map (``redirects.json``), loaded on first use."""
        if self._redirects is None:
            self._redirects = load_redirects(self.opts.out)
        return self._redirects

    def _job(
        self, f: Found, entry: dict[str, Any] | None, processed_at: str, trusted: bool, fresh: bool = False
    ) -> Job:
        from pipeline.run.worker import Job

        entry = entry or {}
        return Job(
            f.path,
            f.rel_path,
            str(self.opts.out),
            self.opts.policy,
            processed_at,
            tuple(entry.get("files", ())),
            self.opts.max_bytes,
            int(entry.get("rev_width", 8)),
            tuple(entry.get("chunk_ids", ())),
            tuple(entry.get("hashes", ())),
            tuple(entry.get("digests", ())),
            trusted,
            fresh,
        )

    def sync(
        self,
        paths: Iterable[str] | None = None,
        on_start: Callable[[int], None] | None = None,
        on_result: Callable[[DocResult], None] | None = None,
    ) -> Summary:
        """Bring the output up to date: the whole corpus, or only ``paths`` (corpus-relative).

        A path that is no longer a document (deleted, renamed away, excluded) has its
        chunk files removed. Each document's chunk files are written first and its lines
        of the change feed right after; stale files are removed next (and announced),
        then the feed is made durable, the redirect map written, and the manifest last.
        """
        opts = self.opts
        run_id = new_run_id()
        run = _Run(
            opts,
            self.p_hash,
            run_id,
            int(self.manifest.get("generation", 0)) + 1,
            Summary(run_id),
            self.manifest.get("docs", {}),
            {},
            set(self.recovering),
            Feed(opts.out),
        )
        try:
            return self._sync(run, paths, on_start, on_result)
        finally:
            run.feed.close()  # written and made durable by then, unless the sync stopped early

    def _sync(
        self,
        run: _Run,
        paths: Iterable[str] | None,
        on_start: Callable[[int], None] | None,
        on_result: Callable[[DocResult], None] | None,
    ) -> Summary:
        opts = self.opts
        summary, old_docs = run.summary, run.old_docs
        started = time.perf_counter()
        since = float(self.manifest.get("written_at_epoch", 0.0))
        if paths is None:
            blind: list[str] = []  # folders it could not list: their documents keep their chunks
            found, problems = discover(opts.corpus, opts.out, opts.exclude, unreadable=blind)
            summary.failures.extend(problems)
            considered = set(old_docs) | {f.rel_path for f in found}
            hidden = {rel for rel in old_docs if any(not b or rel.startswith(b + "/") for b in blind)}
            considered -= hidden
            run.new_docs.update((rel, old_docs[rel]) for rel in hidden)
        else:
            wanted = sorted(set(paths))
            found = [f for f in (find_one(opts.corpus, rel, opts.out, opts.exclude) for rel in wanted) if f]
            considered = set(wanted)
            run.new_docs = {rel: e for rel, e in old_docs.items() if rel not in considered}
        new_docs = run.new_docs
        found = _drop_name_clashes(found, new_docs, summary)
        summary.documents = len(found)
        processed_at = now_iso()
        empty_out, self._empty_out = self._empty_out, False  # true for the first sync at most
        jobs: list[Job] = []
        listings: dict[str, set[str]] = {}
        for f in found:
            entry = old_docs.get(f.rel_path)
            forced = opts.full or f.rel_path in self.recovering or _files_missing(opts.out, entry, listings)
            fresh = None if forced else _fresh(f, entry, self.p_hash, since)
            if fresh is not None:
                new_docs[f.rel_path] = fresh
                summary.skipped += 1
                continue
            jobs.append(self._job(f, entry, processed_at, trusted=not forced, fresh=empty_out))
        present = {f.rel_path for f in found}
        gone = sorted(rel for rel in considered if rel in old_docs and rel not in present)
        sweep = paths is None and (opts.full or self.sweep_due)
        touched = {j.rel_path for j in jobs} | set(gone)
        if sweep:  # in-flight documents that are gone and were never in the manifest: the sweep
            touched |= self.recovering - present - old_docs.keys()  # removes their orphans
        if touched or sweep:
            try:  # before the first chunk file is touched (crash safety)
                save_inflight(opts.out, run.run_id, touched | self.recovering)
            except OSError as exc:
                raise _state_error(opts.out, exc) from None
        if on_start is not None:
            on_start(len(jobs))
        if jobs:
            from pipeline.runner import counter

            counter(opts.policy.tokenizer)  # load once, before the pool forks
        for result in self.results(jobs):
            _record(result, run)
            if on_result is not None:
                on_result(result)
        _widen_collisions(found, run, processed_at, self)
        for entry in new_docs.values():
            summary.chunks += len(entry["files"])
            summary.tokens += int(entry.get("tokens", 0))
        _renames(gone, run)
        # an output that was empty holds only what this run wrote, unless a document failed
        # (a worker stopped while renaming can leave temp files): no orphans to look for
        walk_out = sweep and not (empty_out and not summary.failures)
        removed, left = _remove_stale(run, considered, sweep=walk_out)
        summary.removed = len(removed)
        redirects = self._update_redirects(run)
        run.seal()
        dirty = (
            run.feed.used
            or redirects is not None
            or new_docs.keys() != old_docs.keys()
            or any(new_docs[rel] is not old_docs.get(rel) for rel in new_docs)
            or any(self.manifest.get(k) != v for k, v in self._header().items())
        )
        if dirty:
            manifest = {
                **self._header(),
                "generation": run.generation,
                "run_id": run.run_id,
                "written_at": now_iso(),
                "written_at_epoch": time.time(),
                "docs": new_docs,
            }
            try:
                run.feed.finish()  # first: a run that dies after it says it again
                reached("state-commit")
                if redirects is not None:
                    save_redirects(opts.out, redirects)
                save_manifest(opts.out, manifest)
            except OSError as exc:  # the next run repairs from inflight.json; say so, exit 2
                summary.failures.append(str(_state_error(opts.out, exc, started=True)))
                summary.state_error = True
                self.recovering |= touched
                self.sweep_due = True
                self._redirects = None
                summary.seconds = time.perf_counter() - started
                return summary
            self.manifest = manifest
            if redirects is not None:
                self._redirects = redirects
        # the manifest is true now: what is left to recover are documents whose files may
        # not be what it says (a failed write), and a sweep if a stale file would not go
        self.recovering = (self.recovering - touched) | run.unsafe
        self.sweep_due = (self.sweep_due and not sweep) or left
        try:
            if self.recovering or self.sweep_due:
                save_inflight(opts.out, run.run_id, self.recovering, sweep=self.sweep_due)
            elif touched or sweep:
                clear_inflight(opts.out)
            if sweep and not self.recovering:
                clear_journals(opts.out)
            else:
                clear_journals(opts.out, (run.vanished | touched) - self.recovering)
        except OSError:
            pass  # harmless: the next run re-checks a few documents
        summary.seconds = time.perf_counter() - started
        return summary

    def _header(self) -> dict[str, Any]:
        return {
            "format": MANIFEST_FORMAT,
            "version": __version__,
            "policy_hash": self.p_hash,
            "policy": self.opts.policy.as_dict(),
            "corpus": str(self.opts.corpus.resolve()),
        }

    def _update_redirects(self, run: _Run) -> dict[str, str] | None:
        """Fold this run's redirects into the map (chains collapsed); None when it is unchanged."""
        if not run.fresh and not (run.vanished and self.redirects):
            return None
        live = {cid for entry in run.new_docs.values() for cid in entry.get("chunk_ids", ())}
        before = self.redirects
        after = collapse(before, run.fresh, live)
        if after == before:
            return None
        for old, new in sorted(changes(before, after).items()):
            run.summary.redirects += 1
            run.say(
                "ingest.redirect",
                old=old,
                new=new,
                chunk_id=new,
                hash=run.new_hashes.get(new, ""),
                match=run.how.get(old, "chain"),
            )
        run.seal()
        return after


@dataclass(slots=True)
class _Run:
    """One sync's working state."""

    opts: Options
    p_hash: str
    run_id: str
    generation: int
    summary: Summary
    old_docs: dict[str, dict[str, Any]]
    new_docs: dict[str, dict[str, Any]]
    recovering: set[str]  #: documents whose files the manifest may not describe
    #: the change feed: lines are serialized as they come (while the workers still run)
    #: and written per document (``seal``), so the run holds none of them in memory
    feed: Feed
    said: list[bytes] = field(default_factory=list)  #: lines not written yet (``seal``)
    fresh: dict[str, str] = field(default_factory=dict)  #: old chunk_id → new, found now
    how: dict[str, str] = field(default_factory=dict)  #: old chunk_id → how it was matched
    vanished: set[str] = field(default_factory=set)  #: documents some of whose old ids went
    unsafe: set[str] = field(default_factory=set)  #: documents whose write failed half-way
    new_hashes: dict[str, str] = field(default_factory=dict)  #: chunk_id → hash, chunks made now

    def say(self, kind: str, *, ts: str | None = None, **fields: Any) -> None:
        """One change-feed line (the 004 envelope, ``state.event``); ``seal`` files it."""
        self.said.append(orjson.dumps(event(kind, self.run_id, self.generation, ts=ts, **fields)))

    def seal(self) -> None:
        """The lines said since the last ``seal``, appended to the feed as one block."""
        if self.said:
            self.feed.append(b"\n".join(self.said))
            self.said.clear()


def _record(result: DocResult, run: _Run) -> None:
    """Fold one document's result into the new manifest, the summary, the feed and the redirects."""
    summary, rel = run.summary, result.rel_path
    summary.processed += 1
    summary.warnings.extend(result.warnings)
    for stage, secs in result.seconds.items():
        summary.stage_seconds[stage] = summary.stage_seconds.get(stage, 0.0) + secs
    prev = run.old_docs.get(rel, {})
    if result.error is not None:
        summary.failures.append(result.error)
        if result.unsafe or rel in run.recovering:
            run.unsafe.add(rel)  # its files may not be what the manifest says: re-check next time
        if rel in run.old_docs:  # a failed document keeps its previous chunks
            run.new_docs[rel] = run.old_docs[rel]
        return
    summary.bytes += result.size
    summary.added += len(result.added)
    summary.changed += len(result.changed)
    summary.unchanged += len(result.files) - len(result.added) - len(result.changed)
    summary.written += result.written
    run.new_docs[rel] = {
        "source_hash": result.source_hash,
        "size": result.size,
        "mtime_ns": result.mtime_ns,
        "policy_hash": run.p_hash,
        "version": __version__,
        "uid_rev": result.uid_rev,
        "rev_width": int(prev.get("rev_width", 8)) if prev.get("uid_rev") == result.uid_rev else 8,
        "files": result.files,
        "ids": result.ids,
        "chunk_ids": result.chunk_ids,
        "hashes": result.hashes,
        "digests": result.digests,
        "tokens": result.tokens,
    }
    run.new_hashes.update(zip(result.chunk_ids, result.hashes, strict=True))
    if set(prev.get("chunk_ids", ())) - set(result.chunk_ids):
        run.vanished.add(rel)
    for old, (new, how) in result.redirects.items():
        run.fresh[old] = new
        run.how[old] = how
    before = dict(zip(prev.get("files", ()), prev.get("chunk_ids", ()), strict=False))
    added = set(result.added)
    moved = added | set(result.changed)
    # one document's writes, one moment: the envelope is built once, each line adds what moved
    # (a dict spread keeps the envelope's key order; ``mem_hash`` keeps its place)
    base = event("ingest.write", run.run_id, run.generation)
    said, dumps, ids, chunk_ids, hashes = run.said, orjson.dumps, result.ids, result.chunk_ids, result.hashes
    for i, file in enumerate(result.files):
        if file not in moved:
            continue
        chunk_id, digest = chunk_ids[i], hashes[i]
        line = {
            **base,
            "mem_hash": digest,
            "file": file,
            "id": ids[i],
            "chunk_id": chunk_id,
            "hash": digest,
            "source": rel,
            "change": "added" if file in added else "changed",
        }
        if before.get(file, chunk_id) != chunk_id:
            line["prev_chunk_id"] = before[file]  # for a loader keyed by chunk_id
        said.append(dumps(line))
    run.seal()


def _widen_collisions(found: list[Found], run: _Run, processed_at: str, session: Session) -> None:
    """``doc_uid|r`` must be unique in the corpus: widen ``r=`` to 12 hex on a collision (000)."""
    owners: dict[str, str] = {}
    paths = {f.rel_path: f for f in found}
    new_docs, summary = run.new_docs, run.summary
    for rel in sorted(new_docs):
        key = new_docs[rel].get("uid_rev", "")
        if not key:
            continue
        if key not in owners:
            owners[key] = rel
            continue
        if int(new_docs[rel].get("rev_width", 8)) >= 12 or rel not in paths:
            summary.failures.append(
                f"{rel}: mint: chunk ids collide with {owners[key]} "
                "(hint: give each document a unique doc_id in its front matter)"
            )
            continue
        summary.warnings.append(f"{rel}: mint: doc_uid|r collides with {owners[key]}; r= widened to 12 hex")
        job = session._job(paths[rel], new_docs[rel], processed_at, trusted=True)
        job.rev_width = 12
        result = next(iter(session.results([job])))
        _record(result, run)
        summary.processed -= 1
        if result.error is None:
            new_docs[rel]["rev_width"] = 12


def _renames(gone: list[str], run: _Run) -> None:
    """Chunks of a deleted document found byte for byte in a document made now: a rename (SPEC §3)."""
    run.vanished.update(rel for rel in gone if rel not in run.new_docs)
    if not gone or not run.new_hashes:
        return
    old = [
        (cid, digest)
        for rel in gone
        if rel not in run.new_docs
        for cid, digest in zip(
            run.old_docs[rel].get("chunk_ids", ()), run.old_docs[rel].get("hashes", ()), strict=False
        )
        if cid not in run.new_hashes
    ]
    new = [(cid, digest) for cid, digest in run.new_hashes.items()]
    for old_id, r in match_by_hash(old, new).items():
        run.fresh.setdefault(old_id, r.new)
        run.how.setdefault(old_id, r.how)


def _remove_stale(run: _Run, considered: set[str], *, sweep: bool) -> tuple[list[str], bool]:
    """Delete chunk files no document claims any more (shrunk, renamed or deleted documents).

    With ``sweep`` the whole output folder is walked too, so orphans of an
    interrupted run or a lost manifest, and temp files, go as well. Returns the
    files removed, and whether some file could not be removed.
    """
    out, old_docs, new_docs = run.opts.out, run.old_docs, run.new_docs
    known: dict[str, tuple[str, str, str, str]] = {}
    for rel in considered:
        entry = old_docs.get(rel)
        if not entry or new_docs.get(rel) is entry:
            continue  # skipped, or kept after a failure: nothing of it is stale
        now = set(new_docs[rel]["files"]) if rel in new_docs else set()
        for i, f in enumerate(entry.get("files", [])):
            if f not in now:
                known[f] = (rel, entry["ids"][i], entry["chunk_ids"][i], entry["hashes"][i])
    if not known and not sweep:
        return [], False
    keep = {f for entry in new_docs.values() for f in entry["files"]}
    doomed = sorted(f for f in known if f not in keep)
    if sweep:
        doomed = sorted(set(doomed) | set(_orphans(out, keep)))
    removed: list[str] = []
    left = False
    for rel_file in doomed:
        name = rel_file.rsplit("/", 1)[-1]
        is_tmp = name.startswith(".") and name.endswith(".tmp")
        info = known.get(rel_file) or (None if is_tmp else _describe(out / rel_file))
        try:
            os.unlink(out / rel_file)
        except FileNotFoundError:
            pass
        except OSError:
            left = True
            continue
        if is_tmp:
            continue
        removed.append(rel_file)
        src, chunk_ref, chunk_id, digest = info or ("", "", "", "")
        run.say("ingest.delete", file=rel_file, id=chunk_ref, chunk_id=chunk_id, hash=digest, source=src)
    run.seal()
    for folder in sorted({str(Path(f).parent) for f in removed}, key=len, reverse=True):
        path = out / folder
        while folder not in ("", ".") and path != out:
            try:
                path.rmdir()  # only succeeds when empty
            except OSError:
                break
            path = path.parent
    return removed, left


def _holds_nothing(out: Path) -> bool:
    """True when ``out`` has nothing in it but chunkyard's own state folder."""
    try:
        with os.scandir(out) as entries:
            return all(e.name == STATE_DIR for e in entries)
    except OSError:
        return False


def _describe(path: Path) -> tuple[str, str, str, str] | None:
    """``(source, id, chunk_id, hash)`` of an orphan chunk file, for its delete event."""
    try:
        rec = orjson.loads(path.read_bytes())
        meta = rec.get("metadata") or {}
        return (str(meta.get("sourceFile", "")), str(rec["id"]), str(rec["chunk_id"]), str(rec["hash"]))
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        return None


def _orphans(out: Path, keep: set[str]) -> Iterator[str]:
    """Chunk files and temp files under ``out`` that no manifest entry claims."""
    for dirpath, dirnames, filenames in walk(out):  # not os.walk: it recurses per level
        dirnames[:] = [d for d in dirnames if d != STATE_DIR]
        rel_dir = os.path.relpath(dirpath, out).replace(os.sep, "/")
        for name in filenames:
            rel_file = name if rel_dir == "." else f"{rel_dir}/{name}"
            is_tmp = name.startswith(".") and name.endswith(".tmp")
            if is_tmp or (name.startswith("doc_") and name.endswith(".json") and rel_file not in keep):
                yield rel_file
