"""The per-document guard, worker side: limits, the serve loop, what a stopped document says (docs/spec.md, Runs).

The parent side, which hands out jobs and enforces the deadlines, is ``pool.GuardPool``.

Each document is chunked in a long-lived worker process. The parent gives every
busy worker a deadline and kills it (SIGKILL) when the deadline passes; the
document is reported ("took longer than N s") and a fresh worker takes the next
one. Why so:

- ``concurrent.futures`` cannot cancel a task that is running;
- ``signal.alarm`` works only in the main thread, and ``watch`` syncs from its own;
- a watchdog thread inside the worker cannot interrupt C code that holds the GIL
  (a regular expression, ``str.join`` on a huge list).

So the parent only waits on pipes and process sentinels with a timeout: no signal
handler of its own, and it works from any thread. Workers are forked once (after
the tokenizer is loaded) and live as long as the ``Session``: the common path
pays one message each way per document, not a process start; a worker holds
several documents in its pipe, and the parent, while every worker has work
waiting, naps between two looks and takes the results that came meanwhile
together (see ``GuardPool``).

Memory: every worker caps its own address space (``RLIMIT_AS``) at what it had
when it started plus ``memory_mb``. A document that needs more gets a
``MemoryError`` (reported, then the worker is replaced, since its heap may be
fragmented; a ``SystemError``, which CPython raises when some C paths fail to
allocate, counts as the same) or, when the allocation fails in native code (the
tokenizer is Rust, which aborts), the worker dies and the document is reported as
out of memory.
The size limit (``--max-bytes``) refuses big files before any of this; the cap is
for the small file that explodes (deep nesting makes the parser copy lines once
per level). A worker also exits when its parent goes away, so it never outlives
the run and never keeps the output lock (an ``flock`` shared across ``fork``).

The deadline covers reading, parsing, splitting and the schema check. Once a
worker has begun writing, the deadline is pushed out to ``WRITE_FACTOR`` x the
limit after that moment: killing it between two renames would leave a document
half old, half new. The worker says so on a 16-byte board it shares with the
parent (which job, since when), not with a message: the parent reads it only at a
deadline, and a document costs one message each way.
"""

from __future__ import annotations

import contextlib
import gc
import mmap
import os
import signal
import struct
import threading
import time
import traceback
from typing import TYPE_CHECKING

from pipeline.errors import StageError

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from pipeline.models import Policy

#: Once a worker is writing, its deadline is this many times the limit away.
WRITE_FACTOR = 10
RETIRING = "retiring"  #: the next result is this worker's last
READY = "ready"  #: a warm worker has loaded what a document needs (``serve``'s ``policy``)
#: The board: the number of the job that began writing (the worker's count, from 1), then
#: when (``time.monotonic``, the same clock in every process). The worker stores the time
#: first, the parent reads the number first.
JOB = struct.Struct("q")
SINCE = struct.Struct("d")


def _reason(rel_path: str, problem: str, hint: str) -> str:
    return str(StageError("guard", rel_path, problem, hint))


def timeout_message(rel_path: str, seconds: float, *, writing: bool = False) -> str:
    if writing:
        return _reason(
            rel_path,
            f"took longer than {seconds:g} s writing its chunk files; stopped",
            "check the output folder's disk; the next run re-checks this document",
        )
    return _reason(
        rel_path,
        f"took longer than {seconds:g} s; stopped",
        "split or simplify the document (deep nesting, huge tables and very long lines are "
        "the usual causes), or raise --doc-timeout",
    )


def memory_message(rel_path: str, memory_mb: int, how: str = "stopped") -> str:
    return _reason(
        rel_path,
        f"needs more than {memory_mb:,} MiB of memory; {how}",
        "split or simplify the document (deep nesting is the usual cause), or raise --doc-memory",
    )


def died_message(rel_path: str, exitcode: int | None, memory_mb: int) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            how = signal.Signals(-exitcode).name
        except ValueError:
            how = f"signal {-exitcode}"
    else:
        how = f"exit code {exitcode}"
    if how in ("SIGKILL", "SIGABRT") and memory_mb:
        return memory_message(rel_path, memory_mb, f"the worker died ({how})")
    return _reason(
        rel_path,
        f"the worker process died ({how}) while chunking it",
        "run it alone with --jobs 1 to see more; if it persists, report it with the file",
    )


