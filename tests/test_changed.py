"""The cost of a change (issue 15): the warm worker and ``ingest --changed``.

A one-shot ``ingest`` forks a worker at the first document its walk finds changed, which
loads the chunker itself while the walk goes on (``GuardPool.warm``); ``--changed FILE``
syncs the named documents without a walk. Both must give what a plain run gives, byte
for byte, and a wrong or stale hint must only delay a change, never lose one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from test_incremental import make_corpus, section

from pipeline.models import Policy
from pipeline.run.db import dump_state
from pipeline.run.emit import stable_view
from pipeline.run.feed import read_feed
from pipeline.run.ingest import Options, Session, Summary, ingest
from pipeline.run.pool import GuardPool
from pipeline.run.state import STATE_DIR

POLICY = Policy(target_tokens=64, overlap_tokens=8)


def opts(corpus: Path, out: Path, **kw: object) -> Options:
    return Options(corpus=corpus, out=out, policy=POLICY, jobs=1, **kw)  # type: ignore[arg-type]


def tree(out: Path) -> dict[str, dict[str, object]]:
    """Every chunk file's record without its volatile fields (``processedAt``, timings)."""
    return {
        p.relative_to(out).as_posix(): stable_view(orjson.loads(p.read_bytes()))
        for p in sorted(out.rglob("*.json"))
        if STATE_DIR not in p.parts
    }


def state(out: Path) -> dict[str, object]:
    """The state's documents and redirects, without what differs run to run (mtimes, generation)."""
    dumped = dump_state(out)
    docs = {rel: {k: v for k, v in entry.items() if k != "mtime_ns"} for rel, entry in dumped["docs"].items()}
    return {"docs": docs, "redirects": dumped["redirects"]}


def edits(corpus: Path) -> None:
    """One paragraph edited, one document deleted, one added."""
    guide = corpus / "guide.md"
    guide.write_text(
        guide.read_text().replace("Paragraph 1 of section 2", "A rewritten paragraph of section 2")
    )
    (corpus / "sub" / "notes.md").unlink()
    (corpus / "new.md").write_text("# New\n\n" + section(7, 3))


@pytest.fixture
def twins(tmp_path: Path) -> tuple[tuple[Path, Path], tuple[Path, Path]]:
    """Two copies of one corpus, each ingested once into its own output."""
    corpus = make_corpus(tmp_path / "a")
    shutil.copytree(corpus, tmp_path / "b" / "corpus", copy_function=shutil.copy2)
    pairs = []
    for side in ("a", "b"):
        c, o = tmp_path / side / "corpus", tmp_path / side / "out"
        assert not ingest(opts(c, o)).failures
        pairs.append((c, o))
    return pairs[0], pairs[1]


