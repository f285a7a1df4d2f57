"""The scale indexes (issue 31): BM25 on Tantivy and HNSW, derived from the SQLite store.

Real Tantivy, real usearch, the real ONNX embedder, the sample corpus (about a hundred chunks) indexed
with ``CHUNKYARD_SCALE=on`` (both indexes at any size). Checked: Tantivy holds exactly
FTS5's terms (document frequencies equal ``fts5vocab``'s), its top k equals an exhaustive
BM25 computed here from the formula the docs state, the HNSW finds at least 90 % of what
exact dense search finds, each with its exact score, an edit reaches both indexes without a
rebuild (BM25 then equals a fresh build, and the edited graph finds as much as a fresh one),
a stale index is ignored (exact search answers, with a warning) and rebuilt by the next run,
and SIGKILLs during runs leave search working.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import tantivy  # noqa: F401  (the extra 'scale': a required part, so missing fails, not skips)
import usearch  # noqa: F401
from index_support import copy_sample, fresh_copy, run_ingest

from pipeline.errors import UsageError
from pipeline.index import Searcher, ann, ann_journal, ann_vectors, bm25_tantivy, index
from pipeline.index.analyzer import query_terms
from pipeline.index.fts_tokens import Fts5Tokens
from pipeline.index.scale import SCALE_ENV
from pipeline.index.scale_reader import StoreReader
from pipeline.index.vector_store import open_store

REPO = Path(__file__).resolve().parents[1]
QUESTIONS = [
    "how do I install chunkyard in a virtualenv?",
    "What Python version do I need?",
    "windows line endings byte order mark",
    "overlap between pieces",
    "state-of-the-art",
    "split long paragraphs into chunks",
]


@pytest.fixture(autouse=True)
def scale_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SCALE_ENV, "on")


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("scale-template")
    corpus, out = copy_sample(base / "corpus"), base / "chunks"
    run_ingest(corpus, out)
    os.environ[SCALE_ENV] = "on"
    try:
        index(out)
    finally:
        del os.environ[SCALE_ENV]
    return base


@pytest.fixture
def fresh(template: Path, tmp_path: Path) -> tuple[Path, Path]:
    return fresh_copy(template, tmp_path / "copy")


def _store(out: Path) -> Path:
    return out / ".chunkyard" / "index.sqlite"


# --- the exact BM25 the docs state (Lucene's, as Tantivy computes it) -------------------------


def _fieldnorm_table() -> list[int]:
    """Lucene's ``SmallFloat.byte4ToInt`` for the 256 codes: the lengths a fieldnorm can hold."""

    def int4_to_long(i: int) -> int:
        bits, shift = i & 0x07, (i >> 3) - 1
        return bits if shift == -1 else (bits | 0x08) << shift

    return [b if b < 24 else 24 + int4_to_long(b - 24) for b in range(256)]


def _quantised(length: int, table: list[int]) -> int:
    return max(v for v in table if v <= length)


def exact_bm25(docs: dict[int, list[str]], terms: list[str], k: int) -> list[tuple[int, float]]:
    """Every document scored: ``sum idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))``,
    ``idf = ln(1 + (N - n + 0.5) / (n + 0.5))``, ``dl`` the quantised length."""
    k1, b = 1.2, 0.75
    table = _fieldnorm_table()
    n_docs = len(docs)
    avgdl = sum(len(t) for t in docs.values()) / n_docs
    counts = {row: Counter(tokens) for row, tokens in docs.items()}
    df = {t: sum(1 for c in counts.values() if t in c) for t in terms}
    scored = []
    for row, c in counts.items():
        dl = _quantised(len(docs[row]), table)
        score = 0.0
        for t in terms:
            tf = c.get(t, 0)
            if tf:
                idf = math.log(1 + (n_docs - df[t] + 0.5) / (df[t] + 0.5))
                score += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))
        if score > 0:
            scored.append((row, score))
    scored.sort(key=lambda h: (-h[1], h[0]))
    return scored[:k]


def _documents(store: Path) -> dict[int, list[str]]:
    reader, tokens = StoreReader(store), Fts5Tokens()
    try:
        return {row: tokens.document(text) for row, text in reader.texts()}
    finally:
        reader.close()
        tokens.close()


