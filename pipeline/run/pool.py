"""The per-document guard: no document may hang a run or eat the machine (SPEC §5, bad input).

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
import math
import mmap
import os
import pickle
import select
import signal
import struct
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterator, Sequence
from multiprocessing import get_context
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from pipeline.errors import StageError

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from pipeline.run.worker import DocResult, Job

#: Seconds a document may take before it is stopped (``--doc-timeout``; 0 = no limit).
DEFAULT_DOC_TIMEOUT = 30.0
#: Address space a worker may add, in MiB (``--doc-memory``; 0 = no limit). A legitimate
#: document at the default size limit (20 MB) peaks near 1 GiB; this leaves room for that.
DEFAULT_DOC_MEMORY_MB = 2048
#: Once a worker is writing, its deadline is this many times the limit away.
WRITE_FACTOR = 10
_RETIRING = "retiring"  #: the next result is this worker's last
#: The board: the number of the job that began writing (the worker's count, from 1), then
#: when (``time.monotonic``, the same clock in every process). The worker stores the time
#: first, the parent reads the number first.
_JOB = struct.Struct("q")
_SINCE = struct.Struct("d")


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


def _serve(conn: Connection, parent: int, memory_mb: int, board: mmap.mmap) -> None:
    """Worker loop: a ``Job`` in, a ``DocResult`` out, until the pipe closes."""
    from pipeline.run.worker import DocResult, process_document

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _tune_gc()
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    if memory_mb:
        _cap_memory(memory_mb)
    number = 0

    def writing() -> None:
        _SINCE.pack_into(board, _JOB.size, time.monotonic())
        _JOB.pack_into(board, 0, number)

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
                conn.send(_RETIRING)
            conn.send(result)
        except (OSError, ValueError):
            return
        if fatal:
            return


# -- the parent side ------------------------------------------------------------------


class _Worker:
    __slots__ = (
        "answered",
        "board",
        "conn",
        "deadline",
        "fds",
        "gone",
        "proc",
        "queue",
        "readable",
        "retiring",
        "sizes",
        "writing",
    )

    def __init__(self, proc: BaseProcess, conn: Connection, board: mmap.mmap) -> None:
        self.proc = proc
        self.conn = conn
        self.board = board
        self.answered = 0  #: results received: the running job is the worker's number answered + 1
        self.fds = (conn.fileno(), proc.sentinel)
        # ``Connection.poll`` and ``multiprocessing.connection.wait`` build a selector per
        # call; a document costs several of those calls, so the parent keeps its own polls
        self.readable = select.poll()
        self.readable.register(self.fds[0], select.POLLIN)
        #: the jobs sent and not answered yet, in order: the first is the one running
        self.queue: deque[tuple[int, Job]] = deque()
        self.sizes: deque[int] = deque()  #: their pickled sizes, in the same order
        self.deadline = math.inf
        self.writing = False  #: the running job's deadline is its write deadline
        self.retiring = False
        self.gone = False  #: it has exited (its sentinel fired), or we stopped it

    def writing_since(self) -> float | None:
        """When the running job began writing its chunk files, if it has."""
        if _JOB.unpack_from(self.board)[0] != self.answered + 1:
            return None
        since: float = _SINCE.unpack_from(self.board, _JOB.size)[0]
        return since

    def kill(self) -> None:
        self.gone = True
        with contextlib.suppress(OSError, ValueError, AttributeError):
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()


class GuardPool:
    """Long-lived worker processes that chunk one document each at a time, under limits.

    Each worker holds up to ``QUEUE`` jobs: the one it runs and the next ones, already
    in its pipe, so it goes on while the parent folds results in (with one worker the
    two would otherwise take turns). The deadline is the running job's: it starts
    when the previous result comes back.

    While every worker has work waiting in its pipe, the parent naps between two
    looks at them (``NAP`` at most, and never past half of what the shortest queue
    holds at the run's pace) and folds in all the results that came meanwhile. A
    look per result cost both sides a wake-up each: with two workers over 2,251
    documents, ~0.3 s of CPU the workers could have had. A queued job's deadline
    starts when the parent sees the previous result, so a nap can only make it later.

    Args:
        workers: how many documents may be chunked at once.
        timeout: seconds a document may take (0 or less: no limit).
        memory_mb: address space a worker may add, in MiB (0: no limit).
    """

    #: Jobs a worker holds at most (running + waiting in its pipe).
    QUEUE = 12
    #: Jobs wait in a worker's pipe only while they take this many bytes at most: they
    #: must fit the pipe's buffer (64 KiB on Linux), or the parent would block on them
    #: while the worker blocks sending its result. A bigger job waits for an empty pipe.
    AHEAD_BYTES = 16 * 1024
    #: The longest nap between two looks at the workers, in seconds.
    NAP = 0.008

    def __init__(self, workers: int, timeout: float, memory_mb: int) -> None:
        self.size = max(1, workers)
        self.timeout = timeout if timeout > 0 else math.inf
        self.memory_mb = max(0, memory_mb)
        self._ctx: Any = get_context("fork")  # children inherit the loaded tokenizer
        self._idle: list[_Worker] = []
        self._held: tuple[int, bytes] | None = None  #: a big job waiting for an empty pipe

    def _spawn(self) -> _Worker:
        mine, theirs = self._ctx.Pipe(duplex=True)
        board = mmap.mmap(-1, _JOB.size + _SINCE.size)  # anonymous and shared: the child sees it
        proc = self._ctx.Process(
            target=_serve,
            args=(theirs, os.getpid(), self.memory_mb, board),
            name="chunkyard-worker",
            daemon=True,
        )
        proc.start()
        theirs.close()
        return _Worker(proc, mine, board)

    def _take(self) -> _Worker:
        while self._idle:
            worker = self._idle.pop()
            if worker.proc.is_alive():
                return worker
            worker.kill()
        return self._spawn()

    def _send(self, worker: _Worker, index: int, job: Job) -> bool:
        """Hand ``job`` to ``worker``; False (nothing sent) when it must wait its turn."""
        if self._held is not None and self._held[0] == index:  # turned away before: pickled already
            data = self._held[1]
        else:  # plain data: no fork-aware pickler needed
            data = pickle.dumps(job, pickle.HIGHEST_PROTOCOL)
        if worker.queue and sum(worker.sizes) + len(data) > self.AHEAD_BYTES:
            self._held = (index, data)
            return False
        self._held = None
        worker.conn.send_bytes(data)
        if not worker.queue:
            worker.deadline = time.monotonic() + self.timeout
            worker.writing = False
        worker.queue.append((index, job))
        worker.sizes.append(len(data))
        return True

    def run(self, jobs: Sequence[Job]) -> Iterator[DocResult]:
        """Process ``jobs``; yield their results in the order of ``jobs``."""
        pending = deque(enumerate(jobs))
        self._held = None  # indexes are this run's
        busy: list[_Worker] = []
        done: dict[int, DocResult] = {}
        next_out = 0
        answered, started = 0, time.monotonic()  # the run's pace, for the naps
        watch = select.poll()  # the busy workers' pipes and sentinels
        try:
            while next_out < len(jobs):
                while pending and len(busy) < self.size:
                    worker = self._take()
                    try:
                        self._send(worker, *pending[0])
                    except OSError:  # it died while idle: a fresh one takes the job
                        worker.kill()
                        continue
                    pending.popleft()
                    busy.append(worker)
                    for fd in worker.fds:
                        watch.register(fd, select.POLLIN)
                # near the end, shorter queues: the last jobs go to whichever worker is free first
                depth = min(self.QUEUE, 2 + len(pending) // len(busy))
                for worker in busy:  # the next jobs wait in the pipe of a worker that has one
                    while pending and len(worker.queue) < depth and not worker.retiring:
                        try:
                            if not self._send(worker, *pending[0]):
                                break  # it waits for room in the pipe
                        except OSError:  # a dead worker: its sentinel says so
                            break
                        pending.popleft()
                first = min(w.deadline for w in busy)
                wait_for = None if first == math.inf else max(0.0, first - time.monotonic())
                if pending and answered:  # all queues topped up: let results gather
                    per_doc = (time.monotonic() - started) * len(busy) / answered
                    nap = min(self.NAP, per_doc * (min(len(w.queue) for w in busy) - 1) / 2)
                    if nap > 0.0005 and (wait_for is None or nap < wait_for):
                        self._nap(nap)
                        wait_for = None if wait_for is None else wait_for - nap
                fired = watch.poll(None if wait_for is None else math.ceil(wait_for * 1000))
                ended = {fd for fd, _ in fired}  # a sentinel that fires: that worker has exited
                now = time.monotonic()
                for worker in list(busy):
                    if worker.fds[1] in ended:
                        worker.gone = True
                    for index, result in self._poll(worker, now):
                        done[index] = result
                        answered += 1
                    if not worker.queue or worker.gone or worker.retiring:
                        busy.remove(worker)
                        for fd in worker.fds:  # before its fds close and get reused
                            watch.unregister(fd)
                        pending.extendleft(reversed(worker.queue))  # unanswered: to a fresh worker
                        worker.queue.clear()
                        worker.sizes.clear()
                        if not worker.gone and not worker.retiring:
                            self._idle.append(worker)
                        else:
                            worker.kill()
                while next_out in done:
                    yield done.pop(next_out)
                    next_out += 1
        finally:
            for worker in busy:  # abandoned mid-run (an error, Ctrl-C): stop what they do
                worker.kill()

    def _nap(self, seconds: float) -> None:
        """A pause between two looks at the workers (a method of its own: tests watch it)."""
        time.sleep(seconds)

    def _poll(self, worker: _Worker, now: float) -> list[tuple[int, DocResult]]:
        """The results the worker has sent (or its running job's failure); kills it at its deadline."""
        from pipeline.run.worker import DocResult

        out: list[tuple[int, DocResult]] = []
        try:
            while worker.queue and worker.readable.poll(0):
                msg = worker.conn.recv()
                if msg == _RETIRING:
                    worker.retiring = True
                    continue
                index, _ = worker.queue.popleft()
                worker.sizes.popleft()
                worker.answered += 1
                out.append((index, msg))
                worker.deadline, worker.writing = now + self.timeout, False  # the next job runs
                if worker.retiring:
                    return out  # it is on its way out: the caller stops it
        except (EOFError, OSError):
            pass  # it died: the sentinel tells how
        if not worker.queue:
            worker.deadline = math.inf
            return out
        index, job = worker.queue[0]
        if worker.gone:
            worker.proc.join(1)
            code = worker.proc.exitcode
            unsafe = worker.writing_since() is not None  # died between two renames?
            worker.kill()
            worker.queue.popleft()
            worker.sizes.popleft()
            message = died_message(job.rel_path, code, self.memory_mb)
            out.append((index, DocResult(job.rel_path, error=message, unsafe=unsafe)))
        elif now >= worker.deadline:
            since = None if worker.writing else worker.writing_since()
            if since is not None:  # it is writing: let it finish, up to its write deadline
                worker.writing = True
                worker.deadline = since + WRITE_FACTOR * self.timeout
                if now < worker.deadline:
                    return out
            worker.kill()
            writing = worker.writing_since() is not None  # read when it can no longer move
            limit = self.timeout * (WRITE_FACTOR if worker.writing else 1)
            message = timeout_message(job.rel_path, limit, writing=writing)
            worker.queue.popleft()
            worker.sizes.popleft()
            out.append((index, DocResult(job.rel_path, error=message, unsafe=writing)))
        return out

    def close(self) -> None:
        """Stop the idle workers (politely: they are waiting for a job)."""
        idle, self._idle = self._idle, []
        for worker in idle:
            with contextlib.suppress(OSError, ValueError):
                worker.conn.send(None)
        for worker in idle:
            worker.proc.join(2)
            if worker.proc.is_alive():
                worker.kill()
            else:
                worker.conn.close()
