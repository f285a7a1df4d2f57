"""FTS5's ``bm25()`` computed outside FTS5 (``pipeline.index.bm25_exact``), and the scale BM25
that uses it: Tantivy finds the candidates, their scores are FTS5's (issue 31).

Real components: a real FTS5 table (apsw's SQLite) over the sample corpus's paragraphs, and the
sample corpus indexed with ``CHUNKYARD_SCALE=on`` (real Tantivy, the real ONNX embedder). For
many questions, made of the corpus's own words (English and CJK, words FTS5 cuts into phrases,
words in most rows), the scale path returns the ids FTS5's ``bm25()`` returns, in the same
order, with the same scores (relative 1e-9), before and after an edit and a deletion that the
Tantivy index takes in without a rebuild.
"""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path

import apsw
import pytest
import tantivy  # noqa: F401  (the extra 'scale': a required part, so missing fails, not skips)
from index_support import SAMPLE, copy_sample, run_ingest

from pipeline.index import Searcher, bm25_tantivy, index
from pipeline.index.analyzer import FTS5_TOKENIZE, analyze, fts5_query, query_terms
from pipeline.index.bm25_exact import (
    IDF_FLOOR,
    RowScorer,
    collection,
    fts5_frequency,
    fts5_idf,
    occurrences,
)
from pipeline.index.cjk import BIGRAMS
from pipeline.index.fts_tokens import Fts5Tokens
from pipeline.index.language import default_analyzer, require
from pipeline.index.scale import SCALE_ENV
from pipeline.index.vector_store import open_store

REL = 1e-9
#: Questions whose terms exercise each part of FTS5's formula: a word in most rows (the idf
#: floor), two words with one stem (a phrase scored twice), words FTS5 cuts into a phrase
#: (``_`` and ``'``), a repeated-token phrase, CJK runs (phrases of characters).
EDGES = [
    "the a of and to",
    "chunk chunks chunking chunked",
    "response_model max_tokens",
    "don't can't won't",
    "overlap overlap between pieces",
    "文の区切り方",
    "设定ファイルはどこにありますか",
    "how do I install chunkyard in a virtualenv?",
    "windows line endings byte order mark",
    "state-of-the-art",
]


