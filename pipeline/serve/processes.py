"""``chunkyard serve --processes N``: N server processes taking turns on one listening socket.

Why: a query's Python work (ranking, fusion, passages, the JSON) holds the interpreter's
lock, so one process answers on about one core however many ``--workers`` it runs; on a
machine of several cores, queries wait in line for that lock. N processes, each with its
own ``IndexHandle`` (its embedder, its vectors), accept connections from one socket
(uvicorn's supervisor, spawned processes; a process that dies is started again), so N
cores answer at once.

What they share: the socket, the index on disk (each reads the last committed one), and
the request metrics (Prometheus' multiprocess mode: each process writes its counters to
files in a private temporary folder, and ``/metrics`` sums them, whichever process
answers). Each process loads the model and the vectors once (memory grows with N).
With ``--watch`` the supervisor runs the one writer; each process answers from the last
index the writer committed, as any reader does, and reads the writer's state from a file
the supervisor rewrites after each of its reports. ``--mcp stdio`` runs in one process.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.serve.watching import WriterProcess

#: How a spawned server process learns its settings (JSON; read once, then removed).
SETTINGS_ENV = "CHUNKYARD_SERVE_PROCESS"
#: Where the processes' metric files go (prometheus_client reads it when it is imported).
METRICS_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: Seconds a starting process may take to answer the supervisor (it loads the model and the vectors first).
HEALTHCHECK_S = 120
#: The writer's state, in the private folder (``--watch``).
WRITER_STATE = "writer.json"


def uvicorn_options(host: str, port: int) -> dict[str, Any]:
    """What every ``chunkyard serve`` over HTTP tells uvicorn, with one process or many."""
    return {
        "host": host,
        "port": port,
        "log_level": "warning",
        "access_log": False,
        "server_header": False,
        "timeout_graceful_shutdown": 5,
        # request line + headers: room for a 10^5-character query to be refused as JSON
        "h11_max_incomplete_event_size": 512 * 1024,
    }


def log_plainly() -> None:
    """chunkyard's own log records (a broken chunk file, a failed request) one per line on
    stderr, whole: the MCP SDK gives the root logger a handler that wraps lines at 80 columns,
    and a file name or a fix cut in two cannot be searched for in a log."""
    logger = logging.getLogger("chunkyard")
    if any(getattr(h, "chunkyard_plain", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s"))
    handler.chunkyard_plain = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.propagate = False


def run_processes(
    settings: dict[str, Any], processes: int, host: str, port: int, writer: WriterProcess | None = None
) -> int:
    """Serve with ``processes`` spawned server processes until a signal; the exit code.

    ``settings``: what each process opens and how it guards (``out``, ``store``, ``corpus``,
    ``workers``, ``query_cache``, ``max_concurrent``, ``token``). ``writer`` (``--watch``) is
    started here, before the processes, and stopped after them."""
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    with tempfile.TemporaryDirectory(prefix="chunkyard-serve-metrics-") as metrics:
        os.environ[METRICS_ENV] = metrics
        if writer is not None:
            writer.state_file = Path(metrics) / WRITER_STATE
            settings = {**settings, "writer_state": str(writer.state_file), "watch": str(writer.corpus)}
            writer.start()
        os.environ[SETTINGS_ENV] = json.dumps({**settings, "host": host})
        try:
            config = uvicorn.Config(
                "pipeline.serve.processes:process_app",
                factory=True,
                workers=processes,
                timeout_worker_healthcheck=HEALTHCHECK_S,
                **uvicorn_options(host, port),
            )
            sock = tcp_listener(config.bind_socket())
            Multiprocess(config, sockets=[sock]).run()
        finally:
            os.environ.pop(SETTINGS_ENV, None)
            os.environ.pop(METRICS_ENV, None)
            if writer is not None:
                writer.stop()
    return 0


def tcp_listener(sock: socket.socket) -> socket.socket:
    """The listening socket, as an object that says it is TCP (``proto`` ``IPPROTO_TCP``).

    uvicorn's ``bind_socket`` leaves ``proto`` at 0, the connections accepted from it inherit
    that, and asyncio turns Nagle's algorithm off (``TCP_NODELAY``) only on sockets that say
    TCP: every answer on a kept-alive connection after the first then waited for the client's
    delayed ACK (uvicorn issue 3149; one process is unaffected, asyncio binds its socket itself).
    """
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.proto == socket.IPPROTO_TCP:
        return sock
    tcp = socket.socket(sock.family, sock.type, socket.IPPROTO_TCP, fileno=sock.detach())
    tcp.set_inheritable(True)  # the spawned processes receive it
    return tcp


def process_app() -> Any:
    """One spawned server process's application (uvicorn calls it there): its own handle,
    warmed before the process accepts its first connection."""
    from pipeline.errors import PipelineError
    from pipeline.serve.app import create_app
    from pipeline.serve.handle import open_index
    from pipeline.serve.limits import Limits
    from pipeline.serve.watching import WriterStateFile

    log_plainly()
    settings = json.loads(os.environ.pop(SETTINGS_ENV))
    handle = open_index(
        Path(settings["out"]),
        settings.get("store"),
        corpus=settings.get("corpus"),
        workers=int(settings["workers"]),
        query_cache=int(settings["query_cache"]),
        dense_weight=settings.get("dense_weight"),
    )
    with contextlib.suppress(PipelineError):  # no index yet: the first search says so
        handle.warm()
    limits = Limits(max_concurrent=int(settings["max_concurrent"]))
    writer = None
    if settings.get("writer_state"):
        writer = WriterStateFile(Path(settings["writer_state"]), Path(settings["watch"]))
    return create_app(
        handle, limits=limits, token=settings.get("token"), host=settings["host"], writer=writer
    )


__all__ = ("log_plainly", "process_app", "run_processes", "tcp_listener", "uvicorn_options")
