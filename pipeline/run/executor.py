"""Executors: how a batch of work items becomes results, in order, on processes of this machine or a cluster.

One protocol, ``Executor[T, R]``: ``run(items)`` yields one result per item, in the order of
the items, and ``close()`` lets go of whatever the executor holds (worker processes, a
cluster connection). The session never asks which one it has. Three implement it:

- ``LocalPool``: a plain pool of forked processes mapping a picklable function (or this
  process alone for one worker): a run without per-document limits, ``validate``'s checks;
- ``pool.GuardPool``: long-lived workers under a deadline and a memory cap per document;
- ``ray_executor.RayExecutor``: documents as tasks on a Ray cluster.

``document_executor`` picks the one a run's ``Options`` ask for. An executor of other
items (the index's embedding batches) implements the same two methods.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from pipeline.run.pool import GuardPool  # light (no chunker): loaded with the session, never mid-run

if TYPE_CHECKING:
    from pipeline.run.model import DocResult, Job, Options

T = TypeVar("T")
R = TypeVar("R")
T_contra = TypeVar("T_contra", contravariant=True)
R_co = TypeVar("R_co", covariant=True)


class Executor(Protocol[T_contra, R_co]):
    """Runs items, yields their results in the order of the items; ``close`` releases it."""

    def run(self, items: Sequence[T_contra]) -> Iterator[R_co]: ...

    def close(self) -> None: ...


class LocalPool(Generic[T, R]):
    """``fn`` mapped over items by ``workers`` forked processes (this process when one is enough).

    Forked, so the workers inherit what the parent loaded. The processes live for one
    ``run``: nothing is held between runs. ``window`` bounds how many items are handed to
    the pool at once (None: all of them), so what is in flight stays bounded for an
    iterator of any length; ``chunksize`` is how many items a worker takes at a time
    (a function of the window's size), and ``serial_below`` the fewest items worth
    forking for.
    """

    def __init__(
        self,
        fn: Callable[[T], R],
        workers: int,
        *,
        chunksize: Callable[[int], int] = lambda n: 1,
        window: int | None = None,
        serial_below: int = 2,
    ) -> None:
        self.fn = fn
        self.workers = workers
        self.chunksize = chunksize
        self.window = window
        self.serial_below = serial_below

    def run(self, items: Iterable[T], count: int | None = None) -> Iterator[R]:
        """Results of ``fn`` over ``items``, in order; ``count``: how many, when ``items`` cannot say."""
        if count is None:
            items = list(items)
            count = len(items)
        if not count:
            return
        if self.workers <= 1 or count < self.serial_below:
            yield from map(self.fn, items)
            return
        from concurrent.futures import ProcessPoolExecutor
        from multiprocessing import get_context

        ctx = get_context("fork")  # children inherit the loaded tokenizer and schema
        with ProcessPoolExecutor(max_workers=min(self.workers, count), mp_context=ctx) as pool:
            if self.window is None:
                yield from pool.map(self.fn, items, chunksize=self.chunksize(count))
                return
            source = iter(items)
            while batch := list(itertools.islice(source, self.window)):
                yield from pool.map(self.fn, batch, chunksize=self.chunksize(len(batch)))

    def close(self) -> None:
        """Nothing to release: a run's processes end with it."""


#: Jobs a worker of the local pool takes at a time.
LOCAL_CHUNKSIZE = 4


def document_executor(opts: Options) -> Executor[Job, DocResult]:
    """The executor ``opts`` asks for: the guard pool (a limit on), Ray, or the plain local pool.

    Every one runs ``worker.process_document`` on each job, so the output is the same
    whichever runs it. The guard pool loads what a document needs before it forks (or
    lets a warm worker load it); the others have it loaded here, before any fork.
    """
    if opts.guarded:
        return GuardPool(opts.jobs, opts.doc_timeout, opts.doc_memory_mb, opts.policy)
    from pipeline.run.worker import prepare, process_document

    prepare(opts.policy)  # before any worker forks: none ever imports mid-run
    if opts.executor == "ray":  # the cluster's tasks run this same guarded worker code
        from pipeline.run.ray_executor import RayExecutor

        return RayExecutor(
            opts.out, opts.corpus, opts.address, opts.doc_timeout, opts.doc_memory_mb, opts.batch
        )
    return LocalPool(process_document, opts.jobs, chunksize=lambda n: LOCAL_CHUNKSIZE)
