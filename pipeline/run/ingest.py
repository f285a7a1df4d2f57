"""A corpus run: discovery, the process pool, the state database, the change feed (SPEC §5, §10)."""

from __future__ import annotations

import marshal
import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self, cast

import xxhash

from pipeline._version import __version__
from pipeline.errors import UsageError
from pipeline.models import DEFAULT_MAX_BYTES, Policy
from pipeline.run import feed as feed_mod
from pipeline.run.db import StateDB, StateError, db_path, folder_of
from pipeline.run.discover import Found, Listed, discover, find_one
from pipeline.run.guard import DEFAULT_DOC_MEMORY_MB, DEFAULT_DOC_TIMEOUT
from pipeline.run.migrate import migrate
from pipeline.run.record import Run, fold, forget, prune_folders, sweep
from pipeline.run.state import STATE_DIR, clear_journals, new_run_id, now_iso, output_lock, state_dir
from pipeline.stages.mint import policy_hash

if TYPE_CHECKING:  # the runner pulls in mistletoe and the schema: only a run with work to do loads it
    from pipeline.run.job import DocResult, Job
    from pipeline.run.pool import GuardPool
    from pipeline.run.ray_executor import RayExecutor

#: A file modified this close to the last manifest write is hashed, not trusted by its stat.
_RACY_SECONDS = 2.0
#: A sync into an empty state of this many documents or more makes the chunks' hash index
#: at its end instead of row by row: a hash lands anywhere in the index, so each commit of a
#: big sync wrote most of its pages again (~0.1 CPU s of the parent's ~1.7 in ``make bench``).
BULK = 64


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


def _fresh(found: Found, stamp: tuple[int, int] | None, since: float, db: StateDB) -> int | None:
    """Whether the state still describes this file: its mtime (to record if new), else None.

    ``stamp`` is the recorded ``(size, mtime_ns)`` of a row made under this policy and
    version (None otherwise). Trusted after a stat (the walk's own, if it took one);
    hashed when the stat is ambiguous (same size, but a new or racy mtime).
    """
    if stamp is None:
        return None
    size, mtime_ns = found.size, found.mtime_ns
    if size < 0:
        try:
            st = os.stat(found.path)
        except OSError:
            return None
        size, mtime_ns = st.st_size, st.st_mtime_ns
    if size != stamp[0]:
        return None
    if mtime_ns == stamp[1] and mtime_ns / 1e9 < since - _RACY_SECONDS:
        return mtime_ns
    try:  # the stat is ambiguous: let the content decide
        with open(found.path, "rb") as fh:
            same = xxhash.xxh3_64_hexdigest(fh.read()) == db.source_hash(found.rel_path)
    except OSError:
        return None
    return mtime_ns if same else None


#: A document's freshness columns in ``StateDB.stamp`` (one document, for a sync of paths).
_SIZE, _MTIME, _HASH, _POLICY, _VERSION = range(5)


class _Folders:
    """Whether a document's chunk files are all there, at a stat per output folder.

    A folder whose mtime is the one recorded when it was last listed and found whole has
    lost no file since (a removal changes its mtime); another is listed once per sync.
    """

    def __init__(self, out: Path, db: StateDB, recorded: dict[str, int] | None) -> None:
        self.out, self.db, self.recorded = out, db, recorded
        self.listings: dict[str, set[str] | None] = {}
        self.seen: dict[str, int] = {}  #: folder → mtime when listed now (recorded at the end)

    def whole(self, folder: str) -> bool:
        """The output folder is known to have lost no file (its recorded mtime holds)."""
        if folder not in self.listings:
            self.listings[folder] = self.listing(folder)
        return self.listings[folder] is None

    def missing(self, rel: str) -> bool:
        if self.recorded is None:  # a few documents (a save in watch): a stat per chunk file
            return not all(os.path.exists(self.out / f) for f in self.db.files_of(rel))
        folder = rel.rpartition("/")[0]
        if self.whole(folder):
            return False
        names = self.listings[folder] or set()  # not None: the folder is not known whole
        return any(f.rpartition("/")[2] not in names for f in self.db.files_of(rel))

    def listing(self, folder: str) -> set[str] | None:
        """The names in an output folder; None when its recorded mtime says it is whole."""
        path = self.out / folder if folder else self.out
        try:
            st = os.stat(path)
        except OSError:  # gone, or unreadable: its files are as good as missing
            return set()
        if self.recorded is not None and self.recorded.get(folder) == st.st_mtime_ns:
            return None
        try:
            names = set(os.listdir(path))
        except OSError:
            return set()
        if self.recorded is not None and st.st_mtime < time.time() - _RACY_SECONDS:
            self.seen[folder] = st.st_mtime_ns
        return names


