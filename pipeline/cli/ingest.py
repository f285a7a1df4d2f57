"""`chunkyard ingest` and `chunkyard watch`: a corpus run, with its summary table.

The contract: docs/spec.md, "Runs" and "Watch".
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import orjson
import typer

from pipeline.cli.base import (
    CorpusArg,
    CorpusOpt,
    DocMemoryOpt,
    DocTimeoutOpt,
    ExcludeOpt,
    FullOpt,
    JobsOpt,
    JsonOpt,
    LangOpt,
    MaxBytesOpt,
    OutOpt,
    OverlapOpt,
    PrefixOpt,
    QuietOpt,
    TargetOpt,
    TokenizerOpt,
    WaitOpt,
    bar_progress,
    err,
    make_policy,
    out_console,
    resolve_corpus,
    usage_error,
)
from pipeline.errors import PipelineError
from pipeline.models import DEFAULT_MAX_BYTES
from pipeline.run.ingest import Options, Summary, corpus_relative, ingest
from pipeline.run.model import DEFAULT_DOC_MEMORY_MB, DEFAULT_DOC_TIMEOUT

EXECUTORS = ("local", "ray")
ExecutorOpt = Annotated[
    str,
    typer.Option(
        "--executor",
        metavar="local|ray",
        help="Who chunks: the local process pool, or tasks on a Ray cluster (pip install 'chunkyard\\[ray]').",
    ),
]
AddressOpt = Annotated[
    str | None,
    typer.Option(
        "--address",
        metavar="HOST:PORT",
        help="The Ray cluster to use with --executor ray (default: RAY_ADDRESS, else a cluster on this machine).",
    ),
]
BatchOpt = Annotated[
    int, typer.Option("--batch", min=0, help="Documents per Ray task (0 = chosen from the cluster's CPUs).")
]
ChangedOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--changed",
        metavar="FILE",
        help="Sync only these documents (repeatable; a deleted one is removed), without walking "
        "the corpus: for an editor hook or `git diff --name-only`. A plain ingest still checks everything.",
    ),
]


def check_executor(executor: str, address: str | None, batch: int) -> None:
    """``--address`` and ``--batch`` mean something only with ``--executor ray``."""
    if executor not in EXECUTORS:
        raise typer.BadParameter(
            f"{executor!r} is not one of {', '.join(EXECUTORS)}", param_hint="--executor"
        )
    if executor != "ray" and (address or batch):
        hint = "--address" if address else "--batch"
        raise typer.BadParameter("only goes with --executor ray", param_hint=hint)


def ingest_cmd(
    corpus: CorpusArg = None,
    corpus_opt: CorpusOpt = None,
    out: OutOpt = Path("chunks"),
    target_tokens: TargetOpt = 256,
    overlap_tokens: OverlapOpt = 64,
    tokenizer: TokenizerOpt = "cl100k_base",
    context_prefix: PrefixOpt = True,
    lang: LangOpt = "en",
    jobs: JobsOpt = 0,
    full: FullOpt = False,
    exclude: ExcludeOpt = None,
    max_bytes: MaxBytesOpt = DEFAULT_MAX_BYTES,
    doc_timeout: DocTimeoutOpt = DEFAULT_DOC_TIMEOUT,
    doc_memory: DocMemoryOpt = DEFAULT_DOC_MEMORY_MB,
    wait: WaitOpt = True,
    quiet: QuietOpt = False,
    json_out: JsonOpt = False,
    executor: ExecutorOpt = "local",
    address: AddressOpt = None,
    batch: BatchOpt = 0,
    changed: ChangedOpt = None,
) -> None:
    """Chunk a folder of Markdown into one JSON file per chunk (incremental)."""
    check_executor(executor, address, batch)
    if changed and full:
        raise typer.BadParameter("--full re-checks every document; drop one of them", param_hint="--changed")
    opts = Options(
        corpus=resolve_corpus(corpus, corpus_opt),
        out=out,
        policy=make_policy(target_tokens, overlap_tokens, tokenizer, context_prefix, lang),
        jobs=jobs or os.cpu_count() or 1,
        full=full,
        exclude=tuple(exclude or ()),
        max_bytes=max_bytes,
        wait=wait,
        doc_timeout=doc_timeout,
        doc_memory_mb=doc_memory,
        executor=executor,
        address=address,
        batch=batch,
    )
    show = not quiet and not json_out and err.is_terminal
    progress = bar_progress(show, "{task.fields[doc]}")
    task = progress.add_task("chunking", total=None, doc="")

    def waiting(holder: str) -> None:
        if not quiet:
            err.print(f"[yellow]waiting[/] for the lock on {out}: held by {holder}")

    try:
        if executor == "ray":  # before the output is touched: a missing Ray is a setup error
            from pipeline.run.ray_executor import require_ray

            require_ray()
        paths = [corpus_relative(opts.corpus, p) for p in changed] if changed else None
        with progress:
            summary = ingest(  # no progress shown (--quiet, --json, not a terminal): no calls per document
                opts,
                on_start=(lambda n: progress.update(task, total=n)) if show else None,
                on_result=(lambda r: progress.update(task, advance=1, doc=r.rel_path[-40:]))
                if show
                else None,
                on_wait=waiting,
                changed=paths,
            )
    except PipelineError as exc:
        raise usage_error(exc, json_out) from None
    report(summary, quiet=quiet, json_out=json_out)
    raise typer.Exit(summary.exit_code)


def report(summary: Summary, *, quiet: bool, json_out: bool) -> None:
    """The end-of-run summary: a table (or JSON), then every failure with its reason."""
    if json_out:
        sys.stdout.write(orjson.dumps(summary.as_dict(), option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    for warning in summary.warnings:
        if not quiet:
            err.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    for failure in summary.failures:
        err.print(f"[red]failed:[/] {failure}", highlight=False, soft_wrap=True)
    if quiet:
        return
    from rich.table import Table

    table = Table(title="chunkyard ingest", show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    chunked = summary.processed - len(summary.failures) if summary.processed else 0
    rows = (
        ("documents", f"{summary.documents:,}"),
        (
            "  chunked / skipped (unchanged) / failed",
            f"{max(chunked, 0):,} / {summary.skipped:,} / {len(summary.failures):,}",
        ),
        ("chunks", f"{summary.chunks:,}"),
        ("tokens", f"{summary.tokens:,}"),
        (
            "files written / unchanged / removed",
            f"{summary.written:,} / {summary.unchanged:,} / {summary.removed:,}",
        ),
        ("redirects", f"{summary.redirects:,}"),
        ("seconds", f"{summary.seconds:.2f}"),
        ("MB/s", f"{summary.mb_per_s:.2f}"),
    )
    for name, value in rows:
        table.add_row(name, value)
    out_console.print(table)


def watch_cmd(
    corpus: CorpusArg = None,
    corpus_opt: CorpusOpt = None,
    out: OutOpt = Path("chunks"),
    target_tokens: TargetOpt = 256,
    overlap_tokens: OverlapOpt = 64,
    tokenizer: TokenizerOpt = "cl100k_base",
    context_prefix: PrefixOpt = True,
    lang: LangOpt = "en",
    jobs: JobsOpt = 0,
    full: FullOpt = False,
    exclude: ExcludeOpt = None,
    max_bytes: MaxBytesOpt = DEFAULT_MAX_BYTES,
    doc_timeout: DocTimeoutOpt = DEFAULT_DOC_TIMEOUT,
    doc_memory: DocMemoryOpt = DEFAULT_DOC_MEMORY_MB,
    wait: WaitOpt = True,
    debounce_ms: Annotated[
        int, typer.Option("--debounce-ms", min=0, help="Quiet time after a save before re-chunking.")
    ] = 50,
    polling: Annotated[
        bool, typer.Option("--polling", help="Poll the corpus instead of inotify (network file systems).")
    ] = False,
    quiet: QuietOpt = False,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON line per event on stdout.")] = False,
    index: Annotated[
        bool, typer.Option("--index", help="After each sync, apply the change feed to the index too.")
    ] = False,
    store: Annotated[
        str | None,
        typer.Option("--store", help="The index for --index (default OUT/.chunkyard/index.sqlite)."),
    ] = None,
) -> None:
    """Sync once like ingest, then re-chunk each document as it is saved (Ctrl-C stops)."""
    from pipeline.cli.watch import serve  # watchdog is only imported by this command

    opts = Options(
        corpus=resolve_corpus(corpus, corpus_opt),
        out=out,
        policy=make_policy(target_tokens, overlap_tokens, tokenizer, context_prefix, lang),
        jobs=jobs or os.cpu_count() or 1,
        full=full,
        exclude=tuple(exclude or ()),
        max_bytes=max_bytes,
        wait=wait,
        doc_timeout=doc_timeout,
        doc_memory_mb=doc_memory,
    )
    try:
        code = serve(
            opts,
            out=out_console,
            err=err,
            debounce=debounce_ms / 1000,
            polling=polling,
            quiet=quiet,
            json_out=json_out,
            index=index,
            store=store,
        )
    except PipelineError as exc:
        raise usage_error(exc, json_out) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    raise typer.Exit(code)
