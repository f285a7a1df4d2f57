"""``serve --watch``: start the writer child (``pipeline.serve.writer``) and follow its reports.

The server holds the child's standard input open; when the server dies, however it dies,
the pipe closes and the child stops. The reports (JSON lines) feed ``/v1/health`` and the
metrics: whether the writer runs, its last index run, how many, the last errors.

Under ``serve --processes N`` the supervisor holds the one writer and writes its state to
a file after each report; every server process reads it there (``WriterStateFile``).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Protocol

import orjson

from pipeline.run.emit import write_atomic

#: Seconds ``stop`` waits for the writer to finish its sync before killing it.
STOP_TIMEOUT = 30.0


class WriterView(Protocol):
    """What ``/v1/health`` and the metrics read of the writer."""

    corpus: Path

    def state(self) -> dict[str, Any]: ...


class WriterProcess:
    """The writer child of one ``serve --watch``.

    ``state_file``: where its state is written (whole, temp + rename) after each report, for
    server processes other than this one (``--processes``)."""

    def __init__(
        self,
        corpus: Path,
        out: Path,
        store: str | None = None,
        *,
        quiet: bool = False,
        state_file: Path | None = None,
    ) -> None:
        self.corpus = corpus
        self.out = out
        self.store = store
        self.quiet = quiet
        self.state_file = state_file
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
        self._publish()  # before any server process that reads it starts
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
            self._publish()
        self._proc.wait()
        self._publish()  # the writer ended: say so
        self.ready.set()  # and nobody waits for it any longer

    def _publish(self) -> None:
        if self.state_file is not None:
            write_atomic(self.state_file, orjson.dumps(self.state()))

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


class WriterStateFile:
    """A server process's view of the writer that its supervisor holds (``--processes``): the
    state file, which the supervisor writes before it starts any server process."""

    def __init__(self, path: Path, corpus: Path) -> None:
        self.path = path
        self.corpus = corpus
        self._last: dict[str, Any] = orjson.loads(path.read_bytes())

    def state(self) -> dict[str, Any]:
        with contextlib.suppress(OSError, orjson.JSONDecodeError):  # gone at shutdown: the last one read
            self._last = orjson.loads(self.path.read_bytes())
        return self._last