class _Scan:
    """A whole-corpus sync's view of the walk, folder by folder (``discover``'s ``on_folder``).

    A folder whose documents (names, sizes, mtimes) are those its recorded signature was made
    from, under this policy and version, and whose output folder is known whole, is done with
    as a whole: its documents are counted, not looked up one by one. Any other folder is
    *listed*: its documents' rows are read (one indexed query) and compared one by one, and
    the first that looks changed forks a worker (``Session._warm``). So a run's cost is a
    ``stat`` per document plus work per folder, and per document only in folders that moved.
    """

    def __init__(self, session: Session) -> None:
        self.session, self.db = session, session.db
        self.p_hash, self.version = session.p_hash, __version__
        self.recorded = {} if session.opts.full else self.db.signatures()
        self.out_folders = _Folders(session.opts.out, self.db, self.db.folder_mtimes())
        self.recovering = {folder_of(rel) for rel in session.recovering}
        self.stamps: dict[str, tuple[int, int]] = {}  #: rel → (size, mtime) in listed folders
        self.outdated: set[str] = set()  #: rows of listed folders made under another policy or version
        self.listed: dict[str, list[Listed]] = {}
        self.sigs: dict[str, bytes] = {}
        self.walked: set[str] = set()
        self.skipped = 0
        opts = session.opts
        # all will be chunked by several jobs: the parent loads it once and forks every worker
        everything = opts.jobs > 1 and (opts.full or session._empty_out)
        self.warm = session.one_shot and session._guarded() and not everything

    def signature(self, listed: list[Listed]) -> bytes:
        # (name, size, mtime_ns) in the order the folder listed them: unsorted, because a
        # listing in another order only costs that folder a look row by row, never a wrong skip
        return xxhash.xxh3_128_digest(marshal.dumps((self.p_hash, self.version, listed)))

    def folder(self, prefix: str, listed: list[Listed]) -> bool:
        """Whether the walk should keep a folder's documents (listed one by one) or drop them."""
        if not listed:  # its recorded documents, if any, are gone (``gone_folders``)
            return False
        self.walked.add(prefix)
        sig = self.sigs[prefix] = self.signature(listed)
        if (
            self.recorded.get(prefix) == sig
            and prefix not in self.recovering
            and self.out_folders.whole(prefix[:-1])
        ):
            self.skipped += len(listed)
            return False
        for rel, (size, mtime, current) in self.db.folder_stamps(prefix, self.p_hash, self.version).items():
            self.stamps[rel] = (size, mtime)
            if not current:
                self.outdated.add(rel)
        self.listed[prefix] = listed
        if self.warm and any(self._looks_changed(prefix + name, size, mtime) for name, size, mtime in listed):
            self.warm = False  # one worker is all this is for
            self.session._warm()
        return True

    def _looks_changed(self, rel: str, size: int, mtime: int) -> bool:
        """A guess from the stat alone (the sync decides for real): a no-change run forks nothing."""
        return (
            self.session.opts.full
            or rel in self.outdated
            or rel in self.session.recovering
            or self.stamps.get(rel) != (size, mtime)
        )

    def hidden(self, blind: list[str]) -> set[str]:
        """Recorded documents under folders the walk could not list: unknown, not deleted."""
        rels: set[str] = set()
        for b in blind:
            rels.update(self.db.rels_under(b + "/") if b else self.db.rels())
        return rels

    def gone_folders(self, blind: list[str]) -> set[str]:
        """Recorded documents of folders the walk did not find a document in (and could list)."""
        rels: set[str] = set()
        for folder in self.db.doc_folders() - self.walked:
            if not any(not b or folder.startswith(b + "/") for b in blind):
                rels.update(self.db.folder_stamps(folder, self.p_hash, self.version))
        return rels

    def signatures(self, recovering: set[str]) -> dict[str, bytes]:
        """The listed folders to sign now: every document recorded as the walk saw it, under
        this policy and version, none left to recover, none with an mtime too recent to trust."""
        limit = time.time_ns() - int(_RACY_SECONDS * 1e9)
        signed: dict[str, bytes] = {}
        for prefix, listed in self.listed.items():
            if any(size < 0 or mtime >= limit or prefix + name in recovering for name, size, mtime in listed):
                continue
            rows = self.db.folder_stamps(prefix, self.p_hash, self.version)
            if len(rows) == len(listed) and all(
                rows.get(prefix + name) == (size, mtime, True) for name, size, mtime in listed
            ):
                signed[prefix] = self.sigs[prefix]
        return signed


