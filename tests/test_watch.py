"""Watch mode (SPEC §6) against the real file system and the real observer: no mocked events.

Every wait is on an event: the output is polled until a condition holds (the test fails
only if it never does, after a generous safety net).
"""

from __future__ import annotations

import json
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pipeline.errors import UsageError
from pipeline.models import Policy
from pipeline.run.emit import stable_view
from pipeline.run.feed import read_feed
from pipeline.run.ingest import Options, ingest
from pipeline.run.state import STATE_DIR
from pipeline.run.watch import SyncReport, Watcher, is_editor_temp

# watchdog warns when a folder moved out and back in keeps its inotify watch
pytestmark = pytest.mark.filterwarnings("ignore:Callback with id:RuntimeWarning")

POLICY = Policy(target_tokens=48, overlap_tokens=8)
#: A safety net against a hang, not a speed claim: every wait returns as soon as its event shows.
TIMEOUT = 120.0
#: ``Run.settle``'s barrier documents start so (``changes`` leaves them out).
BARRIER = "zz-barrier-"


def section(title: str, words: int, seed: int) -> str:
    rng = random.Random(seed)
    vocab = [
        "alpha",
        "beta",
        "gamma",
        "delta",
        "chunk",
        "yard",
        "watch",
        "save",
        "editor",
        "rename",
        "folder",
        "token",
        "budget",
    ]
    sentences = [" ".join(rng.choice(vocab) for _ in range(9)).capitalize() + "." for _ in range(words // 9)]
    return f"## {title}\n\n" + " ".join(sentences) + "\n"


def document(title: str, sections: int = 3, seed: int = 0) -> str:
    body = "\n".join(section(f"{title} part {i}", 60, seed * 100 + i) for i in range(sections))
    return f"# {title}\n\nIntro of {title}.\n\n{body}"


def wait_until(cond: Callable[[], object], what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for: {what}")


def chunk_files(out: Path, rel: str) -> list[Path]:
    """The chunk files of one document, in chunk order."""
    folder, _, name = rel.rpartition("/")
    stem = name.rsplit(".", 1)[0]
    files = (out / folder).glob(f"doc_{stem}__ch*.json") if (out / folder).is_dir() else []
    return sorted(files, key=lambda p: int(p.stem.rsplit("__ch", 1)[1]))


def text_of(out: Path, rel: str) -> str:
    """All ``originalText`` of a document's chunk files ('' when it has none)."""
    texts = []
    for path in chunk_files(out, rel):
        try:
            texts.append(json.loads(path.read_bytes())["originalText"])
        except (OSError, ValueError):
            return ""  # a file replaced under us: poll again
    return "\n".join(texts)


def feed(out: Path) -> list[dict[str, object]]:
    return [line.event for line in read_feed(out, 0)]


def all_chunks(out: Path) -> dict[str, object]:
    """Every chunk file under ``out`` by relative path, volatile fields aside."""
    return {
        str(p.relative_to(out)): stable_view(json.loads(p.read_bytes()))
        for p in out.rglob("doc_*.json")
        if STATE_DIR not in p.parts
    }


class Run:
    """A watcher on a corpus, and the reports it made."""

    def __init__(self, corpus: Path, out: Path, debounce: float = 0.05, polling: bool = False) -> None:
        self.corpus, self.out = corpus, out
        self.reports: list[SyncReport] = []
        self.barriers = 0  #: ``settle`` calls so far
        self.lock = threading.Lock()
        options = Options(corpus, out, POLICY, jobs=1)
        self.watcher = Watcher(options, debounce=debounce, polling=polling, on_sync=self._on_sync)

    def _on_sync(self, report: SyncReport) -> None:
        with self.lock:
            self.reports.append(report)

    def changes(self) -> list[tuple[str, str]]:
        """The documents synced after the first sync (``settle``'s barriers aside)."""
        with self.lock:
            return [
                (d.path, d.status)
                for r in self.reports
                if not r.initial
                for d in r.docs
                if not d.path.startswith(BARRIER)
            ]

    def settle(self) -> None:
        """Wait until every event before now is synced: an event, not a quiet spell.

        A barrier document is saved at the corpus root after them; one inotify descriptor
        hands its events over in order (watchdog's move pairing delays them all alike), so
        once the barrier is synced and nothing is pending or syncing, neither is anything
        that came before it."""
        self.barriers += 1
        mark = f"Barrier {self.barriers}"
        self.write(f"{BARRIER}{self.barriers}.md", f"# {mark}\n\nSaved after everything before it.\n")
        self.current(f"{BARRIER}{self.barriers}.md", mark)
        wait_until(self.watcher.idle, "watch to be idle")

    def write(self, rel: str, text: str | bytes) -> None:
        path = self.corpus / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        data = text.encode() if isinstance(text, str) else text
        with open(path, "wb") as fh:  # in place: truncate, write, close
            fh.write(data)

    def current(self, rel: str, needle: str) -> None:
        wait_until(lambda: needle in text_of(self.out, rel), f"{rel} to show {needle!r}")


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    for rel, seed in (("a.md", 1), ("sub/b.md", 2), ("sub/deep/c.md", 3), ("z.markdown", 4)):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(document(rel.split("/")[-1].split(".")[0].upper(), seed=seed))
    (root / "notes.txt").write_text("not a document\n")
    return root


@pytest.fixture
def run(corpus: Path, tmp_path: Path) -> Iterator[Run]:
    r = Run(corpus, tmp_path / "chunks")
    with r.watcher:
        yield r


def test_first_sync_writes_every_document(run: Run) -> None:
    assert run.reports and run.reports[0].initial
    assert run.reports[0].summary.documents == 4
    for rel in ("a.md", "sub/b.md", "sub/deep/c.md", "z.markdown"):
        assert chunk_files(run.out, rel)


def test_save_in_place(run: Run) -> None:
    before = len(feed(run.out))
    run.write("a.md", document("A", seed=1) + "\nSaved in place, mark 1.\n")
    run.current("a.md", "mark 1")
    wait_until(
        lambda: any(e["event"] == "ingest.write" and e["source"] == "a.md" for e in feed(run.out)[before:]),
        "the change feed to show the write",
    )
    wait_until(lambda: run.changes() == [("a.md", "chunked")], "one report: a.md chunked")


def test_save_by_rename_over(run: Run) -> None:
    a = run.corpus / "a.md"
    # JetBrains: write a temp file, move the original aside, move the temp in, delete the original
    (run.corpus / "a.md___jb_tmp___").write_text(document("A", seed=1) + "\nJetBrains save.\n")
    os.rename(a, run.corpus / "a.md___jb_old___")
    os.rename(run.corpus / "a.md___jb_tmp___", a)
    os.unlink(run.corpus / "a.md___jb_old___")
    run.current("a.md", "JetBrains save")
    # vim (backupcopy=no): probe file 4913, rename to a backup, write anew, drop the backup
    (run.corpus / ".a.md.swp").write_bytes(b"\0swap")
    (run.corpus / "4913").write_text("")
    os.unlink(run.corpus / "4913")
    os.rename(a, run.corpus / "a.md~")
    a.write_text(document("A", seed=1) + "\nVim save.\n")
    os.unlink(run.corpus / "a.md~")
    run.current("a.md", "Vim save")
    # any tool: a hidden temp file replaced over the document
    tmp = run.corpus / ".a.md.tmp"
    tmp.write_text(document("A", seed=1) + "\nAtomic replace.\n")
    os.replace(tmp, a)
    run.current("a.md", "Atomic replace")
    run.settle()
    assert {p for p, _ in run.changes()} == {"a.md"}
    assert not [p for p in run.out.rglob("*") if "jb_" in p.name or "~" in p.name or "swp" in p.name]


def test_delete_then_create(run: Run) -> None:
    os.unlink(run.corpus / "a.md")
    run.write("a.md", "# A again\n\nRecreated right after the delete.\n")
    run.current("a.md", "Recreated right after")
    wait_until(lambda: len(chunk_files(run.out, "a.md")) == 1, "the shrunk document's extra chunks to go")


def test_create_then_delete(run: Run) -> None:
    run.write("new/fresh.md", document("Fresh", seed=9))
    run.current("new/fresh.md", "Intro of Fresh")
    # every sync of the save done: one that read the file half written (its first pages, the
    # intro among them) may be followed by another, whose replaced chunk files would be
    # deleted after ``before`` too
    run.settle()
    files = chunk_files(run.out, "new/fresh.md")
    assert len(files) > 1
    before = len(feed(run.out))
    os.unlink(run.corpus / "new/fresh.md")
    wait_until(lambda: not chunk_files(run.out, "new/fresh.md"), "fresh.md's chunks to go")
    expected = {str(f.relative_to(run.out)) for f in files}
    wait_until(
        lambda: {e["file"] for e in feed(run.out)[before:] if e["event"] == "ingest.delete"} == expected,
        "the change feed to show every delete",
    )


def test_rename_document(run: Run) -> None:
    old_text = text_of(run.out, "sub/b.md")
    before = len(feed(run.out))
    os.rename(run.corpus / "sub/b.md", run.corpus / "sub/b2.md")
    wait_until(lambda: not chunk_files(run.out, "sub/b.md"), "b.md's chunks to go")
    run.current("sub/b2.md", "Intro of B")
    assert text_of(run.out, "sub/b2.md") == old_text
    run.settle()
    events = [e for e in feed(run.out)[before:] if not str(e.get("source", "")).startswith(BARRIER)]
    assert {e["source"] for e in events if e["event"] == "ingest.delete"} == {"sub/b.md"}
    assert {e["source"] for e in events if e["event"] == "ingest.write"} == {"sub/b2.md"}
    renamed = [d for r in run.reports for d in r.docs if d.renamed_from]
    assert [(d.renamed_from, d.path) for d in renamed] == [("sub/b.md", "sub/b2.md")]


def test_folder_moved_out_and_in(run: Run, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    shutil.move(str(run.corpus / "sub"), str(outside))
    wait_until(
        lambda: not chunk_files(run.out, "sub/b.md") and not chunk_files(run.out, "sub/deep/c.md"),
        "the moved-out folder's chunks to go",
    )
    shutil.move(str(outside), str(run.corpus / "moved"))
    run.current("moved/b.md", "Intro of B")
    run.current("moved/deep/c.md", "Intro of C")
    run.write("moved/deep/c.md", "# C\n\nEdited after the round trip.\n")  # still watched, under its new name
    run.current("moved/deep/c.md", "after the round trip")
    # a folder made elsewhere, filled, then moved in whole
    staging = tmp_path / "staging"
    (staging / "x/y").mkdir(parents=True)
    (staging / "x/y/new.md").write_text("# New\n\nArrived with its folder.\n")
    shutil.move(str(staging / "x"), str(run.corpus / "x"))
    run.current("x/y/new.md", "Arrived with its folder")


def test_editor_temp_files_are_ignored(run: Run) -> None:
    before = (len(feed(run.out)), len(run.reports))
    for name in (".a.md.swp", ".a.md.swx", "a.md~", "4913", "#a.md#", "a.md.tmp", ".~lock.a.md#", "b.md.bak"):
        (run.corpus / name).write_text("# scratch\n\ntext\n")
    os.symlink("user@host.1234:1700000000", run.corpus / ".#a.md")  # emacs' lock: a symlink to nowhere
    (run.corpus / ".git/objects").mkdir(parents=True)
    (run.corpus / ".git/objects/x.md").write_text("# not a document\n")
    # a barrier, not a sleep: a real document saved after them is seen, so their events were too
    run.write("barrier.md", "# Barrier\n\nSaved after the temp files.\n")
    run.current("barrier.md", "after the temp files")
    run.settle()
    assert {e["source"] for e in feed(run.out)[before[0] :]} == {"barrier.md", f"{BARRIER}1.md"}
    assert run.changes() == [("barrier.md", "chunked")]


@pytest.mark.parametrize(
    ("name", "temp"),
    [
        (".a.md.swp", True),
        (".a.md.swo", True),
        (".a.md.swx", True),
        ("a.md~", True),
        ("4913", True),
        ("#a.md#", True),
        ("a.md.tmp", True),
        (".~lock.a.md#", True),
        ("a.md___jb_tmp___", True),
        ("a.md", False),
        ("..md", False),
        ("!.md", False),
        ("#a.md", False),
        ("notes.md", False),
    ],
)
def test_is_editor_temp(name: str, temp: bool, tmp_path: Path) -> None:
    assert is_editor_temp(str(tmp_path / name)) is temp


def test_regular_file_named_like_an_emacs_lock_is_a_document(run: Run) -> None:
    run.write(".#real.md", "# Real\n\nA document with an odd name.\n")
    run.current(".#real.md", "odd name")


def test_half_written_save_is_reported_then_retried(run: Run) -> None:
    files = chunk_files(run.out, "a.md")
    snapshot = {f: f.read_bytes() for f in files}
    run.write("a.md", b"# A\n\nHalf a save \xe2\x82")  # cut inside a UTF-8 sequence
    wait_until(lambda: ("a.md", "failed") in run.changes(), "the failure to be reported")
    failure = next(d for r in run.reports for d in r.docs if d.status == "failed")
    assert "byte" in (failure.error or "") and "UTF-8" in (failure.error or "")
    assert "a.md" in run.watcher.failing
    assert {f: f.read_bytes() for f in chunk_files(run.out, "a.md")} == snapshot  # previous chunks stay
    run.write("a.md", "# A\n\nHalf a save \u20ac, finished.\n")
    run.current("a.md", "finished")
    wait_until(lambda: not run.watcher.failing, "a.md to be failing no more")


def test_saves_are_debounced_and_coalesced(corpus: Path, tmp_path: Path) -> None:
    """Ten saves of one document while it is not quiet: no sync, then one for all of them.

    The quiet period is an hour, so nothing can ripen by itself while the saves go on; a
    save of another document after them is the sign that every event of the ten was taken
    (one folder's events arrive in order). Then the period ends (``debounce`` 0) and one more
    event wakes the watcher: the ten saves are synced as one."""
    r = Run(corpus, tmp_path / "chunks", debounce=3600.0)
    with r.watcher:
        for i in range(10):
            r.write("a.md", document("A", seed=1) + f"\nKeystroke {i}.\n")
        r.write("zz.md", "# Sign\n\nThe saves before this one were seen.\n")
        wait_until(lambda: "zz.md" in r.watcher.pending(), "the sign's event")
        assert "a.md" in r.watcher.pending()
        assert r.changes() == []  # debounced: a.md has not been quiet for the period
        r.watcher.debounce = 0.0
        r.write("zz.md", "# Sign\n\nSaved again: the watcher wakes.\n")
        r.current("zz.md", "Saved again")
        wait_until(lambda: ("a.md", "chunked") in r.changes(), "a.md to be synced")
        r.current("a.md", "Keystroke 9")
        wait_until(r.watcher.idle, "watch to be idle")
    assert r.changes().count(("a.md", "chunked")) == 1  # coalesced: ten saves, one chunking
    assert [d.path for d in r.reports[1].docs] == ["a.md", "zz.md"]  # in one sync


def test_polling_observer(corpus: Path, tmp_path: Path) -> None:
    r = Run(corpus, tmp_path / "chunks", polling=True)
    with r.watcher:
        r.write("z.markdown", document("Z", seed=4) + "\nSeen by polling.\n")
        r.current("z.markdown", "Seen by polling")
        os.rename(corpus / "z.markdown", corpus / "zz.md")
        r.current("zz.md", "Seen by polling")
        wait_until(lambda: not chunk_files(r.out, "z.markdown"), "z.markdown's chunks to go")


def test_output_is_locked_while_watching(run: Run) -> None:
    with pytest.raises(UsageError, match="locked"):
        ingest(Options(run.corpus, run.out, POLICY, wait=False))


def test_after_any_edits_ingest_changes_nothing(corpus: Path, tmp_path: Path) -> None:
    """The key property: what watch leaves is exactly what ingest would write."""
    out = tmp_path / "chunks"
    rng = random.Random(20240601)
    r = Run(corpus, out)
    with r.watcher:
        docs = ["a.md", "sub/b.md", "sub/deep/c.md", "z.markdown"]
        for step in range(40):
            op = rng.choice(["save", "save", "save", "replace", "rename", "delete", "create", "folder"])
            live = [d for d in docs if (corpus / d).exists()]
            target = rng.choice(live) if live else "a.md"
            if op == "save" or not live:
                r.write(target, document(f"S{step}", sections=rng.randint(1, 4), seed=step))
            elif op == "replace":
                tmp = corpus / f".{Path(target).name}.tmp"
                tmp.write_text(document(f"R{step}", sections=rng.randint(0, 3), seed=step))
                os.replace(tmp, corpus / target)
            elif op == "rename":
                dest = f"{Path(target).parent}/renamed{step}.md".removeprefix("./")
                os.rename(corpus / target, corpus / dest)
                docs.append(dest)
            elif op == "delete":
                os.unlink(corpus / target)
            elif op == "create":
                name = f"new{step}.md"
                r.write(name, document(f"N{step}", seed=step))
                docs.append(name)
            else:
                staging = tmp_path / f"staging{step}"
                (staging / "inner").mkdir(parents=True)
                (staging / "inner/doc.md").write_text(document(f"F{step}", seed=step))
                shutil.move(str(staging), str(corpus / f"folder{step}"))
                docs.append(f"folder{step}/inner/doc.md")
            time.sleep(rng.choice([0.0, 0.005, 0.03, 0.08]))
        r.settle()
    summary = ingest(Options(corpus, out, POLICY, jobs=1))
    assert summary.failures == []
    assert (summary.added, summary.changed, summary.removed) == (0, 0, 0)
    fresh = tmp_path / "fresh"
    ingest(Options(corpus, fresh, POLICY, jobs=1))
    assert all_chunks(out) == all_chunks(fresh)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_cli_watch_stops_cleanly_on_signal(corpus: Path, tmp_path: Path, sig: signal.Signals) -> None:
    out = tmp_path / "chunks"
    cmd = [sys.executable, "-m", "pipeline", "watch", str(corpus), "--out", str(out), "--json",
           "--target-tokens", "48", "--overlap-tokens", "8", "--jobs", "1"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[dict[str, object]] = queue.Queue()

    def read() -> None:
        for line in proc.stdout or ():
            lines.put(json.loads(line))

    threading.Thread(target=read, daemon=True).start()

    def next_event(kind: str) -> dict[str, object]:
        deadline = time.monotonic() + TIMEOUT  # a hang's safety net
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=0.2)
            except queue.Empty:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                continue
            if line["event"] == kind:
                return line
        raise AssertionError(f"no {kind!r} line from chunkyard watch")

    try:
        assert next_event("ready")["documents"] == 4
        (corpus / "a.md").write_text(document("A", seed=1) + "\nEdited under the CLI.\n")
        assert next_event("chunked")["path"] == "a.md"
        proc.send_signal(sig)
        assert proc.wait(timeout=TIMEOUT) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Edited under the CLI" in text_of(out, "a.md")
    summary = ingest(Options(corpus, out, POLICY, jobs=1, wait=False))  # the lock was released
    assert (summary.added, summary.changed, summary.removed) == (0, 0, 0)


def ids_of(out: Path, rel: str) -> list[str]:
    return [json.loads(p.read_bytes())["chunk_id"] for p in chunk_files(out, rel)]


def redirects_since(out: Path, before: int) -> dict[str, str]:
    return {str(e["old"]): str(e["new"]) for e in feed(out)[before:] if e["event"] == "ingest.redirect"}


def test_a_move_whose_delete_comes_first_keeps_its_redirects(run: Run) -> None:
    """A move seen as a deletion, then, a moment later, a new file with the same text (a
    tool that deletes and rewrites, or a rename into a folder inotify did not watch yet):
    one ``ingest`` over both redirects every old id; watch must too, though the deletion
    was ripe before the new file's first event."""
    text, old_ids = (run.corpus / "a.md").read_text(), ids_of(run.out, "a.md")
    before = len(feed(run.out))
    (run.corpus / "a.md").unlink()
    time.sleep(0.2)  # the user's pause between the two: past the debounce, inside the deletion's grace
    run.write("moved/a.md", text)
    run.current("moved/a.md", "Intro of A")
    run.settle()
    assert not chunk_files(run.out, "a.md")
    assert redirects_since(run.out, before) == dict(zip(old_ids, ids_of(run.out, "moved/a.md"), strict=True))


def test_a_copy_then_delete_keeps_its_redirects(run: Run) -> None:
    """The other order: the new file is synced on its own first, the old one deleted after.
    Its chunks were made by the sync before, which one ``ingest`` would have made in the same run."""
    text, old_ids = (run.corpus / "sub/b.md").read_text(), ids_of(run.out, "sub/b.md")
    before = len(feed(run.out))
    run.write("copy/b.md", text)
    run.current("copy/b.md", "Intro of B")
    (run.corpus / "sub/b.md").unlink()
    wait_until(lambda: not chunk_files(run.out, "sub/b.md"), "b.md's chunks to go")
    run.settle()
    assert redirects_since(run.out, before) == dict(zip(old_ids, ids_of(run.out, "copy/b.md"), strict=True))


def test_a_rename_into_a_folder_just_made_keeps_its_redirects(run: Run) -> None:
    """``mkdir new && mv a.md new/``: inotify may not watch ``new`` yet when the rename lands, so
    the move can reach watch as a deletion and, later, a folder with a document in it."""
    old_ids = ids_of(run.out, "z.markdown")
    before = len(feed(run.out))
    (run.corpus / "fresh").mkdir()
    os.rename(run.corpus / "z.markdown", run.corpus / "fresh/z.markdown")
    run.current("fresh/z.markdown", "Intro of Z")
    run.settle()
    assert not chunk_files(run.out, "z.markdown")
    assert redirects_since(run.out, before) == dict(
        zip(old_ids, ids_of(run.out, "fresh/z.markdown"), strict=True)
    )
