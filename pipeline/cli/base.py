"""What every command shares: the typer app, the consoles, the common options and usage errors."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import orjson
import typer
from rich.console import Console

from pipeline.errors import PipelineError
from pipeline.models import Policy
from pipeline.stages.tokens import TOKENIZERS

if TYPE_CHECKING:
    from rich.progress import Progress

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
DenseWeightOpt = Annotated[
    float | None,
    typer.Option(
        "--dense-weight",
        min=0.0,
        metavar="W",
        help="Hybrid: the dense list's weight against BM25's 1 (default: the index's, from `index --dense-weight`, "
        "else its language's: 1, or for CJK text 0.7 by the multilingual model, 0.1 by the English one). "
        "Corpora differ: measure yours with `chunkyard eval GOLD --dense-weight W`.",
    ),
]


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


# --- audit tools (docs/spec.md, "Audit"): validate, resolve, check-citations --------------------------------

AuditOutOpt = Annotated[Path, typer.Option("--out", "-o", help="Chunk folder to audit.")]
AuditCorpusOpt = Annotated[
    Path | None,
    typer.Option("--corpus", help="The corpus folder.", show_default="the manifest's corpus, else corpus/"),
]


def usage_error(exc: PipelineError, json_out: bool) -> typer.Exit:
    """Report a setup problem (no such folder, no manifest): exit 2."""
    from rich.markup import escape

    if json_out:
        sys.stdout.write(
            orjson.dumps({"code": "usage_error", "ok": False, "error": str(exc)}).decode() + "\n"
        )
    err.print(f"[red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
    return typer.Exit(2)


def bar_progress(show: bool, *extra: str) -> Progress:
    """The long-run progress bar on stderr (``description  ━━━━  n/total  [extra]  eta``),
    gone when done; ``show`` off (``--quiet``, ``--json``, not a terminal) disables it.
    ``extra``: format strings of more text columns (``"{task.fields[doc]}"``)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        *(TextColumn(text) for text in extra),
        TimeRemainingColumn(),
        console=err,
        transient=True,
        disable=not show,
    )
