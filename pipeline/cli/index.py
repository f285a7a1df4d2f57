"""`chunkyard index` and `chunkyard search`: the change feed into a vector store, and queries.

The contract: docs/spec.md, "Index, search and evaluation".
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.markup import escape
from rich.text import Text

from pipeline.cli.base import (
    DenseWeightOpt,
    JsonOpt,
    QuietOpt,
    WaitOpt,
    bar_progress,
    err,
    out_console,
    usage_error,
)
from pipeline.errors import PipelineError
from pipeline.index.expand import DEFAULT_BUDGET
from pipeline.index.language import CJK_PASSAGE_TOKENS

IndexOutOpt = Annotated[Path, typer.Option("--out", "-o", help="Chunk folder to index.")]
StoreOpt = Annotated[
    str | None,
    typer.Option(
        "--store",
        help="Index location: a SQLite file, or lancedb:PATH (default OUT/.chunkyard/index.sqlite).",
    ),
]
EmbedderOpt = Annotated[
    str | None,
    typer.Option(
        "--embedder",
        help="Embedder spec (default: the index's own, else the offline ONNX model; for CJK text the multilingual "
        "model when its extra is installed).",
    ),
]

IndexExecutorOpt = Annotated[
    str,
    typer.Option(
        "--executor",
        metavar="local|ray",
        help="Who embeds: this process, or a pool of actors on a Ray cluster (pip install 'chunkyard\\[ray]'); "
        "the writes stay here.",
    ),
]
IndexAddressOpt = Annotated[
    str | None,
    typer.Option(
        "--address",
        metavar="HOST:PORT",
        help="The Ray cluster, with --executor ray (default: RAY_ADDRESS, else a cluster on this machine).",
    ),
]
BatchSizeOpt = Annotated[
    int, typer.Option("--batch-size", min=0, help="Texts per embedding batch (0 = the default).")
]
ActorsOpt = Annotated[
    int,
    typer.Option(
        "--actors",
        min=0,
        help="Ray actors, each with its own model (0 = one per node, or per --cpus-per-actor CPUs or GPU share).",
    ),
]
CpusPerActorOpt = Annotated[
    int,
    typer.Option(
        "--cpus-per-actor",
        min=0,
        help="CPUs and model threads per Ray actor (0 = the smallest node's CPUs; 1 with --actors or --num-gpus).",
    ),
]
NumGpusOpt = Annotated[
    float, typer.Option("--num-gpus", min=0.0, help="GPUs per Ray actor (fractions share a GPU).")
]
DeviceOpt = Annotated[
    str,
    typer.Option(
        "--device",
        metavar="cpu|cuda|auto",
        help="Where the model runs (here, or in each Ray actor): cuda fails (exit 2) without a usable GPU, "
        "auto falls back to the CPU and says so.",
    ),
]


def _mismatch(exc: Any, json_out: bool) -> typer.Exit:
    """An index built with another embedder or analyzer: 001's code, the rebuild command, exit 2."""
    if json_out:
        sys.stdout.write(orjson.dumps({"code": exc.code, "ok": False, "error": str(exc)}).decode() + "\n")
    err.print(f"[red]{exc.code}:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
    return typer.Exit(2)


def index_cmd(
    out: IndexOutOpt = Path("chunks"),
    store: StoreOpt = None,
    embedder: EmbedderOpt = None,
    reconcile: Annotated[
        bool,
        typer.Option("--reconcile", help="Compare the index with every chunk file; repair what differs."),
    ] = False,
    rebuild: Annotated[
        bool, typer.Option("--rebuild", help="Build a new index (e.g. another --embedder) and swap it in.")
    ] = False,
    lang: Annotated[
        str | None,
        typer.Option(
            "--lang",
            help="The corpus's language, for a new index or --rebuild: zh, ja, ko (CJK bigram analyzer, "
            "multilingual embedder when installed), en…; default auto: detected from the chunks.",
        ),
    ] = None,
    dense_weight: Annotated[
        float | None,
        typer.Option(
            "--dense-weight",
            min=0.0,
            metavar="W",
            help="Keep in the index: its hybrid search weighs the dense list W against BM25's 1, for every "
            "reader (search, eval, serve); default: the index's own, else its language's.",
        ),
    ] = None,
    wait: WaitOpt = True,
    executor: IndexExecutorOpt = "local",
    address: IndexAddressOpt = None,
    batch_size: BatchSizeOpt = 0,
    actors: ActorsOpt = 0,
    cpus_per_actor: CpusPerActorOpt = 0,
    num_gpus: NumGpusOpt = 0.0,
    device: DeviceOpt = "cpu",
    quiet: QuietOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Apply the change feed to the vector index: embed only what changed, delete what went."""
    from pipeline.index.batches import EmbedExecution
    from pipeline.index.embed_ray import make_executor
    from pipeline.index.sync import index
    from pipeline.index.vector_store import IndexMismatchError

    show = not quiet and not json_out and err.is_terminal
    progress = bar_progress(show)
    tasks: dict[str, Any] = {}

    def on_progress(stage: str, done: int, total: int) -> None:
        if stage not in tasks:
            tasks[stage] = progress.add_task({"embed": "embedding"}.get(stage, stage), total=total or None)
        progress.update(tasks[stage], completed=done, total=total or None)

    def on_wait(holder: str) -> None:
        if not quiet and not json_out:
            err.print(f"waiting for {escape(holder)} to finish with the index…")

    def on_note(message: str) -> None:
        if not quiet:
            err.print(f"[yellow]{escape(message)}[/]", highlight=False)

    execution = EmbedExecution(executor, address, batch_size, actors, cpus_per_actor, num_gpus, device)
    remote = None
    try:
        if executor == "ray":  # before anything is read: a missing Ray is a setup error
            from pipeline.run.ray_executor import require_ray

            require_ray()
        remote = make_executor(execution, on_note)
        with progress:
            report = index(
                out,
                store,
                embedder,
                reconcile=reconcile,
                rebuild=rebuild,
                wait=wait,
                on_progress=on_progress,
                on_wait=on_wait,
                executor=remote,
                device=device,
                batch_size=batch_size or None,
                on_note=on_note,
                lang=lang,
                dense_weight=dense_weight,
            )
    except IndexMismatchError as exc:
        raise _mismatch(exc, json_out) from None
    except PipelineError as exc:
        raise usage_error(exc, json_out) from None
    finally:
        if remote is not None:
            remote.close()
    if json_out:
        sys.stdout.write(orjson.dumps(report.as_dict(), option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    if quiet:
        return
    for warning in report.warnings:
        err.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False, soft_wrap=True)
    from rich.table import Table

    table = Table(title="chunkyard index", title_justify="left", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("count", justify="right")
    for name in ("added", "updated", "moved", "deleted", "redirected", "embedded", "cache_hits", "skipped"):
        table.add_row(name.replace("_", " "), str(getattr(report, name)))
    table.add_row("chunks in the index", str(report.chunks))
    out_console.print(table)
    if report.full:
        out_console.print(f"read every chunk file: {escape(report.reason)}", highlight=False)
    if report.reconcile:
        fixed = {k: v for k, v in report.fixed.items() if v}
        if fixed:
            for kind, ids in fixed.items():
                out_console.print(f"fixed {len(ids)} {kind}: {escape(', '.join(ids[:5]))}", highlight=False)
        else:
            out_console.print("reconcile: the index equals the chunk files; nothing to fix")
    if report.truncated:
        out_console.print(
            f"[yellow]{report.truncated} chunk(s) exceed the embedder's window of {report.max_tokens} "
            "wordpieces: only their beginning is embedded[/]"
        )
    if report.embedded_on:
        where = report.embedded_on
        nodes = ", ".join(f"{node[:12]}: {n}" for node, n in where["texts_by_node"].items())
        out_console.print(
            f"embedded on Ray: {where['batches']} batches, {where['actors']} actors, "
            f"{where['resent']} re-sent; texts by node: {escape(nodes) or 'none'}",
            highlight=False,
        )
    out_console.print(
        f"embedder {escape(report.embed_model)}: {escape(report.embedder_reason)}; "
        f"analyzer {escape(report.analyzer)}: {escape(report.analyzer_reason)}; "
        f"hybrid dense weight {report.dense_weight:g}: {escape(report.dense_weight_reason)}",
        highlight=False,
    )
    out_console.print(
        f"{escape(report.store)} · {escape(report.embed_model)} · index_hash {escape(report.index_hash)} "
        f"· {report.seconds:.2f} s",
        highlight=False,
    )


def search_cmd(
    query: Annotated[str, typer.Argument(metavar="QUERY", help="What to look for (any text).")],
    out: IndexOutOpt = Path("chunks"),
    store: StoreOpt = None,
    k: Annotated[int, typer.Option("-k", "--k", min=1, max=1000, help="How many chunks to return.")] = 10,
    mode: Annotated[
        str, typer.Option("--mode", help="hybrid (both rankers, fused by z-score), dense or bm25.")
    ] = "hybrid",
    embedder: EmbedderOpt = None,
    quiet: QuietOpt = False,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print 004's retrieval result record with 001's citations.")
    ] = False,
    html: Annotated[
        Path | None,
        typer.Option(
            "--html",
            metavar="FILE",
            help="Also write the hits, highlighted in their source, as one HTML page.",
        ),
    ] = None,
    expand: Annotated[
        int | None,
        typer.Option(
            "--expand",
            min=0,
            metavar="TOKENS",
            help="Merge each hit with its ranked neighbours in its document (across headings) into one "
            f"passage of at most TOKENS, cited as one span (0 = off; default {DEFAULT_BUDGET}, "
            f"{CJK_PASSAGE_TOKENS} for an index of Chinese, Japanese or Korean text).",
        ),
    ] = None,
    no_expand: Annotated[
        bool, typer.Option("--no-expand", help="Plain chunks, no passages (= --expand 0).")
    ] = False,
    dense_weight: DenseWeightOpt = None,
) -> None:
    """Search the index: ranked passages (a hit and its ranked neighbours) with their source,
    lines and citation payload."""
    from pipeline.index.query import search
    from pipeline.index.vector_store import IndexMismatchError

    try:
        record = search(out, query, k=k, mode=mode, store=store, embedder=embedder,
                        expand_tokens=0 if no_expand else expand, dense_weight=dense_weight)  # fmt: skip
        if html is not None:
            _write_search_page(record, query, out, html)
    except IndexMismatchError as exc:
        raise _mismatch(exc, json_out) from None
    except PipelineError as exc:
        raise usage_error(exc, json_out) from None
    if json_out:
        sys.stdout.write(orjson.dumps(record, option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    for warning in record["warnings"]:
        err.print(f"[yellow]{escape(warning)}[/]")
    if quiet:
        for item in record["items"]:
            out_console.print(
                f"{item['file']}:{item['lineSpan']['lineStart']}\t{item['snippet_id']}", markup=False
            )
        return
    from rich.table import Table

    table = Table(title=f"chunkyard search ({mode}, index {record['index_hash']})", title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("score", justify="right")
    table.add_column("source:line", style="cyan", no_wrap=True)
    table.add_column("section")
    table.add_column("snippet")
    for item in record["items"]:
        snippet = " ".join(item["text"].split())
        table.add_row(
            str(item["k_final"]),
            f"{item['score_norm']:.3f}",
            Text(f"{item['file']}:{item['lineSpan']['lineStart']}"),
            Text(item["breadcrumb"] or item["title"]),
            Text(snippet[:160] + ("…" if len(snippet) > 160 else "")),
        )
    out_console.print(table)
    if not record["items"] and not record["warnings"]:
        out_console.print("no chunk matched")


def _write_search_page(record: dict[str, Any], query: str, out: Path, html: Path) -> None:
    """``search --html FILE``: the hits inside their sources (issue 20), read through the chunk store."""
    from pipeline.audit.chunk_state import open_store
    from pipeline.view import render_search
    from pipeline.view.page import write_page

    write_page(html, render_search({**record, "query": query}, open_store(out)))
