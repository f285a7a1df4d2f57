"""Incremental runs (SPEC §5): manifest, minimal writes, stale files, change feed, one writer."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from kill_support import sync_killed_at

from pipeline.models import Policy
from pipeline.run.db import StateDB, db_path, dump_state
from pipeline.run.emit import stable_view
from pipeline.run.feed import read_feed
from pipeline.run.ingest import Options, Session, Summary, ingest
from pipeline.run.state import STATE_DIR

POLICY = Policy(target_tokens=64, overlap_tokens=8)


def section(n: int, paragraphs: int) -> str:
    body = "\n\n".join(
        f"Paragraph {i} of section {n} talks about topic {n}.{i} at some length, "
        f"so that a few of them fill a chunk of sixty-four tokens or so, and then some more words."
        for i in range(paragraphs)
    )
    return f"## Section {n}\n\n{body}\n"


def make_corpus(root: Path) -> Path:
    corpus = root / "corpus"
    (corpus / "sub" / "deeper").mkdir(parents=True)
    (corpus / "guide.md").write_text("# Guide\n\nIntro.\n\n" + "\n".join(section(n, 4) for n in range(1, 5)))
    (corpus / "sub" / "notes.md").write_text("# Notes\n\n" + "\n".join(section(n, 2) for n in range(1, 4)))
    (corpus / "sub" / "deeper" / "faq.md").write_text("# FAQ\n\n" + section(1, 3))
    (corpus / "README.md").write_text("# Readme\n\nA short file.\n")
    (corpus / "other.md").write_text("# Other\n\n" + section(1, 5))
    past = time.time_ns() - 60 * 10**9  # older than the racy-stat window of the first run
    for path in corpus.rglob("*.md"):
        os.utime(path, ns=(past, past))
    return corpus


def run(corpus: Path, out: Path, **kw: Any) -> Summary:
    return ingest(Options(corpus=corpus, out=out, policy=POLICY, jobs=1, **kw))


def chunk_files(out: Path) -> dict[str, os.stat_result]:
    return {
        p.relative_to(out).as_posix(): p.stat()
        for p in sorted(out.rglob("*.json"))
        if STATE_DIR not in p.parts
    }


def stable(out: Path, rel: str) -> dict[str, Any]:
    return stable_view(orjson.loads((out / rel).read_bytes()))


def feed(out: Path) -> list[dict[str, Any]]:
    return [line.event for line in read_feed(out, 0)]


def manifest(out: Path) -> dict[str, Any]:
    return dump_state(out)


def died_touching(out: Path, docs: list[str]) -> None:
    """What a run that was killed leaves: its in-flight rows and the sweep flag."""
    db = StateDB(db_path(out / STATE_DIR))
    with db.transaction():
        db.set_inflight(docs, sweep=True)
    db.close()


@pytest.fixture
def built(tmp_path: Path) -> tuple[Path, Path]:
    corpus = make_corpus(tmp_path)
    out = tmp_path / "out"
    summary = run(corpus, out)
    assert not summary.failures and summary.written == summary.chunks > 10
    time.sleep(0.01)
    return corpus, out


def test_manifest_describes_every_document(built: tuple[Path, Path]) -> None:
    _, out = built
    docs = manifest(out)["docs"]
    assert set(docs) == {"guide.md", "sub/notes.md", "sub/deeper/faq.md", "README.md", "other.md"}
    on_disk = set(chunk_files(out))
    assert on_disk == {f for e in docs.values() for f in e["files"]}
    for entry in docs.values():
        assert {
            "source_hash",
            "size",
            "mtime_ns",
            "policy_hash",
            "version",
            "files",
            "chunk_ids",
            "hashes",
        } <= set(entry)
        for i, f in enumerate(entry["files"]):
            rec = orjson.loads((out / f).read_bytes())
            assert (rec["id"], rec["chunk_id"], rec["hash"]) == (
                entry["ids"][i],
                entry["chunk_ids"][i],
                entry["hashes"][i],
            )
    assert manifest(out)["inflight"] is None


def test_unchanged_reingest_writes_nothing(built: tuple[Path, Path]) -> None:
    corpus, out = built
    before = chunk_files(out)
    state = {p.name: p.stat() for p in (out / STATE_DIR).iterdir() if p.name != "lock"}
    summary = run(corpus, out)
    assert (summary.processed, summary.written, summary.removed, summary.skipped) == (0, 0, 0, 5)
    after = chunk_files(out)
    assert {k: (v.st_ino, v.st_mtime_ns) for k, v in after.items()} == {
        k: (v.st_ino, v.st_mtime_ns) for k, v in before.items()
    }
    for p in (out / STATE_DIR).iterdir():  # not even the manifest or the feed is rewritten
        if p.name != "lock":
            assert (p.stat().st_ino, p.stat().st_mtime_ns) == (
                state[p.name].st_ino,
                state[p.name].st_mtime_ns,
            )


def test_touched_file_is_hashed_not_rechunked(built: tuple[Path, Path]) -> None:
    corpus, out = built
    os.utime(corpus / "guide.md", ns=(time.time_ns(), time.time_ns()))
    summary = run(corpus, out)
    assert (summary.processed, summary.written) == (0, 0)


def test_one_paragraph_edit_rewrites_only_what_changed(built: tuple[Path, Path]) -> None:
    corpus, out = built
    before = chunk_files(out)
    old = {rel: stable(out, rel) for rel in before}
    n_feed = len(feed(out))
    guide = corpus / "guide.md"
    guide.write_text(guide.read_text().replace("topic 3.1 at some length", "topic 3.1 at great length"))
    summary = run(corpus, out)
    after = chunk_files(out)
    assert set(after) == set(before)
    rewritten = {
        rel
        for rel in after
        if (after[rel].st_ino, after[rel].st_mtime_ns) != (before[rel].st_ino, before[rel].st_mtime_ns)
    }
    moved = {rel for rel in after if stable(out, rel) != old[rel]}
    assert rewritten == moved  # a file is rewritten exactly when its content moved...
    assert rewritten and all(rel.startswith("doc_guide__") for rel in rewritten)  # ...in that document only
    assert summary.written == len(rewritten) and summary.processed == 1
    events = feed(out)[n_feed:]
    assert sorted(e["file"] for e in events) == sorted(rewritten)  # the feed lists exactly those
    assert {e["event"] for e in events} == {"ingest.write"}
    # text: exactly the chunks whose embedded text changed; the others only moved (rev is per document)
    texts = {rel for rel in after if stable(out, rel)["embedText"] != old[rel]["embedText"]}
    assert len(texts) == 1 and "great length" in stable(out, next(iter(texts)))["originalText"]
    assert {e["file"] for e in events if e["change"] == "text"} == texts
    assert {e["change"] for e in events if e["file"] not in texts} == {"moved"}
    assert len(events) > len(texts)  # the rev of the others moved
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events)  # monotonic
    # only text inside a section changed: every chunk_id survives (the outline-based r=)
    assert [stable(out, rel)["chunk_id"] for rel in sorted(after)] == [
        old[rel]["chunk_id"] for rel in sorted(after)
    ]
    for e in events:
        assert {"schema_version", "event", "ts", "trace_id", "agent_id", "mem_rev", "mem_hash"} <= set(e)
        assert e["trace_id"] == summary.run_id and e["mem_hash"] == e["hash"]


def test_shrunk_document_loses_its_extra_files(built: tuple[Path, Path]) -> None:
    corpus, out = built
    n_before = len(manifest(out)["docs"]["guide.md"]["files"])
    n_feed = len(feed(out))
    (corpus / "guide.md").write_text("# Guide\n\nIntro.\n\n" + section(1, 4))
    summary = run(corpus, out)
    files = manifest(out)["docs"]["guide.md"]["files"]
    assert len(files) < n_before
    assert sorted(p.name for p in out.glob("doc_guide__ch*.json")) == sorted(files)
    gone = {f"doc_guide__ch{n}.json" for n in range(len(files), n_before)}
    deletes = [e for e in feed(out)[n_feed:] if e["event"] == "ingest.delete"]
    assert {e["file"] for e in deletes} == gone and summary.removed == len(gone)
    assert all(e["chunk_id"] and e["id"] and e["hash"] and e["source"] == "guide.md" for e in deletes)


def test_deleted_and_renamed_documents_lose_their_files(built: tuple[Path, Path]) -> None:
    corpus, out = built
    (corpus / "sub" / "deeper" / "faq.md").unlink()
    (corpus / "other.md").rename(corpus / "sub" / "moved.md")
    run(corpus, out)
    assert not (out / "sub" / "deeper").exists()  # emptied folders go too
    assert not list(out.glob("doc_other__*.json"))
    assert list((out / "sub").glob("doc_moved__*.json"))
    assert set(chunk_files(out)) == {f for e in manifest(out)["docs"].values() for f in e["files"]}


def test_full_rechunks_but_writes_only_what_changed(built: tuple[Path, Path]) -> None:
    corpus, out = built
    summary = run(corpus, out, full=True)
    assert summary.processed == 5 and summary.written == 0
    (out / "doc_README__ch0.json").unlink()  # a missing file: a normal run puts it back
    summary = run(corpus, out)
    assert summary.written == 1 and (out / "doc_README__ch0.json").exists()
    damaged = out / "doc_README__ch0.json"
    good = damaged.read_bytes()
    damaged.write_bytes(b"{}")  # damage a normal run does not look for (validate does)
    assert run(corpus, out).written == 0
    summary = run(corpus, out, full=True)
    assert summary.written == 1 and damaged.read_bytes() != b"{}"
    assert json.loads(damaged.read_bytes())["hash"] == json.loads(good)["hash"]


def test_policy_change_rechunks_everything(built: tuple[Path, Path]) -> None:
    corpus, out = built
    summary = ingest(
        Options(corpus=corpus, out=out, policy=Policy(target_tokens=128, overlap_tokens=8), jobs=1)
    )
    assert summary.processed == 5 and summary.skipped == 0
    assert set(chunk_files(out)) == {f for e in manifest(out)["docs"].values() for f in e["files"]}


def test_orphans_and_temp_files_are_swept_after_a_crash(built: tuple[Path, Path]) -> None:
    corpus, out = built
    (out / "doc_ghost__ch0.json").write_text("{}")
    (out / "sub" / ".doc_notes__ch0.json.123.tmp").write_text("half")
    died_touching(out, ["sub/notes.md"])  # a run died
    n_feed = len(feed(out))
    summary = run(corpus, out)
    assert not (out / "doc_ghost__ch0.json").exists()
    assert not list(out.rglob("*.tmp"))
    assert manifest(out)["inflight"] is None
    assert summary.processed == 1 and summary.written == 0  # sub/notes.md re-checked, nothing to fix
    assert [e["file"] for e in feed(out)[n_feed:]] == ["doc_ghost__ch0.json"]


def test_subset_sync_touches_only_those_paths(built: tuple[Path, Path]) -> None:
    """What ``watch`` does: ``Session.sync(paths)``; other documents are left alone."""
    corpus, out = built
    before = chunk_files(out)
    (corpus / "guide.md").write_text("# Guide\n\nAll new.\n")
    (corpus / "sub" / "notes.md").unlink()
    (corpus / "other.md").write_text("# Other\n\nChanged, but not synced.\n")
    with Session(Options(corpus=corpus, out=out, policy=POLICY, jobs=1)) as session:
        summary = session.sync(["guide.md", "sub/notes.md"])
        assert summary.processed == 1 and summary.removed > 0
        assert session.entry("sub/notes.md") is None
        assert (session.entry("guide.md") or {})["files"] == ["doc_guide__ch0.json"]
        summary = session.sync(["other.md"])
        assert summary.processed == 1
    after = chunk_files(out)
    assert not [f for f in after if f.startswith("sub/doc_notes")]
    for rel in ("README.md", "sub/deeper/faq.md"):
        for f in manifest(out)["docs"][rel]["files"]:
            assert (after[f].st_ino, after[f].st_mtime_ns) == (before[f].st_ino, before[f].st_mtime_ns)


def test_feed_replay_reproduces_the_output(built: tuple[Path, Path]) -> None:
    """A loader that tails the feed (upsert on write, delete on delete) ends with the output."""
    corpus, out = built
    (corpus / "guide.md").write_text(
        (corpus / "guide.md").read_text().replace("## Section 2", "## Section two")
    )
    run(corpus, out)
    (corpus / "sub" / "notes.md").rename(corpus / "notes.md")
    (corpus / "new.md").write_text("# New\n\n" + section(7, 3))
    run(corpus, out)
    (corpus / "other.md").write_text("# Other\n\nShort now.\n")
    run(corpus, out)
    store: dict[str, tuple[str, str]] = {}
    for e in feed(out):
        if e["event"] == "ingest.write":
            store[e["id"]] = (e["chunk_id"], e["hash"])
        elif e["event"] == "ingest.delete":
            store.pop(e["id"], None)
    truth = {}
    for rel in chunk_files(out):
        rec = orjson.loads((out / rel).read_bytes())
        truth[rec["id"]] = (rec["chunk_id"], rec["hash"])
    assert store == truth


def test_lazy_imports_on_an_unchanged_run(built: tuple[Path, Path]) -> None:
    """A run with nothing to chunk loads neither the parser, nor the tokenizer, nor the schema."""
    corpus, out = built
    args = [sys.executable, "-X", "importtime", "-m", "pipeline", "ingest", str(corpus), "--out", str(out)]
    proc = subprocess.run(
        [*args, "-q", "--target-tokens", "64", "--overlap-tokens", "8"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if "|" in line}
    assert not {"mistletoe", "jsonschema", "tiktoken", "pipeline.runner", "pipeline.run.worker"} & loaded


# ---------------------------------------------------------------- one writer

HOLDER = """
import sys, time
from pathlib import Path
from pipeline.run.ingest import Options, Session
with Session(Options(corpus=Path(sys.argv[1]), out=Path(sys.argv[2]))):
    print("held", flush=True)
    time.sleep(120)