def test_tantivy_holds_fts5s_terms_and_its_top_k_is_exact_bm25(template: Path) -> None:
    store = _store(template / "chunks")
    lexical = bm25_tantivy.TantivyBm25(bm25_tantivy.folder_for(store))
    docs = _documents(store)
    reader = StoreReader(store)
    try:
        assert lexical.generation() == reader.generation()
        assert lexical.count() == len(docs) > 50
        # the same terms: every term's document frequency equals FTS5's own (fts5vocab)
        reader.conn.execute("CREATE VIRTUAL TABLE temp.v USING fts5vocab(main, 'fts', 'row')")
        vocab = {str(t): int(n) for t, n in reader.conn.execute("SELECT term, doc FROM temp.v")}
        searcher = lexical._open()
        assert len(vocab) > 500
        for term, n in list(vocab.items())[::7]:
            assert searcher.doc_freq("body", term) == n, term
        tokens = Fts5Tokens()
        checked = 0
        for question in QUESTIONS:
            terms = [t for term in query_terms(question) for t in tokens.query(term)]
            want = exact_bm25(docs, list(dict.fromkeys(terms)), 10)
            got = lexical.search(query_terms(question), 10)
            assert [r for r, _ in got] == [r for r, _ in want], question
            for (_, s_got), (_, s_want) in zip(got, want, strict=True):
                assert s_got == pytest.approx(s_want, rel=1e-5), question
            checked += len(got)
        assert checked >= 40
    finally:
        reader.close()
        lexical.close()


def _found_as_exact_scores_them(
    scaled: list[tuple[str, float]], exact_scores: dict[str, float], question: str
) -> None:
    """What the graph found comes back best first, with the store's own float32 scores."""
    scores = [s for _, s in scaled]
    assert scores == sorted(scores, reverse=True), question
    for chunk, score in scaled:
        assert score == pytest.approx(exact_scores[chunk], abs=1e-6), (question, chunk)


def test_hnsw_finds_what_exact_dense_search_finds_with_the_same_scores(template: Path) -> None:
    """HNSW is approximate: on about a hundred chunks it finds at least 90 % of exact search's
    top 10 (all of it on most runs; a multithreaded build may differ from run to run), and every
    chunk it finds carries exactly the score exact search gives that chunk."""
    out = template / "chunks"
    with Searcher(out, expand_tokens=0) as ask:
        assert ask._scale is not None
        db = open_store(out)
        try:
            found = wanted = 0
            for question in QUESTIONS:
                vector = ask.embedder.embed([question])[0]
                scaled = ask._scale.dense(vector, 10)
                assert scaled is not None and len(scaled) == 10, question
                everything = dict(db.dense(vector, 1000))
                _found_as_exact_scores_them(scaled, everything, question)
                exact = {c for c, _ in db.dense(vector, 10)}
                found += len(exact & {c for c, _ in scaled})
                wanted += len(exact)
            assert found / wanted >= 0.9, f"HNSW recall@10 {found}/{wanted}"
        finally:
            db.close()
        record = ask.record("how do I install chunkyard", 5, "hybrid")
        assert record["items"] and not record["warnings"]


def _rankings(out: Path) -> tuple[list[list[str]], list[set[str]]]:
    """Per question: every chunk BM25 matches (as a sorted list), and what the graph finds of
    exact search's top 10 (each found chunk checked to carry its exact score)."""
    with Searcher(out, expand_tokens=0) as ask:
        assert ask._scale is not None
        db = open_store(out)
        matched, dense = [], []
        try:
            for question in QUESTIONS:
                vector = ask.embedder.embed([question])[0]
                matched.append(sorted(c for c, _ in ask._scale.lexical(query_terms(question), 1000) or []))
                scaled = ask._scale.dense(vector, 10) or []
                _found_as_exact_scores_them(scaled, dict(db.dense(vector, 1000)), question)
                dense.append({c for c, _ in db.dense(vector, 10)} & {c for c, _ in scaled})
        finally:
            db.close()
        return matched, dense


