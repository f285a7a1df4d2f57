"""SIGKILL from outside at random moments, many seeds: ``ingest`` (default ``--jobs``), ``watch``, ``index``.

``tests/test_crash.py`` kills a one-process run at marked points from inside; here a test
kills the real command from outside, as an operator or the OOM killer would, at moments
drawn from a seed (``CHUNKYARD_KILL_SEED``, printed; ``CHUNKYARD_KILLS=5`` runs five times
as many). Every kill is asserted to land while work was in flight (``kill_support``: the run
is frozen, found mid-way, then killed there), and after each one:

- every visible chunk file is whole (it parses and passes the schema);
- one more run converges to a clean run's output: byte-identical chunk files, the same
  state (documents, redirects, nothing in flight);
- a loader that replayed the whole change feed, the killed run's lines included, holds
  exactly the output;
- for ``index``: the old index stays searchable and whole until the new one commits (at the
  frozen moment and after the kill), and one more run makes the index equal the chunk state.

Phases: a first ``ingest`` killed with its workers (the process group); an incremental
``ingest`` whose parent alone is killed while the workers write (they must end on their
own); ``watch`` killed mid-burst; ``index`` into SQLite and into LanceDB.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from index_support import chunk_state, run_ingest, store_state, vector_ids
from kill_support import (
    SEED,
    Tally,
    assert_whole,
    chunk_view,
    good_files,
    kills,
    loader_view,
    output_truth,
    output_view,
    report,
    state_view,
    stop_in_flight,
    subreaper,
    wait_group_gone,
)
from test_crash import edited, generated, write_corpus

from pipeline.models import Policy
from pipeline.run.ingest import Options, ingest

#: Each phase runs for minutes (CHUNKYARD_KILLS scales it): past the suite's per-test limit.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

CHUNKYARD = [sys.executable, "-m", "pipeline"]
SAMPLE = Path(__file__).resolve().parents[1] / "corpus"


def source_docs() -> dict[str, str]:
    """A small corpus (a run takes about a second): the sample corpus and two generated documents."""
    docs = {
        p.relative_to(SAMPLE).as_posix(): p.read_text(encoding="utf-8") for p in sorted(SAMPLE.rglob("*.md"))
    }
    docs.update({f"gen/{name}": text for name, text in generated(2).items()})
    return docs


def ingest_cmd(corpus: Path, out: Path) -> list[str]:
    """The default ``--jobs`` (one worker per CPU): the parent hands out, the workers write."""
    return [*CHUNKYARD, "ingest", str(corpus), "--out", str(out), "-q"]


def timed(cmd: list[str], **kw: Any) -> float:
    started = time.monotonic()
    subprocess.run(cmd, check=True, capture_output=True, **kw)
    return time.monotonic() - started


def classify(out: Path, before: Any, done: Any) -> str:
    """Where the frozen run stands: "before" (the output it started from), "done" (a clean
    run's end, nothing in flight) or "flight"."""
    files = chunk_view(out)
    if files == before[0]:
        return "before"  # (the state is not read then: a first run may hold it locked while it creates it)
    state = state_view(out)
    if files == done[0] and state == done[1]:
        return "done"
    return "flight"


def without_mtimes(state: Any) -> Any:
    """A state but for the sources' mtimes (another corpus folder, written at another time)."""
    docs = {rel: {k: v for k, v in entry.items() if k != "mtime_ns"} for rel, entry in state["docs"].items()}
    return {**state, "docs": docs}


def converge(
    out: Path, corpus: Path, want: Any, known_good: set[bytes], where: str, *, same_corpus: bool = True
) -> None:
    """After a kill: whole files; one more run; the clean run's output; the feed's loader agrees."""
    assert_whole(out, known_good, where)
    repair = ingest(Options(corpus=corpus, out=out, jobs=1))
    assert not repair.failures and repair.exit_code == 0, f"{where}: {repair.failures}"
    files, state = output_view(out)
    if not same_corpus:
        state, want = without_mtimes(state), (want[0], without_mtimes(want[1]))
        # a watch killed mid-burst may have synced part of it first: the ids of that middle state
        # redirect too; the clean run's redirects must all be there, and every target is live
        live = {orjson.loads(data)["chunk_id"] for data in files.values()}
        assert set(state["redirects"].values()) <= live, f"{where}: a redirect to no chunk"
        assert state["redirects"].items() >= want[1]["redirects"].items(), f"{where}: a clean redirect lost"
        state = {**state, "redirects": want[1]["redirects"]}
    assert files.keys() == want[0].keys(), f"{where}: the file set differs from a clean run's"
    assert files == want[0], f"{where}: chunk files differ from a clean run's"
    assert state == want[1], f"{where}: the state differs from a clean run's"
    assert loader_view(out) == output_truth(out), f"{where}: a loader replaying the feed differs"


def attempts(tally: Tally, wanted: int) -> Iterator[int]:
    """Runs to kill until ``wanted`` kills have landed in flight (a moment too late is drawn
    again with a fresh run), at most three times as many runs: on a loaded machine a watch
    may sync a whole burst before the moment half the time (it takes a burst's deletions and
    arrivals in one sync)."""
    i = 0
    while tally.landed < wanted and i < 3 * wanted:
        yield i
        i += 1


def adapt(window: float, landed: bool) -> float:
    """The next run's window for its moments: half after a moment too late (the run ended
    first: runs are faster than the window says), a fifth more after a kill in flight. The
    machine's pace changes while the phase runs (other tests beside it, with pytest-xdist)."""
    return window * 1.2 if landed else window / 2


# -- ingest -------------------------------------------------------------------------------------


def test_ingest_killed_with_its_workers_at_random_moments(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus", edited(source_docs()))
    clean = tmp_path / "clean"
    t_clean = timed(ingest_cmd(corpus, clean))
    want = output_view(clean)
    known_good = good_files(clean)
    tally = Tally("ingest (first run, process group)")
    window = t_clean
    for i in attempts(tally, kills(96)):
        rng = random.Random(f"{SEED}:ingest-group:{i}")
        out = tmp_path / f"out{i}"
        proc = subprocess.Popen(ingest_cmd(corpus, out), start_new_session=True, stdout=subprocess.DEVNULL)
        landed = stop_in_flight(
            proc, rng, lambda out=out: classify(out, ({}, None), want),
            group=True, first=window, step=window / 20, tally=tally,
        )  # fmt: skip
        window = adapt(window, landed)
        if landed:
            tally.landed += 1
            converge(out, corpus, want, known_good, f"ingest kill {i} (seed {SEED})")
        shutil.rmtree(out)
    report(tally)
    assert tally.landed == kills(96)


def test_ingest_parent_killed_while_workers_write(tmp_path: Path) -> None:
    docs_a = source_docs()
    corpus_a = write_corpus(tmp_path / "corpus_a", docs_a)
    corpus = write_corpus(tmp_path / "corpus_b", edited(docs_a))
    base = tmp_path / "base"
    subprocess.run(ingest_cmd(corpus_a, base), check=True, capture_output=True)
    shutil.rmtree(corpus_a)
    before = output_view(base)
    clean = tmp_path / "clean"
    shutil.copytree(base, clean)
    t_clean = timed(ingest_cmd(corpus, clean))
    want = output_view(clean)
    assert want[1] is not None and want[1]["redirects"], "version B should need redirects"
    known_good = good_files(clean) | good_files(base)
    tally = Tally("ingest (incremental, parent alone)")
    window = t_clean
    with subreaper():
        for i in attempts(tally, kills(40)):
            rng = random.Random(f"{SEED}:ingest-parent:{i}")
            out = tmp_path / f"out{i}"
            shutil.copytree(base, out)
            proc = subprocess.Popen(
                ingest_cmd(corpus, out), start_new_session=True, stdout=subprocess.DEVNULL
            )
            landed = stop_in_flight(
                proc, rng, lambda out=out: classify(out, before, want),
                group=False, first=window, step=window / 20, tally=tally,
            )  # fmt: skip
            window = adapt(window, landed)
            wait_group_gone(proc.pid)  # the workers end on their own once the parent is gone
            if landed:
                tally.landed += 1
                converge(out, corpus, want, known_good, f"parent kill {i} (seed {SEED})")
            shutil.rmtree(out)
    report(tally)
    assert tally.landed == kills(40)


# -- watch --------------------------------------------------------------------------------------


def apply_docs(corpus: Path, old: dict[str, str], new: dict[str, str]) -> None:
    """Turn the folder holding ``old`` into ``new`` in one burst: deletions, edits, additions."""
    for name in old.keys() - new.keys():
        (corpus / name).unlink()
    for name, text in new.items():
        if old.get(name) != text:
            (corpus / name).parent.mkdir(parents=True, exist_ok=True)
            (corpus / name).write_text(text, encoding="utf-8")


def test_watch_killed_mid_burst(tmp_path: Path) -> None:
    docs_a = source_docs()
    docs_b = edited(docs_a)
    clean_corpus = write_corpus(tmp_path / "clean_corpus", docs_b)
    clean = tmp_path / "clean"
    subprocess.run(ingest_cmd(clean_corpus, clean), check=True, capture_output=True)
    want_files = chunk_view(clean)
    known_good = good_files(clean)
    tally = Tally("watch (mid-burst, process group)")
    for i in attempts(tally, kills(35)):
        rng = random.Random(f"{SEED}:watch:{i}")
        corpus = write_corpus(tmp_path / f"corpus{i}", docs_a)
        out = tmp_path / f"out{i}"
        proc = subprocess.Popen(
            [*CHUNKYARD, "watch", str(corpus), "--out", str(out), "--json"],
            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline() or "{}")
        assert ready.get("event", ready.get("kind")) == "ready" or "run_id" in ready, ready
        synced = output_view(out)
        assert synced[1] is not None and synced[1]["inflight"] is None
        apply_docs(corpus, docs_a, docs_b)

        def where(out: Path = out, synced: Any = synced) -> str:
            files, state = output_view(out)
            if files == synced[0] and state == synced[1]:
                return "before"  # the burst not yet taken up
            if files == want_files and state is not None and state["inflight"] is None:
                return "done"
            return "flight"

        landed = stop_in_flight(proc, rng, where, group=True, first=0.3, step=0.05, tally=tally, exits=False)
        if not landed:  # the burst was synced whole before the moment: stop watch, try again
            os.killpg(proc.pid, signal.SIGKILL)  # watch and any worker it has
            proc.wait()
        proc.stdout.close()
        if landed:
            tally.landed += 1
            want = (want_files, state_after_clean_ingest(tmp_path, docs_a, docs_b, i))
            converge(out, corpus, want, known_good, f"watch kill {i} (seed {SEED})", same_corpus=False)
        shutil.rmtree(out)
        shutil.rmtree(corpus)
    report(tally)
    assert tally.landed == kills(35)


_STATES: dict[str, Any] = {}


def state_after_clean_ingest(tmp_path: Path, docs_a: dict[str, str], docs_b: dict[str, str], i: int) -> Any:
    """The state a never-killed ``ingest`` of B leaves over A's output, in a corpus folder of the
    same name as the killed one's (the state records the corpus's absolute paths nowhere; kept once)."""
    if "b" not in _STATES:
        corpus = write_corpus(tmp_path / "ref_corpus", docs_a)
        out = tmp_path / "ref_out"
        run_ingest(corpus, out)
        apply_docs(corpus, docs_a, docs_b)
        run_ingest(corpus, out)
        _STATES["b"] = state_view(out)
    return _STATES["b"]


# -- index --------------------------------------------------------------------------------------


def holds_lock(lock: Path, pid: int) -> bool:
    try:
        return lock.read_text().strip() == f"pid {pid}"
    except OSError:
        return False


def searchable(out: Path, store: str | None, expected: dict[str, Any], where: str) -> None:
    """The index as a reader sees it: exactly ``expected`` (the last committed state), and a
    full-text query finds chunks of it."""
    from pipeline.index.vector_store import open_store

    assert store_state(out, store) == expected, f"{where}: the index is not the last committed one"
    db = open_store(out, store)
    try:
        rows = db.rows(sorted(expected)[:3])
        words = [w.lower() for row in rows.values() for w in re.findall(r"[A-Za-z]{5,}", row.text)]
        assert words, f"{where}: the old index returned no rows for its own chunk ids"
        hits = db.lexical(words[:3], 5)
    finally:
        db.close()
    assert hits and {cid for cid, _ in hits} <= expected.keys(), f"{where}: the old index finds nothing"


def change_chunks(corpus: Path, out: Path, i: int) -> None:
    """Work for the next index run: a re-chunk under another budget every fourth round (every
    text new the first time), else paragraphs appended to two documents."""
    budgets = (512, 256, 384)
    if i % 4 == 0:
        run_ingest(
            corpus, out, full=True, policy=Policy(budgets[(i // 4) % 3], 32, "cl100k_base", True, "en")
        )
        return
    docs = sorted(corpus.rglob("*.md"))
    for doc in docs[i % len(docs) :][:2]:
        with doc.open("a", encoding="utf-8") as fh:
            fh.write(f"\n\nParagraph {i} appended, for the index to follow: round {i} of the kill test.\n")
    run_ingest(corpus, out, policy=Policy(budgets[(i // 4) % 3], 32, "cl100k_base", True, "en"))


#: The sample's longest document stays out of the index phases: every fourth round re-chunks
#: the corpus and embeds it again, and the rest (~60 chunks, fifteen commits of four, sections
#: long enough for each budget to cut them its own way) leaves moments enough in flight.
BIG_SAMPLE_DOCS = ("deep-dive.md",)


def index_phase(tmp_path: Path, store: str | None, name: str, count: int) -> Tally:
    from pipeline.index.sync import index, index_embedder
    from pipeline.index.vector_store import StoreError, store_spec

    corpus, out = tmp_path / "corpus", tmp_path / "chunks"
    shutil.copytree(SAMPLE, corpus, ignore=shutil.ignore_patterns(*BIG_SAMPLE_DOCS))
    run_ingest(corpus, out)
    cmd = [*CHUNKYARD, "index", "--out", str(out), "--quiet"] + (["--store", store] if store else [])
    env = {**os.environ, "CHUNKYARD_INDEX_BATCH": "4"}
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    window = 2.0  # seconds after the lock is taken within which a moment is drawn (adapted below)
    embedder = index_embedder(out, store)
    lock = store_spec(out, store)[1]
    lock = lock.with_name(lock.name + ".lock")
    tally = Tally(f"index ({name})")
    for i in attempts(tally, count):
        rng = random.Random(f"{SEED}:index-{name}:{i}")
        change_chunks(corpus, out, i)
        old, new = store_state(out, store), chunk_state(out)
        assert old != new
        proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL)
        where_ = f"index {name} kill {i} (seed {SEED})"

        frozen: list[str] = []  # what the frozen moment showed: "old", or "locked" (mid-commit)

        def where(
            proc: subprocess.Popen[Any] = proc, old: Any = old, new: Any = new, at: str = where_,
            frozen: list[str] = frozen,
        ) -> str:  # fmt: skip
            if not holds_lock(lock, proc.pid):
                return "before" if store_state(out, store) == old else "done"
            try:
                now = store_state(out, store)
            except StoreError:  # the writer was frozen inside its commit, the database locked
                frozen.append("locked")
                return "flight"
            if now == new:
                return "done"  # committed; the process is on its way out
            searchable(out, store, old, at + ", frozen")
            frozen.append("old")
            return "flight"

        landed = stop_in_flight(
            proc, rng, where, group=True, first=window, step=window / 10, tally=tally,
            started=lambda proc=proc: holds_lock(lock, proc.pid),
        )  # fmt: skip
        window = adapt(window, landed)  # the moments follow how long a run holds the lock
        if landed:
            tally.landed += 1
            if frozen[-1] == "old":  # not committed when killed: the old index, whole and searchable
                searchable(out, store, old, where_ + ", after the kill")
            else:  # killed inside the commit: one index or the other, whole, never a mix
                after = store_state(out, store)
                assert after in (old, new), f"{where_}: killed mid-commit, the index is neither"
                searchable(out, store, after, where_ + ", after a kill mid-commit")
                tally.mid_commit += 1
        rerun = index(out, store, embedder)
        assert not getattr(rerun, "failures", None), where_
        assert store_state(out, store) == chunk_state(out) == new, where_
        if store is None:
            assert vector_ids(out) == set(new), where_
    return tally


def test_index_into_sqlite_killed_at_random_moments(tmp_path: Path) -> None:
    tally = index_phase(tmp_path, None, "sqlite", kills(12))
    report(tally)
    assert tally.landed == kills(12)


def test_index_into_lancedb_killed_at_random_moments(tmp_path: Path) -> None:
    pytest.importorskip("lancedb", reason="the lancedb extra: pip install -e '.[lancedb]'")
    tally = index_phase(tmp_path, f"lancedb:{tmp_path / 'lance'}", "lancedb", kills(12))
    report(tally)
    assert tally.landed == kills(12)
