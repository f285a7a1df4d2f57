"""A whole-corpus run: discovery, the process pool, stale files, manifest, change feed (SPEC §5)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Self

import xxhash

from . import __version__
from .discover import Found, discover, find_one
from .errors import UsageError
from .mint import policy_hash
from .models import Policy
from .normalize import DEFAULT_MAX_BYTES
from .runner import DocResult, Job, counter, process_document
from .state import (
    STATE_DIR,
    append_feed,
    event,
    load_manifest,
    new_run_id,
    now_iso,
    output_lock,
    save_manifest,
)

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
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    stage_seconds: dict[str, float] = field(default_factory=dict)

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
            "seconds": round(self.seconds, 3),
            "mb_per_s": round(self.mb_per_s, 3),
            "failed": len(self.failures),
            "failures": self.failures,
            "warnings": self.warnings,
            "stage_seconds": {k: round(v, 3) for k, v in self.stage_seconds.items()},
        }


def _fresh(found: Found, entry: dict[str, Any] | None, p_hash: str, since: float) -> bool:
    """True when the manifest entry still describes this file: same bytes, policy, version."""
    if not entry or entry.get("policy_hash") != p_hash or entry.get("version") != __version__:
        return False
    try:
        st = os.stat(found.path)
    except OSError:
        return False
    if st.st_size != entry.get("size"):
        return False
    if st.st_mtime_ns == entry.get("mtime_ns") and st.st_mtime < since - _RACY_SECONDS:
        return True
    try:  # the stat is ambiguous: let the content decide
        with open(found.path, "rb") as fh:
            same = xxhash.xxh3_64_hexdigest(fh.read()) == entry.get("source_hash")
    except OSError:
        return False
    if same:
        entry["mtime_ns"] = st.st_mtime_ns
    return same


def _results(jobs: list[Job], workers: int) -> Iterator[DocResult]:
    if workers <= 1 or len(jobs) <= 1:
        yield from map(process_document, jobs)
        return
    ctx = get_context("fork")  # children inherit the loaded tokenizer
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
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


class Session:
    """Holds the output lock and the manifest across syncs (one ``ingest``, or a whole ``watch``)."""

    def __init__(self, opts: Options, on_wait: Callable[[str], None] | None = None) -> None:
        if not opts.corpus.is_dir():
            raise UsageError(f"{opts.corpus}: corpus folder not found; pass the folder of Markdown to chunk")
        self.opts = opts
        self.on_wait = on_wait
        self.p_hash = policy_hash(opts.policy)
        self.manifest: dict[str, Any] = {}
        self._lock: Any = None

    def __enter__(self) -> Self:
        self._lock = output_lock(self.opts.out, self.opts.wait, self.on_wait)
        self._lock.__enter__()
        self.manifest = load_manifest(self.opts.out)
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.__exit__(*exc)

    def sync(
        self,
        paths: Iterable[str] | None = None,
        on_start: Callable[[int], None] | None = None,
        on_result: Callable[[DocResult], None] | None = None,
    ) -> Summary:
        """Bring the output up to date: the whole corpus, or only ``paths`` (corpus-relative).

        A path that is no longer a document (deleted, renamed away, excluded) has its
        chunk files removed. Chunk files are written first, stale ones removed next,
        the change feed appended, and the manifest written last.
        """
        opts = self.opts
        run_id = new_run_id()
        summary = Summary(run_id)
        started = time.perf_counter()
        generation = int(self.manifest.get("generation", 0)) + 1
        since = float(self.manifest.get("written_at_epoch", 0.0))
        old_docs: dict[str, dict[str, Any]] = self.manifest.get("docs", {})
        if paths is None:
            found, problems = discover(opts.corpus, opts.out, opts.exclude)
            summary.failures.extend(problems)
            considered = set(old_docs) | {f.rel_path for f in found}
            new_docs: dict[str, dict[str, Any]] = {}
        else:
            wanted = sorted(set(paths))
            found = [f for f in (find_one(opts.corpus, rel, opts.out, opts.exclude) for rel in wanted) if f]
            considered = set(wanted)
            new_docs = {rel: e for rel, e in old_docs.items() if rel not in considered}
        summary.documents = len(found)
        processed_at = now_iso()
        jobs: list[Job] = []
        for f in found:
            entry = old_docs.get(f.rel_path)
            if not opts.full and _fresh(f, entry, self.p_hash, since):
                new_docs[f.rel_path] = entry  # type: ignore[assignment]
                summary.skipped += 1
                continue
            jobs.append(
                Job(
                    f.path,
                    f.rel_path,
                    str(opts.out),
                    opts.policy,
                    processed_at,
                    tuple((entry or {}).get("files", ())),
                    opts.max_bytes,
                    int((entry or {}).get("rev_width", 8)),
                )
            )
        if on_start is not None:
            on_start(len(jobs))
        if jobs:
            counter(opts.policy.tokenizer)  # load once, before the pool forks
        events: list[dict[str, Any]] = []
        for result in _results(jobs, opts.jobs):
            _record(result, old_docs, new_docs, summary, events, opts, self.p_hash, run_id, generation)
            if on_result is not None:
                on_result(result)
        _widen_collisions(
            new_docs, found, old_docs, summary, events, opts, self.p_hash, run_id, generation, processed_at
        )
        for entry in new_docs.values():
            summary.chunks += len(entry["files"])
            summary.tokens += int(entry.get("tokens", 0))
        removed = _remove_stale(
            opts.out, old_docs, new_docs, considered, run_id, generation, events, sweep=paths is None
        )
        summary.removed = len(removed)
        append_feed(opts.out, events)
        self.manifest = {
            "format": 1,
            "generation": generation,
            "version": __version__,
            "policy_hash": self.p_hash,
            "policy": opts.policy.as_dict(),
            "corpus": str(opts.corpus.resolve()),
            "run_id": run_id,
            "written_at": now_iso(),
            "written_at_epoch": time.time(),
            "docs": new_docs,
        }
        save_manifest(opts.out, self.manifest)
        summary.seconds = time.perf_counter() - started
        return summary


def _record(
    result: DocResult,
    old_docs: dict[str, dict[str, Any]],
    new_docs: dict[str, dict[str, Any]],
    summary: Summary,
    events: list[dict[str, Any]],
    opts: Options,
    p_hash: str,
    run_id: str,
    generation: int,
) -> None:
    """Fold one document's result into the new manifest, the summary and the feed."""
    summary.processed += 1
    summary.warnings.extend(result.warnings)
    for stage, secs in result.seconds.items():
        summary.stage_seconds[stage] = summary.stage_seconds.get(stage, 0.0) + secs
    if result.error is not None:
        summary.failures.append(result.error)
        if result.rel_path in old_docs:  # a failed document keeps its previous chunks
            new_docs[result.rel_path] = old_docs[result.rel_path]
        return
    summary.bytes += result.size
    summary.added += len(result.added)
    summary.changed += len(result.changed)
    summary.unchanged += len(result.files) - len(result.added) - len(result.changed)
    try:
        mtime_ns = os.stat(opts.corpus / result.rel_path).st_mtime_ns
    except OSError:
        mtime_ns = 0
    prev = old_docs.get(result.rel_path, {})
    new_docs[result.rel_path] = {
        "source_hash": result.source_hash,
        "size": result.size,
        "mtime_ns": mtime_ns,
        "policy_hash": p_hash,
        "version": __version__,
        "uid_rev": result.uid_rev,
        "rev_width": int(prev.get("rev_width", 8)) if prev.get("uid_rev") == result.uid_rev else 8,
        "files": result.files,
        "ids": result.ids,
        "chunk_ids": result.chunk_ids,
        "hashes": result.hashes,
        "tokens": result.tokens,
    }
    moved = set(result.added) | set(result.changed)
    for i, file in enumerate(result.files):
        if file in moved:
            events.append(
                event(
                    "ingest.write",
                    run_id,
                    generation,
                    file=file,
                    id=result.ids[i],
                    chunk_id=result.chunk_ids[i],
                    hash=result.hashes[i],
                    source=result.rel_path,
                    change="added" if file in result.added else "changed",
                )
            )