def test_an_edit_reaches_both_indexes_without_a_rebuild_and_equals_a_fresh_build(
    fresh: tuple[Path, Path], tmp_path: Path
) -> None:
    corpus, out = fresh
    store = _store(out)
    hnsw_before = ann.HnswIndex(store, 384).state()["file"]
    doc = corpus / "getting-started.md"
    doc.write_text(doc.read_text() + "\n\nA zanzibarian paragraph about quokkas and chunk overlap.\n")
    run_ingest(corpus, out)
    report = index(out)
    assert report.added + report.updated >= 1
    reader = StoreReader(store)
    try:
        generation = reader.generation()
    finally:
        reader.close()
    lexical = bm25_tantivy.TantivyBm25(bm25_tantivy.folder_for(store))
    assert lexical.generation() == generation
    hits = lexical.search(["zanzibarian"], 5)
    lexical.close()
    assert len(hits) == 1
    state = ann.HnswIndex(store, 384).state()
    # the graph file stays; the edit went to its journal
    assert state["generation"] == generation and state["file"] == hnsw_before and state["journal_bytes"] > 0
    with Searcher(out, expand_tokens=0) as ask:
        top = ask.record("zanzibarian quokkas", 1, "bm25")["items"][0]
        assert "quokkas" in top["text"]
    incremental = _rankings(out)
    # a fresh build of the same chunks: remove both indexes, the next run rebuilds them
    bm25_tantivy.remove(bm25_tantivy.folder_for(store))
    ann.HnswIndex(store, 384).remove()
    index(out)
    # the same documents with the same terms; BM25's scores may differ a little until Tantivy
    # merges the deleted documents away (docs/index.md). The edited graph and the fresh one are
    # different graphs: each must find (nearly) all of exact search's top 10, with exact scores
    fresh_matched, fresh_dense = _rankings(out)
    assert fresh_matched == incremental[0]
    for graph in (incremental[1], fresh_dense):
        assert sum(map(len, graph)) >= 0.9 * 10 * len(QUESTIONS), graph


def test_a_stale_index_is_ignored_with_a_warning_and_rebuilt_by_the_next_run(
    fresh: tuple[Path, Path],
) -> None:
    _, out = fresh
    store = _store(out)
    folder = bm25_tantivy.folder_for(store)
    bm25_tantivy.write_state(folder, {"generation": "stale", "chunks": 93})  # as if killed between commits
    with Searcher(out, expand_tokens=0) as ask:
        record = ask.record("overlap between pieces", 5, "bm25")
        assert record["items"]
        assert any("behind the store" in w for w in record["warnings"])
        db = open_store(out)
        try:
            exact = db.lexical(query_terms("overlap between pieces"), 5)
        finally:
            db.close()
        assert [it["chunk_id"] for it in record["items"]] == [c for c, _ in exact]  # FTS5 answered
    report = index(out)  # nothing moved in the store: the stale index is rebuilt all the same
    assert report.added == report.deleted == 0
    with Searcher(out, expand_tokens=0) as ask:
        assert not ask.record("overlap between pieces", 5, "bm25")["warnings"]