def test_the_warm_worker_writes_what_the_parent_loaded_pool_writes(
    twins: tuple[tuple[Path, Path], tuple[Path, Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ingest`` (a worker forked mid-walk loads the chunker) == a session whose parent loads it first."""
    (ca, oa), (cb, ob) = twins
    warmed: list[int] = []
    real_warm = GuardPool.warm

    def counting_warm(self: GuardPool) -> None:
        warmed.append(1)
        real_warm(self)

    monkeypatch.setattr(GuardPool, "warm", counting_warm)
    edits(ca)
    edits(cb)
    got = ingest(opts(ca, oa))
    assert warmed, "the walk found a changed document: a worker should have been forked early"
    with Session(opts(cb, ob)) as session:  # not one-shot: the parent prepares, as watch does
        want = session.sync(None)
    assert len(warmed) == 1
    assert not got.failures and not want.failures
    assert (got.processed, got.written, got.removed) == (want.processed, want.written, want.removed)
    assert tree(oa) == tree(ob)
    assert state(oa) == state(ob)
    kinds = [(e.event["event"], e.event.get("change")) for e in read_feed(oa)]
    assert kinds == [(e.event["event"], e.event.get("change")) for e in read_feed(ob)]


@pytest.fixture
def spawned(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Every worker the guard pool forks, as ``warm`` (forked early, loading the chunker itself) or not."""
    forks: list[bool] = []
    real_spawn = GuardPool._spawn

    def counting_spawn(self: GuardPool, *, warm: bool = False) -> object:
        forks.append(warm)
        return real_spawn(self, warm=warm)

    monkeypatch.setattr(GuardPool, "_spawn", counting_spawn)
    return forks


def test_a_no_change_run_forks_no_worker(
    twins: tuple[tuple[Path, Path], tuple[Path, Path]], spawned: list[bool]
) -> None:
    (corpus, out), _ = twins
    summary = ingest(opts(corpus, out))
    assert summary.processed == 0 and summary.skipped == summary.documents > 0
    assert spawned == []


def test_a_run_that_chunks_everything_with_several_jobs_loads_once_and_forks_them_all(
    twins: tuple[tuple[Path, Path], tuple[Path, Path]], spawned: list[bool]
) -> None:
    """No warm worker: it would load the chunker while the parent loads it again for the next fork."""
    (corpus, out), (_, fresh) = twins
    for run in (
        Options(corpus=corpus, out=out, policy=POLICY, jobs=2, full=True),
        Options(corpus=corpus, out=fresh.parent / "empty", policy=POLICY, jobs=2),  # a first ingest
    ):
        spawned.clear()
        assert not ingest(run).failures
        assert spawned == [False, False]
    spawned.clear()
    assert not ingest(Options(corpus=corpus, out=out, policy=POLICY, jobs=1, full=True)).failures
    assert spawned == [True]  # one job: its worker loads while the walk goes on


def test_a_warm_worker_that_dies_while_loading_is_replaced(
    twins: tuple[tuple[Path, Path], tuple[Path, Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The document is chunked anyway, by an ordinary worker the parent forks after loading."""
    (ca, oa), (cb, ob) = twins
    real_ready = GuardPool._ready

    def dead_on_arrival(self: GuardPool, worker: object) -> bool:
        worker.proc.kill()  # type: ignore[attr-defined]
        worker.proc.join(5)  # type: ignore[attr-defined]
        return real_ready(self, worker)  # type: ignore[arg-type]

    monkeypatch.setattr(GuardPool, "_ready", dead_on_arrival)
    edits(ca)
    edits(cb)
    got = ingest(opts(ca, oa))
    monkeypatch.undo()
    want = ingest(opts(cb, ob))
    assert not got.failures and got.processed == want.processed == 2
    assert tree(oa) == tree(ob)


def run_changed(corpus: Path, out: Path, *changed: str) -> Summary:
    return ingest(opts(corpus, out), changed=changed)


def test_changed_gives_what_a_plain_run_gives(twins: tuple[tuple[Path, Path], tuple[Path, Path]]) -> None:
    (ca, oa), (cb, ob) = twins
    edits(ca)
    edits(cb)
    got = run_changed(ca, oa, "guide.md", "sub/notes.md", "new.md")
    want = ingest(opts(cb, ob))
    assert (got.processed, got.written, got.removed) == (want.processed, want.written, want.removed)
    assert tree(oa) == tree(ob)
    assert state(oa) == state(ob)
    assert ingest(opts(ca, oa)).processed == 0  # nothing left for the walk to find


def test_a_wrong_or_stale_hint_only_delays_a_change(
    twins: tuple[tuple[Path, Path], tuple[Path, Path]],
) -> None:
    """Unchanged, missing and non-document paths cost nothing; an unnamed change waits for the next walk."""
    (ca, oa), (cb, ob) = twins
    before = tree(oa)
    edits(ca)
    edits(cb)
    stale = run_changed(ca, oa, "README.md", "no/such.md", "sub/deeper/faq.md", "sub")
    assert stale.processed == 0 and stale.written == 0 and not stale.failures
    assert tree(oa) == before  # the edit, the deletion and the new file were not named
    assert run_changed(ca, oa, "new.md").processed == 1
    assert ingest(opts(ca, oa)).processed == 1  # the walk finds the edit (and the deletion)
    ingest(opts(cb, ob))
    assert tree(oa) == tree(ob)
    assert state(oa) == state(ob)


def test_cli_changed_takes_paths_as_typed_and_refuses_outside_ones(tmp_path: Path) -> None:
    corpus = make_corpus(tmp_path)
    out = tmp_path / "out"
    env = {**os.environ, "COLUMNS": "300", "NO_COLOR": "1"}
    base = [sys.executable, "-m", "pipeline", "ingest", "corpus", "--out", "out", "--json"]
    base += ["--target-tokens", "64", "--overlap-tokens", "8"]
    proc = subprocess.run(base, cwd=tmp_path, capture_output=True, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    (corpus / "other.md").write_text("# Other\n\n" + section(2, 5))
    proc = subprocess.run(
        [*base, "--changed", "corpus/other.md", "--changed", str(corpus / "README.md")],
        cwd=tmp_path,
        capture_output=True,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    summary = orjson.loads(proc.stdout)
    assert (summary["documents"], summary["processed"], summary["skipped"]) == (2, 1, 1)
    outside = tmp_path / "elsewhere.md"
    outside.write_text("# Elsewhere\n")
    for bad in ([str(outside)], ["--full"]):
        args = [*base, "--changed", "corpus/other.md", *(["--changed", *bad] if bad[0] != "--full" else bad)]
        proc = subprocess.run(args, cwd=tmp_path, capture_output=True, env=env, check=False)
        assert proc.returncode == 2, proc.stdout
        assert b"--changed" in proc.stderr + proc.stdout
    assert out.is_dir()
