"""The command line: typer + rich, thin over the run and audit layers (docs/spec.md, "Command line").

Each command lives in the module of its layer (``ingest``, ``audit``); the list below
is the one place that registers them, in the order ``--help`` shows them.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Annotated

import typer

from pipeline._version import __version__
from pipeline.cli import audit, index, ingest, view
from pipeline.cli.base import app
from pipeline.cli.eval import eval_cmd
from pipeline.cli.serve import serve_cmd

app.command("ingest")(ingest.ingest_cmd)
app.command("watch")(ingest.watch_cmd)
app.command("validate")(audit.validate_cmd)
app.command("resolve")(audit.resolve_cmd)
app.command("check-citations")(audit.check_citations_cmd)
app.command("view")(view.view_cmd)
app.command("index")(index.index_cmd)
app.command("search")(index.search_cmd)
app.command("eval")(eval_cmd)
app.command("serve")(serve_cmd)


def version_callback(value: bool) -> None:
    if value:
        print(f"chunkyard {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=version_callback, is_eager=True, help="Show the version and exit."
        ),
    ] = False,
) -> None:
    """chunkyard: Markdown → one validated JSON file per chunk."""


def run() -> None:
    """Console-script entry point.

    It leaves by ``os._exit`` once stdout and stderr are flushed: Python's own teardown
    would free every object of the run one by one (a visible pause after a large ingest)
    just before the process ends anyway. Every file chunkyard writes is closed by then
    (plain descriptors, or ``with`` blocks), and the workers have been joined.
    """
    try:
        app()
        code: object = 0
    except SystemExit as exc:
        code = exc.code
    if isinstance(code, str):  # what ``sys.exit("message")`` would print
        sys.stderr.write(code + "\n")
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code if isinstance(code, int) else 0 if code is None else 1)
