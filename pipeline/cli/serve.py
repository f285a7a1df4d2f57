"""``chunkyard serve``: one long-lived process holding the index and the embedder warm.

HTTP JSON API + MCP (streamable HTTP at ``/mcp``) on one port, or MCP over stdio
(``--mcp stdio``, what a desktop client launches). ``--watch CORPUS`` keeps the chunk
folder and its index current while serving (``pipeline.serve.writer``). Binds loopback by
default; any other address needs ``--token`` (bearer) or ``--insecure``. The web stack is
the extra ``serve``, imported only by this command.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from pipeline.cli.base import DenseWeightOpt, QuietOpt, err, usage_error
from pipeline.errors import PipelineError, UsageError

TOKEN_ENV = "CHUNKYARD_SERVE_TOKEN"
DEFAULT_PORT = 8750


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None, insecure: bool) -> None:
    """A non-loopback bind without ``--token`` or ``--insecure`` is refused (``UsageError``, exit 2)."""
    if not is_loopback(host) and not token and not insecure:
        raise UsageError(
            f"--host {host} would let other machines read the chunk folder without a password "
            f"(hint: add --token SECRET, or set ${TOKEN_ENV}; --insecure serves it open on purpose)"
        )


def _import_stack() -> None:
    try:
        import fastapi  # noqa: F401
        import mcp  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise UsageError(
            f"chunkyard serve needs the extra 'serve' ({exc.name} is missing) (hint: pip install 'chunkyard[serve]')"
        ) from None


def serve_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="The chunk folder to serve.")] = Path("chunks"),
    watch: Annotated[
        Path | None,
        typer.Option(
            "--watch", metavar="CORPUS", help="Also keep OUT and its index current with CORPUS while serving."
        ),
    ] = None,
    corpus: Annotated[
        Path | None,
        typer.Option("--corpus", help="The sources (default: --watch's, else the one OUT's state records)."),
    ] = None,
    store: Annotated[
        str | None,
        typer.Option("--store", help="The index (default OUT/.chunkyard/index.sqlite; lancedb:PATH)."),
    ] = None,
    host: Annotated[
        str, typer.Option("--host", help="Address to bind (loopback unless --token/--insecure).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="TCP port.")] = DEFAULT_PORT,
    token: Annotated[
        str | None,
        typer.Option(
            "--token", envvar=TOKEN_ENV, help=f"Require 'Authorization: Bearer TOKEN' (or ${TOKEN_ENV})."
        ),
    ] = None,
    insecure: Annotated[
        bool, typer.Option("--insecure", help="Allow a non-loopback bind without a token.")
    ] = False,
    mcp: Annotated[
        str | None, typer.Option("--mcp", metavar="stdio", help="Speak MCP on stdin/stdout instead of HTTP.")
    ] = None,
    workers: Annotated[
        int, typer.Option("--workers", min=1, max=64, help="Queries answered at once (per process).")
    ] = 2,
    processes: Annotated[
        int,
        typer.Option(
            "--processes",
            min=1,
            max=64,
            help="Server processes on one port (one core each; not with --mcp stdio).",
        ),
    ] = 1,
    query_cache: Annotated[
        int, typer.Option("--query-cache", min=0, help="Recent queries whose vectors are kept (0: none).")
    ] = 4096,
    max_concurrent: Annotated[
        int, typer.Option("--max-concurrent", min=1, help="Requests in flight (per process) before 503 busy.")
    ] = 64,
    dense_weight: DenseWeightOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Serve search with citations over HTTP (JSON API + MCP at /mcp), or MCP over stdio."""
    try:
        if mcp not in (None, "stdio"):
            raise UsageError(f"--mcp {mcp}: only 'stdio' (hint: MCP over HTTP is always at /mcp)")
        check_bind(host, token, insecure)
        if processes > 1 and mcp == "stdio":
            raise UsageError(
                f"--processes {processes} with --mcp stdio: stdio is one process's "
                "(hint: drop --processes, or serve HTTP, where MCP is at /mcp)"
            )
        _import_stack()
        code = run_server(
            out, watch=watch, corpus=corpus, store=store, host=host, port=port, token=token,
            mcp_stdio=mcp == "stdio", workers=workers, max_concurrent=max_concurrent, quiet=quiet,
            query_cache=query_cache, processes=processes, dense_weight=dense_weight,
        )  # fmt: skip
    except PipelineError as exc:
        raise usage_error(exc, False) from None
    raise typer.Exit(code)


