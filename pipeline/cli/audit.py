"""The audit commands (docs/spec.md, "Audit"): validate, resolve, check-citations."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import orjson
import typer

from pipeline.cli.base import (
    AuditCorpusOpt,
    AuditOutOpt,
    JobsOpt,
    JsonOpt,
    QuietOpt,
    bar_progress,
    err,
    out_console,
    usage_error,
)
from pipeline.errors import PipelineError


def validate_cmd(
    out: AuditOutOpt = Path("chunks"),
    corpus: AuditCorpusOpt = None,
    reingest: Annotated[
        bool, typer.Option("--reingest", help="Also re-chunk every source in memory: ids must not move.")
    ] = False,
    jobs: JobsOpt = 0,
    quiet: QuietOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Check a chunk folder against its sources (000's validator): exit 0 clean, 1 on any problem.

    Schema, unique ids, chunk_id order, originalText vs the source slice, line spans,
    prev/next chains, stale and missing files, hash and rev, manifest agreement.
    """
    from pipeline.audit.validate import validate
    from pipeline.cli.render import render_validate

    show = not quiet and not json_out and err.is_terminal
    progress = bar_progress(show)
    task = progress.add_task("validating", total=None)
    try:
        with progress:
            result = validate(
                out,
                corpus,
                reingest=reingest,
                jobs=jobs,
                on_start=lambda n: progress.update(task, total=n),
                on_doc=lambda: progress.advance(task),
            )
    except PipelineError as exc:
        raise usage_error(exc, json_out) from None
    if json_out:
        sys.stdout.write(orjson.dumps(result.as_dict(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        render_validate(result, out_console, quiet=quiet)
    raise typer.Exit(0 if result.ok else 1)


def resolve_cmd(
    chunk: Annotated[
        str,
        typer.Argument(
            metavar="ID", help="A chunk_id, an id (doc:NAME::chN), a chunk file, or a redirected chunk_id."
        ),
    ],
    out: AuditOutOpt = Path("chunks"),
    corpus: AuditCorpusOpt = None,
    context: Annotated[
        int, typer.Option("--context", "-C", min=0, help="Lines of context before and after.")
    ] = 3,
    quiet: QuietOpt = False,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print 001's citation payload plus text, file and lineSpan.")
    ] = False,
) -> None:
    """Show the exact source span behind a chunk address, with line numbers and context."""
    from rich.text import Text

    from pipeline.audit.chunk_state import open_store
    from pipeline.audit.resolve import UnknownIdError, resolve
    from pipeline.cli.render import render_resolved

    try:
        store = open_store(out, corpus)
    except PipelineError as exc:
        raise usage_error(exc, json_out) from None
    try:
        found = resolve(store, chunk)
    except UnknownIdError as exc:
        if json_out:
            doc = {
                "code": "unknown_id",
                "ok": False,
                "query": exc.query,
                "error": exc.reason,
                "suggestions": exc.suggestions,
            }
            sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
        else:
            err.print(Text.assemble(("unknown id: ", "red"), f"{exc.query}: {exc.reason}"))
            if exc.suggestions and not quiet:
                err.print("nearest:")
                for s in exc.suggestions:
                    err.print(Text(f"  {s}", style="cyan"))
        raise typer.Exit(1) from None
    except PipelineError as exc:
        err.print(Text(f"error: {exc}", style="red"), soft_wrap=True)
        raise typer.Exit(1) from None
    if json_out:
        sys.stdout.write(orjson.dumps(found.payload(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        render_resolved(found, out_console, err, context=context)


def check_citations_cmd(
    answer: Annotated[
        Path, typer.Argument(metavar="ANSWER.json", help="The answer with its citation block.")
    ],
    out: AuditOutOpt = Path("chunks"),
    corpus: AuditCorpusOpt = None,
    allow_cross_section: Annotated[
        bool, typer.Option("--allow-cross-section", help="Let one segment cite several sections.")
    ] = False,
    store: Annotated[
        str | None,
        typer.Option(
            "--store", help="The live index whose index_hash citations must carry (default: OUT's)."
        ),
    ] = None,
    quiet: QuietOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Check a RAG answer's citations against the chunk store (001's validator): exit 0 ok, 1 on any problem.

    Required per citation: snippet_id (a chunk_id), section_id, source_url, offsets{start,end,unit:"char"},
    tokens, rev, analyzer; index_hash against the live index when there is one (`chunkyard index`).
    A --corpus given must exist (docs/spec.md, "Command line": every command takes one).
    """
    from pipeline.audit.answer import load_answer
    from pipeline.audit.chunk_state import open_store
    from pipeline.audit.citations import check_answer
    from pipeline.cli.render import render_citations
    from pipeline.index.query import live_index_hash

    try:
        chunks = open_store(out, corpus, need_corpus=corpus is not None)
        data, failed = load_answer(answer)
        live = live_index_hash(out, store)
    except PipelineError as exc:
        raise usage_error(exc, json_out) from None
    result = failed or check_answer(
        data, chunks, allow_cross_section=allow_cross_section, name=str(answer), live_index_hash=live
    )
    if json_out:
        sys.stdout.write(orjson.dumps(result.as_dict(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        render_citations(result, out_console, quiet=quiet)
    raise typer.Exit(0 if result.ok else 1)
