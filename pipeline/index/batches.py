"""Where the index's texts are embedded: in this process, or on a Ray cluster.

``sync`` plans the run, drops the texts the vector cache already holds, cuts the rest into
batches (sorted by length, so a batch pads to near its own longest text) and hands them to
a ``BatchEmbedding``. It yields each batch's vectors and token counts as they are ready, in
any order, and the parent writes them to the cache at once: the writes stay in one process,
whatever embeds.

``EmbedExecution`` is what the caller asked for (``chunkyard index --executor ray
--address ... --batch-size ... --actors ... --num-gpus ... --device ...``); ``open_batches``
turns it into the local or the Ray implementation. Ray is imported only for the latter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from pipeline.errors import UsageError
from pipeline.index.embedders import EmbedderError

if TYPE_CHECKING:
    import numpy

EXECUTORS = ("local", "ray")

#: One finished batch: its number in the list given, its vectors (row i for text i), and the
#: length of each text in the model's units.
Done = tuple[int, "numpy.ndarray", list[int]]

#: ``say(message)``: a line for the user (stderr), e.g. the device a run fell back to.
Say = Callable[[str], None]


class BatchRejectedError(EmbedderError):
    """The embedder refused a batch (a text too long for an endpoint, a bad input): not retried.

    ``batch`` is the batch's number, ``reason`` the embedder's own message; ``sync`` names the
    chunk ids of that batch in the error the user sees.
    """

    def __init__(self, batch: int, reason: str) -> None:
        super().__init__(reason)
        self.batch = batch
        self.reason = reason


@dataclass(slots=True)
class EmbedExecution:
    """How to embed: ``local`` (this process) or ``ray`` (a pool of actors on a cluster).

    Attributes:
        executor: ``local`` or ``ray``.
        address: the Ray cluster, as ``ray.init`` takes it (``None``: Ray's default).
        batch_size: texts per batch (0: the executor's default).
        actors: Ray actors (0: one per ``cpus_per_actor`` CPUs of the cluster, or per GPU share).
        cpus_per_actor: CPUs (and model threads) each actor takes (0: the measured default).
        num_gpus: GPUs each actor requests (fractions share one GPU).
        device: ``cpu``, ``cuda`` or ``auto`` for the model, here or in each actor.
    """

    executor: str = "local"
    address: str | None = None
    batch_size: int = 0
    actors: int = 0
    cpus_per_actor: int = 0
    num_gpus: float = 0.0
    device: str = "cpu"
    stats: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        """A ``UsageError`` for options that cannot work together, before anything starts."""
        from pipeline.index.device import DEVICES

        if self.executor not in EXECUTORS:
            raise UsageError(f"--executor {self.executor!r}: choose one of {', '.join(EXECUTORS)}")
        if self.device not in DEVICES:
            raise UsageError(f"--device {self.device!r}: choose one of {', '.join(DEVICES)}")
        if self.batch_size < 0 or self.actors < 0 or self.cpus_per_actor < 0 or self.num_gpus < 0:
            raise UsageError("--batch-size, --actors, --cpus-per-actor and --num-gpus must be >= 0")
        if self.executor == "local" and (self.address or self.actors or self.num_gpus or self.cpus_per_actor):
            raise UsageError(
                "--address, --actors, --cpus-per-actor and --num-gpus need --executor ray "
                "(hint: add --executor ray, or drop them)"
            )


class BatchEmbedding(Protocol):
    """Embeds batches of texts; the parent writes what comes back."""

    def run(self, batches: Sequence[Sequence[str]]) -> Iterator[Done]:
        """Each batch's ``(number, vectors, tokens)`` once ready, in any order, each batch once.

        Raises ``BatchRejectedError`` for a batch the embedder refused; stops the work in
        flight when the caller stops iterating (Ctrl-C, an error while writing).
        """
        ...

    def close(self) -> None:
        """Release what ``run`` took (Ray actors, the connection)."""
        ...


class LocalBatches:
    """Batches embedded one after another by the embedder of this process."""

    def __init__(self, embedder: Any) -> None:
        self.embedder = embedder

    def run(self, batches: Sequence[Sequence[str]]) -> Iterator[Done]:
        for number, texts in enumerate(batches):
            vectors = self.embedder.embed(list(texts))
            yield number, vectors, [int(self.embedder.count_tokens(t)) for t in texts]

    def close(self) -> None:
        pass


def open_batches(
    embedder: Any, spec: str, execution: EmbedExecution, say: Say | None = None
) -> BatchEmbedding:
    """The ``BatchEmbedding`` that ``execution`` asks for; ``spec`` makes ``embedder`` again (Ray)."""
    if execution.executor == "ray":
        from pipeline.index.embed_ray import RayBatches

        return RayBatches(spec, execution, say)
    return LocalBatches(embedder)