"""


def chunkyard(*args: str) -> list[str]:
    return [sys.executable, "-m", "pipeline", *args]


ENV = {**os.environ, "COLUMNS": "300", "NO_COLOR": "1"}


@pytest.fixture
def holder(built: tuple[Path, Path]) -> Any:
    corpus, out = built
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(corpus), str(out)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    yield proc
    proc.kill()
    proc.wait()


def flat(text: str) -> str:
    return " ".join(text.split())


def test_no_wait_fails_fast_naming_the_holder(built: tuple[Path, Path], holder: Any) -> None:
    corpus, out = built
    proc = subprocess.run(  # the holder never lets go: had it waited, it would time out here
        chunkyard("ingest", str(corpus), "--out", str(out), "--no-wait"),
        capture_output=True,
        text=True,
        env=ENV,
        check=False,
        timeout=600,
    )
    assert proc.returncode == 2
    assert f"pid {holder.pid}" in flat(proc.stderr) and "locked" in proc.stderr


def test_second_writer_waits_for_the_first(built: tuple[Path, Path], holder: Any, tmp_path: Path) -> None:
    corpus, out = built
    log = tmp_path / "stderr.txt"
    with open(log, "w") as fh:
        waiter = subprocess.Popen(
            chunkyard("ingest", str(corpus), "--out", str(out)), stderr=fh, stdout=subprocess.DEVNULL, env=ENV
        )
    try:
        deadline = time.monotonic() + 600  # a hang's safety net
        while "waiting" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert f"held by pid {holder.pid}" in flat(log.read_text())
        # it said so right before blocking on the lock, which the holder keeps until told: it
        # cannot have finished, and has not written a manifest
        assert waiter.poll() is None
        generation = dump_state(out)["generation"]
        holder.send_signal(signal.SIGTERM)
        assert waiter.wait(timeout=600) == 0  # a hang's safety net
        assert dump_state(out)["generation"] >= generation
    finally:
        waiter.kill()
        waiter.wait()


def test_lock_of_a_killed_holder_is_taken_over(built: tuple[Path, Path], holder: Any) -> None:
    corpus, out = built
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert f"pid {holder.pid}" in (out / STATE_DIR / "lock").read_text()  # its name is still written there
    proc = subprocess.run(
        chunkyard("ingest", str(corpus), "--out", str(out), "--no-wait", "-q"),
        capture_output=True,
        text=True,
        env=ENV,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"pid {holder.pid}" not in (out / STATE_DIR / "lock").read_text()


def test_two_sources_with_one_doc_name_are_reported_not_merged(tmp_path: Path) -> None:
    corpus, out = tmp_path / "corpus", tmp_path / "out"
    corpus.mkdir()
    (corpus / "a.markdown").write_text("# From markdown\n\nfirst\n")
    (corpus / "a.md").write_text("# From md\n\nsecond\n")
    summary = run(corpus, out)
    assert summary.exit_code == 1
    assert any("a.md" in f and "a.markdown" in f for f in summary.failures)
    record = json.loads((out / "doc_a__ch0.json").read_bytes())
    assert record["metadata"]["sourceFile"] == "a.markdown"  # the first, by path order, keeps the name
    (corpus / "a.markdown").unlink()
    summary = run(corpus, out)  # the clash is gone: a.md gets the name
    assert summary.exit_code == 0
    assert json.loads((out / "doc_a__ch0.json").read_bytes())["metadata"]["sourceFile"] == "a.md"


def test_a_first_run_into_an_empty_folder_never_looks_for_old_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing can be there yet: no chunk file is looked up before it is written (make bench)."""
    import pipeline.run.worker

    def looked(*_a: object) -> bool:
        raise AssertionError("looked for an old chunk file")

    monkeypatch.setattr(pipeline.run.worker, "unchanged", looked)  # the workers fork with it
    corpus = make_corpus(tmp_path)
    out = tmp_path / "out"
    (out / STATE_DIR).mkdir(parents=True)  # a state folder alone is still an empty output
    first = run(corpus, out)
    assert not first.failures and first.written == first.chunks > 10
    again = run(corpus, out, full=True)  # now there are files: each one is compared
    assert len(again.failures) == again.processed == 5
    assert all("looked for an old chunk file" in f for f in again.failures)