def _drop_name_clashes(
    found: list[Found], taken: Callable[[str], str | None], summary: Summary
) -> list[Found]:
    """``a.md`` and ``a.markdown`` would write the same chunk files: keep the first, report the rest.

    ``taken(name)`` is the document this sync leaves as it is that has that name, if any.
    """
    owners: dict[str, str] = {}
    kept: list[Found] = []
    for f in found:
        name = f.rel_path.rsplit(".", 1)[0]
        owner = owners.get(name) or taken(name)
        if owner is not None:
            summary.failures.append(
                f"{f.rel_path}: discover: its chunk files would be those of {owner} "
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
    changed: Iterable[str] | None = None,
) -> Summary:
    """Chunk a corpus into ``opts.out``; incremental unless ``opts.full``.

    ``changed``: only these corpus-relative paths (``ingest --changed``), as a ``watch``
    save syncs them, without the walk: the caller knows what changed. A path that did
    not change costs a stat; one that changed and is not named waits for the next
    whole-corpus run, which finds it as always.
    """
    with Session(opts, on_wait) as session:
        session.one_shot = True
        return session.sync(None if changed is None else list(changed), on_start, on_result)


def corpus_relative(corpus: Path, path: str) -> str:
    """``path`` (as typed: relative to the current folder, or absolute) as a path under ``corpus``.

    The file may be gone (a deletion to record). Raises ``UsageError`` for a path outside it.
    """
    for base, target in (
        (os.path.abspath(corpus), os.path.abspath(path)),
        (os.path.realpath(corpus), os.path.realpath(path)),
    ):
        rel = os.path.relpath(target, base)
        if rel != os.curdir and not rel.startswith(os.pardir + os.sep) and rel != os.pardir:
            return rel.replace(os.sep, "/")
    raise UsageError(
        f"{path}: --changed names a file outside the corpus {corpus} "
        "(hint: name the changed Markdown files under it, relative to the current folder)"
    )


def _state_error(out: Path, exc: BaseException, *, started: bool = False) -> UsageError:
    done = "the next run repairs what this one began" if started else "nothing was changed"
    why = getattr(exc, "strerror", None) or exc
    return UsageError(
        f"{out / STATE_DIR}: cannot write chunkyard's state ({why}); {done} "
        "(hint: make the output folder writable, or free some space)"
    )


