"""The command line: typer + rich, thin over the runner (SPEC §7)."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Annotated

import orjson
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from pipeline._version import __version__
from pipeline.errors import PipelineError
from pipeline.models import Policy
from pipeline.run.ingest import Options, Summary, ingest
from pipeline.run.pool import DEFAULT_DOC_MEMORY_MB, DEFAULT_DOC_TIMEOUT
from pipeline.stages.normalize import DEFAULT_MAX_BYTES
from pipeline.stages.tokens import TOKENIZERS

app = typer.Typer(
    name="chunkyard",
    help="Markdown → one validated JSON file per chunk, for retrieval-augmented generation.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
err = Console(stderr=True)
out_console = Console()

CorpusArg = Annotated[
    Path | None, typer.Argument(help="Folder of Markdown to chunk.", show_default="corpus/")
]
CorpusOpt = Annotated[
    Path | None, typer.Option("--corpus", help="The corpus folder (instead of the argument).")
]
OutOpt = Annotated[Path, typer.Option("--out", "-o", help="Chunk folder.")]
TargetOpt = Annotated[
    int, typer.Option("--target-tokens", min=16, help="Token budget per chunk (embedText).")
]
OverlapOpt = Annotated[
    int, typer.Option("--overlap-tokens", min=0, help="Overlap between pieces of a split paragraph.")
]
TokenizerOpt = Annotated[str, typer.Option("--tokenizer", help=f"Tokenizer: {', '.join(TOKENIZERS)}.")]
PrefixOpt = Annotated[
    bool,
    typer.Option("--context-prefix/--no-context-prefix", help="Prefix embedText with 'title > breadcrumb'."),
]
JobsOpt = Annotated[int, typer.Option("--jobs", "-j", min=0, help="Worker processes (0 = one per core).")]
FullOpt = Annotated[bool, typer.Option("--full", help="Re-chunk every document, not only changed ones.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress and no table; errors only.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print a machine-readable summary on stdout.")]
ExcludeOpt = Annotated[
    list[str] | None, typer.Option("--exclude", help="Glob of paths to skip (repeatable).")
]
MaxBytesOpt = Annotated[int, typer.Option("--max-bytes", min=1, help="Refuse files larger than this.")]
DocTimeoutOpt = Annotated[
    float,
    typer.Option(
        "--doc-timeout",
        min=0,
        metavar="SECONDS",
        help="Stop and report a document that takes longer (0 = no limit).",
    ),
]
DocMemoryOpt = Annotated[
    int,
    typer.Option(
        "--doc-memory", min=0, metavar="MIB", help="Memory one document may use, in MiB (0 = no limit)."
    ),
]
WaitOpt = Annotated[
    bool, typer.Option("--wait/--no-wait", help="Wait for another run holding the output lock.")
]
LangOpt = Annotated[str, typer.Option("--lang", help="Language when front matter names none.")]


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


def resolve_corpus(arg: Path | None, opt: Path | None) -> Path:
    if arg is not None and opt is not None and arg != opt:
        raise typer.BadParameter("give the corpus as the argument or --corpus, not both")
    return arg or opt or Path("corpus")


def make_policy(target: int, overlap: int, tokenizer: str, prefix: bool, lang: str) -> Policy:
    if tokenizer not in TOKENIZERS:
        raise typer.BadParameter(
            f"unknown tokenizer {tokenizer!r}; choose one of {', '.join(TOKENIZERS)}",
            param_hint="--tokenizer",
        )
    if overlap >= target:
        raise typer.BadParameter("must be smaller than --target-tokens", param_hint="--overlap-tokens")
    return Policy(target, overlap, tokenizer, prefix, lang)


@app.command("ingest")
def ingest_cmd(
    corpus: CorpusArg = None,
    corpus_opt: CorpusOpt = None,
    out: OutOpt = Path("chunks"),
    target_tokens: TargetOpt = 512,
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
) -> None:
    """Chunk a folder of Markdown into one JSON file per chunk (incremental)."""
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
    show = not quiet and not json_out and err.is_terminal
    progress = Progress(
        TextColumn("[bold]chunking"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[doc]}"),
        TimeRemainingColumn(),
        console=err,
        transient=True,
        disable=not show,
    )
    task = progress.add_task("chunking", total=None, doc="")

    def waiting(holder: str) -> None:
        if not quiet:
            err.print(f"[yellow]waiting[/] for the lock on {out}: held by {holder}")

    try:
        with progress:
            summary = ingest(  # no progress shown (--quiet, --json, not a terminal): no calls per document
                opts,
                on_start=(lambda n: progress.update(task, total=n)) if show else None,
                on_result=(lambda r: progress.update(task, advance=1, doc=r.rel_path[-40:]))
                if show
                else None,
                on_wait=waiting,
            )
    except PipelineError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
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


@app.command("watch")
def watch_cmd(
    corpus: CorpusArg = None,
    corpus_opt: CorpusOpt = None,
    out: OutOpt = Path("chunks"),
    target_tokens: TargetOpt = 512,
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
        )
    except PipelineError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    raise typer.Exit(code)


def run() -> None:
    """Console-script entry point.

    It leaves by ``os._exit`` once stdout and stderr are flushed: Python's own teardown
    would free every object of the run one by one (60-90 ms after an ingest of 18 MB)
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


