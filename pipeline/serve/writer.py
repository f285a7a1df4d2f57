"""``serve --watch``'s writer: watch the corpus and index each sync, in a child process.

Why a process and not a thread: chunking is Python code that holds the GIL for the length
of a document; in a thread of the server it would stall every query for that long. As a
child, the writer shares nothing with the server but the files: it commits each index
run in one transaction (``pipeline.index.sync``), and the server's readers see the last
committed index (``pipeline.serve.handle``), never a half-applied one.

The child reads its standard input and stops when it closes, or when its parent changes:
the server died, even by SIGKILL, so no writer outlives it and keeps the folder's lock. Stopping is ``Watcher.stop``:
the sync under way finishes, the lock is released; a writer killed outright leaves atomic
chunk files, a feed and an index that the next run converges from (``watch`` and
``index`` guarantee it).

It reports on its standard output, one JSON object a line: ``{"event": "ready"}`` once the
first sync is indexed, ``{"event": "index", ...}`` after each index run (``IndexReport``),
``{"event": "error", "message": ...}``, ``{"event": "stopped"}``.

Run as ``python -m pipeline.serve.writer CORPUS OUT [STORE]``.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from pipeline.errors import PipelineError
from pipeline.run.ingest import Options
from pipeline.run.watch import DEFAULT_DEBOUNCE, SyncReport, Watcher

_LOCK = threading.Lock()


def say(event: str, **fields: Any) -> None:
    """One JSON line on stdout (the server reads them)."""
    line = orjson.dumps({"event": event, "ts": time.time(), **fields}).decode() + "\n"
    with _LOCK:
        sys.stdout.write(line)
        sys.stdout.flush()


class Indexer:
    """``on_sync`` for the watcher: after each sync, apply the change feed to the index."""

    def __init__(self, out: Path, store: str | None) -> None:
        self.out = out
        self.store = store
        self._embedder: Any = None
        self.first = True

    def __call__(self, report: SyncReport) -> None:
        from pipeline.index.sync import index, index_embedder

        if report.error is not None:
            say("error", message=report.error)
        started = time.monotonic()
        try:
            if self._embedder is None:
                self._embedder = index_embedder(self.out, self.store)
            done = index(self.out, self.store, self._embedder)
        except PipelineError as exc:  # the index is as it was; the next save tries again
            say("error", message=f"index: {exc}")
            return
        docs = [d.path for d in report.docs]
        say(
            "index",
            **done.as_dict(),
            docs=docs,
            latency_ms=round(report.latency_ms + (time.monotonic() - started) * 1000, 1),
        )
        if self.first:
            self.first = False
            self._warm()
            say("ready", index_hash=done.index_hash, chunks=done.chunks)

    def _warm(self) -> None:
        """Embed once now: the model's session and tokenizers are made on the first call, and
        that call would otherwise be the first save's, late by the time they take to load."""
        try:
            self._embedder.count_tokens("warm up")
            self._embedder.embed(["warm up"])
        except Exception as exc:  # noqa: BLE001 - only a head start: the first save loads it instead
            say("warning", message=f"could not load the embedder ahead of the first save: {exc}")


def run(corpus: Path, out: Path, store: str | None, debounce: float = DEFAULT_DEBOUNCE) -> int:
    """Watch and index until standard input closes or SIGTERM; 0, or 1 when watching failed."""
    stop = threading.Event()
    parent = os.getppid()

    def input_closed() -> None:
        # os.read, not sys.stdin: a thread blocked in sys.stdin holds its lock, and a forked
        # chunking worker that closes its stdin (multiprocessing does) would wait for it forever
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        stop.set()

    threading.Thread(target=input_closed, name="chunkyard-parent", daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    # the first sync chunks with a pool, as `chunkyard watch` does; later ones in the watcher's thread
    opts = Options(corpus=corpus, out=out, jobs=os.cpu_count() or 1, wait=True)
    watcher = Watcher(
        opts, debounce=debounce, on_sync=Indexer(out, store), on_warning=lambda m: say("warning", message=m)
    )
    try:
        watcher.start()
    except PipelineError as exc:
        say("error", message=str(exc), fatal=True)
        return 1
    while not stop.wait(0.2) and watcher.fatal is None and not watcher.done.is_set():
        if os.getppid() != parent:  # the server is gone (its pipe may live on in a grandchild)
            break
    watcher.stop()
    if watcher.fatal is not None:
        say("error", message=watcher.fatal, fatal=True)
    say("stopped")
    return 1 if watcher.fatal is not None else 0


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        sys.stderr.write("usage: python -m pipeline.serve.writer CORPUS OUT [STORE]\n")
        return 2
    return run(Path(argv[0]), Path(argv[1]), argv[2] if len(argv) == 3 else None)


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    os._exit(code)
