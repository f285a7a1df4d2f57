"""A whole-corpus run: discovery, the process pool, stale files, manifest, change feed (SPEC §5)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import xxhash

from . import __version__
from .discover import Found, discover
from .errors import UsageError
from .mint import policy_hash
from .models import Policy
from .normalize import DEFAULT_MAX_BYTES
from .runner import DocResult, Job, counter, process_document
from .state import (
    STATE_DIR, append_feed, event, load_manifest, new_run_id, now_iso, output_lock, save_manifest,
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
            "run_id": self.run_id, "documents": self.documents, "processed": self.processed,
            "skipped": self.skipped, "chunks": self.chunks, "tokens": self.tokens,
            "bytes": self.bytes, "added": self.added, "changed": self.changed,
            "unchanged": self.unchanged, "removed": self.removed,
            "seconds": round(self.seconds, 3), "mb_per_s": round(self.mb_per_s, 3),
            "failed": len(self.failures), "failures": self.failures, "warnings": self.warnings,
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


def ingest(opts: Options, on_start: Callable[[int], None] | None = None,
           on_result: Callable[[DocResult], None] | None = None,
           on_wait: Callable[[str], None] | None = None) -> Summary:
    """Chunk a corpus into ``opts.out``; incremental unless ``opts.full``."""
    if not opts.corpus.is_dir():
        raise UsageError(f"{opts.corpus}: corpus folder not found; pass the folder of Markdown to chunk")
    run_id = new_run_id()
    summary = Summary(run_id)
    started = time.perf_counter()
    counter(opts.policy.tokenizer)  # load once, before the pool forks; fails early if unknown
    with output_lock(opts.out, opts.wait, on_wait):
        manifest = load_manifest(opts.out)
        generation = int(manifest.get("generation", 0)) + 1
        since = float(manifest.get("written_at_epoch", 0.0))
        old_docs: dict[str, dict[str, Any]] = manifest.get("docs", {})
        p_hash = policy_hash(opts.policy)
        found, problems = discover(opts.corpus, opts.out, opts.exclude)
        summary.failures.extend(problems)
        summary.documents = len(found)
        processed_at = now_iso()
        new_docs: dict[str, dict[str, Any]] = {}
        jobs: list[Job] = []
        for f in found:
            entry = old_docs.get(f.rel_path)
            if not opts.full and _fresh(f, entry, p_hash, since):
                new_docs[f.rel_path] = entry  # type: ignore[assignment]
                summary.skipped += 1
                continue
            jobs.append(Job(f.path, f.rel_path, str(opts.out), opts.policy, processed_at,
                            tuple((entry or {}).get("files", ())), opts.max_bytes,
                            int((entry or {}).get("rev_width", 8))))
        if on_start is not None:
            on_start(len(jobs))
        events: list[dict[str, Any]] = []
        for result in _results(jobs, opts.jobs):
            _record(result, old_docs, new_docs, summary, events, opts, p_hash, run_id, generation)
            if on_result is not None:
                on_result(result)
        _widen_collisions(new_docs, found, old_docs, summary, events, opts, p_hash, run_id, generation, processed_at)
        for rel, entry in new_docs.items():
            summary.chunks += len(entry["files"])
            summary.tokens += int(entry.get("tokens", 0))
        removed = _remove_stale(opts.out, old_docs, new_docs, run_id, generation, events)
        summary.removed = len(removed)
        append_feed(opts.out, events)
        save_manifest(opts.out, {
            "format": 1, "generation": generation, "version": __version__,
            "policy_hash": p_hash, "policy": opts.policy.as_dict(), "run_id": run_id,
            "written_at": now_iso(), "written_at_epoch": time.time(), "docs": new_docs,
        })
    summary.seconds = time.perf_counter() - started
    return summary


def _record(result: DocResult, old_docs: dict[str, dict[str, Any]], new_docs: dict[str, dict[str, Any]],
            summary: Summary, events: list[dict[str, Any]], opts: Options, p_hash: str,
            run_id: str, generation: int) -> None:
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
        "source_hash": result.source_hash, "size": result.size, "mtime_ns": mtime_ns,
        "policy_hash": p_hash, "version": __version__, "uid_rev": result.uid_rev,
        "rev_width": int(prev.get("rev_width", 8)) if prev.get("uid_rev") == result.uid_rev else 8,
        "files": result.files, "ids": result.ids, "chunk_ids": result.chunk_ids,
        "hashes": result.hashes, "tokens": result.tokens,
    }
    moved = set(result.added) | set(result.changed)
    for i, file in enumerate(result.files):
        if file in moved:
            events.append(event("ingest.write", run_id, generation, file=file, id=result.ids[i],
                                chunk_id=result.chunk_ids[i], hash=result.hashes[i],
                                source=result.rel_path,
                                change="added" if file in result.added else "changed"))


def _widen_collisions(new_docs: dict[str, dict[str, Any]], found: list[Found],
                      old_docs: dict[str, dict[str, Any]], summary: Summary,
                      events: list[dict[str, Any]], opts: Options, p_hash: str,
                      run_id: str, generation: int, processed_at: str) -> None:
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
                "(hint: give each document a unique doc_id in its front matter)")
            continue
        summary.warnings.append(f"{rel}: mint: doc_uid|r collides with {owners[key]}; r= widened to 12 hex")
        result = process_document(Job(paths[rel], rel, str(opts.out), opts.policy, processed_at,
                                      tuple(new_docs[rel]["files"]), opts.max_bytes, 12))
        _record(result, old_docs, new_docs, summary, events, opts, p_hash, run_id, generation)
        summary.processed -= 1
        if result.error is None:
            new_docs[rel]["rev_width"] = 12


def _remove_stale(out: Path, old_docs: dict[str, dict[str, Any]], new_docs: dict[str, dict[str, Any]],
                  run_id: str, generation: int, events: list[dict[str, Any]]) -> list[str]:
    """Delete chunk files no document claims any more (shrunk, renamed, deleted, or orphaned)."""
    keep = {f for entry in new_docs.values() for f in entry["files"]}
    removed: list[str] = []
    known: dict[str, tuple[str, str, str, str]] = {}
    for rel, entry in old_docs.items():
        for i, f in enumerate(entry.get("files", [])):
            known[f] = (rel, entry["ids"][i], entry["chunk_ids"][i], entry["hashes"][i])
    for dirpath, dirnames, filenames in os.walk(out):
        dirnames[:] = sorted(d for d in dirnames if d != STATE_DIR)
        rel_dir = os.path.relpath(dirpath, out).replace(os.sep, "/")
        for name in sorted(filenames):
            rel_file = name if rel_dir == "." else f"{rel_dir}/{name}"
            is_tmp = name.startswith(".") and name.endswith(".tmp")
            if not is_tmp and (not name.startswith("doc_") or not name.endswith(".json") or rel_file in keep):
                continue
            try:
                os.unlink(os.path.join(dirpath, name))
            except OSError:
                continue
            if is_tmp:
                continue
            removed.append(rel_file)
            src, cid_id, chunk_id, digest = known.get(rel_file, ("", "", "", ""))
            events.append(event("ingest.delete", run_id, generation, file=rel_file, id=cid_id,
                                chunk_id=chunk_id, hash=digest, source=src))
    for dirpath, _dirs, _files in sorted(os.walk(out, topdown=False), reverse=False):
        if dirpath != str(out) and STATE_DIR not in Path(dirpath).parts:
            try:
                os.rmdir(dirpath)  # only succeeds when empty
            except OSError:
                pass
    return removed