def _questions(texts: list[str], every: int = 1) -> list[str]:
    """Questions made of the texts' own words: five words from each text's start and middle."""
    questions = list(EDGES)
    for text in texts[::every]:
        words = re.findall(r"\w+", text)
        for start in (0, len(words) // 2):
            if words[start : start + 5]:
                questions.append(" ".join(words[start : start + 5]))
    return questions


def _paragraphs() -> list[str]:
    found = []
    for path in sorted(SAMPLE.rglob("*.md")):
        found += [p.strip() for p in path.read_text(encoding="utf-8").split("\n\n") if p.strip()]
    return found


@pytest.fixture(scope="module")
def table() -> apsw.Connection:
    """An FTS5 table ``fts`` as the store makes it, one row per paragraph of the sample corpus."""
    conn = apsw.Connection(":memory:")
    conn.execute(f"CREATE VIRTUAL TABLE fts USING fts5(body, tokenize='{FTS5_TOKENIZE}')")
    for text in _paragraphs():
        conn.execute("INSERT INTO fts(body) VALUES (?)", (analyze(text),))
    return conn


def _fts5(conn: apsw.Connection, terms: list[str]) -> dict[int, float]:
    """FTS5's own scores of every matching row (positive, as search reports them)."""
    rows = conn.execute("SELECT rowid, bm25(fts) FROM fts WHERE fts MATCH ?", (fts5_query(terms),))
    return {int(rowid): -float(score) for rowid, score in rows}


def _computed(conn: apsw.Connection, tokens: Fts5Tokens, terms: list[str]) -> dict[int, float]:
    """The same rows scored by ``bm25_exact`` from FTS5's statistics, every row a candidate."""
    rows, total = collection(conn)
    weighted = [
        (tuple(tokens.query(term)), fts5_idf(rows, fts5_frequency(conn, term)))
        for term in terms
        if tokens.query(term)
    ]
    every = [int(r) for (r,) in conn.execute("SELECT rowid FROM fts")]
    return dict(RowScorer(conn, tokens).scores(weighted, every, total / rows))


def _assert_same(got: dict[int, float], want: dict[int, float], question: str) -> None:
    assert got.keys() == want.keys(), question
    for row, score in want.items():
        assert math.isclose(got[row], score, rel_tol=REL), (question, row, got[row], score)


def test_row_scores_equal_fts5s_bm25_for_every_matching_row(table: apsw.Connection) -> None:
    tokens = Fts5Tokens()
    questions = _questions(_paragraphs(), every=3)
    assert len(questions) > 100
    matched = 0
    for question in questions:
        terms = query_terms(question)
        want = _fts5(table, terms)
        _assert_same(_computed(table, tokens, terms), want, question)
        matched += len(want)
    assert matched > 1000
    # the premise: a phrase given twice (two words, one stem) was exercised
    assert [tuple(tokens.query(t)) for t in query_terms("chunk chunks")] == [("chunk",), ("chunk",)]


def test_the_statistics_follow_inserts_and_deletes(table: apsw.Connection) -> None:
    conn = apsw.Connection(":memory:")
    conn.execute(f"CREATE VIRTUAL TABLE fts USING fts5(body, tokenize='{FTS5_TOKENIZE}')")
    assert collection(conn) == (0, 0)
    tokens = Fts5Tokens()
    for text in _paragraphs():
        conn.execute("INSERT INTO fts(body) VALUES (?)", (analyze(text),))
    conn.execute("DELETE FROM fts WHERE rowid % 3 = 0")
    conn.execute("UPDATE fts SET body = body || ' chunk overlap' WHERE rowid % 5 = 0")
    # most rows left hold "the": its idf is FTS5's floor
    conn.execute("DELETE FROM fts WHERE rowid % 2 = 0 AND rowid NOT IN (SELECT rowid FROM fts('the'))")
    rows, total = collection(conn)
    assert rows == int(next(iter(conn.execute("SELECT count(*) FROM fts")))[0])
    assert total == sum(len(tokens.analyzed(str(b))) for (b,) in conn.execute("SELECT body FROM fts"))
    assert fts5_idf(rows, fts5_frequency(conn, "the")) == IDF_FLOOR
    for question in _questions(_paragraphs(), every=7):
        terms = query_terms(question)
        _assert_same(_computed(conn, tokens, terms), _fts5(conn, terms), question)


def test_phrase_occurrences_overlap_as_fts5s_instances() -> None:
    assert occurrences(("a", "a"), ["a", "a", "a"]) == 2
    assert occurrences(("a", "b"), ["a", "b", "a", "b", "b"]) == 2
    assert occurrences(("ab",), ["ab", "x", "ab"]) == 2


# --- the scale path: Tantivy's candidates, FTS5's scores ---------------------------------------


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("bm25-exact")
    corpus, out = copy_sample(base / "corpus"), base / "chunks"
    run_ingest(corpus, out)
    with pytest.MonkeyPatch.context() as env:
        env.setenv(SCALE_ENV, "on")
        index(out)
    return corpus, out


def _chunk_texts(out: Path) -> list[str]:
    db = open_store(out)
    try:
        return [row.text for row in db.rows(sorted(db.states())).values()]
    finally:
        db.close()


def _assert_scale_equals_fts5(out: Path, questions: list[str], k: int) -> int:
    """Per question, the scale path's top ``k`` equals FTS5's: ids, order, scores."""
    compared = 0
    with Searcher(out, expand_tokens=0) as ask:
        assert ask._scale is not None
        db = open_store(out)
        analysis = require(db.analyzer, default_analyzer(db), where=str(db.path), hint="")
        try:
            for question in questions:
                terms = analysis.query_terms(question)
                want = db.lexical(terms, k)
                got = ask._scale.lexical(terms, k)
                assert got is not None, question
                assert [c for c, _ in got] == [c for c, _ in want], question
                for (_, g), (_, w) in zip(got, want, strict=True):
                    assert math.isclose(g, w, rel_tol=REL), (question, g, w)
                compared += len(want)
            record = ask.record(questions[-1], 5, "bm25")
            assert not record["warnings"]
            if ask._windows is None:  # what a search reports is that score (windows rescore it)
                assert [it["score_raw"] for it in record["items"]] == pytest.approx(
                    [s for _, s in db.lexical(analysis.query_terms(questions[-1]), 5)], rel=REL
                )
        finally:
            db.close()
    return compared


def test_the_scale_top_k_is_fts5s_ids_order_and_scores(indexed: tuple[Path, Path]) -> None:
    _, out = indexed
    questions = _questions(_chunk_texts(out))
    assert len(questions) > 150
    assert _assert_scale_equals_fts5(out, questions, 10) > 1000
    assert _assert_scale_equals_fts5(out, questions[::4], 3) > 100


def test_after_an_edit_and_a_deletion_the_scale_top_k_is_still_fts5s(
    indexed: tuple[Path, Path], tmp_path: Path
) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(indexed[0].parent, copy, symlinks=True)
    corpus, out = copy / "corpus", copy / "chunks"
    questions = _questions(_chunk_texts(out))  # the deleted document's words among them
    doc = corpus / "getting-started.md"
    doc.write_text(doc.read_text() + "\n\nA paragraph about chunk overlap, quokkas and the overlap again.\n")
    (corpus / "windows-notes.md").unlink()
    run_ingest(corpus, out)
    with pytest.MonkeyPatch.context() as env:
        env.setenv(SCALE_ENV, "on")
        report = index(out)
    assert report.deleted >= 1 and report.added + report.updated >= 1
    state = bm25_tantivy.read_state(bm25_tantivy.folder_for(out / ".chunkyard" / "index.sqlite"))
    assert state["deleted"] >= 2  # taken in without a rebuild: Tantivy still holds deleted documents
    assert _assert_scale_equals_fts5(out, [*questions, "quokkas overlap"], 10) > 1000


def test_a_cjk_index_edited_keeps_fts5s_scores_and_its_windows_rank_alike(tmp_path: Path) -> None:
    """The bigram analyzer's index (its FTS5 rows are not the default analyzer's): the rows an
    edit adds reach Tantivy as FTS5 holds them, and the CJK windows rank the same lists whether
    Tantivy or FTS5 found the candidates (a neighbour's own score is the same number)."""
    corpus, out = tmp_path / "corpus", tmp_path / "chunks"
    corpus.mkdir()
    guide = corpus / "guide.md"
    shutil.copy(SAMPLE / "i18n" / "多言語ガイド.md", guide)
    with pytest.MonkeyPatch.context() as env:
        env.setenv(SCALE_ENV, "on")
        run_ingest(corpus, out)
        index(out, lang="cjk")
        guide.write_text(guide.read_text() + "\n\n## 补充\n\n索引建好以后，分句器和检索会一起更新。\n")
        run_ingest(corpus, out)
        index(out)
    db = open_store(out)
    try:
        assert db.meta()["analyzer"].endswith(BIGRAMS)
    finally:
        db.close()
    texts = _chunk_texts(out)
    questions = [t[i : i + 8] for t in texts for i in range(0, len(t), 37)] + EDGES
    assert _assert_scale_equals_fts5(out, questions, 10) > 80
    with Searcher(out, expand_tokens=0) as ask:
        assert ask._windows is not None and ask._scale is not None
        assert ask._windows.counts is not None  # the windows count terms with Tantivy: FTS5's numbers
        analysis = require(ask.db.analyzer, default_analyzer(ask.db), where="", hint="")
        for term in {t for q in questions for t in analysis.query_terms(q)}:
            phrase = tuple(ask._windows._fts.query(term))
            if phrase:
                assert ask._windows.counts(phrase) == fts5_frequency(ask._windows._conn, term), term
        scaled = [ask(q, "bm25", 10) for q in questions]
    bm25_tantivy.remove(bm25_tantivy.folder_for(out / ".chunkyard" / "index.sqlite"))
    with Searcher(out, expand_tokens=0) as ask:
        assert ask._scale is None or ask._scale._bm25 is None
        exact = [ask(q, "bm25", 10) for q in questions]
    for question, got, want in zip(questions, scaled, exact, strict=True):
        assert [h["chunk_id"] for h in got] == [h["chunk_id"] for h in want], question
        assert [h["score_raw"] for h in got] == pytest.approx([h["score_raw"] for h in want], rel=REL)


def test_a_searcher_past_the_callers_generation_gives_way_to_fts5(indexed: tuple[Path, Path]) -> None:
    """The store is read in a snapshot at the generation the caller checked; an index that has
    moved on since (a run finished in between) answers nothing rather than mix two states."""
    _, out = indexed
    store = out / ".chunkyard" / "index.sqlite"
    lexical = bm25_tantivy.TantivyBm25(bm25_tantivy.folder_for(store))
    conn = apsw.Connection(str(store), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        generation = lexical.generation()
        assert generation is not None
        terms = query_terms("overlap between pieces")
        assert lexical.exact(conn, terms, 10, generation)
        assert lexical.exact(conn, terms, 10, "an earlier generation") is None
    finally:
        conn.close()
        lexical.close()