def test_a_first_run_still_sweeps_strays_it_did_not_write(tmp_path: Path) -> None:
    corpus = make_corpus(tmp_path)
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / "doc_ghost__ch0.json").write_text("{}")
    (out / "sub" / ".doc_notes__ch0.json.123.tmp").write_text("half")
    summary = run(corpus, out)
    assert not summary.failures and summary.removed == 1
    assert not (out / "doc_ghost__ch0.json").exists() and not list(out.rglob("*.tmp"))
    assert set(chunk_files(out)) == {f for e in manifest(out)["docs"].values() for f in e["files"]}


def test_missing_files_and_folders_deep_in_the_output_are_put_back(built: tuple[Path, Path]) -> None:
    corpus, out = built
    before = chunk_files(out)
    deep = sorted(f for f in before if f.startswith("sub/deeper/"))
    notes = sorted(f for f in before if f.startswith("sub/doc_notes__"))
    assert deep and len(notes) > 1
    shutil.rmtree(out / "sub" / "deeper")  # a whole folder of chunk files
    (out / notes[-1]).unlink()  # one file among its document's others
    summary = run(corpus, out)
    assert summary.processed == 2 and summary.skipped == 3
    assert summary.written == len(deep) + 1
    assert set(chunk_files(out)) == set(before)


