"""The session: the one writer of an output folder, across syncs (one ``ingest``, or a whole ``watch``).

A sync reads as five steps, each in a module of its own:

1. **plan** (``plan.py``): the corpus and the state → one frozen ``Plan`` (jobs, gone,
   skipped, failures); nothing is written;
2. **begin**: the in-flight record and the header, before any chunk file is touched;
3. **execute** (``executor.py``): the jobs go to an executor, which yields results in order;
4. **record** (``record.py``, ``writer.py``): each result, then each gone document, then the
   sweep, recorded whole with its feed lines;
5. **finish**: the in-flight record cleared, folder signatures and mtimes kept, the feed
   compacted when due.

Crash safety (docs/spec.md, Runs): the documents a sync is about to touch are recorded
before it touches any; each document is then recorded whole, with its feed lines, in
one transaction; the in-flight record is replaced when the sync ends. A session that
finds one (or the sweep flag) left by a run that died re-checks those documents against
the disk, sweeps the output for orphans and temp files, and announces in the change feed
everything the state has not seen: the next run converges to what a clean run produces.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any, Self

from pipeline._version import __version__
from pipeline.errors import UsageError
from pipeline.run import feed
from pipeline.run.db import StateDB, StateError, db_path
from pipeline.run.discover import Found, find_one
from pipeline.run.executor import Executor, LocalPool, document_executor
from pipeline.run.migrate import migrate
from pipeline.run.model import DocResult, Job, Options, Summary
from pipeline.run.plan import Context, Plan, make_job, plan_sync
from pipeline.run.pool import GuardPool
from pipeline.run.record import prune_folders, record_gone, record_result, sweep_orphans
from pipeline.run.state import STATE_DIR, clear_journals, new_run_id, now_iso, output_lock, state_dir
from pipeline.run.writer import BATCH, StateWriter
from pipeline.stages.mint import policy_hash

#: A sync into an empty state of this many documents or more makes the chunks' hash index
#: at its end instead of row by row: a hash lands anywhere in the index, so each commit of
#: a big sync would write most of its pages again.
BULK = 64


class Session:
    """Holds the output lock, the state database and the executor across syncs.

    Args:
        opts: the run's options (``watch`` replaces them after its first sync).
        on_wait: called with the holder's name while waiting for the output lock.
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
        #: one ``ingest``, not a long ``watch``: a worker may load the chunker itself (``_warm``)
        self.one_shot = False
        self._lock: Any = None
        #: the executor that holds processes or a connection (guard pool, Ray), kept across syncs
        self._executor: Executor[Job, DocResult] | None = None
        #: the output held no chunk file when the session began (until its first sync)
        self._output_was_empty = False

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
        self._output_was_empty = _holds_nothing(self.opts.out)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._executor is not None:  # first: a live worker holds a copy of the lock
            self._executor.close()
            self._executor = None
        if self.db is not None:
            self.db.close()
        self._lock.__exit__(*exc)

    def entry(self, rel: str) -> dict[str, Any] | None:
        """The state's entry of one document (files, ids, hashes, freshness), or None."""
        return self.db.entry(rel)

    # -- the sync ------------------------------------------------------------------------

    def sync(
        self,
        paths: Iterable[str] | None = None,
        on_start: Callable[[int], None] | None = None,
        on_result: Callable[[DocResult], None] | None = None,
    ) -> Summary:
        """Bring the output up to date: the whole corpus, or only ``paths`` (corpus-relative).

        A path that is no longer a document (deleted, renamed away, excluded) has its chunk
        files removed. ``on_start`` hears how many documents will be chunked; ``on_result``
        hears of each document once its lines are in the feed.
        """
        started = time.perf_counter()
        writer = self._writer(whole=paths is None, commit_each=on_result is not None)
        plan = plan_sync(self._context(paths is None), paths)
        self._output_was_empty = False  # true for the first sync at most
        summary = writer.summary
        summary.failures.extend(plan.failures)
        summary.documents, summary.skipped = plan.documents, plan.skipped
        writer.unrecorded = set(plan.unrecorded)
        bulk = self._begin(plan, writer)
        if on_start is not None:
            on_start(len(plan.jobs))
        self._execute_and_record(plan, writer, bulk, on_result)
        prune_folders(self.opts.out, writer.maybe_emptied)
        summary.chunks, summary.tokens = self.db.meta_int("chunks"), self.db.meta_int("tokens")
        if writer.error is None:
            self._finish(plan, writer)
        else:  # the next run repairs from the in-flight record; say so, exit 2
            summary.failures.append(str(_state_error(self.opts.out, writer.error, started=True)))
            summary.state_error = True
            self.recovering |= plan.touched
            self.sweep_due = True
        summary.seconds = time.perf_counter() - started
        return summary

    def _writer(self, *, whole: bool, commit_each: bool) -> StateWriter:
        run_id = new_run_id()
        summary = Summary(run_id)
        summary.warnings.extend(self.notes)
        self.notes = []
        return StateWriter(
            self.opts,
            self.p_hash,
            run_id,
            self.db.meta_int("generation") + 1,
            summary,
            self.db,
            set(self.recovering),
            whole=whole,
            copy_behind=self.one_shot,
            max_docs_per_commit=1 if commit_each else BATCH,
            keep_births=not self._output_was_empty,
        )

    def _context(self, whole: bool) -> Context:
        """What the planner needs of the session; a worker is warmed at the first change, if worth it."""
        opts = self.opts
        warm = self.one_shot and opts.guarded
        if whole:  # everything will be chunked by several jobs: the parent loads it and forks them all
            warm = warm and not (opts.jobs > 1 and (opts.full or self._output_was_empty))
        return Context(
            opts,
            self.db,
            self.p_hash,
            self.recovering,
            self.sweep_due,
            self._output_was_empty,
            self._warm if warm else None,
        )

    def _begin(self, plan: Plan, writer: StateWriter) -> bool:
        """Before the first chunk file is touched (crash safety): the in-flight record, the header,
        the moved mtimes. Returns whether the chunks' hash index is left to the end (``BULK``)."""
        db, header = self.db, self._header()
        header_moved = any(db.meta(k) != v for k, v in header.items())
        bulk = len(plan.jobs) >= BULK and not db.has_docs()
        if not (plan.writes or header_moved or plan.new_mtimes):
            return bulk
        try:
            with db.transaction():
                if bulk:
                    db.drop_hash_index()
                if plan.writes:
                    db.set_inflight(plan.touched | self.recovering, sweep=True)
                    db.set_meta(generation=writer.generation, run_id=writer.run_id)
                    # a run that died left its chunks of generation made_since: still "made now"
                    writer.made_since = db.meta_int("made_since") or writer.generation
                    db.set_meta(made_since=writer.made_since)
                db.set_meta(**header)
                for rel, mtime in plan.new_mtimes.items():
                    db.touch_doc(rel, mtime)
        except Exception as exc:  # noqa: BLE001 - sqlite3.Error or OSError: nothing was changed
            raise _state_error(self.opts.out, exc) from None
        return bulk

    def _execute_and_record(
        self, plan: Plan, writer: StateWriter, bulk: bool, on_result: Callable[[DocResult], None] | None
    ) -> None:
        """Chunk the jobs and record each result, then the collisions, the gone documents, the sweep."""
        db = self.db
        try:
            for result in self.results(plan.jobs):
                record_result(result, writer)
                if on_result is not None:
                    on_result(result)
            writer.commit()  # before the collision check's queries and re-runs
            if bulk:
                bulk = False
                db.index_hashes()
            self._widen_collisions(plan.found, writer, plan.processed_at, frozenset(plan.gone))
            self.gone = {}
            for rel in plan.gone:
                files = len(db.files_of(rel))
                record_gone(writer, rel)
                self.gone[rel] = files
            # an output that was empty holds only what this run wrote, unless a document failed
            # (a worker stopped while renaming can leave temp files): no orphans to look for
            if plan.sweep and not (plan.output_was_empty and not writer.summary.failures):
                sweep_orphans(writer)
        finally:
            writer.commit()
            if bulk:  # the sync stopped half-way: the index is made now, or when the state is next opened
                with suppress(Exception):
                    db.index_hashes()

    def _finish(self, plan: Plan, writer: StateWriter) -> None:
        """The state is true now: keep what is left to recover, the folders' signatures and mtimes."""
        db, out = self.db, self.opts.out
        # what is left to recover: documents whose files may not be what the state says (a
        # failed write), and a sweep if a stale file would not go
        self.recovering = (self.recovering - plan.touched) | writer.unsafe
        sweep_was = self.sweep_due
        self.sweep_due = (self.sweep_due and not plan.sweep) or writer.removal_failed
        signed = plan.scan.signatures(self.recovering) if plan.scan is not None else {}
        seen = plan.out_folders.seen if plan.out_folders is not None else {}
        with suppress(Exception):  # harmless if it fails: the next run re-checks what this one touched
            if plan.touched or plan.sweep or sweep_was != self.sweep_due or seen or signed:
                with db.transaction():
                    db.sign(signed)  # after this sync's last write to a document's row
                    db.set_inflight(self.recovering, sweep=self.sweep_due)
                    db.set_meta(written_at=now_iso(), made_since=0)
                    db.set_folder_mtimes({f: m for f, m in seen.items() if f not in writer.folders_stamped})
                    db.set_folder_mtimes(
                        _mtimes(out, writer.folders_stamped)
                    )  # after our last change to them
            if feed.due(db):
                feed.compact(db)
            if plan.sweep and not self.recovering:
                clear_journals(out)
            else:
                clear_journals(out, (writer.with_vanished_ids | plan.touched) - self.recovering)

    def _widen_collisions(
        self, found: Iterable[Found], writer: StateWriter, processed_at: str, gone: frozenset[str]
    ) -> None:
        """``doc_uid|r`` must be unique in the corpus: widen ``r=`` to 12 hex on a collision (000).

        Indexed queries (on ``uid_rev``) for the documents recorded now, not a sort of the corpus.
        A document ``gone`` in this sync holds no ids any more: one whose front matter sets
        ``doc_id`` and that moved to another path has the same ids there, moved, not minted twice.
        """
        summary, db, opts = writer.summary, self.db, self.opts
        paths: dict[str, Found] = {}  # built on the first collision only
        seen: set[str] = set()
        keys = sorted({key for key in writer.uid_revs.values() if key})
        held = db.uid_revs_held_twice(keys)  # a few queries for all, then one per collision
        for key in keys:
            if key not in held or key in seen:
                continue
            seen.add(key)
            owners = [(rel, width) for rel, width in db.rels_with_uid_rev(key) if rel not in gone]
            for rel, width in owners[1:]:
                first = owners[0][0]
                if not paths:
                    paths.update((f.rel_path, f) for f in found)
                if rel not in paths and (one := find_one(opts.corpus, rel, opts.out, opts.exclude)):
                    paths[rel] = one  # a document of a folder the walk did not list one by one
                if width >= 12 or rel not in paths:
                    summary.failures.append(
                        f"{rel}: mint: chunk ids collide with {first} "
                        "(hint: give each document a unique doc_id in its front matter)"
                    )
                    continue
                summary.warnings.append(f"{rel}: mint: doc_uid|r collides with {first}; r= widened to 12 hex")
                job = make_job(opts, paths[rel], db.entry(rel), processed_at, trusted=True, rev_width=12)
                result = next(iter(self.results([job])))
                record_result(result, writer, rev_width=12)
                summary.processed -= 1

    # -- the executor --------------------------------------------------------------------

    def results(self, jobs: Iterable[Job]) -> Iterator[DocResult]:
        """Process ``jobs`` on the session's executor; their results, in order.

        The guard pool's workers live as long as the session, so ``watch`` pays no process
        start per save. With both limits off (0), the plain local pool runs instead.
        """
        jobs = list(jobs)
        if not jobs:
            return iter(())
        return self._documents().run(jobs)

    def _documents(self) -> Executor[Job, DocResult]:
        """The executor the options ask for: kept when it holds something, else made per run."""
        if self._executor is not None:
            return self._executor
        executor = document_executor(self.opts)
        if not isinstance(executor, LocalPool):  # a local pool holds nothing: made with the current jobs
            self._executor = executor
        return executor

    def _warm(self) -> None:
        """A document will be chunked: fork a worker that loads the chunker while the walk goes on.

        Only for a one-shot run (``ingest``) with the guard pool: a long ``watch`` loads it all
        in the parent at its first sync, so that no process imports hours into the session.
        """
        executor = self._documents()
        if isinstance(executor, GuardPool):
            executor.warm()

    def _header(self) -> dict[str, str]:
        import orjson

        policy = orjson.dumps(self.opts.policy.as_dict(), option=orjson.OPT_SORT_KEYS).decode()
        return {
            "version": __version__,
            "policy_hash": self.p_hash,
            "policy": policy,
            "corpus": str(self.opts.corpus.resolve()),
        }


def _state_error(out: Path, exc: BaseException, *, started: bool = False) -> UsageError:
    done = "the next run repairs what this one began" if started else "nothing was changed"
    why = getattr(exc, "strerror", None) or exc
    return UsageError(
        f"{out / STATE_DIR}: cannot write chunkyard's state ({why}); {done} "
        "(hint: make the output folder writable, or free some space)"
    )


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


def _holds_nothing(out: Path) -> bool:
    """True when ``out`` has nothing in it but chunkyard's own state folder."""
    try:
        with os.scandir(out) as entries:
            return all(e.name == STATE_DIR for e in entries)
    except OSError:
        return False
