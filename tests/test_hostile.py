"""Hostile and broken input (issue 7): no crash, no hang, nothing lost.

The corpus comes from ``make_hostile_corpus.py`` (generated, never committed). It is
ingested once tame, then hostile, through the CLI: exit code 1, every bad file listed
with its reason, every good file chunked and checked (``check_chunks.py`` where it can
follow, chunkyard's own invariants elsewhere), the earlier chunk files of the failed
documents untouched, and all of it within 60 s. The guard (``pipeline/guard.py``) and
the parser's limits have tests of their own below.
"""

from __future__ import annotations

import faulthandler
import json
import math
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import SCHEMA, Chunked, as_nobody, has_checker, invariant_errors, load_checker
from make_hostile_corpus import LONG_STEM, STALL_MARK, Case, make_hostile_corpus

import pipeline.run.pool as guard_mod
import pipeline.run.worker as runner_mod
from pipeline.models import Chunk, Policy
from pipeline.run.db import dump_state
from pipeline.run.ingest import Options, Session, ingest
from pipeline.run.pool import GuardPool
from pipeline.run.worker import DocResult, Job
from pipeline.runner import chunk_document, counter
from pipeline.stages.normalize import normalize


def shown(rel: str) -> str:
    """A relative path as chunkyard prints it (bytes that are not UTF-8 escaped)."""
    return os.fsencode(rel).decode("utf-8", "backslashreplace")


#: Root reads a file or folder of mode 000 all the same: then those two cases are good ones
#: (``test_an_unreadable_folder_keeps_its_chunks`` drops privileges to test them).
LOCKS_BITE = os.geteuid() != 0


def cli(*args: str, timeout: float = 300) -> tuple[subprocess.CompletedProcess[str], float]:
    """``python -m pipeline ARGS`` and how long it took."""
    env = {**os.environ, "COLUMNS": "300", "NO_COLOR": "1"}
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=timeout,
    )
    return proc, time.perf_counter() - started


#: The hostile run writes 100 000+ chunk files: removing them from a slow disk took minutes
#: (more than the test's whole time limit), from memory a moment. Where a memory file system
#: with room for them is mounted, the world lives there.
MEMORY_FS, MEMORY_FS_ROOM = Path("/dev/shm"), 2 << 30


def world_parent() -> Path:
    """``/dev/shm`` where it is a writable folder with ``MEMORY_FS_ROOM`` free, else ``/tmp``."""
    try:
        if os.access(MEMORY_FS, os.W_OK) and shutil.disk_usage(MEMORY_FS).free >= MEMORY_FS_ROOM:
            return MEMORY_FS
    except OSError:
        pass
    return Path("/tmp")


@pytest.fixture
def world() -> Iterator[Path]:
    """A folder every user can reach and write (pytest's own tmp folders are private to root)."""
    path = Path(tempfile.mkdtemp(prefix="chunkyard-hostile-", dir=world_parent()))
    path.chmod(0o777)
    yield path
    # unlock what the corpus locked (only that: a chmod of each of the 100 000+ chunk files
    # writes every inode again), then remove it (shutil.rmtree recurses once per folder level)
    subprocess.run(
        ["find", str(path), "!", "-perm", "-u=rwx", "-type", "d", "-exec", "chmod", "u+rwx", "{}", "+"],
        capture_output=True,
        check=False,
    )
    subprocess.run(["rm", "-rf", str(path)], capture_output=True, check=False)


_LOCKS = ("permission denied", "cannot list folder")


def manifest_docs(out: Path) -> dict[str, Any]:
    docs: dict[str, Any] = dump_state(out)["docs"]
    return docs


def snapshot(out: Path, files: list[str]) -> dict[str, tuple[bytes, int]]:
    return {f: ((out / f).read_bytes(), (out / f).stat().st_mtime_ns) for f in files}


def own_errors(corpus: Path, out: Path, rel: str, files: list[str], policy: Policy) -> list[str]:
    """chunkyard's own invariants (conftest) for one document, read back from its chunk files."""
    raw = (corpus / rel).read_bytes()
    doc = normalize(raw, rel)
    chunks = [Chunk(f, json.loads((out / f).read_bytes())) for f in files]
    return list(invariant_errors(Chunked(doc, chunks, policy), None))


def light_errors(corpus: Path, out: Path, rel: str, files: list[str]) -> list[str]:
    """The invariants that stay linear for a huge document: slices, order, chain, coverage, ids."""
    text = normalize((corpus / rel).read_bytes(), rel).text
    recs = [json.loads((out / f).read_bytes()) for f in files]
    errors, end = [], 0
    for i, r in enumerate(recs):
        s, e = r["charOffsets"]["charStart"], r["charOffsets"]["charEnd"]
        if r["originalText"] != text[s:e]:
            errors.append(f"{r['id']}: originalText is not the source slice")
        if i and s <= recs[i - 1]["charOffsets"]["charStart"]:
            errors.append(f"{r['id']}: starts before the previous chunk")
        if text[end:s].strip():
            errors.append(f"{rel}: text lost before {r['id']}")
        if r["prevId"] != (recs[i - 1]["id"] if i else None) or r["chunkNumber"] != i:
            errors.append(f"{r['id']}: chain")
        end = max(end, e)
    if text[end:].strip():
        errors.append(f"{rel}: text lost at the end")
    if len({r["chunk_id"] for r in recs}) != len(recs):
        errors.append(f"{rel}: duplicate chunk_ids")
    return errors


