"""chunkyard's own folder ``CHUNKS/.chunkyard/``: its names, the journal, the lock, feed events (docs/spec.md, Runs).

The state itself (documents, chunks, redirects, in-flight record, change feed) lives in
the database ``state.sqlite`` there (``db.py``, ``feed.py``). The journal stays a folder of
small files: a worker writes it, and only the parent ever writes the database.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any

import orjson
import xxhash

from pipeline.chunkfolder import STATE_DIR as STATE_DIR  # noqa: PLC0414 - re-exported for run/; the name lives in chunkfolder
from pipeline.errors import UsageError
from pipeline.run.emit import write_atomic
from pipeline.stages.mint import SCHEMA_VERSION

#: The state database (``db.py``).
STATE_FILE = "state.sqlite"
LOCK = "lock"
#: Old texts of chunks whose ids an edit makes vanish, kept until the state moves on,
#: so that redirects survive a crash that overwrote the old chunk files.
JOURNAL = "journal"
#: What the state was before the database (read once, by ``migrate.py``).
MANIFEST = "manifest.json"
FEED = "changes.jsonl"
REDIRECTS = "redirects.json"
INFLIGHT = "inflight.json"
MANIFEST_FORMAT = 1


def state_dir(out: Path) -> Path:
    return out / STATE_DIR


def journal_path(out: Path, rel_path: str) -> Path:
    key = xxhash.xxh3_64_hexdigest(rel_path.encode("utf-8"))
    return state_dir(out) / JOURNAL / f"{key}.json"


def read_journal(out: Path, rel_path: str) -> dict[str, tuple[str, str]]:
    """``{old chunk_id: (hash, originalText)}`` saved for ``rel_path`` by an earlier attempt."""
    try:
        data = orjson.loads(journal_path(out, rel_path).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    texts = data.get("texts") if isinstance(data, dict) and data.get("source") == rel_path else None
    if not isinstance(texts, dict):
        return {}
    return {
        str(cid): (str(v[0]), str(v[1])) for cid, v in texts.items() if isinstance(v, list) and len(v) == 2
    }


def write_journal(out: Path, rel_path: str, texts: dict[str, tuple[str, str]]) -> None:
    data = {"source": rel_path, "texts": {cid: list(v) for cid, v in texts.items()}}
    write_atomic(journal_path(out, rel_path), orjson.dumps(data))


def clear_journals(out: Path, rel_paths: Iterable[str] | None = None) -> None:
    """Drop the journals of ``rel_paths`` (all of them when None)."""
    folder = state_dir(out) / JOURNAL
    if rel_paths is None:
        names = os.listdir(folder) if folder.is_dir() else []
        paths = [folder / n for n in names]
    else:
        paths = [journal_path(out, rel) for rel in rel_paths]
    for path in paths:
        with suppress(OSError):
            path.unlink()


def now_iso() -> str:
    """UTC now, ISO 8601 with milliseconds and a ``Z``."""
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


def new_run_id() -> str:
    return str(uuid.uuid4())


def event(kind: str, run_id: str, generation: int, *, ts: str | None = None, **fields: Any) -> dict[str, Any]:
    """One change-feed line: the 004 envelope plus what moved (``ts``: now, unless given)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "event": kind,
        "ts": ts or now_iso(),
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
        fh = open(folder / LOCK, "a+")  # noqa: SIM115 - closed by flock_held
    except OSError as exc:
        raise UsageError(
            f"{out}: cannot create the output folder ({exc.strerror}); choose a writable --out"
        ) from None
    with flock_held(
        fh,
        lambda: f"pid {os.getpid()} on {socket.gethostname()} since {now_iso()}",
        lambda holder: f"{out} is locked by {holder}; wait for it, or drop --no-wait",
        wait=wait,
        on_wait=on_wait,
    ):
        yield


@contextmanager
def flock_held(
    fh: IO[str],
    holder_note: Callable[[], str],
    busy: Callable[[str], str],
    *,
    wait: bool = True,
    on_wait: Callable[[str], None] | None = None,
) -> Iterator[None]:
    """An exclusive ``flock`` on the open lock file ``fh`` for the block (closed after it),
    with ``holder_note()`` written in it once held.

    The lock dies with its holder, so it is never stale. When another process holds it:
    ``wait`` off raises ``UsageError(busy(its note))``; otherwise ``on_wait(its note)`` is
    called and the lock is waited for. Used for the output folder and the search index.
    """
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another chunkyard process"
            if not wait:
                raise UsageError(busy(holder)) from None
            if on_wait is not None:
                on_wait(holder)
            fcntl.flock(fh, fcntl.LOCK_EX)
        fh.seek(0)
        fh.truncate()
        fh.write(holder_note() + "\n")
        fh.flush()
        yield
    finally:
        fh.close()
