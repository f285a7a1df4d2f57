"""The guard pool, parent side: long-lived workers, deadlines, and results in order.

The worker side (the serve loop, the memory cap, the messages) and the reasons for this
design are in ``guard.py``.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import pickle
import select
import time
from collections import deque
from collections.abc import Iterator, Sequence
from multiprocessing import get_context
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from pipeline.run.guard import (
    JOB,
    READY,
    RETIRING,
    SINCE,
    WRITE_FACTOR,
    died_message,
    serve,
    timeout_message,
)

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from pipeline.models import Policy
    from pipeline.run.model import DocResult, Job


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
        "warming",
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
        self.warming = False  #: forked before the parent loaded anything: it says READY once it has

    def writing_since(self) -> float | None:
        """When the running job began writing its chunk files, if it has."""
        if JOB.unpack_from(self.board)[0] != self.answered + 1:
            return None
        since: float = SINCE.unpack_from(self.board, JOB.size)[0]
        return since

    def kill(self) -> None:
        self.gone = True
        with contextlib.suppress(OSError, ValueError, AttributeError):
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()


class GuardPool:
    """Long-lived worker processes that chunk one document each at a time, under limits.

    An ``Executor[Job, DocResult]`` (``executor.py``): ``run`` yields results in the order of the jobs.

    Each worker holds up to ``QUEUE`` jobs: the one it runs and the next ones, already
    in its pipe, so it goes on while the parent records results (with one worker the
    two would otherwise take turns). The deadline is the running job's: it starts
    when the previous result comes back.

    While every worker has work waiting in its pipe, the parent naps between two
    looks at them (``NAP`` at most, and never past half of what the shortest queue
    holds at the run's pace) and takes all the results that came meanwhile together: a
    look per result would cost both sides a wake-up each, CPU the workers could have had.
    A queued job's deadline starts when the parent sees the previous result, so a nap can
    only make it later.

    Workers are forked once the parent has loaded all a document needs (``worker.prepare``,
    done here before the first fork when ``policy`` is given), so they inherit it. One
    worker may be forked earlier instead (``warm``): it loads all that itself while the
    parent goes on (a run that finds one changed document early in its walk), and the
    parent itself then loads nothing unless it must fork another.

    Args:
        workers: how many documents may be chunked at once.
        timeout: seconds a document may take (0 or less: no limit).
        memory_mb: address space a worker may add, in MiB (0: no limit).
        policy: what to load before forking; None when the caller has loaded it.
    """

    #: Jobs a worker holds at most (running + waiting in its pipe).
    QUEUE = 12
    #: Jobs wait in a worker's pipe only while they take this many bytes at most: they
    #: must fit the pipe's buffer (64 KiB on Linux), or the parent would block on them
    #: while the worker blocks sending its result. A bigger job waits for an empty pipe.
    AHEAD_BYTES = 16 * 1024
    #: The longest nap between two looks at the workers, in seconds.
    NAP = 0.008
    #: Seconds a warm worker may take to load (then it is replaced by an ordinary one).
    WARM_LIMIT = 120.0

    def __init__(self, workers: int, timeout: float, memory_mb: int, policy: Policy | None = None) -> None:
        self.size = max(1, workers)
        self.policy = policy
        self._loaded = policy is None  #: the parent holds what a document needs
        self.timeout = timeout if timeout > 0 else math.inf
        self.memory_mb = max(0, memory_mb)
        self._ctx: Any = get_context("fork")  # children inherit the loaded tokenizer
        self._idle: list[_Worker] = []
        self._held: tuple[int, bytes] | None = None  #: a big job waiting for an empty pipe

    def warm(self) -> None:
        """Fork one worker now that loads what a document needs itself (no-op if one is idle)."""
        if not self._idle and not self._loaded and self.policy is not None:
            self._idle.append(self._spawn(warm=True))

    def _spawn(self, *, warm: bool = False) -> _Worker:
        if not warm and not self._loaded and self.policy is not None:
            from pipeline.run.worker import prepare

            prepare(self.policy)  # before the fork: the worker inherits it, never imports mid-run
            self._loaded = True
        mine, theirs = self._ctx.Pipe(duplex=True)
        board = mmap.mmap(-1, JOB.size + SINCE.size)  # anonymous and shared: the child sees it
        proc = self._ctx.Process(
            target=serve,
            args=(theirs, os.getpid(), self.memory_mb, board, self.policy if warm else None),
            name="chunkyard-worker",
            daemon=True,
        )
        proc.start()
        theirs.close()
        worker = _Worker(proc, mine, board)
        worker.warming = warm
        return worker

    def _take(self) -> _Worker:
        while self._idle:
            worker = self._idle.pop()
            if worker.warming and not self._ready(worker):
                worker.kill()
                continue
            if worker.proc.is_alive():
                return worker
            worker.kill()
        return self._spawn()

    def _ready(self, worker: _Worker) -> bool:
        """Wait for a warm worker to have loaded (its documents' deadlines start after)."""
        worker.warming = False
        try:
            return bool(worker.conn.poll(self.WARM_LIMIT)) and worker.conn.recv() == READY
        except (EOFError, OSError):
            return False

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
        from pipeline.run.model import DocResult

        out: list[tuple[int, DocResult]] = []
        try:
            while worker.queue and worker.readable.poll(0):
                msg = worker.conn.recv()
                if msg == RETIRING:
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
