"""``serve --watch``: start the writer child (``pipeline.serve.writer``) and follow its reports.

The server holds the child's standard input open; when the server dies, however it dies,
the pipe closes and the child stops. The reports (JSON lines) feed ``/v1/health`` and the
metrics: whether the writer runs, its last index run, how many, the last errors.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import orjson

#: Seconds ``stop`` waits for the writer to finish its sync before killing it.
STOP_TIMEOUT = 30.0


class WriterProcess:
    """The writer child of one ``serve --watch``."""

    def __init__(self, corpus: Path, out: Path, store: str | None = None, *, quiet: bool = False) -> None:
        self.corpus = corpus
        self.out = out
        self.store = store
        self.quiet = quiet
        self.ready = threading.Event()  #: set once the first sync is indexed (or the writer ended)
        self.syncs = 0
        self.last_sync: float | None = None
        self.index_hash: str | None = None
        #: the last index run's save → committed time (ms), as the writer measured it
        self.last_latency_ms: float | None = None
        self.errors: deque[str] = deque(maxlen=20)
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None

    def start(self) -> None:
        command = [sys.executable, "-m", "pipeline.serve.writer", str(self.corpus), str(self.out)]
        if self.store:
            command.append(self.store)
        self._proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._reader = threading.Thread(target=self._read, name="chunkyard-writer-reports", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for raw in self._proc.stdout:
            try:
                event = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            kind = event.get("event")
            if kind == "index":
                self.syncs += 1
                self.last_sync = float(event.get("ts") or time.time())
                self.index_hash = event.get("index_hash") or self.index_hash
                latency = event.get("latency_ms")
                self.last_latency_ms = float(latency) if isinstance(latency, int | float) else None
            elif kind == "ready":
                self.ready.set()
            elif kind in ("error", "warning"):
                self.errors.append(str(event.get("message", "")))
                if not self.quiet:
                    sys.stderr.write(f"chunkyard serve: writer {kind}: {event.get('message', '')}\n")
        self.ready.set()  # the writer ended: nobody waits for it any longer

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def state(self) -> dict[str, Any]:
        """For ``/v1/health`` and the metrics."""
        return {
            "alive": self.alive,
            "corpus": str(self.corpus),
            "syncs": self.syncs,
            "last_sync": self.last_sync,
            "index_hash": self.index_hash,
            "last_latency_ms": self.last_latency_ms,
            "errors": list(self.errors),
            "exit_code": None if self._proc is None else self._proc.poll(),
        }

    def stop(self) -> None:
        """Close the writer's input (it finishes its sync and stops); kill it past ``STOP_TIMEOUT``."""
        proc = self._proc
        if proc is None:
            return
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if self._reader is not None:
            self._reader.join(5)