def _widen_collisions(
    new_docs: dict[str, dict[str, Any]],
    found: list[Found],
    old_docs: dict[str, dict[str, Any]],
    summary: Summary,
    events: list[dict[str, Any]],
    opts: Options,
    p_hash: str,
    run_id: str,
    generation: int,
    processed_at: str,
) -> None:
    """``doc_uid|r`` must be unique in the corpus: widen ``r=`` to 12 hex on a collision (000)."""
    owners: dict[str, str] = {}
    paths = {f.rel_path: f.path for f in found}
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
        result = process_document(
            Job(
                paths[rel],
                rel,
                str(opts.out),
                opts.policy,
                processed_at,
                tuple(new_docs[rel]["files"]),
                opts.max_bytes,
                12,
            )
        )
        _record(result, old_docs, new_docs, summary, events, opts, p_hash, run_id, generation)
        summary.processed -= 1
        if result.error is None:
            new_docs[rel]["rev_width"] = 12


def _remove_stale(
    out: Path,
    old_docs: dict[str, dict[str, Any]],
    new_docs: dict[str, dict[str, Any]],
    considered: set[str],
    run_id: str,
    generation: int,
    events: list[dict[str, Any]],
    *,
    sweep: bool,
) -> list[str]:
    """Delete chunk files no document claims any more (shrunk, renamed or deleted documents).

    With ``sweep`` the whole output folder is walked too, so orphans of an
    interrupted run or a lost manifest, and temp files, go as well.
    """
    keep = {f for entry in new_docs.values() for f in entry["files"]}
    known: dict[str, tuple[str, str, str, str]] = {}
    for rel in considered:
        entry = old_docs.get(rel) or {}
        for i, f in enumerate(entry.get("files", [])):
            known[f] = (rel, entry["ids"][i], entry["chunk_ids"][i], entry["hashes"][i])
    doomed = sorted(f for f in known if f not in keep)
    if sweep:
        doomed = sorted(set(doomed) | set(_orphans(out, keep)))
    removed: list[str] = []
    for rel_file in doomed:
        name = rel_file.rsplit("/", 1)[-1]
        try:
            os.unlink(out / rel_file)
        except FileNotFoundError:
            pass
        except OSError:
            continue
        if name.startswith(".") and name.endswith(".tmp"):
            continue
        removed.append(rel_file)
        src, chunk_ref, chunk_id, digest = known.get(rel_file, ("", "", "", ""))
        events.append(
            event(
                "ingest.delete",
                run_id,
                generation,
                file=rel_file,
                id=chunk_ref,
                chunk_id=chunk_id,
                hash=digest,
                source=src,
            )
        )
    for folder in sorted({str(Path(f).parent) for f in removed}, key=len, reverse=True):
        path = out / folder
        while folder not in ("", ".") and path != out:
            try:
                path.rmdir()  # only succeeds when empty
            except OSError:
                break
            path = path.parent
    return removed


def _orphans(out: Path, keep: set[str]) -> Iterator[str]:
    """Chunk files and temp files under ``out`` that no manifest entry claims."""
    for dirpath, dirnames, filenames in os.walk(out):
        dirnames[:] = [d for d in dirnames if d != STATE_DIR]
        rel_dir = os.path.relpath(dirpath, out).replace(os.sep, "/")
        for name in filenames:
            rel_file = name if rel_dir == "." else f"{rel_dir}/{name}"
            is_tmp = name.startswith(".") and name.endswith(".tmp")
            if is_tmp or (name.startswith("doc_") and name.endswith(".json") and rel_file not in keep):
                yield rel_file
