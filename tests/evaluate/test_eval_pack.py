"""Chunkyard's own chunks of corpus/ answer every gold question; the metrics pack validates."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import jsonschema
import pytest

from pipeline.evaluate.chunks import load_chunk_files
from pipeline.evaluate.export import write_beir
from pipeline.evaluate.gold import Sources, load_gold
from pipeline.evaluate.metrics import coverage, evaluate_modes
from pipeline.evaluate.pack import gold_digest, metrics_pack, metrics_schema, pack_json

ROOT = Path(__file__).resolve().parents[2]
GOLD = ROOT / "tests" / "gold" / "corpus.jsonl"


@pytest.fixture(scope="module")
def chunk_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("chunks")
    subprocess.run(
        [sys.executable, "-m", "pipeline", "ingest", str(ROOT / "corpus"), "--out", str(out), "--quiet", "--jobs", "1"],
        check=True,
    )
    return out


def oracle_and_reverse(gold, chunks):
    """Per question: chunks ranked by how much of the answer they cover (best first), and reversed."""
    best, worst = {}, {}
    for q in gold:
        ranked = sorted(chunks, key=lambda c: (-coverage_of(c, q), c.chunk_id))
        best[q.id] = [c.as_item() for c in ranked[:10]]
        worst[q.id] = [c.as_item() for c in reversed(ranked[:10])]
    return best, worst


def coverage_of(chunk, q) -> float:
    from pipeline.evaluate.metrics import retrieved_from

    return coverage(retrieved_from(chunk.as_item()), q)


def test_every_gold_answer_lies_in_a_chunk_and_citations_match(chunk_dir: Path) -> None:
    gold = load_gold(GOLD, ROOT / "corpus")
    chunks = load_chunk_files(chunk_dir)
    assert {c.source for c in chunks} >= {q.source for q in gold}
    best, worst = oracle_and_reverse(gold, chunks)
    reports = evaluate_modes(gold, {"oracle": best, "reversed": worst}, sources=Sources(ROOT / "corpus"))
    oracle = reports["oracle"].metrics
    # the 50 % rule: some chunk of chunkyard's covers at least half of every answer, and its
    # offsets slice the source (BOM, CRLF, front matter and all) to exactly its originalText
    assert oracle["recall@1"] == 1.0
    assert oracle["citation_match"] == 1.0
    # reversing the top 10 puts the best chunk at rank 10: recall@10 holds, the rest falls
    rev = reports["reversed"].metrics
    assert rev["recall@10"] == 1.0 and rev["recall@5"] < 1.0 and rev["nDCG@10"] < oracle["nDCG@10"]


def test_pack_validates_against_its_schema(chunk_dir: Path) -> None:
    gold = load_gold(GOLD, ROOT / "corpus")
    best, _ = oracle_and_reverse(gold, load_chunk_files(chunk_dir))
    reports = evaluate_modes(gold, {"dense": best, "hybrid": best}, sources=Sources(ROOT / "corpus"))
    when = datetime(2026, 11, 25, 8, 0, tzinfo=UTC)
    pack = metrics_pack(reports, dataset="corpus", gold_hash=gold_digest(GOLD), per_query=True, now=when,
                        index={"index_hash": "sqlite:abc", "embed_model": "all-MiniLM-L6-v2"})
    validator = jsonschema.Draft202012Validator(metrics_schema(), format_checker=jsonschema.FormatChecker())
    validator.validate(json.loads(pack_json(pack)))
    assert pack["mode"] == "hybrid" and pack["nDCG@10"] == 1.0 and pack["mem_rev"] == "sqlite:abc"
    assert pack["ts"] == "2026-11-25T08:00:00Z"
    assert len(pack["per_query"]) == 2 * len(gold)
    assert pack["modes"]["dense"]["strict"]["recall@10"] <= 1.0
    broken = {**pack, "nDCG@10": 1.5}
    assert not validator.is_valid(broken)
    assert not validator.is_valid({**pack, "surprise": 1})


def test_beir_export(chunk_dir: Path, tmp_path: Path) -> None:
    gold = load_gold(GOLD, ROOT / "corpus")
    chunks = load_chunk_files(chunk_dir)
    out = write_beir(tmp_path / "beir", gold, [c.as_item() for c in chunks])
    corpus = [json.loads(line) for line in (out / "corpus.jsonl").read_text().splitlines()]
    queries = [json.loads(line) for line in (out / "queries.jsonl").read_text().splitlines()]
    qrels = (out / "qrels" / "test.tsv").read_text().splitlines()
    assert len(corpus) == len(chunks) and {"_id", "title", "text"} <= set(corpus[0])
    assert [q["_id"] for q in queries] == [q.id for q in gold]
    assert qrels[0] == "query-id\tcorpus-id\tscore"
    judged = {row.split("\t")[0] for row in qrels[1:]}
    assert judged == {q.id for q in gold}  # every question has a relevant chunk
    ids = {c["_id"] for c in corpus}
    assert all(row.split("\t")[1] in ids for row in qrels[1:])


def test_run_eval_end_to_end_with_trec_files(chunk_dir: Path, tmp_path: Path) -> None:
    """A search function over chunkyard's chunk files (word overlap, test-only) through run_eval."""
    pytrec_eval = pytest.importorskip("pytrec_eval")
    from pipeline.evaluate.run import run_eval

    chunks = load_chunk_files(chunk_dir)

    def search(query: str, mode: str, k: int):
        words = set(query.lower().split())
        scored = sorted(chunks, key=lambda c: (-len(words & set(c.embed.lower().split())), c.chunk_id))
        ranked = scored if mode == "overlap" else list(reversed(scored))
        return [{**c.as_item(), "score": float(-n)} for n, c in enumerate(ranked[:k])]

    result = run_eval(GOLD, ROOT / "corpus", search, modes=("overlap", "reversed"), k=30, per_query=True)
    overlap, rev = result.reports["overlap"].metrics, result.reports["reversed"].metrics
    assert overlap["recall@10"] > rev["recall@10"]  # the reversed ranking puts the least related first
    assert result.pack["mode"] == "overlap" and result.pack["dataset"] == "corpus"
    files = result.trec_files()
    assert set(files) == {"answer.qrels", "overlap.run", "overlap.answer.run", "reversed.run", "reversed.answer.run"}
    # trec_eval on the written files gives the pack's numbers
    qrels = pytrec_eval.parse_qrel(files["answer.qrels"].splitlines())
    run = pytrec_eval.parse_run([" ".join(line.split()) for line in files["overlap.answer.run"].splitlines()])
    top10 = {q: dict(sorted(d.items(), key=lambda kv: -kv[1])[:10]) for q, d in run.items()}
    per_q = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recip_rank"}).evaluate(top10)
    ndcg = sum(v["ndcg_cut_10"] for v in per_q.values()) / len(result.gold)
    assert result.pack["nDCG@10"] == pytest.approx(ndcg, abs=1e-5)