def run_server(
    out: Path,
    *,
    watch: Path | None,
    corpus: Path | None,
    store: str | None,
    host: str,
    port: int,
    token: str | None,
    mcp_stdio: bool,
    workers: int,
    max_concurrent: int,
    quiet: bool,
    query_cache: int = 4096,
    processes: int = 1,
    dense_weight: float | None = None,
) -> int:
    """Start the writer (``--watch``), open the index, serve until a signal; the exit code."""
    # one BLAS thread per query (set before numpy loads): the workers are the parallelism,
    # and a pool of BLAS threads per product would only hand the query between threads
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from pipeline.serve.processes import log_plainly, run_processes

    log_plainly()
    from pipeline.serve.handle import open_index
    from pipeline.serve.limits import Limits
    from pipeline.serve.watching import WriterProcess

    if watch is not None and not watch.is_dir():
        raise UsageError(f"{watch}: no such corpus folder (hint: --watch takes the folder of Markdown files)")
    if watch is None and not out.is_dir():
        raise UsageError(
            f"{out}: no such chunk folder (hint: chunkyard ingest CORPUS --out {out}, or --watch CORPUS)"
        )
    writer = WriterProcess(watch, out, store, quiet=quiet) if watch is not None else None
    if processes > 1:
        _announce(host, port, writer, quiet, f" · {processes} processes")
        passages_from = corpus or watch
        settings = {
            "out": str(out), "store": store, "corpus": str(passages_from) if passages_from else None,
            "workers": workers, "query_cache": query_cache, "max_concurrent": max_concurrent, "token": token,
            "dense_weight": dense_weight,
        }  # fmt: skip
        return run_processes(settings, processes, host, port, writer)
    limits = Limits(max_concurrent=max_concurrent)
    if writer is not None:
        writer.start()
    handle = open_index(
        out,
        store,
        corpus=corpus or watch,
        workers=workers,
        query_cache=query_cache,
        dense_weight=dense_weight,
    )
    try:
        _warm(handle)
        if mcp_stdio:
            from pipeline.serve.mcp_tools import build_mcp

            build_mcp(handle, limits).run("stdio")
            return 0
        return _run_http(handle, limits, writer, host=host, port=port, token=token, quiet=quiet)
    finally:
        if writer is not None:
            writer.stop()
        handle.close()


def _warm(handle: Any) -> None:
    """Load the embedder and the vectors before the first client waits for them (when there is an index)."""
    with contextlib.suppress(PipelineError):  # no index yet: the writer builds it, the first search loads
        handle.warm()


def _run_http(
    handle: Any, limits: Any, writer: Any, *, host: str, port: int, token: str | None, quiet: bool
) -> int:
    import uvicorn

    from pipeline.serve.app import create_app
    from pipeline.serve.processes import uvicorn_options

    app = create_app(handle, limits=limits, token=token, host=host, writer=writer)
    server = uvicorn.Server(uvicorn.Config(app, **uvicorn_options(host, port)))
    _announce(host, port, writer, quiet)
    server.run()
    return 0


def _announce(host: str, port: int, writer: Any, quiet: bool, extra: str = "") -> None:
    if not quiet:
        shown = f"[{host}]" if ":" in host else host
        err.print(
            f"chunkyard serve: http://{shown}:{port}/v1/search · MCP at /mcp · metrics at /metrics"
            + (f" · watching {writer.corpus}" if writer is not None else "")
            + extra
            + " (Ctrl-C stops)",
            highlight=False,
            soft_wrap=True,
        )
    sys.stderr.flush()