def checker_errors(corpus: Path, out: Path, docs: dict[str, Any], rels: list[str], view: Path) -> list[str]:
    """``check_chunks.py`` over a view holding only ``rels`` and their chunk files (symlinks)."""
    src, dst = view / "corpus", view / "chunks"
    for rel in rels:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).symlink_to(corpus / rel)
        for f in docs[rel]["files"]:
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            (dst / f).symlink_to(out / f)
    checker = load_checker()
    report = checker.Report()
    totals = checker.check(src, dst, SCHEMA, report)
    assert totals["docs"] == len([r for r in rels if docs[r]["files"]])
    return [f"{name}: {example}" for name, fails in report.fails.items() for example in fails]


def test_hostile_corpus_through_the_cli(world: Path) -> None:
    corpus, out = world / "corpus", world / "out"
    # 1. a tame corpus: every document that will break has chunk files first
    tame = make_hostile_corpus(corpus, stage="before")
    proc, _ = cli("ingest", "--out", str(out), "--quiet", "--", str(corpus))
    assert proc.returncode == 0, proc.stderr
    docs = manifest_docs(out)
    assert all(docs[c.rel]["files"] for c in tame)
    keep = snapshot(out, [f for c in tame if c.expect == "bad" for f in docs[c.rel]["files"]])
    gone = [f for c in tame if c.expect == "empty" for f in docs[c.rel]["files"]]

    # 2. the hostile corpus
    cases = make_hostile_corpus(corpus)
    if not LOCKS_BITE:
        cases = tuple(Case(c.rel, "good") if c.reason in _LOCKS else c for c in cases)
        keep = {f: v for f, v in keep.items() if not f.startswith(("locked/", "doc_unreadable_"))}
    # no time limit: every outcome below is the document's, not the machine's speed (the guard's
    # deadline has its own tests, with a stage that is slow by construction); memory stays capped
    proc, seconds = cli(
        "ingest", "--out", str(out), "--doc-timeout", "0", "--jobs", "2", "--json", "--", str(corpus)
    )
    print(f"\nhostile run: exit {proc.returncode} in {seconds:.1f} s")
    assert proc.returncode == 1, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    failures: list[str] = summary["failures"]
    warnings: list[str] = summary["warnings"]
    docs = manifest_docs(out)
    by_case = {c.rel: c for c in cases}

    def failure_of(case: Case) -> str | None:
        name = shown(case.rel)
        folder = name.rsplit("/", 1)[0] + "/" if "/" in name else None
        hits = [f for f in failures if f.startswith((name + ":", f"{folder}:") if folder else (name + ":",))]
        assert len(hits) <= 1, hits
        return hits[0] if hits else None

    # every failure is a bad (or heavy) case, each bad case failed once, for its reason, with a hint
    for failure in failures:
        assert any(
            failure.startswith((shown(c.rel), shown(c.rel).rsplit("/", 1)[0] + "/:"))
            for c in cases
            if c.expect == "bad"
        ), f"unexpected failure: {failure}"
        assert "hint:" in failure, failure
    for case in cases:
        failure = failure_of(case)
        if case.expect == "bad":
            assert failure is not None, f"{case.rel} should have failed"
            assert case.reason.lower() in failure.lower(), failure
        else:
            assert failure is None, failure
        if case.warning:
            assert any(w.startswith(case.rel) and case.warning in w for w in warnings), (case.rel, warnings)

    # earlier chunk files of failed documents untouched; those of emptied documents gone
    assert snapshot(out, list(keep)) == keep
    assert not [f for f in gone if (out / f).exists()]
    for case in cases:
        if case.expect == "empty":
            assert not docs.get(case.rel, {}).get("files"), case.rel

    # good documents: chunked, and correct
    policy = Policy()
    good = [c.rel for c in cases if c.expect == "good"]
    own = [c.rel for c in cases if c.expect == "good-own"]
    heavy = [c.rel for c in cases if c.expect == "heavy"]
    for rel in good + own + heavy:
        assert docs.get(rel, {}).get("files"), f"{rel} was not chunked"
    if has_checker():
        errors = checker_errors(corpus, out, docs, good, world / "view")
    else:  # no shared checker here: chunkyard's own invariants for every document
        own += good
        errors = []
    for rel in own:
        errors += own_errors(corpus, out, rel, docs[rel]["files"], policy)
    for rel in heavy:  # too big for the quadratic checks: the linear ones
        errors += light_errors(corpus, out, rel, docs[rel]["files"])
    assert not errors, "\n".join(errors[:20])

    # file-system details
    long_files = docs[f"names/{LONG_STEM}.md"]["files"]
    assert all(len(Path(f).name.encode()) <= 255 for f in long_files)
    record = json.loads((out / long_files[0]).read_bytes())
    assert record["id"] == f"doc:names/{LONG_STEM}::ch0"  # the full name is kept inside
    assert record["metadata"]["sourceFile"] == f"names/{LONG_STEM}.md"
    link = [json.loads((out / f).read_bytes())["originalText"] for f in docs["links/to_plain.md"]["files"]]
    assert link == [json.loads((out / f).read_bytes())["originalText"] for f in docs["plain.md"]["files"]]
    assert not [rel for rel in docs if rel.startswith("links/loop")]  # the loop was not walked
    assert "links/dangling.md" not in docs
    assert by_case["names/-rf.md"].rel in docs


