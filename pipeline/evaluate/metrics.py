"""Retrieval metrics over a gold set: recall@k, MRR@10, nDCG@10, recall in a token budget, citations.

**The hit rule.** A retrieved item is a *hit* for a question when it comes from the
question's source and its span ``[start, end)`` covers at least half of the answer's span
(``coverage >= 0.5``); the *strict* variant asks for the whole answer (``coverage == 1``).
Each question has one answer, so the metrics are answer-level: what counts is the rank of
the **first** hit; later hits repeat an answer already found and earn nothing (a chunker
whose overlapping windows return the same passage twice gains nothing from it).

- ``recall@k``: 1 when the first hit is within the top ``k``.
- ``MRR@10``: ``1/rank`` of the first hit within the top 10, else 0.
- ``nDCG@10``: ``1/log2(rank + 1)`` of the first hit within the top 10, else 0 (one
  relevant answer: the ideal DCG is 1). This is trec_eval's ``ndcg_cut.10`` on a run whose
  items are mapped to the answer they hit, first occurrence kept (``export.answer_run``).
- ``recall@{B}tok``: 1 when the first hit lies in the longest prefix of the ranking whose
  items hold at most ``B`` tokens in all: what fits in a prompt. An item's tokens are its
  ``tokens`` (chunkyard: ``tokenStats.tokens``) or, when absent, its text counted in cl100k.
- ``citation_match`` (001): of the questions with a hit in the top 10, the share whose first
  hit's offsets, applied to the source as it is now, give back the item's text exactly (and
  whose ``rev``, when the item carries one, is the source's current ``rev``).

The rank is the item's position in the list it comes in; a retriever breaks its own ties
(``score_norm`` desc, ``section_id`` asc, ``snippet_id`` asc: docs/spec.md, "Index, search and
evaluation"). Every mean is over
all questions of the gold set; a question absent from the run counts as nothing retrieved.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageError
from ..stages.tokens import Counter
from .gold import GoldQuestion, Sources

KS = (1, 5, 10)
BUDGETS = (1000, 2000)
CUTOFF = 10  #: MRR and nDCG are cut at this rank
HIT_COVERAGE = 0.5
STRICT_COVERAGE = 1.0


@dataclass(frozen=True, slots=True)
class Retrieved:
    """One ranked item, in whatever shape the retriever gave it (see ``retrieved_from``)."""

    chunk_id: str
    source: str
    start: int
    end: int
    tokens: int | None = None
    score: float | None = None
    text: str | None = None
    rev: str | None = None


def _first(item: Mapping[str, Any], *names: str) -> Any:
    for name in names:
        value: Any = item
        for part in name.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        if value is not None:
            return value
    return None


def retrieved_from(item: Mapping[str, Any] | Retrieved, where: str = "item") -> Retrieved:
    """Read a search result item, a chunk file record or a peer's chunk into ``Retrieved``.

    Accepted fields: the id from ``snippet_id``, ``chunk_id`` or ``id``; the corpus-relative
    path from ``file`` (``chunkyard search``), ``metadata.sourceFile`` (a chunk file),
    ``sourceFile``, ``source`` or ``source_url``, in that order (front matter may set
    ``source_url`` to a web address, and a search item's ``source`` names the ranker that
    found it, so the path fields win); the span from
    ``offsets {start, end}``, ``charOffsets {charStart, charEnd}``, ``charStart``/``charEnd``
    or ``start``/``end``; tokens from ``tokens`` or ``tokenStats.tokens``; the score from
    ``score``, ``score_norm`` or ``score_raw``; the text from ``originalText`` or ``text``.
    """
    if isinstance(item, Retrieved):
        return item
    chunk_id = _first(item, "snippet_id", "chunk_id", "id")
    source = _first(item, "file", "metadata.sourceFile", "sourceFile", "source", "source_url")
    start = _first(item, "offsets.start", "charOffsets.charStart", "charStart", "start")
    end = _first(item, "offsets.end", "charOffsets.charEnd", "charEnd", "end")
    missing = [
        n
        for n, v in (("chunk id", chunk_id), ("source", source), ("start", start), ("end", end))
        if v is None
    ]
    if missing:
        raise UsageError(
            f"{where}: retrieved item has no {', '.join(missing)} "
            "(hint: give snippet_id/chunk_id, source or source_url, and offsets {start, end})"
        )
    offsets = _first(item, "offsets.unit")
    if offsets not in (None, "char"):
        raise UsageError(f"{where}: offsets are in {offsets!r} units (hint: give character offsets)")
    tokens = _first(item, "tokens", "tokenStats.tokens")
    score = _first(item, "score", "score_norm", "score_raw")
    return Retrieved(
        chunk_id=str(chunk_id),
        source=str(source),
        start=int(start),
        end=int(end),
        tokens=None if tokens is None else int(tokens),
        score=None if score is None else float(score),
        text=_first(item, "originalText", "text"),
        rev=_first(item, "rev"),
    )


def coverage(item: Retrieved, gold: GoldQuestion) -> float:
    """The share of the answer's span that the item's span covers (0 for another source)."""
    if item.source != gold.source:
        return 0.0
    overlap = min(item.end, gold.end) - max(item.start, gold.start)
    return max(0, overlap) / (gold.end - gold.start)


@dataclass(frozen=True, slots=True)
class QueryScore:
    """How one question fared: ranks of its first hits, and what fits in each budget."""

    id: str
    retrieved: int
    first_hit: int | None
    """1-based rank of the first item covering ≥ 50 % of the answer."""
    first_full_hit: int | None
    """1-based rank of the first item covering all of it."""
    fits: Mapping[int, int]
    """Per token budget: how many top items fit in it."""
    citation: bool | None
    """Whether the first hit in the top 10 is a verifiable citation (None: no such hit)."""

    def metrics(self, strict: bool = False) -> dict[str, float]:
        """This question's metrics (see the module docstring)."""
        rank = self.first_full_hit if strict else self.first_hit
        out = {f"recall@{k}": float(rank is not None and rank <= k) for k in KS}
        top = rank is not None and rank <= CUTOFF
        out[f"MRR@{CUTOFF}"] = 1.0 / rank if top and rank else 0.0
        out[f"nDCG@{CUTOFF}"] = 1.0 / math.log2(rank + 1) if top and rank else 0.0
        for budget, n in sorted(self.fits.items()):
            out[f"recall@{budget}tok"] = float(rank is not None and rank <= n)
        return out