class Session:
    """Holds the output lock and the state database across syncs (one ``ingest``, or a whole ``watch``).

    Crash safety (SPEC §5): before a sync touches a chunk file it records the documents it
    is about to touch (the ``inflight`` rows); each document is then recorded, with its
    feed lines, whole in one transaction (several documents to one in a big sync,
    ``record.Run``); the rows are replaced when the sync ends. A session that finds rows
    (or the sweep flag) left by a run that died re-checks those documents against the
    disk (untrusted), sweeps the output for orphans and temp files, and announces in the
    change feed everything the state has not seen: the next run converges to what a
    clean run produces.
    """

    def __init__(self, opts: Options, on_wait: Callable[[str], None] | None = None) -> None:
        if not opts.corpus.is_dir():
            raise UsageError(f"{opts.corpus}: corpus folder not found; pass the folder of Markdown to chunk")
        if opts.executor not in ("local", "ray"):
            raise UsageError(f"executor {opts.executor!r}: not one of local, ray")
        self.opts = opts
        self.on_wait = on_wait
        self.p_hash = policy_hash(opts.policy)
        self.db: StateDB = None  # type: ignore[assignment]  # opened by __enter__
        #: documents a run that died was working on: re-checked against the disk
        self.recovering: set[str] = set()
        #: the output may hold orphans or temp files: sweep it on the next whole-corpus sync
        self.sweep_due = False
        #: said once, with the first sync's warnings (a migration from manifest.json)
        self.notes: list[str] = []
        #: the documents the last sync removed, with how many chunk files each had
        self.gone: dict[str, int] = {}
        self._lock: Any = None
        self._pool: GuardPool | RayExecutor | None = None
        #: the output held no chunk file when the session began (until its first sync)
        self._empty_out = False
        #: one ``ingest``, not a long ``watch``: a worker may load the chunker itself (``_warm``)
        self.one_shot = False

    def __enter__(self) -> Self:
        self._lock = output_lock(self.opts.out, self.opts.wait, self.on_wait)
        self._lock.__enter__()
        try:
            self.db = StateDB(db_path(state_dir(self.opts.out)))
            note = migrate(self.opts.out, self.db)
            if note:
                self.notes.append(note)
            inflight = self.db.inflight()
        except StateError as exc:
            self._lock.__exit__(None, None, None)
            raise _state_error(self.opts.out, exc) from None
        except BaseException:
            self._lock.__exit__(None, None, None)
            raise
        self.recovering, sweep_flag = inflight or (set(), False)
        self.sweep_due = sweep_flag or not self.db.has_docs()
        self._empty_out = _holds_nothing(self.opts.out)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:  # first: a live worker holds a copy of the lock
            self._pool.close()
            self._pool = None
        if self.db is not None:
            self.db.close()
        self._lock.__exit__(*exc)

    def results(self, jobs: list[Job]) -> Iterator[DocResult]:
        """Process ``jobs`` under the per-document guard (time and memory), in order.

        The worker processes live as long as the session, so ``watch`` pays no process
        start per save. With both limits off (0), the unguarded path runs instead.
        """
        opts = self.opts
        if not jobs:
            return iter(())
        if self._guarded():  # the pool loads what a document needs before it forks
            return self._guard_pool().run(jobs)
        from pipeline.run.worker import prepare

        prepare(opts.policy)  # before any worker forks: none ever imports mid-run
        if opts.executor == "ray":  # the cluster's tasks run this same guarded worker code
            if self._pool is None:
                from pipeline.run.ray_executor import RayExecutor

                self._pool = RayExecutor(
                    opts.out, opts.corpus, opts.address, opts.doc_timeout, opts.doc_memory_mb, opts.batch
                )
            return self._pool.run(jobs)
        return _results(jobs, opts.jobs)

    def _guarded(self) -> bool:
        """Documents go to the local guard pool (not Ray, and a limit is on)."""
        opts = self.opts
        return opts.executor == "local" and (opts.doc_timeout > 0 or opts.doc_memory_mb > 0)

    def _guard_pool(self) -> GuardPool:
        if self._pool is None:
            from pipeline.run.pool import GuardPool

            opts = self.opts
            self._pool = GuardPool(opts.jobs, opts.doc_timeout, opts.doc_memory_mb, opts.policy)
        return cast("GuardPool", self._pool)  # the executor is the session's: local here

    def _warm(self) -> None:
        """A document will be chunked: fork a worker that loads the chunker while the walk goes on.

        Only for a one-shot run (``ingest``): a long ``watch`` loads it all in the parent
        at its first sync, so that no process imports hours into the session.
        """
        if self.one_shot and self._guarded():
            self._guard_pool().warm()

    def entry(self, rel: str) -> dict[str, Any] | None:
        """The state's entry of one document (as the manifest had it), or None."""
        return self.db.entry(rel)

    def _job(
        self, f: Found, entry: dict[str, Any] | None, processed_at: str, trusted: bool, fresh: bool = False
    ) -> Job:
        from pipeline.run.job import Job

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

    def _header(self) -> dict[str, str]:
        return {
            "version": __version__,
            "policy_hash": self.p_hash,
            "policy": _dumps(self.opts.policy.as_dict()),
            "corpus": str(self.opts.corpus.resolve()),
        }

    def sync(
        self,
        paths: Iterable[str] | None = None,
        on_start: Callable[[int], None] | None = None,
        on_result: Callable[[DocResult], None] | None = None,
    ) -> Summary:
        """Bring the output up to date: the whole corpus, or only ``paths`` (corpus-relative).

        A path that is no longer a document (deleted, renamed away, excluded) has its
        chunk files removed. Each document's chunk files are written first, then its
        state, its lines of the change feed, its stale files' removal and its redirects
        are committed together; documents that are gone are recorded next, then the
        sweep (after a crash, or ``--full``), then the run's header.
        """
        run_id = new_run_id()
        run = Run(
            self.opts,
            self.p_hash,
            run_id,
            self.db.meta_int("generation") + 1,
            Summary(run_id),
            self.db,
            set(self.recovering),
        )
        run.whole = paths is None
        run.copy_behind = self.one_shot
        run.summary.warnings.extend(self.notes)
        self.notes = []
        return self._sync(run, paths, on_start, on_result)

    def _sync(
        self,
        run: Run,
        paths: Iterable[str] | None,
        on_start: Callable[[int], None] | None,
        on_result: Callable[[DocResult], None] | None,
    ) -> Summary:
        opts, db = self.opts, self.db
        summary = run.summary
        started = time.perf_counter()
        since = float(db.meta("written_at_epoch") or 0.0)
        if paths is None:
            scan = _Scan(self)
            blind: list[str] = []  # folders it could not list: their documents keep their chunks
            found, problems = discover(
                opts.corpus, opts.out, opts.exclude, unreadable=blind, stat=True, on_folder=scan.folder
            )
            summary.failures.extend(problems)
            stamps, outdated, folders = scan.stamps, scan.outdated, scan.out_folders
            hidden = scan.hidden(blind)
            held = {rel.rsplit(".", 1)[0]: rel for rel in hidden}
            if held or len({f.rel_path.rsplit(".", 1)[0] for f in found}) < len(found):
                found = _drop_name_clashes(found, held.get, summary)
            present = {f.rel_path for f in found}
            gone = sorted((stamps.keys() - present - hidden) | scan.gone_folders(blind))
        else:
            wanted = sorted(set(paths))
            found = [f for f in (find_one(opts.corpus, rel, opts.out, opts.exclude) for rel in wanted) if f]
            if found:  # ``ingest --changed``: most likely to chunk, so load the chunker meanwhile
                self._warm()
            considered = set(wanted)

            def taken(name: str) -> str | None:
                return next((r for r in db.rels_named(name) if r not in considered), None)

            found = _drop_name_clashes(found, taken, summary)
            present = {f.rel_path for f in found}
            rows = {rel: s for rel in wanted if (s := db.stamp(rel)) is not None}
            outdated = {
                rel for rel, s in rows.items() if s[_POLICY] != self.p_hash or s[_VERSION] != __version__
            }
            stamps = {rel: (s[_SIZE], s[_MTIME]) for rel, s in rows.items()}
            gone = sorted(rel for rel in wanted if rel in stamps and rel not in present)
            folders = _Folders(opts.out, db, None)
        summary.documents = len(found)
        if paths is None:  # the documents of folders whose signature held were not listed one by one
            summary.documents += scan.skipped
            summary.skipped += scan.skipped
        processed_at = now_iso()
        empty_out, self._empty_out = self._empty_out, False  # true for the first sync at most
        jobs: list[Job] = []
        touched_mtimes: dict[str, int] = {}
        # the common case first, inline: the stat the walk took is the one recorded, not racy,
        # and the output folder is known whole (``_Folders``); anything else takes the long way
        trusted_before = int((since - _RACY_SECONDS) * 1e9)
        intact = not opts.full and folders.recorded is not None
        for f in found:
            rel = f.rel_path
            stamp = stamps.get(rel)
            if (
                intact
                and stamp is not None
                and stamp[1] == f.mtime_ns
                and stamp[0] == f.size
                and f.mtime_ns < trusted_before
                and rel not in outdated
                and rel not in self.recovering
                and folders.whole(rel.rpartition("/")[0])
            ):
                summary.skipped += 1
                continue
            forced = (
                opts.full
                or f.rel_path in self.recovering
                or (stamp is not None and folders.missing(f.rel_path))
            )
            mtime = None if forced or f.rel_path in outdated else _fresh(f, stamp, since, db)
            if mtime is not None:
                if stamp is not None and mtime != stamp[1]:
                    touched_mtimes[f.rel_path] = mtime
                summary.skipped += 1
                continue
            if stamp is None:  # no row: nothing to look up, now or when its result is recorded
                run.unrecorded.add(rel)
            entry = None if stamp is None else db.entry(rel)
            jobs.append(self._job(f, entry, processed_at, trusted=not forced, fresh=empty_out))
        del stamps
        sweep_now = paths is None and (opts.full or self.sweep_due)
        touched = {j.rel_path for j in jobs} | set(gone)
        if sweep_now:  # in-flight documents that are gone and were never recorded: the sweep
            touched |= self.recovering - present  # removes their orphans
        header = self._header()
        header_moved = any(db.meta(k) != v for k, v in header.items())
        # a sync into an empty state: the chunks' hash index is made once, at the end (below)
        bulk = len(jobs) >= BULK and not db.has_docs()
        try:
            if touched or sweep_now or header_moved or touched_mtimes:
                self._begin(run, touched, sweep_now, header, touched_mtimes, bulk)
        except Exception as exc:  # noqa: BLE001 - sqlite3.Error or OSError: nothing was changed
            raise _state_error(opts.out, exc) from None
        if on_start is not None:
            on_start(len(jobs))
        if on_result is not None:  # it hears of a document once its lines are in the feed
            run.batch = 1
        try:  # documents are recorded several to a transaction (``Run.record``): commit the last
            for result in self.results(jobs):
                fold(result, run)
                if on_result is not None:
                    on_result(result)
            del jobs
            run.settle()  # before the collision check's queries and re-runs
            if bulk:
                bulk = False
                db.index_hashes()
            self._widen_collisions(found, run, processed_at)
            self.gone = {}
            for rel in gone:
                entry_files = len(db.files_of(rel))
                forget(run, rel)
                self.gone[rel] = entry_files
            # an output that was empty holds only what this run wrote, unless a document failed
            # (a worker stopped while renaming can leave temp files): no orphans to look for
            if sweep_now and not (empty_out and not summary.failures):
                sweep(run)
        finally:
            run.settle()
            if bulk:  # the sync stopped half-way: the index is made now, or when the state is next opened
                with suppress(Exception):
                    db.index_hashes()
        prune_folders(opts.out, run.emptied)
        summary.chunks = db.meta_int("chunks")
        summary.tokens = db.meta_int("tokens")
        if run.error is not None:  # the next run repairs from the in-flight rows; say so, exit 2
            summary.failures.append(str(_state_error(opts.out, run.error, started=True)))
            summary.state_error = True
            self.recovering |= touched
            self.sweep_due = True
            summary.seconds = time.perf_counter() - started
            return summary
        # the state is true now: what is left to recover are documents whose files may not
        # be what it says (a failed write), and a sweep if a stale file would not go
        self.recovering = (self.recovering - touched) | run.unsafe
        sweep_was = self.sweep_due
        self.sweep_due = (self.sweep_due and not sweep_now) or run.left
        signed = scan.signatures(self.recovering) if paths is None else {}
        with suppress(Exception):  # harmless if it fails: the next run re-checks what this one touched
            if touched or sweep_now or sweep_was != self.sweep_due or folders.seen or signed:
                with db.transaction():
                    db.sign(signed)  # after this sync's last write to a document's row
                    db.set_inflight(self.recovering, sweep=self.sweep_due)
                    db.set_meta(written_at=now_iso(), made_since=0)
                    db.set_folder_mtimes({f: m for f, m in folders.seen.items() if f not in run.recorded})
                    db.set_folder_mtimes(_mtimes(opts.out, run.recorded))  # after our last change to them
            if feed_mod.due(db):
                feed_mod.compact(db)
            if sweep_now and not self.recovering:
                clear_journals(opts.out)
            else:
                clear_journals(opts.out, (run.vanished | touched) - self.recovering)
        summary.seconds = time.perf_counter() - started
        return summary

    def _begin(
        self,
        run: Run,
        touched: set[str],
        sweep_now: bool,
        header: dict[str, str],
        mtimes: dict[str, int],
        bulk: bool = False,
    ) -> None:
        """Before the first chunk file is touched (crash safety): the in-flight rows, the header.

        ``bulk``: the state is empty and many documents are coming: the chunks' hash index
        is dropped, to be made once they are all recorded (``StateDB.index_hashes``).
        """
        db = self.db
        with db.transaction():
            if bulk:
                db.drop_hash_index()
            if touched or sweep_now:
                db.set_inflight(touched | self.recovering, sweep=True)
                db.set_meta(generation=run.generation, run_id=run.run_id)
                # a run that died left its chunks of generation made_since: still "made now"
                run.made_since = db.meta_int("made_since") or run.generation
                db.set_meta(made_since=run.made_since)
            db.set_meta(**header)
            for rel, mtime in mtimes.items():
                db.touch_doc(rel, mtime)

    def _widen_collisions(self, found: list[Found], run: Run, processed_at: str) -> None:
        """``doc_uid|r`` must be unique in the corpus: widen ``r=`` to 12 hex on a collision (000).

        Indexed queries (on ``uid_rev``) for the documents recorded now, not a sort of the corpus.
        """
        summary, db = run.summary, self.db
        paths: dict[str, Found] = {}  # built on the first collision only
        seen: set[str] = set()
        keys = sorted({key for key in run.processed.values() if key})
        held = db.uid_revs_held_twice(keys)  # a few queries for all, then one per collision
        for key in keys:
            if key not in held or key in seen:
                continue
            seen.add(key)
            owners = db.rels_with_uid_rev(key)
            for rel, width in owners[1:]:
                first = owners[0][0]
                if not paths:
                    paths.update((f.rel_path, f) for f in found)
                if rel not in paths and (
                    one := find_one(self.opts.corpus, rel, self.opts.out, self.opts.exclude)
                ):
                    paths[rel] = one  # a document of a folder the walk did not list one by one
                if width >= 12 or rel not in paths:
                    summary.failures.append(
                        f"{rel}: mint: chunk ids collide with {first} "
                        "(hint: give each document a unique doc_id in its front matter)"
                    )
                    continue
                summary.warnings.append(f"{rel}: mint: doc_uid|r collides with {first}; r= widened to 12 hex")
                job = self._job(paths[rel], db.entry(rel), processed_at, trusted=True)
                job.rev_width = 12
                result = next(iter(self.results([job])))
                fold(result, run, rev_width=12)
                summary.processed -= 1


def _mtimes(out: Path, folders: Iterable[str]) -> dict[str, int]:
    """The mtimes of output folders this sync wrote into, once it is done with them.

    Taken at the end, because writing into a folder's subfolders (making one) moves its
    mtime too. A chunk file deleted by hand while a sync runs is found by ``--full`` or
    ``validate``, not by the next run.
    """
    found: dict[str, int] = {}
    for folder in folders:
        with suppress(OSError):
            found[folder] = os.stat(out / folder if folder else out).st_mtime_ns
    return found


def _dumps(value: Any) -> str:
    import orjson

    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _holds_nothing(out: Path) -> bool:
    """True when ``out`` has nothing in it but chunkyard's own state folder."""
    try:
        with os.scandir(out) as entries:
            return all(e.name == STATE_DIR for e in entries)
    except OSError:
        return False
