"""chunkyard's own state in ``CHUNKS/.chunkyard/``: manifest, change feed, lock (SPEC §5)."""

from __future__ import annotations

import fcntl
import os
import socket
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import orjson
import xxhash

from pipeline.errors import UsageError
from pipeline.run.checkpoint import reached
from pipeline.run.emit import write_atomic
from pipeline.stages.mint import SCHEMA_VERSION

STATE_DIR = ".chunkyard"
MANIFEST = "manifest.json"
FEED = "changes.jsonl"
REDIRECTS = "redirects.json"
LOCK = "lock"
#: Written before a sync touches any chunk file, removed after its manifest: while it is
#: there, the manifest may not describe the disk for the documents it lists.
INFLIGHT = "inflight.json"
#: Old texts of chunks whose ids an edit makes vanish, kept until the manifest moves on,
#: so that redirects survive a crash that overwrote the old chunk files.
JOURNAL = "journal"
MANIFEST_FORMAT = 1
REDIRECTS_FORMAT = 1


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
    # compact: it is rewritten on every sync that changes something
    write_atomic(state_dir(out) / MANIFEST, orjson.dumps(manifest, option=orjson.OPT_APPEND_NEWLINE))


def load_redirects(out: Path) -> dict[str, str]:
    """``redirects.json`` as ``{old chunk_id: new chunk_id}``; empty when absent or unreadable."""
    try:
        data = orjson.loads((state_dir(out) / REDIRECTS).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    table = data.get("redirects") if isinstance(data, dict) else None
    if not isinstance(table, dict):
        return {}
    return {str(k): v for k, v in table.items() if isinstance(v, str)}


def save_redirects(out: Path, redirects: dict[str, str]) -> None:
    """``{"format": 1, "redirects": {old: new}}``, atomically (read by ``chunkyard resolve``)."""
    data = {"format": REDIRECTS_FORMAT, "redirects": dict(sorted(redirects.items()))}
    write_atomic(state_dir(out) / REDIRECTS, orjson.dumps(data, option=orjson.OPT_INDENT_2) + b"\n")


def load_inflight(out: Path) -> tuple[set[str], bool] | None:
    """What a run left to recover: the documents it was touching, and whether to sweep.

    None when the last run finished cleanly.
    """
    try:
        data = orjson.loads((state_dir(out) / INFLIGHT).read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, orjson.JSONDecodeError):
        return set(), True  # present but unreadable: still a sign of a run that died
    if not isinstance(data, dict):
        return set(), True
    docs = data.get("docs")
    return ({str(d) for d in docs} if isinstance(docs, list) else set()), bool(data.get("sweep", True))


def save_inflight(out: Path, run_id: str, docs: Iterable[str], *, sweep: bool = True) -> None:
    """Written before a sync touches anything (``sweep``: a run that dies there may leave orphans)."""
    data = {"run_id": run_id, "docs": sorted(docs), "sweep": sweep}
    write_atomic(state_dir(out) / INFLIGHT, orjson.dumps(data))


def clear_inflight(out: Path) -> None:
    (state_dir(out) / INFLIGHT).unlink(missing_ok=True)


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


class Feed:
    """The change feed of one sync, appended to as documents finish, made durable at the end.

    Each block (one document's lines, or the deletes, or the redirects) is written
    as soon as it is sealed: its chunk files are already in place, so a loader that
    tails the feed may take them at once, and the run holds none of its feed in
    memory. A run that dies before its manifest is written says it all again (SPEC
    §5: the next run announces what the manifest has not seen). ``finish`` makes the
    lines durable (one ``fsync``) before the manifest may name them.

    A write that fails (a full disk) is taken back whole, so a tailing loader never
    sees half a line; the sync goes on without a feed, and ``finish`` raises the error.
    """

    __slots__ = ("_fd", "_size", "error", "lines", "out")

    def __init__(self, out: Path) -> None:
        self.out = out
        self._fd: int | None = None
        self._size = 0  #: the feed's length after our last whole write
        self.error: OSError | None = None
        self.lines = 0  #: lines written by this sync

    def append(self, block: bytes) -> None:
        """One or more serialized events (``orjson.dumps(event(...))``), joined by newlines."""
        if self.error is not None:
            return
        data = block + b"\n"  # the last line ends with a newline too
        try:
            if self._fd is None:
                path = state_dir(self.out) / FEED
                path.parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
                self._size = os.fstat(self._fd).st_size
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(self._fd, view) :]
            except OSError:  # never leave half a line for a tailing loader
                os.ftruncate(self._fd, self._size)
                raise
        except OSError as exc:
            self.error = exc
            return
        self._size += len(data)
        self.lines += data.count(b"\n")
        reached("feed-append")

    @property
    def used(self) -> bool:
        """Whether this sync had something to say (written, or lost to a write error)."""
        return bool(self.lines) or self.error is not None

    def finish(self) -> None:
        """Make what was written durable. Raises the first write error."""
        try:
            if self.error is not None:
                raise self.error
            if self._fd is not None:
                os.fsync(self._fd)
        finally:
            self.close()

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


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