# -- the guard --------------------------------------------------------------------------


def _corpus(root: Path, docs: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for rel, text in docs.items():
        (root / rel).write_text(text)
    return root


HOG_MARK = "<!-- chunkyard-test: hog -->"
GOOD = "# Good\n\nA fine document.\n"
SLOW = f"{STALL_MARK}\n# Slow\n\nNever finishes under ``stalling_stage``.\n"
HOG = f"{HOG_MARK}\n# Hog\n\nAllocates until refused under ``stalling_stage``.\n"


def stalling_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    """A test-only stage, slow or hungry by construction, whatever the parser's speed: a document
    that starts with ``STALL_MARK`` never finishes, one that starts with ``HOG_MARK`` allocates
    16 MiB after 16 MiB until refused. Patched before the pool forks its workers."""
    real = runner_mod.chunk_document

    def stage(raw: bytes, rel_path: str, *a: Any, **k: Any) -> Any:
        if raw.startswith(STALL_MARK.encode()):
            threading.Event().wait()  # never set: only the guard ends this
        if raw.startswith(HOG_MARK.encode()):
            hoard = []
            while True:  # only the memory cap ends this
                hoard.append(bytearray(16 << 20))
        return real(raw, rel_path, *a, **k)

    monkeypatch.setattr(runner_mod, "chunk_document", stage)


def _jobs(corpus: Path, out: Path, rels: list[str]) -> list[Job]:
    return [Job(str(corpus / r), r, str(out), Policy(), "2026-01-01T00:00:00Z") for r in rels]


def test_a_slow_document_is_stopped_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stalling_stage(monkeypatch)
    corpus = _corpus(tmp_path / "c", {"a.md": GOOD, "slow.md": SLOW, "z.md": GOOD})
    counter("cl100k_base")
    pool = GuardPool(1, 1.0, 0)  # one worker: the one after the slow document needs a new worker
    try:
        results = list(pool.run(_jobs(corpus, tmp_path / "o", ["a.md", "slow.md", "z.md"])))
    finally:
        pool.close()
    assert [r.rel_path for r in results] == ["a.md", "slow.md", "z.md"]
    assert results[0].error is None and results[2].error is None and results[2].files
    assert (
        results[1].error
        and "took longer than 1 s" in results[1].error
        and "--doc-timeout" in results[1].error
    )


def test_the_guard_works_from_a_thread_that_is_not_main(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """watch syncs from its own thread, where signal-based alarms cannot work."""
    stalling_stage(monkeypatch)
    corpus = _corpus(tmp_path / "c", {"a.md": GOOD, "slow.md": SLOW})
    opts = Options(corpus, tmp_path / "o", jobs=1, doc_timeout=1.0)
    got: list[Any] = []
    with Session(opts) as session:
        thread = threading.Thread(target=lambda: got.append(session.sync(["a.md", "slow.md"])))
        thread.start()
        thread.join(600)  # a hang's safety net, not a speed claim: the stage never ends by itself
        assert not thread.is_alive()
        assert isinstance(session._executor, GuardPool)
        workers = [w.proc for w in session._executor._idle]
    assert not [p for p in workers if p.is_alive()]  # the session took its workers with it
    (summary,) = got
    assert (
        summary.failures
        and summary.failures[0].startswith("slow.md")
        and "took longer" in summary.failures[0]
    )
    assert (tmp_path / "o" / "doc_a__ch0.json").exists()


def test_a_document_that_needs_too_much_memory_is_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stalling_stage(monkeypatch)
    corpus = _corpus(tmp_path / "c", {"hog.md": HOG, "z.md": GOOD})
    counter("cl100k_base")
    pool = GuardPool(1, 0, 48)  # 48 MiB over what the worker has, no deadline: the hog wants it all
    try:
        results = list(pool.run(_jobs(corpus, tmp_path / "o", ["hog.md", "z.md"])))
    finally:
        pool.close()
    assert results[0].error and "needs more than 48 MiB" in results[0].error, results[0].error
    assert results[1].error is None and results[1].files


def test_a_worker_that_dies_or_hits_a_bug_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = runner_mod.chunk_document

    def sabotage(raw: bytes, rel_path: str, *a: Any, **k: Any) -> Any:
        if rel_path == "crash.md":
            os.kill(os.getpid(), signal.SIGSEGV)
        if rel_path == "bug.md":
            raise ValueError("an unexpected bug")
        return real(raw, rel_path, *a, **k)

    monkeypatch.setattr(runner_mod, "chunk_document", sabotage)  # before the pool forks its workers
    corpus = _corpus(tmp_path / "c", {"crash.md": GOOD, "bug.md": GOOD, "ok.md": GOOD})
    pool = GuardPool(2, 30.0, 0)
    dumps = faulthandler.is_enabled()
    faulthandler.disable()  # pytest's: it would print the worker's crash as if it were ours
    try:
        results: list[DocResult] = list(
            pool.run(_jobs(corpus, tmp_path / "o", ["crash.md", "bug.md", "ok.md"]))
        )
    finally:
        pool.close()
        if dumps:
            faulthandler.enable()
    assert results[0].error and "died (SIGSEGV)" in results[0].error
    assert results[1].error and "internal error ValueError" in results[1].error and "bug" in results[1].error
    assert results[2].error is None and results[2].files


@pytest.mark.parametrize("memory_mb", [48, 0])
def test_an_allocation_failure_that_python_reports_oddly_is_still_out_of_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, memory_mb: int
) -> None:
    """CPython can report a failed allocation as SystemError, or a MemoryError as another
    exception's context; under a memory cap both are the document's size, not a bug."""
    real = runner_mod.chunk_document

    def sabotage(raw: bytes, rel_path: str, *a: Any, **k: Any) -> Any:
        if rel_path == "odd.md":
            raise SystemError("error return without exception set")
        if rel_path == "chained.md":
            try:
                raise MemoryError
            except MemoryError:
                raise KeyError("while handling it")  # noqa: B904 - the context is the point
        return real(raw, rel_path, *a, **k)

    monkeypatch.setattr(runner_mod, "chunk_document", sabotage)  # before the pool forks its workers
    names = ["odd.md", "chained.md", "ok.md"]
    corpus = _corpus(tmp_path / "c", dict.fromkeys(names, GOOD))
    pool = GuardPool(1, 30.0, memory_mb)
    try:
        results = list(pool.run(_jobs(corpus, tmp_path / "o", names)))
    finally:
        pool.close()
    if memory_mb:
        assert results[0].error and "needs more than 48 MiB" in results[0].error
        assert results[1].error and "needs more than 48 MiB" in results[1].error
    else:
        assert results[0].error and "internal error SystemError" in results[0].error
        assert results[1].error and "internal error KeyError" in results[1].error
    assert results[2].error is None and results[2].files


def test_a_queued_job_gets_its_own_full_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker holds the next job in its pipe; that job's clock starts when it starts.

    ``d0`` holds its write (where the guard lets it run past its deadline) until ``d1``, sent
    into the worker's pipe right behind it, has waited there longer than a whole deadline: a
    clock started at the send would stop ``d1`` the moment ``d0`` answers."""
    monkeypatch.setattr(guard_mod, "WRITE_FACTOR", 10**6)  # d0's write deadline: out of reach
    gates = _gated_writes(monkeypatch, tmp_path / "gates", {"d0.md"})
    corpus = _corpus(tmp_path / "c", {f"d{i}.md": GOOD for i in range(3)})
    counter("cl100k_base")
    pool = GuardPool(1, 2.0, 0)
    sent: dict[str, float] = {}
    d1_sent = threading.Event()
    real_send = pool._send

    def send(worker: Any, index: int, job: Job) -> bool:
        ok = real_send(worker, index, job)
        if ok:
            sent[job.rel_path] = time.monotonic()
            if job.rel_path == "d1.md":
                d1_sent.set()
        return ok

    def release_d0() -> None:  # once d1's deadline, counted from its send, is over
        try:
            if d1_sent.wait(600):  # (a hang's safety net)
                while (left := sent["d1.md"] + pool.timeout - time.monotonic()) >= 0:
                    time.sleep(left + 0.01)
        finally:
            (gates / "d0.md.go").touch()

    monkeypatch.setattr(pool, "_send", send)
    releaser = threading.Thread(target=release_d0, daemon=True)
    releaser.start()
    try:
        results = list(pool.run(_jobs(corpus, tmp_path / "o", ["d0.md", "d1.md", "d2.md"])))
    finally:
        pool.close()
    releaser.join(600)
    assert d1_sent.is_set()  # (d0 could answer only after d1 had waited out a deadline)
    assert [r.error for r in results] == [None, None, None]


def test_a_job_too_big_to_send_ahead_waits_for_an_empty_pipe(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "c", {f"d{i}.md": GOOD for i in range(4)})
    counter("cl100k_base")
    pool = GuardPool(1, 30.0, 0)
    pool.AHEAD_BYTES = 0  # every job is "big": none may wait in a busy worker's pipe
    try:
        results = list(pool.run(_jobs(corpus, tmp_path / "o", [f"d{i}.md" for i in range(4)])))
    finally:
        pool.close()
    assert [r.rel_path for r in results] == [f"d{i}.md" for i in range(4)]
    assert all(r.error is None and r.files for r in results)


def test_jobs_wait_in_a_pipe_only_within_its_byte_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job of an incremental run carries its document's old ids and digests (kilobytes):
    what waits in a pipe is bounded by bytes, not only by count, or the parent could block
    on a full pipe while the worker blocks sending its result."""
    rels = [f"d{i:02d}.md" for i in range(12)]
    corpus = _corpus(tmp_path / "c", dict.fromkeys(rels, GOOD))
    counter("cl100k_base")
    jobs = _jobs(corpus, tmp_path / "o", rels)
    for job in jobs:  # ~6 KB each once pickled: two fit the 16 KiB budget, three do not
        job.old_digests = tuple(f"{job.rel_path}-{n:012d}" for n in range(300))
    size = len(pickle.dumps(jobs[0], pickle.HIGHEST_PROTOCOL))
    pool = GuardPool(1, 30.0, 0)
    assert 2 * size <= pool.AHEAD_BYTES < 3 * size
    in_pipe: list[int] = []
    real_send = pool._send

    def send(worker: Any, index: int, job: Job) -> bool:
        sent = real_send(worker, index, job)
        in_pipe.append(sum(worker.sizes))
        return sent

    monkeypatch.setattr(pool, "_send", send)
    try:
        results = list(pool.run(jobs))
    finally:
        pool.close()
    assert [r.rel_path for r in results] == rels
    assert all(r.error is None and r.files for r in results)
    assert max(in_pipe) == 2 * size  # two waited at once, never a third


def test_the_parent_naps_while_every_worker_has_work_waiting(tmp_path: Path) -> None:
    """Results gather while the parent sleeps (a wake-up per result costs both sides CPU);
    a lone job, as a save in watch mode, never waits for a nap."""
    rels = [f"d{i:02d}.md" for i in range(80)]
    corpus = _corpus(tmp_path / "c", dict.fromkeys(rels, GOOD))
    counter("cl100k_base")
    pool = GuardPool(2, 30.0, 0)
    naps: list[float] = []
    real_nap = pool._nap

    def nap(seconds: float) -> None:
        naps.append(seconds)
        real_nap(seconds)

    pool._nap = nap  # type: ignore[method-assign]
    try:
        results = list(pool.run(_jobs(corpus, tmp_path / "o", rels)))
        many = len(naps)
        alone = list(pool.run(_jobs(corpus, tmp_path / "o2", ["d00.md"])))
    finally:
        pool.close()
    assert [r.rel_path for r in results] == rels
    assert all(r.error is None and r.files for r in results)
    assert many and all(0 < s <= pool.NAP for s in naps)
    assert alone[0].error is None and len(naps) == many


def test_a_slow_document_among_many_is_stopped_on_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parent naps while workers have work queued; a deadline still ends a slow document."""
    stalling_stage(monkeypatch)
    rels = [f"d{i:02d}.md" for i in range(40)]
    docs = dict.fromkeys(rels, GOOD) | {"slow.md": SLOW}
    corpus = _corpus(tmp_path / "c", docs)
    order = [*rels[:20], "slow.md", *rels[20:]]
    counter("cl100k_base")
    pool = GuardPool(2, 1.0, 0)
    try:
        results = list(pool.run(_jobs(corpus, tmp_path / "o", order)))
    finally:
        pool.close()
    assert [r.rel_path for r in results] == order
    slow = results[20]
    assert slow.error and "took longer than 1 s" in slow.error
    assert all(r.error is None and r.files for r in results if r is not slow)


def test_jobs_waiting_behind_a_crash_go_to_a_fresh_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = runner_mod.chunk_document

    def sabotage(raw: bytes, rel_path: str, *a: Any, **k: Any) -> Any:
        if rel_path.startswith("crash"):
            os.kill(os.getpid(), signal.SIGKILL)
        return real(raw, rel_path, *a, **k)

    monkeypatch.setattr(runner_mod, "chunk_document", sabotage)
    rels = ["a.md", "crash1.md", "b.md", "crash2.md", "crash3.md", "c.md", "d.md"]
    corpus = _corpus(tmp_path / "c", dict.fromkeys(rels, GOOD))
    pool = GuardPool(1, 30.0, 0)
    try:
        results = list(pool.run(_jobs(corpus, tmp_path / "o", rels)))
    finally:
        pool.close()
    assert [r.rel_path for r in results] == rels
    for r in results:
        if r.rel_path.startswith("crash"):
            assert r.error and "died (SIGKILL)" in r.error, r.error
        else:
            assert r.error is None and r.files, r.rel_path


def test_workers_exit_when_their_parent_dies(tmp_path: Path) -> None:
    """A worker outliving its run would keep the output lock (an flock shared across fork)."""
    _corpus(tmp_path / "c", {"slow.md": SLOW})
    started = tmp_path / "started"
    script = f"""
import os, threading, time
from pathlib import Path
import pipeline.run.worker as runner_mod
from pipeline.run.pool import GuardPool
from pipeline.models import Policy
from pipeline.run.worker import Job
from pipeline.runner import counter
def stall(raw, rel_path, *a, **k):  # the test's stage: slow by construction
    Path({str(started)!r} + ".tmp").write_text(str(os.getpid()))
    os.rename({str(started)!r} + ".tmp", {str(started)!r})  # whole when the parent sees it
    threading.Event().wait()
runner_mod.chunk_document = stall
counter("cl100k_base")
pool = GuardPool(1, 0, 0)
job = Job({str(tmp_path / "c" / "slow.md")!r}, "slow.md", {str(tmp_path / "o")!r}, Policy(), "2026-01-01T00:00:00Z")
threading.Thread(target=lambda: list(pool.run([job])), daemon=True).start()
while not Path({str(started)!r}).exists():  # the worker is inside the document
    time.sleep(0.01)
print(os.getpid(), Path({str(started)!r}).read_text(), flush=True)
os._exit(0)
"""
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, check=False
    )
    pids = [int(x) for x in proc.stdout.split()]
    assert len(pids) == 2, proc.stdout + proc.stderr
    worker = pids[1]
    safety_net = time.monotonic() + 300  # a hang's net, not a speed claim: it exits at once
    while Path(f"/proc/{worker}").exists():  # waits for the worker's exit
        stat = Path(f"/proc/{worker}/stat").read_text() if Path(f"/proc/{worker}/stat").exists() else ""
        if stat.split(") ")[-1][:1] == "Z":
            break  # exited, waiting to be reaped by init
        assert time.monotonic() < safety_net, "the worker outlived its parent"
        time.sleep(0.05)


def test_an_unreadable_folder_keeps_its_chunks(world: Path) -> None:
    """A folder that cannot be listed is reported; its documents are unknown, not deleted."""
    corpus, out = _corpus(world / "corpus", {"top.md": GOOD}), world / "out"
    _corpus(corpus / "locked", {"inside.md": "# Inside\n\nIt has chunks.\n"})
    with as_nobody():
        assert not ingest(Options(corpus, out, jobs=1)).failures
    before = snapshot(out, ["locked/doc_inside__ch0.json"])
    (corpus / "locked").chmod(0)
    try:
        with as_nobody():
            summary = ingest(Options(corpus, out, jobs=1))
    finally:
        (corpus / "locked").chmod(0o755)
    assert summary.failures == [
        "locked/: read: cannot list folder (Permission denied) (hint: make it readable)"
    ]
    assert snapshot(out, ["locked/doc_inside__ch0.json"]) == before
    assert "locked/inside.md" in manifest_docs(out)
    with as_nobody():
        assert not ingest(Options(corpus, out, jobs=1)).failures  # readable again: nothing to redo
    assert snapshot(out, ["locked/doc_inside__ch0.json"]) == before


def test_names_that_are_not_utf8_are_reported_not_fatal(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "c", {"ok.md": GOOD})
    with open(os.path.join(os.fsencode(corpus), b"caf\xe9.md"), "wb") as fh:
        fh.write(b"# Latin-1\n")
    os.mkdir(os.path.join(os.fsencode(corpus), b"dir\xff"))
    summary = ingest(Options(corpus, tmp_path / "o", jobs=1))
    assert sorted(summary.failures) == [
        "caf\\xe9.md: read: the name is not valid UTF-8, skipped (hint: rename it to UTF-8)",
        "dir\\xff: read: the name is not valid UTF-8, skipped (hint: rename it to UTF-8)",
    ]
    assert (tmp_path / "o" / "doc_ok__ch0.json").exists()


def test_a_folder_tree_deeper_than_the_recursion_limit(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "c", {"top.md": GOOD})
    fd = os.open(corpus, os.O_RDONLY)
    for _ in range(1_100):  # os.makedirs itself recurses once per level
        os.mkdir("d", dir_fd=fd)
        nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    with os.fdopen(os.open("bottom.md", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as fh:
        fh.write(GOOD)
    os.close(fd)
    out = tmp_path / "o"
    summary = ingest(Options(corpus, out, jobs=1))
    assert not summary.failures
    rel = "/".join(["d"] * 1_100) + "/bottom.md"
    assert manifest_docs(out)[rel]["files"] == ["/".join(["d"] * 1_100) + "/doc_bottom__ch0.json"]
    (corpus / "top.md").unlink()
    assert not ingest(Options(corpus, out, jobs=1, full=True)).failures  # the sweep walks it too
    subprocess.run(["rm", "-rf", str(corpus), str(out)], check=False)


# -- the parser's limits -----------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        ">" * 10_000 + " deep\n",
        "- " * 10_000 + "deep\n",
        "1. " * 5_000 + "deep\n",
        "> - " * 3_000 + "deep\n",
        "".join(">" * i + f" level {i}\n" for i in range(1, 400)),
        "".join("  " * i + f"- level {i}\n" for i in range(400)),
    ],
    ids=["quotes", "bullets", "ordered", "mixed", "quote-stairs", "list-stairs"],
)
def test_deep_nesting_is_chunked_not_a_recursion_error(text: str) -> None:
    doc, chunks = chunk_document(text.encode(), "deep.md", Policy())
    result = Chunked(doc, chunks, Policy())
    assert chunks
    assert not list(invariant_errors(result))


def test_link_reference_definitions_are_linear_and_unchanged() -> None:
    """The patched ``Footnote.read``: mistletoe's result, without its quadratic slicing."""
    from mistletoe import block_token

    from pipeline.stages.mdpatch import install_patches
    from pipeline.stages.mdpatch.blocks import read_definitions as _read_definitions
    from pipeline.stages.parse import _mistletoe

    install_patches()
    texts = [
        "[a]: /u\n[b]: /v 'title'\n[c]:\n  /w\n  \"t\"\n\npara\n",
        "[a]: /u\nnot a definition\n[b]: /v\n",
        '[a]: /u "unclosed\ntitle"\n[b]: /v\n',
        '[a]: /u "unclosed\n\nafter\n',
        "[a]: <x y>\n[b]: /v bad\n[c]: /w\n",
        "[a]:\n\n[b]: /v\n",
        "[a]: /u\nx",
        "  [a]: /u\n   [b]: /v\n    [c]: /w\n",
        "[a]: /u\n" + "x" * 20_000 + "\n[b]: /v\n",
        "".join(f"[r{i}]: /u{i} 't{i}'\n" for i in range(3_000)) + "tail\n",
    ]
    patched = block_token.Footnote.read
    original = block_token.Footnote.__dict__["read"]
    assert original.__func__ is _read_definitions
    for text in texts:
        ours = _shape(_mistletoe(text))
        try:
            block_token.Footnote.read = classmethod(_mistletoe_read)  # type: ignore[method-assign,assignment]
            theirs = _shape(_mistletoe(text))
        finally:
            block_token.Footnote.read = patched  # type: ignore[method-assign]
        assert ours == theirs, text[:80]
    # linear by count, not by the clock: the characters each match may look at (from its
    # offset to the end of what it is given) grow with the run, not with its square
    work = [0]
    real = block_token.Footnote.match_reference.__func__  # type: ignore[attr-defined]

    def counted(cls: Any, text: str, offset: int) -> Any:
        work[0] += len(text) - offset
        return real(cls, text, offset)

    looked = []
    for n in (20_000, 40_000):
        work[0] = 0
        try:
            block_token.Footnote.match_reference = classmethod(counted)  # type: ignore[method-assign,assignment]
            _mistletoe("".join(f"[r{i}]: /u{i}\n" for i in range(n)))
        finally:
            block_token.Footnote.match_reference = classmethod(real)  # type: ignore[method-assign,assignment]
        looked.append(work[0])
    assert looked[1] <= 2.2 * looked[0], looked  # mistletoe's own read: 4x for twice the run


def _shape(doc: Any) -> list[tuple[str, int]]:
    return [(type(t).__name__, t.line_number) for t in doc.children]


def _mistletoe_read(cls: Any, lines: Any) -> Any:
    """mistletoe 1.x's ``Footnote.read``, verbatim, for comparison."""
    from mistletoe import token

    line_buffer = []
    next_line = lines.peek()
    while next_line is not None and next_line.strip() != "":
        line_buffer.append(next(lines))
        next_line = lines.peek()
    string = "".join(line_buffer)
    offset = 0
    matches = []
    while offset < len(string) - 1:
        match_info = cls.match_reference(string, offset)
        if match_info is None:
            lines._index -= string[offset:].count("\n")
            break
        offset, match = match_info
        matches.append(match)
    cls.append_footnotes(matches, token._root_node)
    return matches or None


def test_front_matter_that_explodes_is_a_warning() -> None:
    laughs = (
        "---\na: &a [x, x, x, x, x, x, x, x, x]\n"
        + "".join(
            f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
        )
        + "---\nbody\n"
    )
    doc = normalize(laughs.encode(), "laughs.md")
    assert doc.front_matter is None and doc.body_start > 0 and "expands to more than" in doc.warnings[0]
    deep_toml = "+++\nx = " + "[" * 5_000 + "]" * 5_000 + "\n+++\nbody\n"
    doc = normalize(deep_toml.encode(), "deep.md")
    assert doc.front_matter is None and "nested too deep" in doc.warnings[0]
    doc = normalize(b"---\nn: 123456789012345678901234567890\nf: .inf\n---\nbody\n", "n.md")
    assert doc.front_matter == {"n": "123456789012345678901234567890", "f": None}
    doc, chunks = chunk_document(b"---\nn: 123456789012345678901234567890\n---\nbody\n", "n.md", Policy())
    assert chunks[0].record["metadata"]["frontMatter"] == {"n": "123456789012345678901234567890"}


def test_unclosed_front_matter_is_read_as_markdown_with_a_warning() -> None:
    doc = normalize(b"---\ntitle: x\n\n# Body\n", "open.md")
    assert doc.body_start == 0 and "never closed" in doc.warnings[0]
    assert not normalize(b"---\n\nA thematic break, then text.\n", "hr.md").warnings


def test_a_parse_that_fails_inside_a_quote_leaves_no_state_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """mistletoe turns setext headings off while it reads a quote; a failure there (a worker
    lives on after a document fails) must not turn them off for every later document."""
    from mistletoe import block_token

    from pipeline.stages.normalize import normalize as norm
    from pipeline.stages.parse import _mistletoe, parse

    real = block_token.Paragraph.read.__func__  # type: ignore[attr-defined]

    def read(cls: Any, lines: Any) -> Any:
        if "boom" in lines.peek():
            raise RuntimeError("boom")
        return real(cls, lines)

    monkeypatch.setattr(block_token.Paragraph, "read", classmethod(read))
    with pytest.raises(RuntimeError):
        _mistletoe("> boom\n")
    monkeypatch.undo()
    blocks = parse(norm(b"Title\n===\n\ntext\n", "t.md"))
    assert [b.kind for b in blocks] == ["heading", "paragraph"]


def _slow_writes(monkeypatch: pytest.MonkeyPatch, seconds: float, rels: set[str]) -> None:
    """Documents in ``rels`` take ``seconds`` to write (patched before the pool forks)."""
    real = runner_mod._write

    def slow(job: Job, *a: Any, **k: Any) -> Any:
        if job.rel_path in rels:
            threading.Event().wait(None if seconds == math.inf else seconds)
        return real(job, *a, **k)

    monkeypatch.setattr(runner_mod, "_write", slow)


def _gated_writes(monkeypatch: pytest.MonkeyPatch, gates: Path, rels: set[str]) -> Path:
    """Documents in ``rels`` hold their write until the file ``gates/<rel>.go`` exists: a test-only
    stage that is as slow as the test says (patched before the pool forks)."""
    gates.mkdir(parents=True, exist_ok=True)
    real = runner_mod._write

    def gated(job: Job, *a: Any, **k: Any) -> Any:
        if job.rel_path in rels:
            go = gates / f"{job.rel_path}.go"
            while not go.exists():
                threading.Event().wait(0.01)
        return real(job, *a, **k)

    monkeypatch.setattr(runner_mod, "_write", gated)
    return gates


def test_a_document_writing_its_files_gets_more_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past its deadline while writing, a worker is let finish: a kill between renames hurts.

    ``d1`` and ``d2`` hold their writes until the parent has seen their deadline pass (and
    given them the write deadline instead): each is released by that decision, not by a clock."""
    monkeypatch.setattr(guard_mod, "WRITE_FACTOR", 10**6)  # the write deadline: out of reach here
    gates = _gated_writes(monkeypatch, tmp_path / "gates", {"d1.md", "d2.md"})
    corpus = _corpus(tmp_path / "c", {f"d{i}.md": GOOD for i in range(4)})
    counter("cl100k_base")
    pool = GuardPool(1, 1.0, 0)
    let_finish: list[str] = []  # documents the parent let write on past their deadline
    real_poll = pool._poll

    def poll(worker: Any, now: float) -> Any:
        out = real_poll(worker, now)
        if worker.writing and worker.queue and worker.queue[0][1].rel_path not in let_finish:
            let_finish.append(worker.queue[0][1].rel_path)
            (gates / f"{let_finish[-1]}.go").touch()
        return out

    monkeypatch.setattr(pool, "_poll", poll)
    try:
        results = list(pool.run(_jobs(corpus, tmp_path / "o", [f"d{i}.md" for i in range(4)])))
        assert len(pool._idle) == 1  # the same worker did them all: none was stopped
    finally:
        pool.close()
    assert let_finish == ["d1.md", "d2.md"]
    assert [r.error for r in results] == [None] * 4
    assert all((tmp_path / "o" / f"doc_d{i}__ch0.json").exists() for i in range(4))


def test_a_write_that_never_ends_is_stopped_and_marked_unsafe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(guard_mod, "WRITE_FACTOR", 3)
    _slow_writes(monkeypatch, math.inf, {"stuck.md"})  # never ends: only the guard stops it
    corpus = _corpus(tmp_path / "c", {"a.md": GOOD, "stuck.md": GOOD, "z.md": GOOD})
    counter("cl100k_base")
    pool = GuardPool(1, 0.5, 0)  # stopped 3 x 0.5 s after its writing began
    try:
        results = list(pool.run(_jobs(corpus, tmp_path / "o", ["a.md", "stuck.md", "z.md"])))
    finally:
        pool.close()
    assert results[0].error is None and results[2].error is None
    assert results[1].error and "took longer than 1.5 s writing its chunk files" in results[1].error
    assert results[1].unsafe  # its files may be half new: the next run re-checks the document
