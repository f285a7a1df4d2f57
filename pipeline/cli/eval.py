"""``chunkyard eval GOLD.jsonl``: a gold set asked of the index, scored as 004's metrics pack.

The contract: docs/spec.md, "Index, search and evaluation".

Thin over ``pipeline.evaluate.run.run_eval``: this module opens the index that
``chunkyard index`` built, hands its search function to ``run_eval``, and prints the pack
(a rich table, or the JSON with ``--json``), with BEIR / TREC exports and an HTML page on
request.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from pipeline.cli.base import AuditCorpusOpt, DenseWeightOpt, JsonOpt, QuietOpt, err, out_console, usage_error
from pipeline.errors import PipelineError, UsageError
from pipeline.index.expand import DEFAULT_BUDGET

MODES = ("hybrid", "dense", "bm25")
#: The columns of the table, in the order 004 and MTEB list them (nDCG@10 is the headline).
COLUMNS = ("recall@1", "recall@5", "recall@10", "MRR@10", "nDCG@10", "recall@1000tok", "recall@2000tok")

#: Short column labels (the pack's names in full under ``--json``).
LABELS = {
    "recall@1": "R@1",
    "recall@5": "R@5",
    "recall@10": "R@10",
    "recall@1000tok": "R@1k tok",
    "recall@2000tok": "R@2k tok",
    "citation_match": "cite",
}

GoldArg = Annotated[
    Path,
    typer.Argument(
        metavar="GOLD.jsonl", help="Gold set: one JSON line per question (id, question, source, quote)."
    ),
]
EvalOutOpt = Annotated[Path, typer.Option("--out", "-o", help="Chunk folder whose index is asked.")]
StoreOpt = Annotated[
    Path | None,
    typer.Option("--store", help="The index file.", show_default="the index under CHUNKS/.chunkyard/"),
]
KOpt = Annotated[
    int,
    typer.Option("-k", "--k", min=10, help="Items retrieved per question (enough to fill 2,000 tokens)."),
]
ModeOpt = Annotated[
    list[str] | None,
    typer.Option("--mode", help="hybrid, dense or bm25 (repeatable).", show_default="all three"),
]
ExpandOpt = Annotated[
    int | None,
    typer.Option(
        "--expand",
        min=0,
        metavar="TOKENS",
        help="Merge each hit with its ranked neighbours (across headings) up to TOKENS, cited as one span "
        f"(0 = off; default {DEFAULT_BUDGET}, the index language's for CJK text), exactly as `chunkyard search` does.",
    ),
]
NoExpandOpt = Annotated[bool, typer.Option("--no-expand", help="Plain chunks, no passages (= --expand 0).")]
PerQueryOpt = Annotated[bool, typer.Option("--per-query", help="One row per question and mode.")]
BeirOpt = Annotated[
    Path | None,
    typer.Option("--beir", metavar="DIR", help="Also write a BEIR folder (corpus, queries, qrels)."),
]
TrecOpt = Annotated[
    Path | None, typer.Option("--trec", metavar="DIR", help="Also write TREC run and qrels files.")
]
HtmlOpt = Annotated[
    Path | None, typer.Option("--html", metavar="FILE", help="Also write the evaluation as one HTML page.")
]


def open_index_search(
    out: Path,
    store: Path | None,
    expand_tokens: int | None = None,
    corpus: Path | None = None,
    dense_weight: float | None = None,
) -> tuple[Any, dict[str, Any]]:
    """The index's ``search(query, mode, k)`` (``pipeline.index.query.Searcher``, passages of
    ``expand_tokens``, hybrid with ``dense_weight`` (``None``: the index's), as ``chunkyard
    search`` gives them) and its identity (``index_hash``, ``embed_model``, ``analyzer``, as the
    index records them, ``expand_tokens`` and the hybrid ``weights``)."""
    try:
        from pipeline.index.query import Searcher
    except ImportError as exc:  # the index extra (apsw, sqlite-vec, onnxruntime) is missing
        raise UsageError(
            f"chunkyard eval needs the index ({exc.name} is not installed) "
            "(hint: pip install 'chunkyard[index]', then run `chunkyard index`)"
        ) from None
    weights = None if dense_weight is None else (1.0, dense_weight)
    searcher = Searcher(out, store, expand_tokens=expand_tokens, corpus=corpus, weights=weights)
    identity: dict[str, Any] = {
        key: searcher.meta[key] for key in ("index_hash", "embed_model", "analyzer") if searcher.meta.get(key)
    }
    identity["expand_tokens"] = searcher.expand_tokens  # None asked: the index language's budget
    identity["weights"] = {"bm25": searcher.weights[0], "dense": searcher.weights[1]}
    return searcher, identity


def _modes(modes: Sequence[str] | None) -> tuple[str, ...]:
    chosen = tuple(dict.fromkeys(modes or MODES))
    bad = [m for m in chosen if m not in MODES]
    if bad:
        raise typer.BadParameter(
            f"unknown mode {bad[0]!r}; choose from {', '.join(MODES)}", param_hint="--mode"
        )
    return chosen


def eval_cmd(
    gold: GoldArg,
    out: EvalOutOpt = Path("chunks"),
    corpus: AuditCorpusOpt = None,
    store: StoreOpt = None,
    k: KOpt = 50,
    mode: ModeOpt = None,
    expand: ExpandOpt = None,
    no_expand: NoExpandOpt = False,
    per_query: PerQueryOpt = False,
    beir: BeirOpt = None,
    trec: TrecOpt = None,
    html: HtmlOpt = None,
    dense_weight: DenseWeightOpt = None,
    quiet: QuietOpt = False,
    json_out: JsonOpt = False,
) -> None:
    """Ask the index every question of GOLD.jsonl and score the answers: 004's metrics pack.

    A retrieved chunk hits a question when it comes from the question's source and covers
    at least half of the answer's span (strict: all of it). Reports recall@1/5/10, MRR@10,
    nDCG@10 (the headline), recall within 1,000 / 2,000 tokens of retrieved text and
    citation match, per mode. Exit 0, or 2 when the gold set or the index cannot be used.
    """
    from pipeline.audit.chunk_state import open_store
    from pipeline.evaluate.run import prompt_search, run_eval

    modes = _modes(mode)
    try:
        chunk_store = open_store(out, corpus, need_corpus=True)
        search, identity = open_index_search(
            out, store, 0 if no_expand else expand, chunk_store.corpus, dense_weight
        )
        asked = prompt_search(search, out, chunk_store.corpus)
        result = run_eval(
            gold, chunk_store.corpus, asked, modes=modes, k=k, index=identity, per_query=per_query
        )
    except PipelineError as exc:
        raise usage_error(exc, json_out) from None
    written = _exports(result, out, beir, trec, html)
    if json_out:
        from pipeline.evaluate.pack import pack_json

        sys.stdout.write(pack_json(result.pack))
    elif not quiet:
        render_pack(result.pack, out_console)
        for path in written:
            err.print(f"wrote {path}", highlight=False, markup=False)
    raise typer.Exit(0)


def _exports(result: Any, out: Path, beir: Path | None, trec: Path | None, html: Path | None) -> list[Path]:
    """Write what was asked for besides the pack; the paths written."""
    written: list[Path] = []
    if beir is not None:
        from pipeline.evaluate.chunks import load_chunk_files
        from pipeline.evaluate.export import write_beir

        pool = [c.as_item() for c in load_chunk_files(out)]
        written.append(write_beir(beir, result.gold, pool))
    if trec is not None:
        trec.mkdir(parents=True, exist_ok=True)
        for name, text in result.trec_files().items():
            (trec / name).write_text(text, encoding="utf-8")
            written.append(trec / name)
    if html is not None:
        from pipeline.view.results import eval_rows, render_eval

        html.parent.mkdir(parents=True, exist_ok=True)
        html.write_bytes(render_eval(result.pack, eval_rows(result.gold, result.runs)))
        written.append(html)
    return written


def render_pack(pack: Mapping[str, Any], console: Console) -> None:
    """The pack as a table: one row per mode (percent), then per question when it has them."""
    from rich.table import Table

    table = Table(title=f"{pack['dataset']}: {pack['questions']} questions", title_justify="left")
    table.add_column("mode")
    for name in (*COLUMNS, "citation_match"):
        table.add_column(LABELS.get(name, name), justify="right")
    for mode, entry in pack["modes"].items():
        metrics = entry["metrics"]
        cells = [f"{100 * metrics[c]:.1f}" if c in metrics else "-" for c in (*COLUMNS, "citation_match")]
        table.add_row(mode, *cells)
    console.print(table)
    rows = pack.get("per_query")
    if rows:
        per = Table(title="per question", title_justify="left")
        for name in ("mode", "id", "first hit", "first full hit", "citation"):
            per.add_column(name, justify="right" if "hit" in name else "left")
        for row in rows:
            per.add_row(
                row["mode"],
                row["id"],
                str(row["first_hit"] or "-"),
                str(row["first_full_hit"] or "-"),
                {True: "ok", False: "no", None: "-"}[row["citation"]],
            )
        console.print(per)
    console.print(
        f"hit: a chunk of the answer's source covering ≥ {pack['hit_rule']['coverage']:.0%} of its span; "
        f"budgets in {pack['budgets']['tokenizer']} tokens",
        highlight=False,
    )
