"""Helpers of the ``chunkyard serve`` tests: a small indexed corpus, a served process, a plain client.

The corpus is six documents of the FastAPI docs (``../shared/corpora/fastapi-en``) that
28 questions of ``bench/gold/fastapi-en.jsonl`` are about: indexing it with the real ONNX
embedder takes seconds, not minutes. It is built once per test process and copied per use.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHUNKYARD = str(Path(sys.executable).with_name("chunkyard"))
FASTAPI = ROOT.parent / "shared" / "corpora" / "fastapi-en"
GOLD = ROOT / "bench" / "gold" / "fastapi-en.jsonl"
SUBSET = (
    "docs/en/docs/tutorial/metadata.md",
    "docs/en/docs/fastapi-cli.md",
    "docs/en/docs/tutorial/cors.md",
    "docs/en/docs/advanced/middleware.md",
    "docs/en/docs/tutorial/body-nested-models.md",
    "docs/en/docs/tutorial/extra-models.md",
)
_TEMPLATE: dict[str, Path] = {}
_LOGS: dict[int, Any] = {}  #: a started server's pid -> its stderr file


def need_corpus() -> None:
    if not FASTAPI.is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{FASTAPI} is missing: the serve tests need the shared FastAPI corpus")
        pytest.skip(f"{FASTAPI} is missing")


def need_serve_stack() -> None:
    """The extra 'serve' (fastapi, uvicorn, mcp, prometheus-client): skipped without it, failed under CI."""
    try:
        import fastapi  # noqa: F401
        import mcp  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the extra 'serve' is missing ({exc.name}): make install installs it")
        pytest.skip(f"the extra 'serve' is not installed ({exc.name})", allow_module_level=True)


def gold_questions() -> list[dict[str, Any]]:
    """The gold questions whose answer lies in the subset."""
    found = []
    for line in GOLD.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row["source"] in SUBSET:
            found.append(row)
    return found


def copy_subset(dest: Path) -> Path:
    for rel in SUBSET:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(FASTAPI / rel, target)
    return dest


def indexed(root: Path, where: Path) -> tuple[Path, Path]:
    """``(corpus, chunks)`` in ``where``: a copy of the subset, ingested and indexed (built once)."""
    need_corpus()
    if "template" not in _TEMPLATE:
        from pipeline.api import ingest, update_index

        template = root / "serve-template"
        copy_subset(template / "corpus")
        assert ingest(template / "corpus", template / "chunks").exit_code == 0
        update_index(template / "chunks")
        _TEMPLATE["template"] = template
    shutil.copytree(_TEMPLATE["template"], where, symlinks=True)
    return where / "corpus", where / "chunks"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Client:
    """A plain HTTP/1.1 client (``http.client``): raw bytes in, status + JSON out."""

    def __init__(self, port: int, token: str | None = None) -> None:
        self.port = port
        self.token = token
        self.proc: subprocess.Popen[bytes] | None = None  #: the server, when this client started it

    def raw(
        self, method: str, path: bytes | str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            sent = dict(headers or {})
            if self.token and "Authorization" not in sent:
                sent["Authorization"] = f"Bearer {self.token}"
            target = path.decode("latin-1") if isinstance(path, bytes) else path
            conn.putrequest(method, target, skip_accept_encoding=True)
            for name, value in sent.items():
                conn.putheader(name, value)
            if body is not None:
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def get(self, path: str) -> tuple[int, Any]:
        status, _, data = self.raw("GET", path)
        return status, json.loads(data)

    def post(self, path: str, payload: Any) -> tuple[int, Any]:
        status, _, data = self.raw(
            "POST", path, json.dumps(payload).encode(), {"Content-Type": "application/json"}
        )
        return status, json.loads(data)


def start(args: list[str], cwd: Path, port: int) -> subprocess.Popen[bytes]:
    """``chunkyard serve ARGS --port PORT`` in a session of its own (a test may kill the whole
    group); stderr goes to a file, so that a chatty server never blocks on a full pipe."""
    log = tempfile.TemporaryFile()  # noqa: SIM115 - closed by stop(), after the server
    proc = subprocess.Popen(
        [CHUNKYARD, "serve", *args, "--port", str(port), "--quiet"],
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=log,
        start_new_session=True,
    )
    _LOGS[proc.pid] = log
    return proc


@contextmanager
def served(
    args: list[str], cwd: Path, *, ready: str = "/v1/health", timeout: float = 180
) -> Iterator[Client]:
    """``chunkyard serve ARGS --port P`` on 127.0.0.1 until the block ends (SIGTERM, then SIGKILL)."""
    port = free_port()
    token = args[args.index("--token") + 1] if "--token" in args else None
    proc = start(args, cwd, port)
    client = Client(port, token)
    client.proc = proc
    try:
        wait_until(lambda: _answers(client, ready), timeout, proc)
        yield client
    finally:
        stop(proc)


def _answers(client: Client, path: str) -> bool:
    try:
        status, _, _ = client.raw("GET", path)
    except OSError:
        return False
    return status == 200


def wait_until(check: Any, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"chunkyard serve exited with {proc.returncode}: {stderr_of(proc)[-2000:]}")
        time.sleep(0.1)
    raise AssertionError(f"not ready within {timeout} s")


def stderr_of(proc: subprocess.Popen[bytes]) -> str:
    log = _LOGS.get(proc.pid)
    if log is None:
        return ""
    log.seek(0)
    return log.read().decode(errors="replace")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (serve stops its writer, which finishes its sync), then SIGKILL of the group."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    log = _LOGS.pop(proc.pid, None)
    if log is not None:
        log.close()


def without_volatile(record: dict[str, Any]) -> dict[str, Any]:
    """A search record less what differs between two runs of the same query (time, trace id)."""
    return {k: v for k, v in record.items() if k not in ("ts", "trace_id")}
