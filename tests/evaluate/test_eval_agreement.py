"""The metrics agree with trec_eval (pytrec_eval) on the same runs, ties made explicit."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from pipeline.evaluate.export import (
    answer_qrels,
    answer_run,
    chunk_qrels,
    docno,
    scored_run,
    trec_qrels,
    trec_run,
)
from pipeline.evaluate.gold import parse_gold
from pipeline.evaluate.metrics import evaluate_run

pytrec_eval = pytest.importorskip("pytrec_eval")

MEASURES = {"recall.1,5,10", "recip_rank", "ndcg_cut.10"}


def trec(qrels, run) -> dict[str, dict[str, float]]:
    """trec_eval's measures on the top 10 of each ranking (recip_rank has no cut-off of its own)."""
    as_dict = {q: dict(items[:10]) for q, items in run.items()}
    return pytrec_eval.RelevanceEvaluator(qrels, MEASURES).evaluate(as_dict)


def ours_vs_trec(ours: dict[str, float], theirs: dict[str, float]) -> None:
    assert ours["recall@1"] == pytest.approx(theirs["recall_1"])
    assert ours["recall@5"] == pytest.approx(theirs["recall_5"])
    assert ours["recall@10"] == pytest.approx(theirs["recall_10"])
    assert ours["MRR@10"] == pytest.approx(theirs["recip_rank"])
    assert ours["nDCG@10"] == pytest.approx(theirs["ndcg_cut_10"])


