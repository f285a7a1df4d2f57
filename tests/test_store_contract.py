"""The ``VectorStore`` contract, one set of tests for both stores (SQLite + sqlite-vec, LanceDB).

Real stores, real vectors (the ONNX model). The same end-to-end checks too: index the
sample corpus into the store, edit, index again, reconcile, search hostile queries.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from index_support import chunk_state, copy_sample, run_ingest, store_state
from test_redirects import apply_edit

from pipeline.index import index, search
from pipeline.index.embedders import make_embedder
from pipeline.index.rows import ChunkRow
from pipeline.index.vector_store import open_store

KINDS = ["sqlite", "lancedb"]
TEXTS = {
    "a|r=1|s=1|p=000|b=000": "Borrowing lets a function use a value without taking ownership of it.",
    "a|r=1|s=2|p=000|b=000": "The state-of-the-art splitter keeps code blocks whole.",
    "b|r=1|s=1|p=000|b=000": "这是一个关于中文文本检索的段落。",
    "b|r=1|s=2|p=000|b=000": "Install the package with pip and check the version it prints.",
}


def _row(cid: str, text: str, file: str = "") -> ChunkRow:
    return ChunkRow(
        chunk_id=cid,
        file=file or f"{cid.split('|')[0]}.json",
        id=f"doc:{cid}",
        hash="blake3:" + str(abs(hash(text))),
        digest="blake3:" + str(abs(hash(("e", text)))),
        doc_id=cid.split("|")[0],
        section_id=cid.split("|s=")[1].split("|")[0],
        source_url=f"{cid.split('|')[0]}.md",
        source_file=f"{cid.split('|')[0]}.md",
        start=0,
        end=len(text),
        line_start=1,
        line_end=1,
        tokens=len(text.split()),
        rev="0123abcd",
        analyzer="verbatim",
        policy_hash="p",
        title="T",
        breadcrumb="T",
        text=text,
        embed_text=text,
        model_tokens=len(text.split()),
    )


def _path(kind: str, tmp_path: Path) -> str:
    return f"lancedb:{tmp_path / 'idx.lance'}" if kind == "lancedb" else f"sqlite:{tmp_path / 'idx.sqlite'}"


@pytest.fixture(scope="module")
def vectors() -> dict[str, Any]:
    embedder = make_embedder(None)
    got = embedder.embed(list(TEXTS.values()))
    return {cid: got[i] for i, cid in enumerate(TEXTS)} | {"_embedder": embedder}


@pytest.mark.parametrize("kind", KINDS)
def test_commit_read_search_delete_and_reopen(kind: str, tmp_path: Path, vectors: dict[str, Any]) -> None:
    spec = _path(kind, tmp_path)
    db = open_store(tmp_path, spec, dim=384, create=True)
    assert db.meta() == {} and db.states() == {}
    rows = [(_row(cid, text), vectors[cid]) for cid, text in TEXTS.items()]
    db.commit(rows, [], {"generation": "1", "cursor": "bytes:10", "embed_model": "m"}, model="m")
    assert set(db.states()) == set(TEXTS)
    assert db.meta()["cursor"] == "bytes:10"
    for cid in TEXTS:  # each vector's nearest chunk is its own
        best = db.dense(vectors[cid], 2)
        assert best[0][0] == cid and best[0][1] == pytest.approx(1.0, abs=1e-3)
    assert db.lexical(["borrowing"], 3)[0][0] == "a|r=1|s=1|p=000|b=000"
    assert db.lexical(["state-of-the-art"], 3)[0][0] == "a|r=1|s=2|p=000|b=000"
    assert db.lexical(["文 本"], 3)[0][0] == "b|r=1|s=1|p=000|b=000"
    assert db.lexical(['"quoted', "pip"], 3)[0][0] == "b|r=1|s=2|p=000|b=000"
    assert db.substring("function use", 3) == [("a|r=1|s=1|p=000|b=000", 1.0)]
    assert db.rows(["a|r=1|s=2|p=000|b=000"])["a|r=1|s=2|p=000|b=000"].text == TEXTS["a|r=1|s=2|p=000|b=000"]
    # a move (same text, new file): the vector stays; a delete: gone from every side
    moved = _row("a|r=1|s=1|p=000|b=000", TEXTS["a|r=1|s=1|p=000|b=000"], file="moved.json")
    db.commit(
        [(moved, None)], ["b|r=1|s=2|p=000|b=000"], {"generation": "2", "cursor": "bytes:20"}, model="m"
    )
    states = db.states()
    assert states["a|r=1|s=1|p=000|b=000"].file == "moved.json"
    assert "b|r=1|s=2|p=000|b=000" not in states
    assert db.dense(vectors["a|r=1|s=1|p=000|b=000"], 1)[0][0] == "a|r=1|s=1|p=000|b=000"
    assert db.lexical(["pip"], 3) == []
    assert all(cid != "b|r=1|s=2|p=000|b=000" for cid, _ in db.dense(vectors["b|r=1|s=2|p=000|b=000"], 5))
    # a changed text under the same id replaces the vector (no upsert in sqlite-vec: delete + insert)
    changed = _row("a|r=1|s=2|p=000|b=000", TEXTS["b|r=1|s=2|p=000|b=000"])
    db.commit([(changed, vectors["b|r=1|s=2|p=000|b=000"])], [], {"generation": "3"}, model="m")
    assert db.dense(vectors["b|r=1|s=2|p=000|b=000"], 1)[0][0] == "a|r=1|s=2|p=000|b=000"
    db.put_cache("m", {"d1": (vectors["a|r=1|s=1|p=000|b=000"], 7)})
    got = db.cached("m", ["d1", "d2"])
    assert set(got) == {"d1"} and got["d1"][1] == 7
    assert np.allclose(got["d1"][0], vectors["a|r=1|s=1|p=000|b=000"])
    assert db.cached("other model", ["d1"]) == {}
    db.close()
    again = open_store(tmp_path, spec)
    assert set(again.states()) == set(TEXTS) - {"b|r=1|s=2|p=000|b=000"}
    assert again.meta()["generation"] == "3"
    assert set(again.cached("m", ["d1", "d2"])) == {"d1"}  # a cached vector outlives its store object
    again.close()


@pytest.mark.parametrize("kind", KINDS)
def test_index_edit_reconcile_and_search_through_each_store(kind: str, tmp_path: Path) -> None:
    corpus, out = copy_sample(tmp_path / "corpus"), tmp_path / "chunks"
    spec = _path(kind, tmp_path)
    run_ingest(corpus, out)
    first = index(out, spec)
    assert first.index_hash.startswith("lancedb:" if kind == "lancedb" else "sqlite-vec:")
    assert store_state(out, spec) == chunk_state(out)
    known = {d for _, _, d in chunk_state(out).values()}
    doc = corpus / "guides" / "deep-dive.md"
    doc.write_text(
        apply_edit(doc.read_text(encoding="utf-8"), "guides/deep-dive.md", "add_heading", random.Random(3))
    )
    (corpus / "windows-notes.md").unlink()
    run_ingest(corpus, out)
    report = index(out, spec)
    after = chunk_state(out)
    assert report.embedded == len({d for _, _, d in after.values()} - known)
    assert store_state(out, spec) == after
    assert not any(index(out, spec, reconcile=True).fixed.values())
    for query, mode in (
        ("splitting long paragraphs", "hybrid"),
        ("多言語", "bm25"),
        ("configuration", "dense"),
    ):
        record = search(out, query, k=3, mode=mode, store=spec)
        assert record["items"], (kind, query)
        assert record["index_hash"] == report.index_hash


@pytest.mark.parametrize("kind", KINDS)
def test_equal_scores_across_the_cut_resolve_by_chunk_id(
    kind: str, tmp_path: Path, vectors: dict[str, Any]
) -> None:
    """001 rule 5 inside the store: six rows with the same text and vector, written in reverse
    id order; BM25 and dense both keep the smallest ids when k cuts through the tie."""
    text = TEXTS["a|r=1|s=1|p=000|b=000"]
    vector = vectors["a|r=1|s=1|p=000|b=000"]
    ids = [f"t|r=1|s={n}|p=000|b=000" for n in range(1, 7)]
    db = open_store(tmp_path, _path(kind, tmp_path), dim=len(vector), create=True)
    try:
        rows = [(_row(cid, text), vector) for cid in reversed(ids)]
        db.commit(rows, [], {"generation": "1"}, model="m")
        for k in (1, 2, 4):
            assert [cid for cid, _ in db.lexical(["borrowing"], k)] == ids[:k], k
            for _ in range(2):  # the SQLite store's first query is vec0's KNN, the next its matrix
                assert [cid for cid, _ in db.dense(vector, k)] == ids[:k], k
    finally:
        db.close()
