"""The plan of a sync: what to chunk, what is gone, what to leave alone, decided before anything is written.

``plan_sync`` reads the corpus (a walk, or the named paths) and the state, and returns one
frozen ``Plan``: the jobs for the workers, the documents that are gone, the unchanged
documents whose mtime alone moved, and the failures found on the way (unreadable
folders, two documents that would write the same chunk files). It writes nothing, so a
sync that fails to plan has changed nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline._version import __version__
from pipeline.run.db import StateDB
from pipeline.run.discover import Found, discover, find_one
from pipeline.run.model import Job, Options
from pipeline.run.scan import RACY_SECONDS, CorpusScan, OutputFolders, unchanged_mtime
from pipeline.run.state import now_iso

#: A document's freshness columns in ``StateDB.stamp`` (one document, for a sync of paths).
_SIZE, _MTIME, _HASH, _POLICY, _VERSION = range(5)


@dataclass(frozen=True, slots=True)
class Plan:
    """What one sync is to do, decided from the corpus and the state before any write."""

    whole: bool  #: a whole-corpus sync (a walk), not one of named paths
    found: tuple[Found, ...]  #: the documents there now (name clashes dropped)
    jobs: tuple[Job, ...]  #: documents to chunk, in path order
    gone: tuple[str, ...]  #: recorded documents that are no longer documents
    touched: frozenset[str]  #: what the in-flight record holds while the sync runs
    #: unchanged documents (hashed) whose mtime moved: only the recorded mtime changes
    new_mtimes: Mapping[str, int]
    documents: int  #: documents in the corpus (or among the named paths)
    skipped: int  #: documents found current
    failures: tuple[str, ...]  #: unreadable folders, name clashes
    sweep: bool  #: look for files no document claims (after a crash, or ``--full``)
    unrecorded: frozenset[str]  #: documents of jobs the state has no row for
    processed_at: str  #: the jobs' ``processedAt``
    output_was_empty: bool  #: the output held no chunk file: only what this sync writes will be there
    #: corpus folders listed one by one, with their signatures (signed at the end if all is current)
    scan: CorpusScan | None = field(default=None, compare=False)
    out_folders: OutputFolders | None = field(default=None, compare=False)

    @property
    def writes(self) -> bool:
        """The sync writes chunk files or removes some: the in-flight record goes first."""
        return bool(self.touched) or self.sweep


@dataclass(slots=True)
class Context:
    """What the planner reads besides the corpus: the session's state and choices."""

    opts: Options
    db: StateDB
    policy_hash: str
    recovering: set[str]  #: documents a run that died was working on
    sweep_due: bool  #: the output may hold orphans: sweep on the next whole-corpus sync
    output_was_empty: bool  #: the output held no chunk file when the session began
    #: called at most once, when a document first looks changed (None: never)
    on_first_change: Callable[[], None] | None = None