def random_case(tmp_path: Path, seed: int):
    """Three documents, a pool of overlapping windows (sizes 40-400), 60 answers, random runs."""
    rng = random.Random(seed)
    sources = {}
    for name in ("a.md", "b/c.md", "d e.md"):
        text = "".join(rng.choice("abcdefgh \n") for _ in range(3000))
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
        sources[name] = text
    pool = []
    for name in sources:
        pos = 0
        while pos < 3000:
            size = rng.choice((40, 120, 400))
            end = min(3000, pos + size)
            pool.append({"chunk_id": f"{name}#{pos}", "source": name, "offsets": {"start": pos, "end": end}, "tokens": 1})
            if end == 3000:
                break
            pos = end - rng.choice((0, 0, size // 2))  # some windows overlap by half
    lines = []
    for n in range(60):
        name = rng.choice(sorted(sources))
        start = rng.randrange(0, 2690)
        lines.append(json.dumps({"id": f"q{n}", "question": "?", "source": name, "start": start,
                                 "end": start + rng.choice((21, 81, 301))}))
    gold = parse_gold(lines, "gold.jsonl", tmp_path)
    run = {}
    for q in gold:
        if q.id == "q0":
            continue  # a question the run does not answer at all
        same = [c for c in pool if c["source"] == q.source]
        picks = rng.sample(same, min(len(same), 8))
        picks += rng.sample([c for c in pool if c not in picks], 12)
        rng.shuffle(picks)
        run[q.id] = [{**c, "score": rng.choice((1.0, 0.5, 0.25))} for c in picks]  # many ties
    return gold, run, pool


@pytest.mark.parametrize("seed", range(5))
def test_answer_level_agrees_with_trec_eval(tmp_path: Path, seed: int) -> None:
    gold, run, _ = random_case(tmp_path, seed)
    report = evaluate_run(gold, run)
    theirs = trec(answer_qrels(gold), answer_run(gold, run))
    for score in report.per_query:
        if score.id in theirs:
            ours_vs_trec(score.metrics(), theirs[score.id])
        else:
            assert score.retrieved == 0 and score.metrics()["recall@10"] == 0
    mean = {m: sum(t[m] for t in theirs.values()) / len(gold) for m in next(iter(theirs.values()))}
    ours_vs_trec(report.metrics, mean)  # q0 counts as 0 in both means


def test_strict_variant_agrees_with_trec_eval(tmp_path: Path) -> None:
    gold, run, _ = random_case(tmp_path, 99)
    report = evaluate_run(gold, run)
    theirs = trec(answer_qrels(gold), answer_run(gold, run, threshold=1.0))
    for score in report.per_query:
        if score.id in theirs:
            ours_vs_trec(score.metrics(strict=True), theirs[score.id])


def test_ties_break_by_docno_descending_unless_made_explicit(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("x" * 100, encoding="utf-8")
    gold = parse_gold([json.dumps({"id": "q", "question": "?", "source": "a.md", "start": 0, "end": 10})],
                      "g", tmp_path)
    # the retriever ranks the miss "m" before the hit "h", both at score 0.5 (its own tiebreak)
    run = {"q": [{"chunk_id": "m", "source": "a.md", "offsets": {"start": 50, "end": 60}, "score": 0.5,
                  "tokens": 1},
                 {"chunk_id": "h", "source": "a.md", "offsets": {"start": 0, "end": 10}, "score": 0.5,
                  "tokens": 1}]}
    qrels = {"q": {"h": 1}}
    # raw tied scores: trec_eval reorders by docno descending ("m" > "h"), here by luck the same order
    raw = trec(qrels, {"q": [("m", 0.5), ("h", 0.5)]})["q"]
    assert raw["recip_rank"] == 0.5
    # rename so that docno order disagrees with the retriever's: trec_eval puts "z" (hit) first
    run["q"][1]["chunk_id"] = "z"
    naive = trec({"q": {"z": 1}}, {"q": [("m", 0.5), ("z", 0.5)]})["q"]
    assert naive["recip_rank"] == 1.0  # not what the retriever returned
    explicit = scored_run(run)
    assert explicit["q"] == [("m", 2.0), ("z", 1.0)]  # scores now fall strictly with the rank
    assert trec({"q": {"z": 1}}, explicit)["q"]["recip_rank"] == 0.5
    assert evaluate_run(gold, run).metrics["MRR@10"] == 0.5


def test_chunk_level_qrels_agree_when_chunks_do_not_overlap(tmp_path: Path) -> None:
    """With disjoint chunks at most one covers > 50 %; the BEIR-style qrels give the same numbers."""
    rng = random.Random(7)
    text = "".join(rng.choice("abc ") for _ in range(5000))
    (tmp_path / "a.md").write_text(text, encoding="utf-8")
    cuts = sorted(rng.sample(range(1, 5000), 60))
    pool = [{"chunk_id": f"c{n:03d}", "source": "a.md", "offsets": {"start": a, "end": b}, "tokens": 1}
            for n, (a, b) in enumerate(zip([0, *cuts], [*cuts, 5000], strict=True))]
    lines = []
    for n in range(40):
        start = rng.randrange(0, 4900)
        lines.append(json.dumps({"id": f"q{n}", "question": "?", "source": "a.md", "start": start,
                                 "end": start + rng.choice((31, 91))}))
    gold = parse_gold(lines, "g", tmp_path)
    qrels = chunk_qrels(gold, pool)
    assert all(len(docs) <= 1 for docs in qrels.values())
    answered = [q for q in gold if qrels[q.id]]
    run = {q.id: rng.sample(pool, 15) for q in answered}
    theirs = trec({q.id: qrels[q.id] for q in answered}, scored_run(run))
    for score in evaluate_run(answered, run).per_query:
        ours_vs_trec(score.metrics(), theirs[score.id])


def test_trec_files(tmp_path: Path) -> None:
    run = {"q1": [{"chunk_id": "odd names/!|r=1|s=0", "source": "x", "start": 0, "end": 1, "score": 3.0},
                  {"chunk_id": "b", "source": "x", "start": 0, "end": 1, "score": 2.5}]}
    text = trec_run(scored_run(run), tag="t")
    assert text == "q1 Q0 odd%20names/!|r=1|s=0 1 3.000000 t\nq1 Q0 b 2 2.500000 t\n"
    assert trec_qrels({"q1": {"b": 1}}) == "q1 0 b 1\n"
    assert docno("50% a\tb") == "50%25%20a%09b"
