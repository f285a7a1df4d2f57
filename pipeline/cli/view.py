"""``chunkyard view``: a document in the terminal, or the whole chunk folder as one HTML report."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import orjson
import typer

from pipeline.cli.base import AuditCorpusOpt, JsonOpt, QuietOpt, err, out_console, usage_error
from pipeline.errors import PipelineError

ViewOutOpt = Annotated[Path, typer.Option("--out", "-o", help="Chunk folder to show.")]
DocsArg = Annotated[
    list[str] | None,
    typer.Argument(metavar="[DOC]...", help="Documents (paths relative to the corpus); all with --html."),
]
HtmlOpt = Annotated[
    Path | None,
    typer.Option("--html", metavar="FILE", help="Write one self-contained HTML report (no network needed)."),
]


def view_cmd(
    docs: DocsArg = None,
    out: ViewOutOpt = Path("chunks"),
    corpus: AuditCorpusOpt = None,
    html: HtmlOpt = None,
    quiet: QuietOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """See the chunks: DOC in the terminal with chunk boundaries in alternating colors, or --html FILE.

    The HTML report shows the corpus overview (chunk sizes against the target, block types,
    the largest and smallest chunks, atomic blocks over the budget, failed documents) and
    each document's source with every chunk's span as a band; hover or click for the chunk.
    """
    from pipeline.audit.chunk_state import open_store
    from pipeline.view.collect import read_doc
    from pipeline.view.terminal import find_doc, print_document

    try:
        store = open_store(out, corpus)
        keys = [find_doc(store, d) for d in docs or ()]
        if html is None and not keys:
            raise PipelineError("give a DOC to show in the terminal, or --html FILE for the whole report")
    except PipelineError as exc:
        raise usage_error(exc, json_out) from None
    if html is None:
        for key in keys:
            print_document(read_doc(store, key, store.docs[key]), out_console)
        raise typer.Exit(0)

    from pipeline.view.report import write_report

    started = time.perf_counter()
    try:
        report = write_report(store, html, keys or None)
    except PipelineError as exc:
        err.print(f"[red]error:[/] {exc}", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(1) from None
    summary = {
        "ok": True,
        "html": str(html),
        "bytes": html.stat().st_size,
        "documents": report.overview["documents"],
        "chunks": report.overview["chunks"],
        "failed": len(report.overview["failures"]),
        "seconds": round(time.perf_counter() - started, 3),
    }
    if json_out:
        sys.stdout.write(orjson.dumps(summary).decode() + "\n")
    elif not quiet:
        err.print(
            f"wrote {html} ({summary['bytes'] / 1e6:.1f} MB): {summary['documents']} documents, "
            f"{summary['chunks']} chunks, {summary['failed']} failed, in {summary['seconds']} s",
            highlight=False,
            markup=False,
        )
    raise typer.Exit(0)
