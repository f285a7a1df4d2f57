"""The change feed in the state database: seq, per-document commits, retention, migration (SPEC §5, §10)."""

from __future__ import annotations

import errno
import os
import random
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.run import feed as feed_mod
from pipeline.run.db import StateDB, db_path, dump_state
from pipeline.run.feed import FeedGapError, read_feed
from pipeline.run.ingest import Options, Session, ingest
from pipeline.run.state import STATE_DIR
from pipeline.run.worker import DocResult

DOC = "# Title {n}\n\nSome words about {n}.\n\n## Part\n\nMore words about part {n}.\n"


def corpus_of(tmp_path: Path, docs: int) -> tuple[Path, Path]:
    corpus, out = tmp_path / "corpus", tmp_path / "out"
    corpus.mkdir()
    for n in range(docs):
        (corpus / f"doc{n}.md").write_text(DOC.format(n=n))
    return corpus, out


def lines_of(out: Path, after: int = 0) -> list[dict[str, Any]]:
    return [line.event for line in read_feed(out, after)]


def test_a_document_is_in_the_feed_before_the_run_ends(tmp_path: Path) -> None:
    """A loader reading the feed sees a document's lines once its files are written."""
    corpus, out = corpus_of(tmp_path, 3)
    seen: list[tuple[str, set[str]]] = []

    def on_result(result: DocResult) -> None:
        sources = {e["source"] for e in lines_of(out)}
        seen.append((result.rel_path, sources))

    with Session(Options(corpus=corpus, out=out, jobs=1)) as session:
        summary = session.sync(on_result=on_result)
    assert summary.exit_code == 0
    # on_result runs after the document is recorded: its own lines, and those before it, are there
    assert seen == [
        ("doc0.md", {"doc0.md"}),
        ("doc1.md", {"doc0.md", "doc1.md"}),
        ("doc2.md", {"doc0.md", "doc1.md", "doc2.md"}),
    ]
    events = lines_of(out)
    assert len(events) == summary.chunks == summary.added
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert {e["change"] for e in events} == {"text"}  # all new text
    for event in events:  # every announced file is there, whole
        assert orjson.loads((out / event["file"]).read_bytes())["chunk_id"] == event["chunk_id"]


def test_a_write_line_is_the_envelope_then_its_fields_each_once(tmp_path: Path) -> None:
    """The parent writes a line's bytes from the envelope's, spliced: the same JSON, no key twice."""
    corpus, out = corpus_of(tmp_path, 2)
    ingest(Options(corpus=corpus, out=out, jobs=1))
    (corpus / "doc0.md").write_text(DOC.format(n=0).replace("## Part", "## New\n\nText.\n\n## Part"))
    ingest(Options(corpus=corpus, out=out, jobs=1))
    db = StateDB.reader(db_path(out / STATE_DIR))
    try:
        raw = [bytes(line) for (line,) in db.conn.execute("SELECT line FROM feed WHERE kind='w' ORDER BY seq")]
    finally:
        db.close()
    envelope = ["schema_version", "event", "ts", "trace_id", "agent_id", "mem_rev", "mem_hash"]
    fields = ["file", "id", "chunk_id", "hash", "source", "change"]
    assert len(raw) > 4
    for line in raw:
        event = orjson.loads(line)
        assert orjson.dumps(event) == line  # no key twice (a repeated key would not survive this)
        keys = list(event)
        assert keys in (envelope + fields, [*envelope, *fields, "prev_chunk_id"]), keys
        assert event["mem_hash"] == event["hash"]
    assert any("prev_chunk_id" in orjson.loads(line) for line in raw)  # a heading added: ids moved