def plan_sync(ctx: Context, paths: Iterable[str] | None) -> Plan:
    """The plan for the whole corpus (``paths`` None), or for the corpus-relative ``paths``."""
    opts, db = ctx.opts, ctx.db
    since = float(db.meta("written_at_epoch") or 0.0)
    failures: list[str] = []
    if paths is None:
        scan = CorpusScan(
            db,
            opts.out,
            ctx.policy_hash,
            full=opts.full,
            recovering=ctx.recovering,
            on_first_change=ctx.on_first_change,
        )
        unreadable: list[str] = []  # folders the walk could not list: their documents keep their chunks
        found, problems = discover(
            opts.corpus, opts.out, opts.exclude, unreadable=unreadable, stat=True, on_folder=scan.folder
        )
        failures.extend(problems)
        stamps, outdated, folders = scan.stamps, scan.outdated, scan.out_folders
        unknown = scan.under_unreadable(unreadable)
        held = {rel.rsplit(".", 1)[0]: rel for rel in unknown}
        if held or len({f.rel_path.rsplit(".", 1)[0] for f in found}) < len(found):
            found = _drop_name_clashes(found, held.get, failures)
        present = {f.rel_path for f in found}
        gone = sorted((stamps.keys() - present - unknown) | scan.gone_folders(unreadable))
        documents = skipped = scan.skipped  # documents of folders whose signature held
    else:
        scan = None
        wanted = sorted(set(paths))
        found = [f for f in (find_one(opts.corpus, rel, opts.out, opts.exclude) for rel in wanted) if f]
        if found and ctx.on_first_change is not None:  # ``--changed``: most likely to chunk
            ctx.on_first_change()
        considered = set(wanted)

        def taken(name: str) -> str | None:
            return next((r for r in db.rels_named(name) if r not in considered), None)

        found = _drop_name_clashes(found, taken, failures)
        present = {f.rel_path for f in found}
        rows = {rel: s for rel in wanted if (s := db.stamp(rel)) is not None}
        outdated = {
            rel for rel, s in rows.items() if s[_POLICY] != ctx.policy_hash or s[_VERSION] != __version__
        }
        stamps = {rel: (s[_SIZE], s[_MTIME]) for rel, s in rows.items()}
        gone = sorted(rel for rel in wanted if rel in stamps and rel not in present)
        folders = OutputFolders(opts.out, db, None)
        documents = skipped = 0
    processed_at = now_iso()
    jobs: list[Job] = []
    unrecorded: set[str] = set()
    new_mtimes: dict[str, int] = {}
    # the common case first, inline: the stat the walk took is the one recorded, not racy,
    # and the output folder is known whole (``OutputFolders``); anything else takes the long way
    trusted_before = int((since - RACY_SECONDS) * 1e9)
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
            and rel not in ctx.recovering
            and folders.whole(rel.rpartition("/")[0])
        ):
            skipped += 1
            continue
        forced = opts.full or rel in ctx.recovering or (stamp is not None and folders.missing(rel))
        mtime = None if forced or rel in outdated else unchanged_mtime(f, stamp, since, db)
        if mtime is not None:
            if stamp is not None and mtime != stamp[1]:
                new_mtimes[rel] = mtime
            skipped += 1
            continue
        if stamp is None:  # no row: nothing to look up, now or when its result is recorded
            unrecorded.add(rel)
        entry = None if stamp is None else db.entry(rel)
        jobs.append(
            make_job(opts, f, entry, processed_at, trusted=not forced, output_was_empty=ctx.output_was_empty)
        )
    del stamps
    sweep = paths is None and (opts.full or ctx.sweep_due)
    touched = {j.rel_path for j in jobs} | set(gone)
    if sweep:  # in-flight documents that are gone and were never recorded: the sweep
        touched |= ctx.recovering - present  # removes their orphans
    return Plan(
        whole=paths is None,
        found=tuple(found),
        jobs=tuple(jobs),
        gone=tuple(gone),
        touched=frozenset(touched),
        new_mtimes=new_mtimes,
        documents=documents + len(found),
        skipped=skipped,
        failures=tuple(failures),
        sweep=sweep,
        unrecorded=frozenset(unrecorded),
        processed_at=processed_at,
        output_was_empty=ctx.output_was_empty,
        scan=scan,
        out_folders=folders,
    )


def make_job(
    opts: Options,
    f: Found,
    entry: dict[str, Any] | None,
    processed_at: str,
    *,
    trusted: bool,
    output_was_empty: bool = False,
    rev_width: int | None = None,
) -> Job:
    """The job of one document, with what the state had of it (``entry``, None for a new one)."""
    entry = entry or {}
    return Job(
        f.path,
        f.rel_path,
        str(opts.out),
        opts.policy,
        processed_at,
        tuple(entry.get("files", ())),
        opts.max_bytes,
        rev_width if rev_width is not None else int(entry.get("rev_width", 8)),
        tuple(entry.get("chunk_ids", ())),
        tuple(entry.get("hashes", ())),
        tuple(entry.get("digests", ())),
        trusted,
        output_was_empty,
    )


def _drop_name_clashes(
    found: list[Found], taken: Callable[[str], str | None], failures: list[str]
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
            failures.append(
                f"{f.rel_path}: discover: its chunk files would be those of {owner} "
                f"(both are doc_{name.rsplit('/', 1)[-1]}) (hint: rename one of them, or --exclude it)"
            )
            continue
        owners[name] = f.rel_path
        kept.append(f)
    return kept


__all__ = ["Context", "Plan", "make_job", "plan_sync"]
