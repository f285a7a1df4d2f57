"""Audit: ``validate`` — 000's validator over a whole chunk store, 001-style return codes (docs/spec.md, Audit tools).

Every document in the manifest is checked on its own (``check_document``, a pure
function of the files it reads, mapped over a process pool); what spans
documents — unique ids, stale files, redirects — is checked once at the end.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from pipeline.audit.chunk_state import ChunkStore, open_store
from pipeline.audit.doccheck import DocOutcome, DocTask, check_document
from pipeline.audit.problems import CODES, STATE_DB_FILE, STATE_REDIRECTS, Problem, Report
from pipeline.models import Policy
from pipeline.run.discover import discover, walk
from pipeline.run.emit import fast_validator
from pipeline.run.executor import LocalPool
from pipeline.run.state import STATE_DIR, STATE_FILE
from pipeline.stages.mint import policy_hash

__all__ = ["CODES", "Problem", "Report", "validate"]

#: Documents handed to the pool at once: what is in flight stays bounded, whatever the corpus.
_WINDOW = 512
#: Fewer documents than this are checked in this process: forking would cost more.
_SERIAL_BELOW = 64


def _document_checker(jobs: int) -> LocalPool[DocTask, DocOutcome]:
    """``check_document`` over a local pool, in order, ``_WINDOW`` documents at a time."""
    return LocalPool(
        check_document,
        jobs,
        chunksize=lambda n: max(1, min(32, n // (jobs * 4))),
        window=_WINDOW,
        serial_below=_SERIAL_BELOW,
    )


class _Keys:
    """Every chunk file's (file, id, chunk_id), in a temp SQLite file: the corpus-wide checks
    (unique ids, live redirect targets) are queries, and memory does not grow with the chunks."""

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="chunkyard-validate-")
        self.conn = sqlite3.connect(os.path.join(self._dir.name, "keys.sqlite"), isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=OFF")
        self.conn.execute("PRAGMA synchronous=OFF")
        self.conn.execute("CREATE TABLE keys(file TEXT, id TEXT, chunk_id TEXT)")
        self.conn.execute("BEGIN")

    def add(self, keys: Iterable[tuple[str, str, str]]) -> None:
        self.conn.executemany("INSERT INTO keys VALUES(?,?,?)", keys)

    def seal(self) -> None:
        self.conn.execute("COMMIT")
        self.conn.execute("CREATE INDEX keys_id ON keys(id)")
        self.conn.execute("CREATE INDEX keys_chunk_id ON keys(chunk_id)")

    def duplicates(self, column: str) -> Iterator[tuple[str, str, str]]:
        """``(file, value, first file)`` for each file whose value an earlier file (in file order) has."""
        assert column in ("id", "chunk_id")
        yield from self.conn.execute(
            f"SELECT k.file, k.{column}, d.first FROM keys k JOIN (SELECT {column} AS v, min(file) AS first "
            f"FROM keys GROUP BY {column} HAVING count(*) > 1) d ON k.{column} = d.v "
            "WHERE k.file <> d.first ORDER BY k.file"
        )

    def has_chunk_id(self, chunk_id: str) -> bool:
        return (
            self.conn.execute("SELECT 1 FROM keys WHERE chunk_id=? LIMIT 1", (chunk_id,)).fetchone()
            is not None
        )

    def close(self) -> None:
        self.conn.close()
        self._dir.cleanup()


def validate(
    out: Path,
    corpus: Path | None = None,
    *,
    reingest: bool = False,
    jobs: int = 0,
    on_start: Callable[[int], None] | None = None,
    on_doc: Callable[[], None] | None = None,
) -> Report:
    """Check a whole output folder; ``UsageError`` when it is not one (no folder, no manifest)."""
    started = time.perf_counter()
    store = open_store(out, corpus, need_corpus=True)
    report = Report(str(out), str(store.corpus), documents=len(store.docs), reingest=reingest)
    if store.db is not None and store.db.inflight() is not None:
        report.problems.append(Problem("interrupted_run", STATE_FILE, "inflight", "a sync has not finished"))
    manifest_policy: dict[str, Any] = store.manifest.get("policy") or {}
    p_hash = str(store.manifest.get("policy_hash", ""))
    try:
        if policy_hash(Policy(**manifest_policy)) != p_hash:
            report.problems.append(
                Problem(
                    "manifest_mismatch", STATE_DB_FILE, "policy_hash", "does not hash the manifest's policy"
                )
            )
    except TypeError as exc:
        report.problems.append(Problem("manifest_mismatch", STATE_DB_FILE, "policy", str(exc)))
        reingest = False
    count = len(store.docs)
    tasks = (
        DocTask(str(out), str(store.corpus), rel, entry, p_hash, manifest_policy if reingest else None)
        for rel, entry in store.docs.items()  # in path order, one entry at a time
    )
    fast_validator()  # compile the schema once, before any fork
    if reingest:
        from pipeline.runner import counter

        counter(str(manifest_policy.get("tokenizer")))  # load the vocabulary once, before any fork
    if on_start is not None:
        on_start(count)
    keys = _Keys()
    try:
        outcomes = _document_checker(jobs or os.cpu_count() or 1).run(tasks, count)
        _check_all(store, report, keys, outcomes, on_doc)
    finally:
        keys.close()
    report.seconds = time.perf_counter() - started
    return report


def _check_all(
    store: ChunkStore,
    report: Report,
    keys: _Keys,
    outcomes: Iterator[DocOutcome],
    on_doc: Callable[[], None] | None,
) -> None:
    for outcome in outcomes:
        report.problems.extend(outcome.problems)
        keys.add(outcome.keys)
        if on_doc is not None:
            on_doc()
    report.files = store.db.count_chunks() if store.db is not None else 0
    keys.add(_check_stale(store, report))
    keys.seal()
    _check_unique(keys, store, report)
    _check_redirects(store, keys, report)
    _check_unindexed(store, report)


def _check_stale(store: ChunkStore, report: Report) -> Iterator[tuple[str, str, str]]:
    """Files under the output that no document lists; yields their keys for the duplicate check.

    One indexed query per file (``chunks.file``), not a set of every listed file.
    """
    listed = store.index("file")
    for dirpath, dirnames, filenames in walk(store.out):  # not os.walk: it recurses per level
        dirnames[:] = sorted(d for d in dirnames if d != STATE_DIR)
        rel_dir = os.path.relpath(dirpath, store.out).replace(os.sep, "/")
        for name in sorted(filenames):
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if rel in listed:
                continue
            if name.startswith(".") and name.endswith(".tmp"):
                report.problems.append(
                    Problem("stale_file", rel, "(file)", "a temp file left by a killed run")
                )
                continue
            if not name.endswith(".json"):
                continue
            report.problems.append(
                Problem("stale_file", rel, "(file)", "no document in the manifest lists it")
            )
            try:
                rec = orjson.loads((store.out / rel).read_bytes())
            except (OSError, orjson.JSONDecodeError):
                continue
            if (
                isinstance(rec, dict)
                and isinstance(rec.get("id"), str)
                and isinstance(rec.get("chunk_id"), str)
            ):
                yield rel, rec["id"], rec["chunk_id"]


def _check_unique(keys: _Keys, store: ChunkStore, report: Report) -> None:
    """Ids and chunk_ids unique over every chunk file a loader would see; doc_uid|r unique too."""
    for code, fld in (("duplicate_id", "id"), ("duplicate_chunk_id", "chunk_id")):
        for f, value, first in keys.duplicates(fld):
            report.problems.append(Problem(code, f, fld, f"{value!r} is also in {first}"))
    owners: dict[str, str] = {}
    for rel, uid_rev in store.db.iter_uid_revs() if store.db is not None else ():
        if uid_rev and uid_rev in owners:
            report.problems.append(
                Problem(
                    "uid_collision",
                    STATE_DB_FILE,
                    f"docs.{rel}.uid_rev",
                    f"{uid_rev!r} is also {owners[uid_rev]}'s",
                    rel,
                )
            )
        owners.setdefault(uid_rev, rel)


def _check_redirects(store: ChunkStore, live: _Keys, report: Report) -> None:
    """Every redirect lands on a live chunk_id, in one hop."""
    if store.db is None:
        return
    db = store.db
    for old, new in db.iter_redirects():
        nxt = db.redirect(new)
        if nxt is not None:
            report.problems.append(
                Problem("redirect_chain", STATE_REDIRECTS, f"redirects.{old}", f"→ {new!r} → {nxt!r}")
            )
        elif not live.has_chunk_id(new) and not db.is_live(new):
            report.problems.append(
                Problem(
                    "dangling_redirect", STATE_REDIRECTS, f"redirects.{old}", f"→ {new!r}, which no chunk has"
                )
            )


def _check_unindexed(store: ChunkStore, report: Report) -> None:
    """Source documents without a manifest entry (only a warning: ``--exclude`` is not recorded)."""
    found, _ = discover(store.corpus, store.out)
    for f in found:
        if f.rel_path not in store.docs:
            report.problems.append(
                Problem(
                    "not_ingested", "", "metadata.sourceFile", "the manifest has no entry for it", f.rel_path
                )
            )
