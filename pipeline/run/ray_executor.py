"""The Ray executor: documents chunked by tasks on a Ray cluster, recorded by the parent (docs/spec.md, State and scale).

``chunkyard ingest --executor ray`` sends the documents that need work to Ray tasks,
a batch of documents per task. A task runs each document through the same guarded
worker code as the local pool (``GuardPool`` → ``worker.process_document``: read,
chunk, schema check, atomic write of its chunk files, under the per-document time
and memory limits) and returns the small ``DocResult`` of each. The parent stays
the only writer of the state, the change feed and the lock, and takes the
results in the order of the jobs, so the output is the local pool's, byte for byte.

Faults:

- A node that dies takes its tasks with it; Ray runs them again elsewhere
  (``MAX_RETRIES``, system failures only). The parent takes one result per task,
  so a retried document is counted once, and its files are the same (they are a
  function of the document; atomic writes make a half-done attempt invisible).
- A document that fails (bad input, too slow, too big) is a ``DocResult`` with an
  error, not an exception: Ray never retries it. A task that fails for good
  (retries spent) reports each of its documents as failed, and the run goes on.
- Ctrl-C (or any error in the parent) cancels the tasks in flight; the state the
  run left (its in-flight record) lets the next run converge, as with the local pool.

Ray is imported only here, and only when this executor is asked for (the ``ray``
extra). Corpus and output must be on a file system every node mounts at the same
path: ``probe.check_shared`` checks it before the first document goes out.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import math
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import StageError, UsageError
from pipeline.run.guard import bug_message

if TYPE_CHECKING:
    from pipeline.run.model import DocResult, Job
    from pipeline.run.pool import GuardPool

#: Times Ray runs a task again after a system failure (its node or worker process died).
MAX_RETRIES = 3
#: Documents per task at most, when the batch size is left to chunkyard (``batch=0``).
MAX_BATCH = 64
#: Tasks in flight per CPU of the cluster: enough that no CPU waits for the parent.
IN_FLIGHT_PER_CPU = 2
#: Seconds a cancelled task has to stop by itself before its worker process is killed.
CANCEL_GRACE = 5.0

RAY_MISSING = (
    "--executor ray: Ray is not installed in this Python ({python}) "
    "(hint: pip install 'chunkyard[ray]', on every node of the cluster, or use --executor local)"
)


def require_ray() -> None:
    """Raise the ``UsageError`` of ``import_ray`` now when Ray is missing, without importing it."""
    if importlib.util.find_spec("ray") is None:
        raise UsageError(RAY_MISSING.format(python=sys.executable))


def import_ray() -> Any:
    """The ``ray`` module, or a ``UsageError`` that says how to install it."""
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise UsageError(RAY_MISSING.format(python=sys.executable)) from None


# -- the task side: runs in a Ray worker process ------------------------------------------

#: The guard pool of this Ray worker process, by (timeout, memory): forked once, kept for
#: the tasks that follow (a Ray worker runs many tasks of one job).
_POOLS: dict[tuple[float, int], GuardPool] = {}


def run_batch(jobs: Sequence[Job], timeout: float, memory_mb: int) -> list[DocResult]:
    """Process a batch of documents in this Ray worker; one ``DocResult`` per job, in order.

    The local executor's code, unchanged: with a limit set, each document runs in the
    guard pool's forked worker (deadline, memory cap, a fresh worker after a fault);
    with both limits off, in this process. No document's failure escapes as an
    exception: Ray would take it for a system failure and retry it.
    """
    from pipeline.run.model import DocResult
    from pipeline.run.worker import prepare, process_document

    if not jobs:
        return []
    prepare(jobs[0].policy)  # before the guard pool forks: its worker never imports mid-run
    if timeout <= 0 and memory_mb <= 0:
        results = []
        for job in jobs:
            try:
                results.append(process_document(job))
            except Exception as exc:  # noqa: BLE001 - a bug in one document must not fail the task
                results.append(DocResult(job.rel_path, error=bug_message(job.rel_path, exc)))
        return results
    pool = _POOLS.get((timeout, memory_mb))
    if pool is None:
        from pipeline.run.pool import GuardPool

        pool = _POOLS[(timeout, memory_mb)] = GuardPool(1, timeout, memory_mb)
    return list(pool.run(jobs))


# -- the parent side -------------------------------------------------------------------------


def batch_size(jobs: int, cpus: int, batch: int = 0) -> int:
    """Documents per task: ``batch`` if set, else about eight tasks per CPU, ``MAX_BATCH`` at most.

    Small enough that every CPU gets work and a retry after a node loss redoes
    little; large enough that a task's fixed overhead is spread over many documents.
    """
    if batch > 0:
        return batch
    return max(1, min(MAX_BATCH, math.ceil(jobs / max(1, cpus * 8))))


def failed_task_message(rel_path: str, exc: BaseException) -> str:
    """A document whose task failed for good: its retries spent, or cancelled."""
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    return str(
        StageError(
            "ray",
            rel_path,
            f"its Ray task failed ({type(exc).__name__}: {first})".replace(": )", ")"),
            "see `ray status` and the Ray logs of its node; the next run retries this document",
        )
    )


#: Seconds to wait for the cluster's port before saying it cannot be reached.
CONNECT_TIMEOUT = 10.0


def _check_reachable(address: str | None) -> None:
    """A ``HOST:PORT`` that nothing answers on is a ``UsageError`` now: ``ray.init`` would retry for minutes."""
    host, _, port = (address or "").removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # "auto", "local", or Ray's default: Ray finds the cluster itself
    import socket

    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT).close()
    except OSError as exc:
        raise UsageError(
            f"--executor ray: nothing answers at {address} ({exc.strerror or exc}) "
            "(hint: start the cluster with `ray start --head` and pass the address it prints to --address)"
        ) from None


def _cluster_news_to_stderr() -> None:
    """Ray's driver prints the cluster's error news ("Raylet is terminated ...") on stdout: to stderr.

    Those lines come from a thread of Ray's (``listen_error_messages``) through
    ``ray._private.worker.print_to_stdstream``, which picks stdout for them; on stdout they
    would break ``--json``. Each message is cut to its first line (the rest is in the
    node's Ray logs). Where Ray has no such function any more, nothing changes.
    """
    worker = sys.modules.get("ray._private.worker")
    show = getattr(worker, "print_to_stdstream", None)
    if show is None or getattr(show, "chunkyard_stderr", False):
        return

    def to_stderr(data: dict[str, Any], ignore_prefix: bool) -> None:
        # the first line of each: a dead node's message carries its raylet's last hundred log lines
        lines = [str(line).strip().splitlines()[0] for line in data.get("lines", ()) if str(line).strip()]
        show({**data, "lines": lines, "is_err": True}, ignore_prefix)

    to_stderr.chunkyard_stderr = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = to_stderr  # type: ignore[union-attr]


class RayExecutor:
    """Runs jobs as Ray tasks on the cluster at ``address``: an ``Executor[Job, DocResult]`` as ``GuardPool`` is.

    Connects on the first ``run`` (a run with nothing to do never starts Ray), checks
    there that every node sees the corpus and the output, and disconnects on ``close``.

    Args:
        out: the output folder (each node must see it at this path).
        corpus: the corpus folder (likewise).
        address: the cluster, as ``ray.init`` takes it (None: ``RAY_ADDRESS``, a cluster
            started on this machine, else a local Ray of this machine's CPUs).
        timeout: seconds a document may take (0: no limit), as ``--doc-timeout``.
        memory_mb: MiB a document may add (0: no limit), as ``--doc-memory``.
        batch: documents per task (0: chosen from the cluster's CPUs).
    """

    def __init__(
        self, out: Path, corpus: Path, address: str | None, timeout: float, memory_mb: int, batch: int = 0
    ) -> None:
        self.out = Path(os.path.abspath(out))
        self.corpus = Path(os.path.abspath(corpus))
        self.address = address
        self.timeout = max(0.0, timeout)
        self.memory_mb = max(0, memory_mb)
        self.batch = batch
        self._ray: Any = None
        self._task: Any = None
        self._started_ray = False  #: this executor called ``ray.init``: it shuts Ray down

    def _connect(self, sample: str) -> None:
        ray = import_ray()
        _cluster_news_to_stderr()
        if not ray.is_initialized():
            _check_reachable(self.address)
            try:
                ray.init(
                    address=self.address,
                    logging_level=logging.WARNING,
                    log_to_driver=False,
                    include_dashboard=False,
                )
            except (ConnectionError, RuntimeError) as exc:  # unreachable, or another Ray version
                first = (str(exc).strip().splitlines() or [""])[0][:300]
                raise UsageError(
                    f"--executor ray: cannot join the Ray cluster at {self.address or 'auto'}: {first} "
                    "(hint: start one with `ray start --head`, then pass its address to --address)"
                ) from None
            self._started_ray = True
        self._ray = ray
        self._task = ray.remote(num_cpus=1, max_retries=MAX_RETRIES, retry_exceptions=False)(run_batch)
        from pipeline.run.probe import check_shared

        try:
            check_shared(ray, self.out, self.corpus, sample)
        except BaseException:
            self.close()  # not connected until the nodes passed: a later run probes again
            raise

    def run(self, jobs: Sequence[Job]) -> Iterator[DocResult]:
        """Process ``jobs`` on the cluster; yield their results in the order of ``jobs``."""
        if not jobs:
            return
        jobs = [replace(j, path=os.path.abspath(j.path), out=str(self.out)) for j in jobs]
        if self._ray is None:
            self._connect(jobs[0].path)
        ray = self._ray
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        size = batch_size(len(jobs), cpus, self.batch)
        batches = [jobs[i : i + size] for i in range(0, len(jobs), size)]
        window = max(2, IN_FLIGHT_PER_CPU * cpus)
        flying: dict[Any, int] = {}  # task → its batch's number
        done: dict[int, list[DocResult]] = {}
        next_batch = next_out = 0
        try:
            while next_out < len(batches):
                while next_batch < len(batches) and len(flying) < window:
                    ref = self._task.remote(batches[next_batch], self.timeout, self.memory_mb)
                    flying[ref] = next_batch
                    next_batch += 1
                ready, _ = ray.wait(list(flying), num_returns=1)
                for ref in ready:
                    number = flying.pop(ref)
                    done[number] = self._collect(ref, batches[number])
                while next_out in done:
                    yield from done.pop(next_out)
                    next_out += 1
        finally:
            if flying:  # abandoned mid-run (Ctrl-C, an error): stop the cluster's work
                self._cancel(list(flying))

    def _collect(self, ref: Any, batch: list[Job]) -> list[DocResult]:
        """A finished task's results; a task that failed for good fails each of its documents."""
        from pipeline.run.model import DocResult

        try:
            results: list[DocResult] = self._ray.get(ref)
        except self._ray.exceptions.RayError as exc:  # its node died too often, or it was cancelled
            # it may have died between two renames: the next run re-checks these documents
            return [
                DocResult(j.rel_path, error=failed_task_message(j.rel_path, exc), unsafe=True) for j in batch
            ]
        if [r.rel_path for r in results] != [j.rel_path for j in batch]:  # never seen: say so
            raise RuntimeError("a Ray task returned results for other documents than it was given")
        return results

    def _cancel(self, refs: list[Any]) -> None:
        """Cancel the tasks: a running one stops its guard worker itself, or is killed after a grace."""
        ray = self._ray
        for ref in refs:  # finished meanwhile, or the cluster is gone: nothing to stop
            with contextlib.suppress(Exception):
                ray.cancel(ref)
        try:
            _, left = ray.wait(refs, num_returns=len(refs), timeout=CANCEL_GRACE)
        except Exception:  # noqa: BLE001
            left = refs
        for ref in left:
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)

    def close(self) -> None:
        """Disconnect from the cluster (if this executor connected)."""
        if self._started_ray and self._ray is not None:
            self._ray.shutdown()
        self._ray = self._task = None
        self._started_ray = False