def test_state_that_cannot_be_written_is_exit_2_and_the_next_run_says_what_it_missed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills up after the first document: exit 2; the next run announces the rest, no more."""
    corpus, out = corpus_of(tmp_path, 3)
    real_commit, commits = StateDB.commit, [0]

    def full_after_two(self: StateDB) -> None:  # the in-flight record and doc0.md fit
        commits[0] += 1
        if commits[0] <= 2:
            return real_commit(self)
        self.conn.execute("ROLLBACK")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(StateDB, "commit", full_after_two)
    with Session(Options(corpus=corpus, out=out, jobs=1)) as session:
        summary = session.sync()
    monkeypatch.undo()
    assert summary.exit_code == 2
    assert any("No space left on device" in f for f in summary.failures)
    assert {e["source"] for e in lines_of(out)} == {"doc0.md"}
    assert set(dump_state(out)["docs"]) == {"doc0.md"}  # the state names nothing the feed does not
    files = sorted(p.relative_to(out).as_posix() for p in out.glob("*.json"))
    assert len(files) == 6  # every chunk file was written all the same

    with Session(Options(corpus=corpus, out=out, jobs=1)) as session:
        again = session.sync()
    assert again.exit_code == 0
    announced = {e["file"] for e in lines_of(out) if e["trace_id"] == again.run_id}
    assert announced == {f for f in files if not f.startswith("doc_doc0")}


def test_a_run_stopped_while_recording_commits_no_half_document_and_the_next_run_converges(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Documents share a transaction: one stopped half-way (Ctrl-C) takes none of them with it half."""
    from pipeline.run import record

    corpus, out = corpus_of(tmp_path, 8)
    real, calls = record._announce_writes, [0]

    def stopped_at_the_sixth(*args: Any) -> None:
        calls[0] += 1
        if calls[0] == 6:  # docs 0, 1-2 committed; 3-4 in the open transaction; 5 half recorded
            raise KeyboardInterrupt
        real(*args)

    monkeypatch.setattr(record, "_announce_writes", stopped_at_the_sixth)
    with pytest.raises(KeyboardInterrupt):
        ingest(Options(corpus=corpus, out=out, jobs=1))
    monkeypatch.undo()
    state = dump_state(out)
    assert set(state["docs"]) == {e["source"] for e in lines_of(out)} == {"doc0.md", "doc1.md", "doc2.md"}
    assert state["inflight"] is not None and len(state["inflight"]["docs"]) == 8
    again = ingest(Options(corpus=corpus, out=out, jobs=1))
    assert again.exit_code == 0
    assert {e["source"] for e in lines_of(out)} == {f"doc{n}.md" for n in range(8)}
    assert dump_state(out)["inflight"] is None


def test_a_reader_after_the_end_or_below_the_floor_hears_of_the_gap(tmp_path: Path) -> None:
    corpus, out = corpus_of(tmp_path, 2)
    with pytest.raises(FeedGapError):  # no feed yet: nothing reaches seq 3
        list(read_feed(out, 3))
    assert list(read_feed(out, 0)) == []
    ingest(Options(corpus=corpus, out=out, jobs=1))
    last = feed_mod.last_seq(out)
    assert last == 4 and list(read_feed(out, last)) == []
    with pytest.raises(FeedGapError, match="made anew"):
        list(read_feed(out, last + 1))
    db = StateDB(db_path(out / STATE_DIR))
    with db.transaction():
        db.set_meta(feed_floor=3)
    db.close()
    with pytest.raises(FeedGapError, match="compacted past it"):
        list(read_feed(out, 2))
    assert [line.seq for line in read_feed(out, 3)] == [4]


def _replay(out: Path, store: dict[str, tuple[str, str]], after: int) -> int:
    """A loader keyed by chunk file: file → (chunk_id, hash); returns the seq it stands at."""
    try:
        lines = list(read_feed(out, after))
    except FeedGapError:
        store.clear()
        lines = list(read_feed(out, 0))
    for line in lines:
        e = line.event
        if e["event"] == "ingest.write":
            store[e["file"]] = (e["chunk_id"], e["hash"])
        elif e["event"] == "ingest.delete":
            store.pop(e["file"], None)
        after = line.seq
    return after


