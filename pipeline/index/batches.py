"""Where the index's texts are embedded, as the user asked: ``--executor``, ``--device`` and the Ray options.

``sync`` plans the run, drops the texts the vector cache already holds, and hands the rest
in length-sorted batches to an ``EmbedExecutor`` (``pipeline.index.embed_step``): ``None``
(this process, batch after batch) or Ray actors (``pipeline.index.embed_ray``). Either
way the parent writes every vector: only the embedding moves.

``EmbedExecution`` holds the options of ``chunkyard index --executor ray --address ...
--batch-size ... --actors ... --cpus-per-actor ... --num-gpus ... --device ...``;
``pipeline.index.embed_ray.make_executor`` turns them into the executor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pipeline.errors import UsageError
from pipeline.index.embedders import EmbedderError

EXECUTORS = ("local", "ray")

#: ``say(message)``: a line for the user (stderr), e.g. the device a run fell back to.
Say = Callable[[str], None]


class BatchRejectedError(EmbedderError):
    """The embedder refused a batch (a text too long for an endpoint, a bad input): not retried.

    ``digests`` are the batch's texts' digests (``sync`` names their chunk ids in the error
    the user sees); ``reason`` is the embedder's own message.
    """

    def __init__(self, digests: tuple[str, ...], reason: str) -> None:
        super().__init__(reason)
        self.digests = digests
        self.reason = reason


@dataclass(slots=True)
class EmbedExecution:
    """How to embed: ``local`` (this process) or ``ray`` (a pool of actors on a cluster).

    Attributes:
        executor: ``local`` or ``ray``.
        address: the Ray cluster, as ``ray.init`` takes it (``None``: Ray's default).
        batch_size: texts per batch (0: ``embed_step``'s default).
        actors: Ray actors (0: one per ``cpus_per_actor`` CPUs of the cluster, or per GPU share).
        cpus_per_actor: CPUs (and model threads) each actor takes (0: the smallest node's CPUs,
            so one actor per node; 1 when ``actors`` or ``num_gpus`` is given).
        num_gpus: GPUs each actor requests (fractions share one GPU).
        device: ``cpu``, ``cuda`` or ``auto``: where the model runs, here or in each actor.
    """

    executor: str = "local"
    address: str | None = None
    batch_size: int = 0
    actors: int = 0
    cpus_per_actor: int = 0
    num_gpus: float = 0.0
    device: str = "cpu"

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