def test_off_removes_the_scale_indexes(fresh: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    _, out = fresh
    store = _store(out)
    monkeypatch.setenv(SCALE_ENV, "off")
    index(out)
    assert not bm25_tantivy.folder_for(store).exists()
    assert not ann.state_path(store).exists()
    with Searcher(out, expand_tokens=0) as ask:
        assert ask._scale is None
        assert ask.record("overlap between pieces", 3, "hybrid")["items"]


def test_sigkills_during_index_runs_leave_search_working_and_the_next_run_converges(
    fresh: tuple[Path, Path],
) -> None:
    corpus, out = fresh
    store = _store(out)
    env = {**os.environ, SCALE_ENV: "on"}
    doc = corpus / "getting-started.md"
    for n, delay in enumerate((0.8, 1.6, 2.4, 3.2)):
        doc.write_text(doc.read_text() + f"\n\nKill round {n}: a paragraph of its own, word{n}x.\n")
        run_ingest(corpus, out)
        # every index under the scale indexes is rebuilt in this run: the longest window
        bm25_tantivy.write_state(bm25_tantivy.folder_for(store), {"generation": "old", "chunks": 0})
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline", "index", "--out", str(out), "--quiet"],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(delay)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        with Searcher(out, expand_tokens=0) as ask:  # the previous index answers (maybe by exact search)
            assert ask.record("overlap between pieces", 3, "hybrid")["items"]
    index(out)
    reader = StoreReader(store)
    try:
        generation = reader.generation()
    finally:
        reader.close()
    assert bm25_tantivy.TantivyBm25(bm25_tantivy.folder_for(store)).generation() == generation
    assert ann.HnswIndex(store, 384).generation() == generation
    with Searcher(out, expand_tokens=0) as ask:
        record = ask.record("word3x", 1, "bm25")
        assert not record["warnings"] and "word3x" in record["items"][0]["text"]


def test_rebuild_swaps_in_a_store_whose_scale_indexes_follow_it(fresh: tuple[Path, Path]) -> None:
    _, out = fresh
    store = _store(out)
    report = index(out, rebuild=True)
    assert report.reason == "rebuild"
    assert not store.with_name(store.name + ".rebuild" + bm25_tantivy.SUFFIX).exists()
    reader = StoreReader(store)
    try:
        current = reader.generation()
    finally:
        reader.close()
    assert bm25_tantivy.TantivyBm25(bm25_tantivy.folder_for(store)).generation() == current
    assert ann.HnswIndex(store, 384).generation() == current
    with Searcher(out, expand_tokens=0) as ask:
        record = ask.record("overlap between pieces", 3, "hybrid")
        assert record["items"] and not record["warnings"]


def test_index_warns_past_the_measured_range(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.index.scale import BM25_MIN_CHUNKS, MEASURED_MAX, range_warning, wanted

    monkeypatch.setenv(SCALE_ENV, "auto")
    assert wanted(BM25_MIN_CHUNKS - 1) == (False, False)
    assert wanted(MEASURED_MAX["sqlite-vec+scale"]) == (True, True)
    assert range_warning("sqlite-vec", 42_000) is None
    past = range_warning("sqlite-vec", MEASURED_MAX["sqlite-vec+scale"] + 1)
    assert past is not None and "largest index measured" in past
    lance = range_warning("lancedb", MEASURED_MAX["lancedb"] + 1)
    assert lance is not None and "LanceDB" in lance
    monkeypatch.setenv(SCALE_ENV, "sometimes")
    with pytest.raises(UsageError, match="CHUNKYARD_SCALE"):
        wanted(1)


def _stored_keys(store: Path) -> set[int]:
    reader = StoreReader(store)
    try:
        keys, _ = reader.vectors(384)
    finally:
        reader.close()
    return {int(k) for k in keys}


def _vectors_file_is_the_stores(store: Path) -> int:
    """The graph's vectors file holds, for every key it answers for (the graph's, less what
    the journal hides), exactly the store's float32 bytes; returns how many it answers for."""
    graph = ann.HnswIndex(store, 384)
    state = graph.state()
    assert state["vectors"] and (store.parent / state["vectors"]).is_file(), state
    reader = StoreReader(store)
    try:
        keys, matrix = reader.vectors(384)
    finally:
        reader.close()
    stored = {int(k): row.tobytes() for k, row in zip(keys, matrix, strict=True)}
    try:
        answered = graph.exact(sorted(stored))
    finally:
        graph.close()
    hidden = graph._journal(state).hidden
    assert answered and all(answered[k] == stored[k] for k in answered)
    assert not set(answered) & hidden
    return len(answered)


def test_the_searcher_reads_candidates_vectors_beside_the_graph_and_maps_no_store_page(
    fresh: tuple[Path, Path],
) -> None:
    """The exact vectors come from the graph's vectors file (the store's bytes, copied), so
    the searcher maps nothing of the store (mapped pages touched stay in its RSS); an index
    saved without that file answers from the store meanwhile and gets one from the next run."""
    corpus, out = fresh
    store = _store(out)
    assert _vectors_file_is_the_stores(store) == len(_stored_keys(store))
    with Searcher(out, expand_tokens=0) as ask:
        assert ask._scale is not None
        vector = ask.embedder.embed(["overlap between pieces"])[0]
        with_file = ask._scale.dense(vector, 10)
        assert with_file and not ask._scale.stale
        maps = Path("/proc/self/maps")
        mapped = (
            {line.split(None, 5)[-1] for line in maps.read_text().splitlines()} if maps.exists() else set()
        )
        assert str(store) not in mapped  # the graph is (its own file); the store's pages are not
    # as an older index left it: no vectors file named
    state = ann.HnswIndex(store, 384).state()
    (store.parent / state["vectors"]).unlink()
    ann.HnswIndex(store, 384)._write_state({**state, "vectors": ""})
    with Searcher(out, expand_tokens=0) as ask:
        assert ask._scale is not None
        assert ask._scale.dense(vector, 10) == with_file  # from the store: the same scores
    index(out)  # nothing to commit: the run gives the graph its vectors file
    assert _vectors_file_is_the_stores(store) == len(_stored_keys(store))
    _edit(corpus, out, "A zanzibarian paragraph about quokkas and chunk overlap.")
    answered = _vectors_file_is_the_stores(store)  # the journal's keys: from the store
    assert answered < len(_stored_keys(store))
    with Searcher(out, expand_tokens=0) as ask:
        assert ask._scale is not None
        db = open_store(out)
        try:
            quokkas = ask.embedder.embed(["quokkas and chunk overlap"])[0]
            _found_as_exact_scores_them(
                ask._scale.dense(quokkas, 10) or [], dict(db.dense(quokkas, 1000)), "q"
            )
        finally:
            db.close()


def _edit(corpus: Path, out: Path, text: str) -> None:
    doc = corpus / "getting-started.md"
    doc.write_text(doc.read_text() + f"\n\n{text}\n")
    run_ingest(corpus, out)
    report = index(out)
    assert report.added + report.updated >= 1


def test_edits_go_to_the_graphs_journal_and_a_compaction_folds_them_in(
    fresh: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An edit appends to the journal (the graph file is not written again: same inode, same
    bytes); the graph plus its journal hold exactly the store's rows, as a fresh build does, and
    find the edited chunk; past ``JOURNAL_MAX_KEYS`` a run compacts into a new file."""
    corpus, out = fresh
    store = _store(out)
    graph = ann.HnswIndex(store, 384)
    before = graph.state()
    base = store.parent / before["file"]
    inode, mtime = base.stat().st_ino, base.stat().st_mtime_ns
    _edit(corpus, out, "A zanzibarian paragraph about quokkas and chunk overlap.")
    _edit(corpus, out, "Then a second paragraph about wombats.")
    state = graph.state()
    assert state["file"] == before["file"] and state["journal_keys"] >= 4
    assert (base.stat().st_ino, base.stat().st_mtime_ns) == (inode, mtime)
    assert graph.keys() == _stored_keys(store)
    with Searcher(out, expand_tokens=0) as ask:
        assert ask._scale is not None
        vector = ask.embedder.embed(["a paragraph about wombats"])[0]
        top = ask._scale.dense(vector, 3)
        assert top and not ask._scale.stale
        db = open_store(out)
        try:
            assert top[0] == db.dense(vector, 1)[0]  # the edited chunk, found through the journal
        finally:
            db.close()
    journalled = _rankings(out)
    # a fresh build of the same rows: the same keys, and as much of exact search found
    ann.HnswIndex(store, 384).remove()
    index(out)
    assert ann.HnswIndex(store, 384).keys() == _stored_keys(store)
    fresh_dense = _rankings(out)[1]
    for found in (journalled[1], fresh_dense):
        assert sum(map(len, found)) >= 0.9 * 10 * len(QUESTIONS), found
    # past the journal's size a run compacts: a new graph file, an empty journal, the same keys
    monkeypatch.setattr(ann, "JOURNAL_MAX_KEYS", 0)
    kept = ann.HnswIndex(store, 384).state()["file"]
    _edit(corpus, out, "A third paragraph, about numbats.")
    state = ann.HnswIndex(store, 384).state()
    assert state["file"] != kept and state["journal_bytes"] == 0
    assert not (store.parent / kept).exists()
    assert not (store.parent / (kept + ann_vectors.SUFFIX)).exists()
    assert ann.HnswIndex(store, 384).keys() == _stored_keys(store)
    # the compaction merged the journal into a new vectors file: every key, the store's bytes
    assert _vectors_file_is_the_stores(store) == len(_stored_keys(store))


def test_a_killed_journal_append_leaves_the_previous_index_and_is_cut_by_the_next_run(
    fresh: tuple[Path, Path],
) -> None:
    """What a run killed between its journal append and its state leaves (bytes past the valid
    length): readers ignore them and answer as before, and the next run cuts them off."""
    corpus, out = fresh
    store = _store(out)
    _edit(corpus, out, "A zanzibarian paragraph about quokkas.")
    graph = ann.HnswIndex(store, 384)
    state = graph.state()
    journal = store.parent / state["journal"]
    with Searcher(out, expand_tokens=0) as ask:
        vector = ask.embedder.embed(["quokkas"])[0]
        assert ask._scale is not None
        before = ask._scale.dense(vector, 10)
    with open(journal, "ab") as fh:  # half a block, as a SIGKILL during the append leaves it
        fh.write(ann_journal.MAGIC + bytes(5))
    with Searcher(out, expand_tokens=0) as ask:
        assert ask._scale is not None
        assert ask._scale.dense(vector, 10) == before and not ask._scale.stale
    _edit(corpus, out, "Then a paragraph about wombats.")
    state = ann.HnswIndex(store, 384).state()
    assert journal.stat().st_size == state["journal_bytes"]
    assert ann.HnswIndex(store, 384).keys() == _stored_keys(store)
