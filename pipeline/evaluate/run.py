"""One evaluation, end to end: a gold file, a search function, the modes → reports, the pack, the runs.

``chunkyard eval`` is this plus an index: it hands ``run_eval`` a ``search(query, mode, k)``
that asks the index (issue 16), and renders the pack. Anything that ranks chunks of the
same corpus can be evaluated the same way (the bench hands in its peers' retrievers).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .export import answer_qrels, answer_run, scored_run, trec_qrels, trec_run
from .gold import GoldQuestion, Sources, load_gold
from .metrics import BUDGETS, ModeReport, evaluate_modes
from .pack import gold_digest, metrics_pack

#: ``search(query, mode, k)`` → ranked items (``metrics.retrieved_from`` shapes).
SearchFn = Callable[[str, str, int], Sequence[Mapping[str, Any]]]


@dataclass(frozen=True, slots=True)
class EvalResult:
    """What one evaluation produced: the questions, each mode's report and run, and the pack."""

    gold: list[GoldQuestion]
    reports: dict[str, ModeReport]
    runs: dict[str, dict[str, list[Mapping[str, Any]]]]
    pack: dict[str, Any]

    def trec_files(self, tag: str = "chunkyard") -> dict[str, str]:
        """TREC texts: ``<mode>.run`` (chunk ids, ties made explicit), ``<mode>.answer.run`` and
        ``answer.qrels`` (the answer-level view whose trec_eval numbers equal the pack's)."""
        files = {"answer.qrels": trec_qrels(answer_qrels(self.gold))}
        for mode, run in self.runs.items():
            files[f"{mode}.run"] = trec_run(scored_run(run), f"{tag}-{mode}")
            files[f"{mode}.answer.run"] = trec_run(answer_run(self.gold, run), f"{tag}-{mode}")
        return files


def run_eval(
    gold_path: Path,
    corpus: Path,
    search: SearchFn,
    *,
    modes: Sequence[str] = ("hybrid", "dense", "bm25"),
    k: int = 50,
    budgets: Sequence[int] = BUDGETS,
    dataset: str | None = None,
    index: Mapping[str, Any] | None = None,
    per_query: bool = False,
) -> EvalResult:
    """Ask every gold question in every mode and score the answers (``k`` ≥ what fills the budgets)."""
    gold = load_gold(gold_path, corpus)
    runs = {mode: {q.id: list(search(q.question, mode, k)) for q in gold} for mode in modes}
    reports = evaluate_modes(gold, runs, budgets=budgets, sources=Sources(corpus))
    pack = metrics_pack(
        reports,
        dataset=dataset or gold_path.stem,
        gold_hash=gold_digest(gold_path),
        index=index,
        budgets=budgets,
        per_query=per_query,
    )
    return EvalResult(gold, reports, runs, pack)


def prompt_search(
    search: SearchFn, out: Path, corpus: Path, expand_tokens: int = 0, ranked_only: bool = True
) -> SearchFn:
    """``search`` as the prompt sees it: with ``expand_tokens``, each hit grown into its
    same-section neighbours up to that many tokens (``pipeline.index.expand``, one citation
    span read from the source; with ``ranked_only``, only into neighbours the search ranked
    too, so adjacent hits merge); every item's tokens counted again from its text in cl100k,
    so the budgets mean the same whatever tokenizer the chunk policy used."""
    from ..chunkfolder import iter_chunk_files, read_chunk_file
    from ..index.expand import chunk_spans, expand

    sources = Sources(corpus)
    spans = None
    if expand_tokens:
        spans = chunk_spans(read_chunk_file(out / rel) for rel in iter_chunk_files(out))

    def text_of(source: str, start: int, end: int) -> str:
        return sources.get(source).text[start:end]

    def run(query: str, mode: str, k: int) -> list[dict[str, Any]]:
        items = [dict(it) for it in search(query, mode, k)]
        if spans is not None:
            items = expand(items, spans.get, expand_tokens, text_of=text_of, ranked_only=ranked_only)
        for item in items:
            if item.get("text") is not None or item.get("originalText") is not None:
                item.pop("tokens", None)
        return items

    return run
