"""chunkyard's own state in ``CHUNKS/.chunkyard/``: manifest, change feed, lock (SPEC §5)."""

from __future__ import annotations

import fcntl
import os
import socket
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

from .emit import write_atomic
from .errors import UsageError
from .mint import SCHEMA_VERSION

STATE_DIR = ".chunkyard"
MANIFEST = "manifest.json"
FEED = "changes.jsonl"
LOCK = "lock"
MANIFEST_FORMAT = 1


def state_dir(out: Path) -> Path:
    return out / STATE_DIR


def load_manifest(out: Path) -> dict[str, Any]:
    """The manifest of the last completed run, or an empty one."""
    try:
        data = orjson.loads((state_dir(out) / MANIFEST).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {"format": MANIFEST_FORMAT, "generation": 0, "docs": {}}
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        return {"format": MANIFEST_FORMAT, "generation": 0, "docs": {}}
    return data


def save_manifest(out: Path, manifest: dict[str, Any]) -> None:
    """Written last, atomically: the manifest never describes files that are not there."""
    data = orjson.dumps(manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
    write_atomic(state_dir(out) / MANIFEST, data + b"\n")


def now_iso() -> str:
    """UTC now, ISO 8601 with milliseconds and a ``Z``."""
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


def new_run_id() -> str:
    return str(uuid.uuid4())


def append_feed(out: Path, events: Iterable[dict[str, Any]]) -> int:
    """Append change events (004 envelope) as JSON Lines; one write, then fsync."""
    lines = b"".join(orjson.dumps(e) + b"\n" for e in events)
    if not lines:
        return 0
    path = state_dir(out) / FEED
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as fh:
        fh.write(lines)
        fh.flush()
        os.fsync(fh.fileno())
    return lines.count(b"\n")


def event(kind: str, run_id: str, generation: int, **fields: Any) -> dict[str, Any]:
    """One change-feed line: the 004 envelope plus what moved."""
    return {
        "schema_version": SCHEMA_VERSION,
        "event": kind,
        "ts": now_iso(),
        "trace_id": run_id,
        "agent_id": "chunkyard",
        "mem_rev": f"r{generation}",
        "mem_hash": fields.get("hash") or "",
        **fields,
    }


@contextmanager
def output_lock(out: Path, wait: bool = True, on_wait: Any = None) -> Iterator[None]:
    """One writer per output folder. The lock dies with its holder, so it is never stale."""
    folder = state_dir(out)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fh = open(folder / LOCK, "a+")  # noqa: SIM115 - held for the whole session
    except OSError as exc:
        raise UsageError(
            f"{out}: cannot create the output folder ({exc.strerror}); choose a writable --out"
        ) from None
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another chunkyard process"
            if not wait:
                raise UsageError(f"{out} is locked by {holder}; wait for it, or drop --no-wait") from None
            if on_wait is not None:
                on_wait(holder)
            fcntl.flock(fh, fcntl.LOCK_EX)
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} on {socket.gethostname()} since {now_iso()}\n")
        fh.flush()
        yield
    finally:
        fh.close()