# --- audit tools (SPEC §8): validate, resolve, check-citations --------------------------------

AuditOutOpt = Annotated[Path, typer.Option("--out", "-o", help="Chunk folder to audit.")]
AuditCorpusOpt = Annotated[
    Path | None,
    typer.Option("--corpus", help="The corpus folder.", show_default="the manifest's corpus, else corpus/"),
]


def _usage_error(exc: PipelineError, json_out: bool) -> typer.Exit:
    """Report a setup problem (no such folder, no manifest): exit 2."""
    from rich.markup import escape

    if json_out:
        sys.stdout.write(
            orjson.dumps({"code": "usage_error", "ok": False, "error": str(exc)}).decode() + "\n"
        )
    err.print(f"[red]error:[/] {escape(str(exc))}", highlight=False)
    return typer.Exit(2)


@app.command("validate")
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
    progress = Progress(
        TextColumn("[bold]validating"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
        disable=not show,
    )
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
        raise _usage_error(exc, json_out) from None
    if json_out:
        sys.stdout.write(orjson.dumps(result.as_dict(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        render_validate(result, out_console, quiet=quiet)
    raise typer.Exit(0 if result.ok else 1)


@app.command("resolve")
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

    from pipeline.audit.resolve import UnknownIdError, resolve
    from pipeline.audit.store import open_store
    from pipeline.cli.render import render_resolved

    try:
        store = open_store(out, corpus)
    except PipelineError as exc:
        raise _usage_error(exc, json_out) from None
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
        err.print(Text(f"error: {exc}", style="red"))
        raise typer.Exit(1) from None
    if json_out:
        sys.stdout.write(orjson.dumps(found.payload(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        render_resolved(found, out_console, err, context=context)


@app.command("check-citations")
def check_citations_cmd(
    answer: Annotated[
        Path, typer.Argument(metavar="ANSWER.json", help="The answer with its citation block.")
    ],
    out: AuditOutOpt = Path("chunks"),
    allow_cross_section: Annotated[
        bool, typer.Option("--allow-cross-section", help="Let one segment cite several sections.")
    ] = False,
    quiet: QuietOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Check a RAG answer's citations against the chunk store (001's validator): exit 0 ok, 1 on any problem.

    Required per citation: snippet_id (a chunk_id), section_id, source_url, offsets{start,end,unit:"char"},
    tokens, rev, analyzer. index_hash, embed_model and scores are the loader's to check.
    """
    from pipeline.audit.citations import check_answer, load_answer
    from pipeline.audit.store import open_store
    from pipeline.cli.render import render_citations

    try:
        store = open_store(out)
        data, failed = load_answer(answer)
    except PipelineError as exc:
        raise _usage_error(exc, json_out) from None
    result = failed or check_answer(data, store, allow_cross_section=allow_cross_section, name=str(answer))
    if json_out:
        sys.stdout.write(orjson.dumps(result.as_dict(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        render_citations(result, out_console, quiet=quiet)
    raise typer.Exit(0 if result.ok else 1)
