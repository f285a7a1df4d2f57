"""``chunkyard index --executor ray``: the texts embedded by a pool of Ray actors, written here.

The parent plans the run and keeps every write (the vector cache batch by batch, then the
one commit of rows, cursor and ``index_hash``), as the Ray reference designs for RAG
ingestion do: only texts travel to the cluster, only vectors come back. Nodes need the
same chunkyard, Ray and Python, and the embedder's extra; they need no shared file system.

It is an ``EmbedExecutor`` (``pipeline.index.embed_step``). Each actor makes the embedder
once (``make_embedder(spec)`` on its node, ``spec`` being the embedder's ``spec`` attribute,
the device resolved there) and then embeds batch after batch; each has ``PER_ACTOR`` batches queued so it never
waits for the parent. Batches come back in any order and are yielded at once.

Faults:

- An actor lost with its node or process (``RayActorError``, a worker crash, a lost
  object: system failures only) has its batches sent again to the others, each batch at
  most ``MAX_ATTEMPTS`` times, and a replacement actor is asked for (it joins when the
  cluster has room). Each batch is yielded once: the first answer wins.
- A batch the embedder refuses (an exception inside ``embed``) comes back as such, is
  never retried, and stops the run with ``BatchRejectedError``; the index stays as it was.
- An actor that cannot even start (the model missing on a node, ``--device cuda`` on a node
  without a GPU) stops the run with the reason (``UsageError``, exit 2).
- Ctrl-C, or any error in the parent, kills the actors; nothing was committed yet.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from typing import Any

from pipeline.errors import UsageError
from pipeline.index.batches import BatchRejectedError, EmbedExecution, Say
from pipeline.index.embed_step import EmbedBatch, EmbeddedBatch
from pipeline.index.embedders import Embedder, EmbedderError

#: CPUs (and model threads) per actor when ``--cpus-per-actor`` is not given and ``--actors``
#: or ``--num-gpus`` is; given neither, each actor takes a whole node (``_node_cpus``).
DEFAULT_CPUS_PER_ACTOR = 1
#: Batches queued on each actor: one running, one ready to start when it ends.
PER_ACTOR = 2
#: Times one batch may be sent out in all (the first time and the re-sends after system failures).
MAX_ATTEMPTS = 4
#: Seconds to wait for a first actor to come up (its node loads the model) before giving up.
START_TIMEOUT = 300.0


class EmbedActor:
    """One embedder, made once on its node; ``embed`` answers batch after batch.

    A plain class: ``RayBatches`` makes it a Ray actor class (``ray.remote``) at run time,
    so this module imports without Ray.
    """

    def __init__(self, spec: str, device: str, threads: int) -> None:
        from pipeline.index.device import resolve_device
        from pipeline.index.embedders import make_embedder

        self.notes: list[str] = []
        self.device = resolve_device(device, spec, self.notes.append)
        self.embedder = make_embedder(
            spec, threads=threads, device=None if self.device == "cpu" else self.device
        )
        self.node = _node_id()

    def where(self) -> tuple[str, str, list[str]]:
        """This actor's node id, its device, and what resolving the device said."""
        return self.node, self.device, self.notes

    def embed(self, texts: list[str]) -> tuple[bool, Any, list[int]]:
        """``(True, vectors, tokens)``, or ``(False, reason, [])`` when the embedder refused the batch.

        The embedder's own failure is an answer, not an exception: Ray must not take it for
        a system failure, and the parent must not send it again.
        """
        try:
            vectors = self.embedder.embed(texts)
            tokens = [int(self.embedder.count_tokens(t)) for t in texts]
        except Exception as exc:  # noqa: BLE001 - whatever the embedder raised is its answer
            first = (str(exc).strip().splitlines() or [""])[0][:500]
            return False, f"{type(exc).__name__}: {first}", []
        return True, vectors, tokens


def _node_id() -> str:
    import ray

    return str(ray.get_runtime_context().get_node_id())