def bug_message(rel_path: str, exc: BaseException) -> str:
    """An exception no stage raises on purpose: a chunkyard bug, reported, not fatal to the run."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""
    first = str(exc).splitlines()[0][:200] if str(exc) else ""
    return _reason(
        rel_path,
        f"internal error {type(exc).__name__}{where}: {first}".rstrip(": "),
        "this is a chunkyard bug; please report it with the file",
    )


# -- the worker side ------------------------------------------------------------------


def _address_space() -> int:
    """Bytes of address space this process has mapped now (Linux), else 0."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _cap_memory(memory_mb: int) -> None:
    """``RLIMIT_AS`` = what the worker has now + ``memory_mb``; best effort where unsupported."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return
    base = _address_space()
    if not base:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    want = base + memory_mb * 1024 * 1024
    if hard != resource.RLIM_INFINITY:
        want = min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        return  # someone set a tighter limit already: keep it
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (want, hard))


def _out_of_memory(exc: BaseException) -> bool:
    """Whether an exception other than ``MemoryError`` is how a capped worker ran out.

    CPython does not always turn a failed allocation into ``MemoryError``: some C
    paths return an error without setting one, which surfaces as ``SystemError``
    ("error return without exception set"), and a ``MemoryError`` raised while
    another exception was handled hides behind it as its context. Under the
    address-space cap either means the document wanted more than it may have.
    """
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        if isinstance(link, (MemoryError, SystemError)):
            return True
        seen.add(id(link))
        link = link.__cause__ or link.__context__
    return False


def _exit_with_parent(parent: int) -> None:
    """A worker whose parent died exits (its copy of the output lock goes with it)."""
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(3)


#: Allocations (less deallocations) between two young-generation collections in a worker;
#: CPython's default is 700. A document's parse tree is cyclic (mistletoe links each token
#: to its parent), so the collector must still run: rarer, not never.
_GC_YOUNG = 5000


def _tune_gc() -> None:
    """Fewer collections in a worker, none of them over what it inherited.

    ``gc.freeze`` moves every object the worker was forked with (modules, the
    tokenizer's wrapper, mistletoe's tables) into a generation the collector never
    walks: a full collection no longer visits them, nor writes to their pages (which
    would copy them out of the memory shared with the parent).
    """
    gc.freeze()
    gc.set_threshold(_GC_YOUNG, 10, 10)


def serve(
    conn: Connection, parent: int, memory_mb: int, board: mmap.mmap, policy: Policy | None = None
) -> None:
    """Worker loop: a ``Job`` in, a ``DocResult`` out, until the pipe closes.

    With ``policy`` (a worker forked before the parent loaded anything, ``GuardPool.warm``)
    it first loads all a document needs itself (``worker.prepare``) and says ``READY``:
    the same loading the parent would have done before forking, done at the worker's
    start, never in the middle of a document. If that fails (a missing extra) it says so
    and exits quietly: the parent then loads it itself, and reports the error as a run would.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    if policy is not None:
        try:
            from pipeline.run.worker import prepare

            prepare(policy)
        except Exception:  # noqa: BLE001 - a setup error: the parent loads it again and reports it
            with contextlib.suppress(OSError, ValueError):
                conn.send("failed")
            return
        conn.send(READY)
    from pipeline.run.worker import DocResult, process_document  # loaded already (forked or prepared)

    _tune_gc()
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    if memory_mb:
        _cap_memory(memory_mb)
    number = 0

    def writing() -> None:
        SINCE.pack_into(board, JOB.size, time.monotonic())
        JOB.pack_into(board, 0, number)

    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        number += 1
        fatal = False
        try:
            result = process_document(job, before_write=writing)
        except MemoryError:
            result = DocResult(job.rel_path, error=memory_message(job.rel_path, memory_mb))
            fatal = True  # the heap may be in pieces: let a fresh worker take over
        except Exception as exc:  # noqa: BLE001 - a bug in one document must not stop the run
            fatal = memory_mb > 0 and _out_of_memory(exc)
            result = DocResult(
                job.rel_path,
                error=memory_message(job.rel_path, memory_mb) if fatal else bug_message(job.rel_path, exc),
            )
        try:
            if fatal:
                conn.send(RETIRING)
            conn.send(result)
        except (OSError, ValueError):
            return
        if fatal:
            return
