"""Exports for other evaluation tools: BEIR folders, TREC run and qrels files (research §6.1).

- **BEIR**: ``corpus.jsonl`` (``_id``, ``title``, ``text``), ``queries.jsonl`` (``_id``,
  ``text``), ``qrels/test.tsv`` (a header row, then ``query-id corpus-id score``). Its qrels
  are chunk-level: every chunk of the pool that covers ≥ 50 % of a question's answer is
  relevant, so a chunker with overlapping windows has several relevant chunks per question.
- **TREC**: run lines ``qid Q0 docno rank score tag``, qrels lines ``qid 0 docno rel``.
  trec_eval ignores the rank column, orders by score and breaks ties by docno
  **descending**; ``trec_run`` keeps the retriever's order by writing scores that fall
  strictly with the rank whenever the given scores would not (ties, missing scores).
- ``answer_run``/``answer_qrels``: the answer-level view ``metrics`` computes, for any tool:
  the first item that hits the answer becomes the document ``answer:<qid>``, later hits are
  dropped (they repeat the answer), the rest keep their own docno.

A docno has no whitespace: spaces, tabs, newlines and ``%`` in chunk ids are %-escaped.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .gold import GoldQuestion
from .metrics import HIT_COVERAGE, Retrieved, coverage, retrieved_from

Run = Mapping[str, Sequence[Mapping[str, Any] | Retrieved]]
#: question id → ranked (docno, score), the shape pytrec_eval and ranx take as dicts.
ScoredRun = dict[str, list[tuple[str, float]]]

_ESCAPES = {"%": "%25", " ": "%20", "\t": "%09", "\n": "%0A", "\r": "%0D"}


def docno(chunk_id: str) -> str:
    """A chunk id as a TREC docno: no whitespace (``%``-escaped)."""
    return "".join(_ESCAPES.get(c, c) for c in chunk_id)


def answer_docno(qid: str) -> str:
    """The docno that stands for a question's answer in the answer-level view."""
    return docno(f"answer:{qid}")


def _explicit_scores(items: Sequence[Retrieved]) -> list[float]:
    scores = [it.score for it in items if it.score is not None]
    if len(scores) == len(items) and all(a > b for a, b in itertools.pairwise(scores)):
        return scores
    return [float(len(items) - n) for n in range(len(items))]


def scored_run(run: Run) -> ScoredRun:
    """Ranked (docno, score) per question, the scores falling strictly with the rank."""
    out: ScoredRun = {}
    for qid, items in run.items():
        ranked = [retrieved_from(it, f"{qid}: item {n}") for n, it in enumerate(items, 1)]
        out[qid] = list(zip([docno(it.chunk_id) for it in ranked], _explicit_scores(ranked), strict=True))
    return out


def answer_run(gold: Sequence[GoldQuestion], run: Run, threshold: float = HIT_COVERAGE) -> ScoredRun:
    """The answer-level run: the first hit becomes ``answer:<qid>``, later hits are dropped."""
    out: ScoredRun = {}
    for q in gold:
        ranked = [retrieved_from(it, f"{q.id}: item {n}") for n, it in enumerate(run.get(q.id, ()), 1)]
        kept: list[tuple[str, float]] = []
        found = False
        for item in ranked:
            if coverage(item, q) >= threshold:
                if found:
                    continue
                found = True
                kept.append((answer_docno(q.id), 0.0))
            else:
                kept.append((docno(item.chunk_id), 0.0))
        scores = [float(len(kept) - n) for n in range(len(kept))]
        out[q.id] = [(d, s) for (d, _), s in zip(kept, scores, strict=True)]
    return out


def answer_qrels(gold: Sequence[GoldQuestion]) -> dict[str, dict[str, int]]:
    """One relevant document per question: its answer."""
    return {q.id: {answer_docno(q.id): 1} for q in gold}


def chunk_qrels(
    gold: Sequence[GoldQuestion],
    chunks: Iterable[Mapping[str, Any] | Retrieved],
    threshold: float = HIT_COVERAGE,
) -> dict[str, dict[str, int]]:
    """Every chunk of the pool that covers ≥ ``threshold`` of a question's answer."""
    by_source: dict[str, list[Retrieved]] = {}
    for n, c in enumerate(chunks, 1):
        chunk = retrieved_from(c, f"chunk {n}")
        by_source.setdefault(chunk.source, []).append(chunk)
    return {
        q.id: {docno(c.chunk_id): 1 for c in by_source.get(q.source, ()) if coverage(c, q) >= threshold}
        for q in gold
    }


def trec_run(run: ScoredRun, tag: str = "chunkyard") -> str:
    """TREC run text, ``qid Q0 docno rank score tag`` per line."""
    return "".join(
        f"{qid} Q0 {d} {rank} {score:.6f} {tag}\n"
        for qid, items in run.items()
        for rank, (d, score) in enumerate(items, 1)
    )


def trec_qrels(qrels: Mapping[str, Mapping[str, int]]) -> str:
    """TREC qrels text, ``qid 0 docno rel`` per line."""
    return "".join(f"{qid} 0 {d} {rel}\n" for qid, docs in qrels.items() for d, rel in docs.items())


def write_beir(
    out: Path,
    gold: Sequence[GoldQuestion],
    chunks: Sequence[Mapping[str, Any] | Retrieved],
    threshold: float = HIT_COVERAGE,
) -> Path:
    """Write a BEIR folder (corpus, queries, chunk-level qrels/test.tsv) and return it."""
    pool = [retrieved_from(c, f"chunk {n}") for n, c in enumerate(chunks, 1)]
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    with (out / "corpus.jsonl").open("w", encoding="utf-8") as fh:
        for c in pool:
            meta = {"source": c.source, "start": c.start, "end": c.end}
            row = {"_id": docno(c.chunk_id), "title": "", "text": c.text or "", "metadata": meta}
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    with (out / "queries.jsonl").open("w", encoding="utf-8") as fh:
        for q in gold:
            fh.write(json.dumps({"_id": q.id, "text": q.question}, ensure_ascii=False) + "\n")
    rows = ["query-id\tcorpus-id\tscore\n"]
    for qid, docs in chunk_qrels(gold, pool, threshold).items():
        rows.extend(f"{qid}\t{d}\t{rel}\n" for d, rel in docs.items())
    (out / "qrels" / "test.tsv").write_text("".join(rows), encoding="utf-8")
    return out
