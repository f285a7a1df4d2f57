"""The SQLite store's fast query paths answer exactly what the plain ones answer (issue 16's latency work).

* BM25: FTS5 sorts and cuts to k before the chunk ids are joined; ties across the cut fall
  back to the full join ordered by (score, chunk_id). Compared with that full join for every
  question of the gold set, at several k, on an index with duplicated sections (real ties).
* Dense: a store asked more than once keeps every vector in one in-memory matrix, read from
  vec0's own tables; its top k (ids and scores) equals vec0's KNN, also after edits and deletes
  were committed by another run (the matrix is read again).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from index_support import run_ingest

from pipeline.index import index
from pipeline.index.analyzer import fts5_query, query_terms
from pipeline.index.embedders import make_embedder
from pipeline.index.sqlite_store import SqliteStore

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = [
    json.loads(line)["question"]
    for line in (ROOT / "tests" / "gold" / "corpus.jsonl").read_text(encoding="utf-8").splitlines()
    if line.strip()
] + ["the", "a the of", "chunk", "zzzz-not-there", "中文", "twice over"]  # the last: six tied twins first
TWIN = "## Twin\n\nThe same words about chunk budgets and overlap, twice over.\n\n"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The sample corpus plus a document of identical sections (equal BM25 scores), indexed."""
    base = tmp_path_factory.mktemp("paths")
    corpus, out = base / "corpus", base / "chunks"
    shutil.copytree(ROOT / "corpus", corpus)
    (corpus / "twins.md").write_text("# Twins\n\n" + TWIN * 6, encoding="utf-8")
    run_ingest(corpus, out)
    index(out)
    return corpus, out


def _store(out: Path) -> SqliteStore:
    return SqliteStore(out / ".chunkyard" / "index.sqlite")


def _joined(db: SqliteStore, terms: list[str], k: int) -> list[tuple[str, float]]:
    """BM25 as the store answered before the fast path: one join, ordered by (score, chunk_id)."""
    return [
        (cid, -float(score))
        for cid, score in db._conn.execute(
            "SELECT c.chunk_id, bm25(fts) AS s FROM fts JOIN chunks c ON c.rowid = fts.rowid "
            "WHERE fts MATCH ? ORDER BY s, c.chunk_id LIMIT ?",
            (fts5_query(terms), k),
        )
    ]


def test_bm25_fast_path_equals_the_full_join(built: tuple[Path, Path]) -> None:
    _, out = built
    db = _store(out)
    try:
        tied = 0
        for question in QUESTIONS:
            terms = query_terms(question)
            for k in (1, 2, 3, 5, 10, 50):
                expected = _joined(db, terms, k)
                assert db.lexical(terms, k) == expected, (question, k)
                full = _joined(db, terms, k + 1)
                tied += len(full) > k and full[k][1] == full[k - 1][1]
        assert tied > 0  # the tie-across-the-cut fallback was exercised
    finally:
        db.close()


def _dense_both_ways(out: Path, vectors: list[object], k: int) -> None:
    plain, kept = _store(out), _store(out)
    try:
        kept.dense(vectors[0], k)  # the first query of a store goes to vec0; the next ones use the matrix
        assert kept._matrix() is not None
        for vector in vectors:
            fresh = _store(out)
            try:
                expected = fresh.dense(vector, k)  # vec0's KNN
            finally:
                fresh.close()
            assert kept.dense(vector, k) == expected
        assert plain.dense(vectors[0], k) == kept.dense(vectors[0], k)
    finally:
        plain.close()
        kept.close()


def test_dense_matrix_path_equals_vec0_knn(built: tuple[Path, Path]) -> None:
    _, out = built
    embedder = make_embedder(None)
    vectors = list(embedder.embed(QUESTIONS))
    for k in (1, 5, 10, 40):
        _dense_both_ways(out, vectors, k)


def test_dense_matrix_follows_the_runs_committed_since(built: tuple[Path, Path], tmp_path: Path) -> None:
    corpus, out = built
    shutil.copytree(corpus, tmp_path / "corpus")
    shutil.copytree(out, tmp_path / "chunks", symlinks=True)
    corpus, out = tmp_path / "corpus", tmp_path / "chunks"
    embedder = make_embedder(None)
    probe = "Zebracorn migration schedules for the northern herd"
    kept = _store(out)
    try:
        kept.dense(embedder.embed([probe])[0], 5)
        before = kept.dense(embedder.embed([probe])[0], 5)  # from the matrix
        (corpus / "twins.md").unlink()  # deletes rows from vec0
        (corpus / "zebracorn.md").write_text(f"# Herd\n\n{probe}, in detail.\n", encoding="utf-8")
        run_ingest(corpus, out)
        report = index(out)
        assert report.deleted > 0 and report.added > 0
        after = kept.dense(embedder.embed([probe])[0], 5)
        assert after != before and after[0][0].startswith("zebracorn")
        assert not any(
            cid.startswith("twins") for cid, _ in kept.dense(embedder.embed(["same words"])[0], 40)
        )
        _dense_both_ways(out, list(embedder.embed(QUESTIONS[:8])), 10)
    finally:
        kept.close()
