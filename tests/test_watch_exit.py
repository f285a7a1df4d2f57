"""``chunkyard watch``'s exit codes and its end (SPEC §5-6): 1 with failing documents, 2 on a usage
error, 130 on Ctrl-C while it waits for the lock, and a corpus root deleted under it. Every JSON
line it prints conforms to ``schemas/watch-event.schema.json``. Waits are on its output lines."""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from test_cli_contract import conforms

SAFETY_NET = 300.0  #: a hang's net, not a speed claim: each wait ends when its line comes


class Watch:
    """``python -m pipeline watch CORPUS --out OUT --json``, its stdout lines read as they come."""

    def __init__(self, corpus: Path, out: Path) -> None:
        cmd = [sys.executable, "-m", "pipeline", "watch", str(corpus), "--out", str(out), "--json", "-j", "1"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self.events: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout or ():
            self.lines.put(json.loads(line))

    def next_event(self, kind: str) -> dict[str, Any]:
        deadline = time.monotonic() + SAFETY_NET
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                continue
            conforms("watch-event", line)
            self.events.append(line)
            if line["event"] == kind:
                return line
        raise AssertionError(f"no {kind!r} line from chunkyard watch; got {self.events}")

    def wait(self) -> int:
        return self.proc.wait(timeout=SAFETY_NET)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def test_failing_documents_at_the_end_exit_1(tmp_path: Path) -> None:
    corpus, out = tmp_path / "corpus", tmp_path / "out"
    corpus.mkdir()
    (corpus / "good.md").write_text("# Good\n\nFine.\n")
    (corpus / "bad.md").write_bytes(b"# Bad\n\n\xff\n")
    watch = Watch(corpus, out)
    try:
        ready = watch.next_event("ready")
        assert ready["failed"] == 1 and ready["failures"][0].startswith("bad.md:")
        watch.proc.send_signal(signal.SIGINT)
        assert watch.next_event("stopped")["failing"] == ["bad.md"]
        assert watch.wait() == 1
    finally:
        watch.close()


def test_a_clean_watch_exits_0_and_a_fixed_document_clears(tmp_path: Path) -> None:
    corpus, out = tmp_path / "corpus", tmp_path / "out"
    corpus.mkdir()
    (corpus / "bad.md").write_bytes(b"# Bad\n\n\xff\n")
    watch = Watch(corpus, out)
    try:
        assert watch.next_event("ready")["failed"] == 1
        (corpus / "bad.md").write_text("# Fixed\n\nNow UTF-8.\n")
        assert watch.next_event("chunked")["path"] == "bad.md"
        watch.proc.send_signal(signal.SIGTERM)
        assert watch.next_event("stopped")["failing"] == []
        assert watch.wait() == 0
    finally:
        watch.close()


HOLDER = """
import sys, threading
from pathlib import Path
from pipeline.run.ingest import Options, Session
with Session(Options(corpus=Path(sys.argv[1]), out=Path(sys.argv[2]))):
    print("held", flush=True)
    threading.Event().wait()
"""


def test_ctrl_c_while_waiting_for_the_lock_exits_130(tmp_path: Path) -> None:
    corpus, out = tmp_path / "corpus", tmp_path / "out"
    corpus.mkdir()
    (corpus / "a.md").write_text("# A\n\nText.\n")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(corpus), str(out)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        cmd = [sys.executable, "-m", "pipeline", "watch", str(corpus), "--out", str(out), "-j", "1"]
        env = {**os.environ, "COLUMNS": "300", "NO_COLOR": "1"}
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        try:
            assert proc.stderr is not None
            said = ""
            while f"pid {holder.pid}" not in " ".join(said.split()):  # until it says it waits, on the lock
                line = proc.stderr.readline()
                assert line, said
                said += line
            assert "waiting" in said, said
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=SAFETY_NET) == 130
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        holder.kill()
        holder.wait()
    assert not list(out.glob("doc_*.json"))  # it never synced


def test_a_deleted_corpus_root_stops_watch_with_exit_1_and_keeps_the_chunks(tmp_path: Path) -> None:
    corpus, out = tmp_path / "corpus", tmp_path / "out"
    corpus.mkdir()
    (corpus / "a.md").write_text("# A\n\nText.\n")
    watch = Watch(corpus, out)
    try:
        watch.next_event("ready")
        shutil.rmtree(corpus)
        error = watch.next_event("error")
        assert error["message"] == f"{corpus}: the corpus folder was deleted or moved; watch stopped"
        assert watch.next_event("stopped")["failing"] == []
        assert watch.wait() == 1
    finally:
        watch.close()
    assert (out / "doc_a__ch0.json").exists()  # a vanished corpus is no reason to delete the chunks


def test_a_slow_rm_rf_of_the_corpus_keeps_the_chunks_of_documents_unlinked_first(tmp_path: Path) -> None:
    """``rm -rf`` unlinks the documents, then the folder: a sync in between (the debounce is
    50 ms, a loaded machine can pause ``rm`` longer) would delete their chunks. Deletions wait
    ``DELETE_GRACE`` (0.5 s) for the root to go first; this ``rm`` pauses 0.2 s."""
    corpus, out = tmp_path / "corpus", tmp_path / "out"
    corpus.mkdir()
    (corpus / "a.md").write_text("# A\n\nText.\n")
    (corpus / "b.md").write_text("# B\n\nText.\n")
    watch = Watch(corpus, out)
    try:
        watch.next_event("ready")
        (corpus / "a.md").unlink()
        time.sleep(0.2)
        shutil.rmtree(corpus)
        watch.next_event("error")
        assert watch.wait() == 1
    finally:
        watch.close()
    assert not [e for e in watch.events if e["event"] == "removed"], "a sync ran between the unlink and the rmdir"
    assert {p.name for p in out.glob("doc_*.json")} == {"doc_a__ch0.json", "doc_b__ch0.json"}