@dataclass(frozen=True, slots=True)
class ModeReport:
    """Mean metrics of one retrieval mode over a gold set, and the per-question scores."""

    mode: str
    questions: int
    metrics: dict[str, float]
    strict: dict[str, float]
    per_query: list[QueryScore] = field(repr=False)


def _citation(item: Retrieved, sources: Sources | None) -> bool | None:
    if sources is None:
        return None
    try:
        doc = sources.get(item.source)
    except UsageError:
        return False
    if not 0 <= item.start < item.end <= len(doc.text):
        return False
    if item.rev is not None and item.rev != doc.rev:
        return False
    return item.text is None or doc.text[item.start : item.end] == item.text


def score_query(
    gold: GoldQuestion,
    items: Sequence[Mapping[str, Any] | Retrieved],
    *,
    budgets: Sequence[int] = BUDGETS,
    sources: Sources | None = None,
    count: Callable[[str], int] | None = None,
) -> QueryScore:
    """Score one question's ranked items. ``sources`` enables the citation check."""
    ranked = [retrieved_from(it, f"{gold.id}: item {n}") for n, it in enumerate(items, 1)]
    if len({it.chunk_id for it in ranked}) < len(ranked):
        seen: dict[str, int] = {}
        for rank, it in enumerate(ranked, 1):
            if it.chunk_id in seen:
                raise UsageError(
                    f"{gold.id}: chunk {it.chunk_id} is ranked twice ({seen[it.chunk_id]} and {rank}) "
                    "(hint: a ranking lists each chunk once)"
                )
            seen[it.chunk_id] = rank
    first = full = None
    for rank, item in enumerate(ranked, 1):
        cov = coverage(item, gold)
        if first is None and cov >= HIT_COVERAGE:
            first = rank
        if full is None and cov >= STRICT_COVERAGE:
            full = rank
        if full is not None:
            break
    fits: dict[int, int] = {}
    for budget in budgets:
        used = n = 0
        for item in ranked:
            used += _tokens(item, gold.id, count)
            if used > budget:
                break
            n += 1
        fits[budget] = n
    citation = _citation(ranked[first - 1], sources) if first is not None and first <= CUTOFF else None
    return QueryScore(gold.id, len(ranked), first, full, fits, citation)


def _tokens(item: Retrieved, qid: str, count: Callable[[str], int] | None) -> int:
    if item.tokens is not None:
        return item.tokens
    if item.text is None:
        raise UsageError(f"{qid}: item {item.chunk_id} has neither tokens nor text (hint: give either)")
    return (count or _default_count())(item.text)


_COUNT: list[Callable[[str], int]] = []


def _default_count() -> Callable[[str], int]:
    if not _COUNT:
        _COUNT.append(Counter("cl100k_base").count)
    return _COUNT[0]


def mean_metrics(scores: Sequence[QueryScore], strict: bool = False) -> dict[str, float]:
    """Each metric's mean over the questions; ``citation_match`` over questions with a hit."""
    if not scores:
        return {}
    rows = [s.metrics(strict) for s in scores]
    out = {name: sum(r[name] for r in rows) / len(rows) for name in rows[0]}
    if not strict:
        checked = [s.citation for s in scores if s.citation is not None]
        if checked:
            out["citation_match"] = sum(checked) / len(checked)
    return out


def evaluate_run(
    gold: Sequence[GoldQuestion],
    run: Mapping[str, Sequence[Mapping[str, Any] | Retrieved]],
    *,
    mode: str = "run",
    budgets: Sequence[int] = BUDGETS,
    sources: Sources | None = None,
    count: Callable[[str], int] | None = None,
) -> ModeReport:
    """Score a run (question id → ranked items) against a gold set."""
    scores = [score_query(q, run.get(q.id, ()), budgets=budgets, sources=sources, count=count) for q in gold]
    return ModeReport(mode, len(gold), mean_metrics(scores), mean_metrics(scores, strict=True), scores)


def evaluate_modes(
    gold: Sequence[GoldQuestion],
    runs: Mapping[str, Mapping[str, Sequence[Mapping[str, Any] | Retrieved]]],
    **kwargs: Any,
) -> dict[str, ModeReport]:
    """``evaluate_run`` per mode (``dense``, ``bm25``, ``hybrid`` …), in the order given."""
    return {mode: evaluate_run(gold, run, mode=mode, **kwargs) for mode, run in runs.items()}