class RayEmbedExecutor:
    """The ``EmbedExecutor`` of a pool of ``EmbedActor`` on a Ray cluster.

    ``summary`` says, after a run, where its texts were embedded (``IndexReport.embedded_on``).
    """

    def __init__(self, execution: EmbedExecution, say: Say | None = None) -> None:
        self.execution = execution
        self.say = say
        self.summary: dict[str, Any] = {}
        self._ray: Any = None
        self._started_ray = False

    # -- the cluster ----------------------------------------------------------------------

    def _connect(self) -> Any:
        from pipeline.run.ray_executor import _check_reachable, _cluster_news_to_stderr, import_ray

        ray = import_ray()
        _cluster_news_to_stderr()
        if not ray.is_initialized():
            _check_reachable(self.execution.address)
            try:
                ray.init(
                    address=self.execution.address,
                    logging_level=logging.WARNING,
                    log_to_driver=False,
                    include_dashboard=False,
                )
            except (ConnectionError, RuntimeError) as exc:
                first = (str(exc).strip().splitlines() or [""])[0][:300]
                raise UsageError(
                    f"--executor ray: cannot join the Ray cluster at {self.execution.address or 'auto'}: "
                    f"{first} (hint: start one with `ray start --head`, then pass its address to --address)"
                ) from None
            self._started_ray = True
        self._ray = ray
        return ray

    def _sizes(self, ray: Any, batches: int) -> tuple[int, int]:
        """(actors, CPUs per actor): the options, else one actor per GPU share, else actors of
        the smallest node's CPUs, one per node of that size. An actor's embedder runs one
        single-thread session per CPU side by side (``OnnxEmbedder``), as fast as as many
        one-CPU actors, with one model load and one process per node instead of one per CPU."""
        cpus = self.execution.cpus_per_actor
        if not cpus:
            whole = not self.execution.actors and self.execution.num_gpus <= 0
            cpus = _node_cpus(ray) if whole else DEFAULT_CPUS_PER_ACTOR
        actors = self.execution.actors
        if not actors:
            resources = ray.cluster_resources()
            if self.execution.num_gpus > 0:
                actors = int(resources.get("GPU", 0) // self.execution.num_gpus)
                if actors < 1:
                    raise UsageError(
                        f"--num-gpus {self.execution.num_gpus:g}: the Ray cluster has "
                        f"{resources.get('GPU', 0):g} GPUs (hint: see `ray status`, or drop --num-gpus)"
                    )
            else:
                actors = max(1, int(resources.get("CPU", 1) // cpus))
        return max(1, min(actors, batches)), cpus

    def _spawn(self, cls: Any, spec: str, cpus: int) -> Any:
        return cls.options(
            num_cpus=cpus,
            num_gpus=self.execution.num_gpus,
            max_restarts=0,  # a lost actor is replaced by the parent, its batches re-sent
            max_task_retries=0,
            scheduling_strategy="SPREAD",
        ).remote(spec, self.execution.device, cpus)

    # -- the run --------------------------------------------------------------------------

    def run(self, embedder: Embedder, batches: Sequence[EmbedBatch]) -> Iterator[EmbeddedBatch]:
        """Each batch embedded, as it comes back (any order, each once); see the module docstring."""
        if not batches:
            return
        spec = str(getattr(embedder, "spec", "") or embedder.name)
        ray = self._ray or self._connect()
        system_failures = _system_failures(ray)
        wanted, cpus = self._sizes(ray, len(batches))
        cls = ray.remote(EmbedActor)
        queue = deque(range(len(batches)))
        attempts: Counter[int] = Counter()
        actors: dict[int, Any] = {}  #: ready actors by number
        nodes: dict[int, str] = {}
        starting: dict[Any, int] = {}  #: a ``where`` call → the actor that answers it
        handles: dict[int, Any] = {}  #: every actor made (to kill at the end)
        flying: dict[Any, tuple[int, int]] = {}  #: an ``embed`` call → (batch, actor)
        load: Counter[int] = Counter()
        by_node: Counter[str] = Counter()
        devices: dict[str, str] = {}
        done: set[int] = set()
        said: set[str] = set()
        resent = 0

        def start_one() -> None:
            number = len(handles)
            handles[number] = self._spawn(cls, spec, cpus)
            starting[handles[number].where.remote()] = number

        def lose(number: int) -> None:
            actors.pop(number, None)
            with contextlib.suppress(Exception):
                ray.kill(handles[number], no_restart=True)
            if len(handles) < wanted + MAX_ATTEMPTS * wanted:
                start_one()  # joins when the cluster has room again

        for _ in range(wanted):
            start_one()
        try:
            while len(done) < len(batches):
                for number, actor in list(actors.items()):
                    while load[number] < PER_ACTOR and queue:
                        batch = queue.popleft()
                        attempts[batch] += 1
                        flying[actor.embed.remote(list(batches[batch].texts))] = (batch, number)
                        load[number] += 1
                if not flying and not starting:
                    raise EmbedderError(
                        "--executor ray: every embedding actor was lost and none could be started again "
                        "(hint: see `ray status`; the next run starts from the vectors cached so far)"
                    )
                timeout = None if flying or actors else START_TIMEOUT
                ready, _ = ray.wait([*flying, *starting], num_returns=1, timeout=timeout)
                if not ready:
                    raise EmbedderError(
                        f"--executor ray: no embedding actor started within {START_TIMEOUT:g} s "
                        "(hint: `ray status` shows whether the cluster has the CPUs/GPUs asked for)"
                    )
                for ref in ready:
                    if ref in starting:
                        number = starting.pop(ref)
                        try:
                            node, device, notes = ray.get(ref)
                        except system_failures as exc:
                            if _init_failed(exc):
                                raise UsageError(_start_problem(exc)) from None
                            lose(number)
                            continue
                        actors[number], nodes[number] = handles[number], node
                        devices[node] = device
                        for note in notes:
                            if self.say and note not in said:
                                said.add(note)
                                self.say(note)
                        continue
                    batch, number = flying.pop(ref)
                    load[number] -= 1
                    try:
                        ok, payload, tokens = ray.get(ref)
                    except system_failures:
                        if number in actors:
                            lose(number)
                        if attempts[batch] >= MAX_ATTEMPTS:
                            raise EmbedderError(
                                f"--executor ray: batch {batch} was lost {attempts[batch]} times with its "
                                "actors (hint: see `ray status` and the Ray logs of the nodes)"
                            ) from None
                        queue.appendleft(batch)
                        resent += 1
                        continue
                    if batch in done:
                        continue
                    if not ok:
                        raise BatchRejectedError(batches[batch].digests, str(payload))
                    done.add(batch)
                    by_node[nodes[number]] += len(batches[batch].texts)
                    yield EmbeddedBatch(batches[batch].digests, payload, tuple(tokens))
        finally:
            for handle in handles.values():
                with contextlib.suppress(Exception):
                    ray.kill(handle, no_restart=True)
            self.summary = {
                "executor": "ray",
                "actors": len(handles),
                "batches": len(batches),
                "resent": resent,
                "texts_by_node": dict(sorted(by_node.items())),
                "device_by_node": dict(sorted(devices.items())),
            }

    def close(self) -> None:
        """Disconnect from the cluster (if this run connected)."""
        if self._started_ray and self._ray is not None:
            self._ray.shutdown()
        self._ray = None
        self._started_ray = False


def _system_failures(ray: Any) -> tuple[type[BaseException], ...]:
    """Ray's errors for a lost actor, process, node or object: the failures worth a re-send."""
    names = ("RayActorError", "WorkerCrashedError", "NodeDiedError", "ObjectLostError", "OwnerDiedError")
    return tuple(getattr(ray.exceptions, n) for n in names if hasattr(ray.exceptions, n))


def _init_failed(exc: BaseException) -> bool:
    """The actor's constructor raised (a setup problem on its node), rather than its node dying."""
    return bool(getattr(exc, "actor_init_failed", False))


def _start_problem(exc: BaseException) -> str:
    """The message of an actor that could not start: the constructor's own error, first line."""
    text = str(exc)
    for line in text.splitlines():
        if "UsageError:" in line or "EmbedderError:" in line:
            return (
                "--executor ray: an embedding actor could not start: " + line.split("Error: ", 1)[1].strip()
            )
    first = (text.strip().splitlines() or [""])[0][:300]
    return f"--executor ray: an embedding actor could not start: {first} (hint: see the Ray logs of its node)"


def make_executor(execution: EmbedExecution, say: Say | None = None) -> RayEmbedExecutor | None:
    """The executor ``execution`` asks for: ``None`` for a local run (``embed_step``'s default).

    Ray itself is imported only when a Ray run embeds. The caller closes a Ray executor when
    done (``close()``: it leaves the cluster).
    """
    execution.check()
    if execution.executor != "ray":
        return None
    return RayEmbedExecutor(execution, say)


def _node_cpus(ray: Any) -> int:
    """The CPUs of the smallest live node of the cluster (at least 1): an actor that size
    fits on every node."""
    sizes = [int(node.get("Resources", {}).get("CPU", 0)) for node in ray.nodes() if node.get("Alive", False)]
    return max(1, min((size for size in sizes if size >= 1), default=1))