def test_a_no_change_run_reads_no_chunk_lists(
    built: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cost follows the change (SPEC §10): with nothing changed, a run stats documents and
    output folders, and never asks the state for a document's chunk lists."""
    corpus, out = built

    def refused(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("a no-change run read a document's chunk lists")

    monkeypatch.setattr(StateDB, "entry", refused)
    monkeypatch.setattr(StateDB, "files_of", refused)
    summary = run(corpus, out)
    assert (summary.processed, summary.skipped, summary.written) == (0, 5, 0)
    monkeypatch.undo()
    (out / "doc_README__ch0.json").unlink()  # a folder whose mtime moved is listed again
    assert run(corpus, out).written == 1


def test_a_folder_whose_listing_matches_its_signature_is_not_read_row_by_row(
    built: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cost follows the change (SPEC §10): a whole-corpus run reads the rows of the folders whose
    documents moved, not every document's: the others' listings match their signatures."""
    corpus, out = built
    read: list[str] = []
    rows = StateDB.folder_stamps

    def counted(db: StateDB, folder: str, *a: Any) -> Any:
        read.append(folder)
        return rows(db, folder, *a)

    monkeypatch.setattr(StateDB, "folder_stamps", counted)
    summary = run(corpus, out)
    assert (summary.documents, summary.skipped, summary.processed, read) == (5, 5, 0, [])
    text = (corpus / "sub" / "notes.md").read_text()
    (corpus / "sub" / "notes.md").write_text(text + "\nA paragraph added at the end.\n")
    summary = run(corpus, out)
    assert (summary.documents, summary.skipped, summary.processed) == (5, 4, 1)
    assert read and set(read) == {"sub/"}, read  # the edited document's folder, nothing else
    (corpus / "sub" / "deeper" / "faq.md").unlink()  # a folder left with no document
    read.clear()
    summary = run(corpus, out)
    assert "sub/deeper/faq.md" not in manifest(out)["docs"] and summary.removed > 0
    assert "" not in read, read  # the root's signature still holds


def test_a_document_restored_with_its_old_size_and_mtime_after_a_save_is_chunked_again(
    built: tuple[Path, Path],
) -> None:
    """A save synced alone (``--changed``, ``watch``) drops its folder's signature: restoring the
    old bytes with their old mtime (``cp -p`` of a backup) then differs from the state, not from
    the signature, and the next whole-corpus run must see it."""
    corpus, out = built
    path = corpus / "other.md"
    old, st = path.read_bytes(), path.stat()
    path.write_bytes(old.replace(b"some length", b"some other length"))
    assert ingest(Options(corpus=corpus, out=out, policy=POLICY, jobs=1), changed=["other.md"]).processed == 1
    path.write_bytes(old)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    summary = run(corpus, out)
    assert summary.processed == 1
    texts = [
        orjson.loads((out / f).read_bytes())["originalText"]
        for f in manifest(out)["docs"]["other.md"]["files"]
    ]
    assert not any("some other length" in t for t in texts)


def test_every_write_to_a_documents_row_drops_its_folders_signature(built: tuple[Path, Path]) -> None:
    """A signature vouches for a folder only while no row of it changed outside the walk that made it."""
    _, out = built
    db = StateDB(db_path(out / STATE_DIR))
    try:
        signed = db.signatures()
        assert set(signed) == {"", "sub/", "sub/deeper/"}  # every folder with a document
        entry = db.entry("sub/notes.md")
        assert entry is not None
        for folder, write in (
            ("sub/", lambda: db.put_doc("sub/notes.md", entry, 1)),
            ("sub/deeper/", lambda: db.touch_doc("sub/deeper/faq.md", 1)),
            ("", lambda: db.drop_doc("other.md")),
        ):
            with db.transaction():
                db.sign(signed)
                write()
            assert set(db.signatures()) == set(signed) - {folder}, folder
    finally:
        db.close()


def test_a_doc_uid_collision_widens_r_with_a_warning_then_fails_past_12(tmp_path: Path) -> None:
    """Two documents with one ``doc_id`` and one outline: the second gets 12-hex ``r=`` (000)."""
    corpus, out = tmp_path / "corpus", tmp_path / "out"
    corpus.mkdir()
    text = "---\ndoc_id: shared\n---\n# Same\n\nFirst {}.\n"
    (corpus / "a.md").write_text(text.format("a"))
    (corpus / "b.md").write_text(text.format("b"))
    summary = run(corpus, out)
    assert not summary.failures
    assert [w for w in summary.warnings if "collides" in w] == [
        "b.md: mint: doc_uid|r collides with a.md; r= widened to 12 hex"
    ]
    docs = manifest(out)["docs"]
    assert (
        len(docs["a.md"]["uid_rev"].split("r=")[1]) == 8 and len(docs["b.md"]["uid_rev"].split("r=")[1]) == 12
    )
    assert docs["b.md"]["rev_width"] == 12
    again = run(corpus, out)  # stable: nothing to widen again
    assert (again.processed, again.failures, again.warnings) == (0, [], [])


def test_a_collision_is_widened_by_the_run_after_one_that_died_before_it(tmp_path: Path) -> None:
    corpus, out = tmp_path / "corpus", tmp_path / "out"
    corpus.mkdir()
    text = "---\ndoc_id: shared\n---\n# Same\n\nFirst {}.\n"
    (corpus / "a.md").write_text(text.format("a"))
    (corpus / "b.md").write_text(text.format("b"))

    # a real SIGKILL: both documents recorded, the collision not seen
    sync_killed_at(
        corpus, out, "pipeline.run.ingest.Session._widen_collisions",
        target_tokens=POLICY.target_tokens, overlap_tokens=POLICY.overlap_tokens,
    )  # fmt: skip
    summary = run(corpus, out)
    assert any("r= widened to 12 hex" in w for w in summary.warnings)
    assert manifest(out)["docs"]["b.md"]["rev_width"] == 12 and manifest(out)["inflight"] is None


def test_a_first_run_looks_up_no_documents_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A document the state has no row for is never looked up (its job, its recording):
    a first run of 2,251 documents asked 4,502 times for rows that were not there."""
    corpus = make_corpus(tmp_path)

    def refused(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("looked up a document the state has no row for")

    monkeypatch.setattr(StateDB, "entry", refused)
    summary = run(corpus, tmp_path / "out")
    assert not summary.failures and summary.written == summary.chunks > 10
    (corpus / "new.md").write_text("# New\n\nA document added since.\n")
    assert run(corpus, tmp_path / "out").written == 1
    monkeypatch.undo()
    assert manifest(tmp_path / "out")["docs"].keys() == {
        "README.md", "guide.md", "new.md", "other.md", "sub/notes.md", "sub/deeper/faq.md"
    }
