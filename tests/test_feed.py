"""The change feed is written as documents finish, made durable before the manifest (state.Feed)."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import orjson
import pytest

import pipeline.run.state as state_mod
from pipeline.run.ingest import Options, Session
from pipeline.run.state import FEED, MANIFEST, STATE_DIR, Feed
from pipeline.run.worker import DocResult

DOC = "# Title {n}\n\nSome words about {n}.\n\n## Part\n\nMore words about part {n}.\n"


def corpus_of(tmp_path: Path, docs: int) -> tuple[Path, Path]:
    corpus, out = tmp_path / "corpus", tmp_path / "out"
    corpus.mkdir()
    for n in range(docs):
        (corpus / f"doc{n}.md").write_text(DOC.format(n=n))
    return corpus, out


def lines_of(out: Path) -> list[dict[str, Any]]:
    path = out / STATE_DIR / FEED
    if not path.exists():
        return []
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), "the feed ends in the middle of a line"
    return [orjson.loads(line) for line in data.splitlines()]


def test_a_document_is_in_the_feed_before_the_run_ends(tmp_path: Path) -> None:
    """A loader tailing the feed sees a document's lines once its files are written."""
    corpus, out = corpus_of(tmp_path, 3)
    seen: list[tuple[str, set[str]]] = []

    def on_result(result: DocResult) -> None:
        sources = {e["source"] for e in lines_of(out)}
        seen.append((result.rel_path, sources))

    with Session(Options(corpus=corpus, out=out, jobs=1)) as session:
        summary = session.sync(on_result=on_result)
    assert summary.exit_code == 0
    # on_result runs after the document is folded in: its own lines, and those before it, are there
    assert seen == [
        ("doc0.md", {"doc0.md"}),
        ("doc1.md", {"doc0.md", "doc1.md"}),
        ("doc2.md", {"doc0.md", "doc1.md", "doc2.md"}),
    ]
    events = lines_of(out)
    assert len(events) == summary.chunks == summary.added
    for event in events:  # every announced file is there, whole
        assert orjson.loads((out / event["file"]).read_bytes())["chunk_id"] == event["chunk_id"]


def full_disk_after(monkeypatch: pytest.MonkeyPatch, writes: int) -> None:
    """Writes to the feed work ``writes`` times; then half a block gets in and the disk is full."""
    real_write = os.write
    calls = 0

    def write(fd: int, data: Any) -> int:
        nonlocal calls
        if not os.readlink(f"/proc/self/fd/{fd}").endswith(FEED):
            return real_write(fd, data)  # chunk files and the in-flight record: room enough
        calls += 1
        if calls <= writes:
            return real_write(fd, data)
        if calls == writes + 1:
            return real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(state_mod.os, "write", write)


def test_a_feed_write_that_fails_is_taken_back_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Half a block reached the disk, then it was full: the feed is cut back to its last whole line."""
    feed = Feed(tmp_path)
    feed.append(b'{"a":1}\n{"a":2}')
    full_disk_after(monkeypatch, 0)
    feed.append(b'{"b":1}\n{"b":2}\n{"b":3}')
    monkeypatch.undo()
    assert isinstance(feed.error, OSError) and feed.error.errno == errno.ENOSPC
    feed.append(b'{"c":1}')  # nothing more is written once a write failed...
    assert (tmp_path / STATE_DIR / FEED).read_bytes() == b'{"a":1}\n{"a":2}\n'
    with pytest.raises(OSError, match="No space left"):  # ...and the sync hears of it at the end
        feed.finish()
    assert feed.lines == 2


def test_a_feed_that_cannot_be_written_is_exit_2_and_the_next_run_says_it_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus, out = corpus_of(tmp_path, 3)
    full_disk_after(monkeypatch, 1)  # the first document's lines, then half of the second's
    with Session(Options(corpus=corpus, out=out, jobs=1)) as session:
        summary = session.sync()
    monkeypatch.undo()
    assert summary.exit_code == 2
    assert any("No space left on device" in f for f in summary.failures)
    assert not (out / STATE_DIR / MANIFEST).exists()  # no manifest names what the feed may not
    assert {e["source"] for e in lines_of(out)} == {"doc0.md"}
    files = sorted(p.relative_to(out).as_posix() for p in out.glob("*.json"))
    assert len(files) == 6  # every chunk file was written all the same

    with Session(Options(corpus=corpus, out=out, jobs=1)) as session:
        again = session.sync()
    assert again.exit_code == 0
    announced = {e["file"] for e in lines_of(out) if e["trace_id"] == again.run_id}
    assert announced == set(files)  # the next run announces all that the manifest had not seen