def _truth(out: Path) -> dict[str, tuple[str, str]]:
    truth = {}
    for path in out.rglob("doc_*.json"):
        rec = orjson.loads(path.read_bytes())
        truth[path.relative_to(out).as_posix()] = (rec["chunk_id"], rec["hash"])
    return truth


def test_the_feed_stays_bounded_and_every_committed_seq_resumes_to_the_current_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five full re-ingests of an edited corpus: the feed stays within twice one clean ingest's
    (the retention rule), and readers that stopped at many different seqs all end current."""
    monkeypatch.setattr(feed_mod, "MIN_COMPACT", 10)  # a small corpus compacts too
    rng = random.Random(15)
    corpus, out = tmp_path / "corpus", tmp_path / "out"
    corpus.mkdir()
    texts = {
        f"d{n:02d}.md": f"# Doc {n}\n\n"
        + "\n\n".join(
            f"## Part {p}\n\nWords {n} {p} " + "more words " * rng.randint(5, 60)
            for p in range(rng.randint(1, 6))
        )
        for n in range(30)
    }
    for name, text in texts.items():
        (corpus / name).write_text(text)
    ingest(Options(corpus=corpus, out=out, jobs=1))
    clean = feed_mod.last_seq(out)
    readers: dict[int, dict[str, tuple[str, str]]] = {}
    for stop in range(0, clean + 1, max(1, clean // 12)):  # readers that stopped mid-way
        store: dict[str, tuple[str, str]] = {}
        for line in read_feed(out, 0):
            if line.seq > stop:
                break
            _replay_line(store, line.event)
        readers[stop] = store
    for round_ in range(5):
        for name in rng.sample(sorted(texts), 8):  # edits, deletions, new documents, shrinks
            path = corpus / name
            what = rng.choice(["edit", "delete", "shrink", "grow"])
            if what == "delete" and path.exists():
                path.unlink()
            elif what == "shrink" and path.exists():
                path.write_text(path.read_text()[: len(path.read_text()) // 3])
            else:
                path.write_text(
                    texts[name] + f"\n\n## Round {round_}\n\nNew words {round_}.\n" * rng.randint(1, 3)
                )
        ingest(Options(corpus=corpus, out=out, jobs=1, full=True))
        mid = feed_mod.last_seq(out)
        readers[mid] = {}
        _replay(out, readers[mid], 0)
    with db_ro(out) as rows:
        assert rows <= 2 * max(clean, len(_truth(out))) + 10, (rows, clean)
        # it was compacted: about half of the history is gone (what stays is one line per file
        # and per redirect; a document deleted, then written again, redirects its old ids)
        assert rows < 0.55 * feed_mod.last_seq(out), (rows, feed_mod.last_seq(out))
    truth = _truth(out)
    for after, store in readers.items():
        _replay(out, store, after)
        assert store == truth, f"a reader that stopped at seq {after}"


def _replay_line(store: dict[str, tuple[str, str]], e: dict[str, Any]) -> None:
    if e["event"] == "ingest.write":
        store[e["file"]] = (e["chunk_id"], e["hash"])
    elif e["event"] == "ingest.delete":
        store.pop(e["file"], None)


class db_ro:  # noqa: N801 - reads like a function
    """The number of lines the feed holds."""

    def __init__(self, out: Path) -> None:
        self.db = StateDB.reader(db_path(out / STATE_DIR))

    def __enter__(self) -> int:
        return int(self.db.conn.execute("SELECT count(*) FROM feed").fetchone()[0])

    def __exit__(self, *exc: object) -> None:
        self.db.close()


def test_an_old_manifest_is_migrated_without_rechunking(tmp_path: Path) -> None:
    """An output of an older chunkyard (manifest.json, redirects.json, changes.jsonl) is taken over."""
    corpus, out = corpus_of(tmp_path, 4)
    ingest(Options(corpus=corpus, out=out, jobs=1))
    state = dump_state(out)
    folder = out / STATE_DIR
    manifest = {k: state[k] for k in ("version", "policy_hash", "policy", "corpus", "generation")}
    docs = {rel: {k: v for k, v in e.items() if k != "embeds"} for rel, e in state["docs"].items()}
    (folder / "manifest.json").write_bytes(orjson.dumps({**manifest, "format": 1, "docs": docs}))
    (folder / "redirects.json").write_bytes(orjson.dumps({"format": 1, "redirects": {"gone|r=1|s=1": "x"}}))
    (folder / "changes.jsonl").write_bytes(b'{"event": "ingest.write"}\n')
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db_path(folder)}{suffix}").unlink(missing_ok=True)
    files = {p: p.stat().st_mtime_ns for p in out.glob("*.json")}
    past = time.time_ns() - 60 * 10**9
    for path in corpus.glob("*.md"):
        os.utime(path, ns=(past, past))
        docs[path.name]["mtime_ns"] = past
    (folder / "manifest.json").write_bytes(orjson.dumps({**manifest, "format": 1, "docs": docs}))

    summary = ingest(Options(corpus=corpus, out=out, jobs=1))
    assert summary.exit_code == 0 and summary.processed == 0 and summary.skipped == 4  # no re-chunking
    assert any(
        "migrated manifest.json (4 documents, 8 chunk files, 1 redirects)" in w for w in summary.warnings
    )
    assert {p: p.stat().st_mtime_ns for p in out.glob("*.json")} == files
    after = dump_state(out)
    assert after["redirects"] == {"gone|r=1|s=1": "x"}
    assert {rel: e["chunk_ids"] for rel, e in after["docs"].items()} == {
        rel: e["chunk_ids"] for rel, e in docs.items()
    }
    assert not (folder / "manifest.json").exists() and (folder / "changes.jsonl.pre-seq").exists()
    store: dict[str, tuple[str, str]] = {}
    _replay(out, store, 0)  # a reader from seq 0 holds the current state
    assert store == _truth(out)
    (corpus / "doc1.md").write_text(DOC.format(n=1) + "\nOne more line.\n")
    again = ingest(Options(corpus=corpus, out=out, jobs=1))
    assert again.processed == 1 and not again.warnings  # said once


def test_a_reader_during_the_first_run_sees_an_empty_feed_not_an_error(tmp_path: Path) -> None:
    """A loader tailing the feed while the first ingest is still creating the database."""
    import sqlite3

    path = db_path(tmp_path / "out" / STATE_DIR)
    path.parent.mkdir(parents=True)
    sqlite3.connect(path).close()  # the file exists, its tables do not yet
    assert list(read_feed(tmp_path / "out", 0)) == []
    with pytest.raises(FeedGapError):
        list(read_feed(tmp_path / "out", 5))


#: The state database as format 2 made it: each document's lists in ``entries`` as well as in
#: its ``chunks`` rows, which had an ``id`` column and four indexes.
_FORMAT_2 = """
CREATE TABLE entries(rel TEXT PRIMARY KEY, lists BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE chunks(
    rel TEXT NOT NULL, n INTEGER NOT NULL, file TEXT NOT NULL, id TEXT NOT NULL,
    chunk_id TEXT NOT NULL, hash TEXT NOT NULL, gen INTEGER NOT NULL,
    PRIMARY KEY(rel, n)) WITHOUT ROWID;
CREATE INDEX chunks_file ON chunks(file);
CREATE INDEX chunks_chunk_id ON chunks(chunk_id);
CREATE INDEX chunks_id ON chunks(id);
CREATE INDEX chunks_hash ON chunks(hash, gen);
"""


def _to_format_2(out: Path) -> None:
    """Rewrite ``out``'s state as a chunkyard of format 2 left it."""
    state = dump_state(out)
    db = StateDB(db_path(out / STATE_DIR))
    conn = db.conn
    gens = {(r, n): g for r, n, g in conn.execute("SELECT rel, n, gen FROM chunks")}
    conn.execute("BEGIN")
    conn.execute("DROP TABLE chunks")
    for statement in _FORMAT_2.split(";"):
        if statement.strip():
            conn.execute(statement)
    for rel, e in state["docs"].items():
        lists = {k: e[k] for k in ("files", "ids", "chunk_ids", "hashes", "digests", "embeds")}
        conn.execute("INSERT INTO entries VALUES(?, ?)", (rel, orjson.dumps(lists)))
        for n, file in enumerate(e["files"]):
            row = (rel, n, file, e["ids"][n], e["chunk_ids"][n], e["hashes"][n], gens[(rel, n)])
            conn.execute("INSERT INTO chunks VALUES(?,?,?,?,?,?,?)", row)
    conn.execute("COMMIT")
    db.close()


def test_a_format_2_state_is_converted_on_first_open_without_rechunking(tmp_path: Path) -> None:
    """An output of the previous state format keeps everything it knew, and nothing is re-chunked."""
    from pipeline.audit.chunk_state import open_store
    from pipeline.errors import UsageError
    from pipeline.run.db import StateError

    corpus, out = corpus_of(tmp_path, 4)
    ingest(Options(corpus=corpus, out=out, jobs=1))
    before = dump_state(out)
    seq = feed_mod.last_seq(out)
    _to_format_2(out)
    with pytest.raises(StateError, match=r"older format \(2\).*run chunkyard ingest once"):
        StateDB.reader(db_path(out / STATE_DIR))  # a reader cannot convert it: it says what will
    with pytest.raises(UsageError, match="older format"):
        open_store(out, corpus)
    files = {p: p.stat().st_mtime_ns for p in out.glob("*.json")}

    summary = ingest(Options(corpus=corpus, out=out, jobs=1))
    assert summary.exit_code == 0 and summary.processed == 0 and summary.skipped == 4
    assert {p: p.stat().st_mtime_ns for p in out.glob("*.json")} == files
    assert feed_mod.last_seq(out) == seq  # nothing to announce
    after = dump_state(out)
    assert after["docs"] == before["docs"]  # digests and embeds included
    db = StateDB.reader(db_path(out / STATE_DIR))
    try:
        tables = {name for (name,) in db.conn.execute("SELECT name FROM sqlite_master")}
        assert "entries" not in tables and "chunks_id" not in tables
        assert "id" not in {c[1] for c in db.conn.execute("PRAGMA table_info(chunks)")}
        rel = sorted(before["docs"])[1]
        chunk = before["docs"][rel]["ids"][1]
        assert db.locate("id", chunk) == (rel, 1, before["docs"][rel]["files"][1])
        assert db.locate("id", chunk + "0") is None and db.locate("id", "doc:nowhere::ch1") is None
        assert list(db.iter_column("id")) == sorted(i for e in before["docs"].values() for i in e["ids"])
    finally:
        db.close()
    assert open_store(out, corpus).docs[rel]["ids"] == before["docs"][rel]["ids"]

    # the embeds survived: a renamed heading moves every chunk id of the document (r= hashes
    # the outline), and only the chunk whose embedded text holds the heading is announced as text
    (corpus / "doc1.md").write_text(DOC.format(n=1).replace("## Part", "## Part two"))
    ingest(Options(corpus=corpus, out=out, jobs=1))
    changes = [line.event for line in read_feed(out, seq) if line.event["event"] == "ingest.write"]
    assert [(e["file"], e["change"]) for e in changes] == [
        ("doc_doc1__ch0.json", "moved"),
        ("doc_doc1__ch1.json", "text"),
    ], changes


def test_a_first_sync_makes_the_hash_index_at_its_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sync into an empty state sorts the chunks' hash index once; renames are found by it later."""
    from pipeline.run import session as session_mod

    monkeypatch.setattr(session_mod, "BULK", 3)
    dropped: list[str] = []
    drop = StateDB.drop_hash_index
    monkeypatch.setattr(StateDB, "drop_hash_index", lambda db: (dropped.append("x"), drop(db))[1])
    corpus, out = corpus_of(tmp_path, 4)

    def indexes() -> set[str]:
        db = StateDB.reader(db_path(out / STATE_DIR))
        try:
            return {n for (n,) in db.conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        finally:
            db.close()

    ingest(Options(corpus=corpus, out=out, jobs=1))
    assert dropped == ["x"] and "chunks_hash" in indexes()
    old = dump_state(out)["docs"]["doc3.md"]["chunk_ids"]
    seq = feed_mod.last_seq(out)
    (corpus / "doc3.md").rename(corpus / "moved.md")  # the state is not empty: the index stays
    ingest(Options(corpus=corpus, out=out, jobs=1))
    assert dropped == ["x"]
    renames = {e["old"]: e["match"] for e in lines_of(out, seq) if e["event"] == "ingest.redirect"}
    assert renames == dict.fromkeys(old, "rename")


def test_a_big_sync_copies_its_wal_into_the_database_while_it_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a commit that grew the WAL by ``BEHIND_BYTES``, a thread copies it into the
    database (PASSIVE, its own connection) while the sync goes on; ``close`` waits for it,
    and what the sync recorded is what a sync without those copies records."""
    from pipeline.run import db as db_mod

    corpus, out = corpus_of(tmp_path, 40)
    ingest(Options(corpus=corpus, out=tmp_path / "plain", jobs=1))
    started: list[Path] = []
    copy = db_mod._checkpoint
    monkeypatch.setattr(db_mod, "_checkpoint", lambda path: (started.append(path), copy(path))[1])
    monkeypatch.setattr(db_mod, "BEHIND_BYTES", 1)
    ingest(Options(corpus=corpus, out=out, jobs=1))
    assert len(started) > 1  # transactions hold 1, 2, 4 … documents: several commits, several copies
    assert set(started) == {db_path(out / STATE_DIR)}
    assert not os.path.exists(f"{started[0]}-wal")  # closed: nothing left to copy

    def stable(state: dict[str, Any]) -> dict[str, Any]:
        return {rel: {k: v for k, v in doc.items() if k != "mtime_ns"} for rel, doc in state["docs"].items()}

    assert stable(dump_state(out)) == stable(dump_state(tmp_path / "plain"))
    assert len(lines_of(out)) == len(lines_of(tmp_path / "plain"))
    # a progress bar (each document committed alone) copies behind too; a watch's save does not
    started.clear()
    ingest(Options(corpus=corpus, out=tmp_path / "shown", jobs=1), on_result=lambda _r: None)
    assert len(started) > 1
    started.clear()
    with Session(Options(corpus=corpus, out=tmp_path / "watched", jobs=1)) as session:  # as ``watch`` does
        session.sync(on_result=lambda _r: None)
        (corpus / "doc0.md").write_text(DOC.format(n="zero"))
        session.sync(["doc0.md"], on_result=lambda _r: None)
    assert started == []


def test_checkpoint_behind_copies_committed_pages_one_copy_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from pipeline.run import db as db_mod

    path = tmp_path / "state.sqlite"
    db = StateDB(path)
    with db.transaction():
        feed_mod.append(db, [(f"f\x1f{n}", "w", 1, b"x" * 100) for n in range(100)])
    db.checkpoint_behind()  # a small WAL: left to close
    assert db._checkpointer is None
    with db.transaction():
        feed_mod.append(db, [(f"f\x1f{n}", "w", 1, b"x" * 1000) for n in range(6000)])  # ~6 MB
    assert path.stat().st_size < 1_000_000  # committed, in the WAL only
    go = threading.Event()
    copy = db_mod._checkpoint
    monkeypatch.setattr(db_mod, "_checkpoint", lambda p: (go.wait(10), copy(p))[1])
    db.checkpoint_behind()
    copier = db._checkpointer
    assert copier is not None and copier.is_alive()
    db.checkpoint_behind()  # while it copies, no second copy starts
    assert db._checkpointer is copier
    go.set()
    copier.join()
    assert path.stat().st_size > 6_000_000  # copied into the database, before close
    db.close()
    assert db._checkpointer is None
