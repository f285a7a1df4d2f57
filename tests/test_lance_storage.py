"""How the LanceDB store lays its columns out: text columns written uncompressed in a new
store (``add`` spends most of its time compressing them otherwise), and a store written by
the earlier layout (compressed, no field metadata) read, edited and searched as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("lancedb")

from test_store_contract import _row

from pipeline.index.lance_store import UNCOMPRESSED, LanceStore

TEXTS = {
    f"doc{i}|r=1|s={i}|p=000|b=000": text
    for i, text in enumerate(
        [
            "Borrowing lets a function use a value without taking ownership of it.",
            "Ownership rules: each value has an owner, and one owner at a time.",
            "The borrow checker compares scopes to decide whether all borrows are valid.",
            "Cargo builds the project and downloads its dependencies.",
            "A trait object points to an instance of a type that implements the trait.",
            "Lifetimes ensure references are valid as long as we need them to be.",
        ]
    )
}
META = {"embed_model": "m", "dim": "8", "generation": "1"}


def _vectors(n: int, seed: int = 0) -> np.ndarray:
    got = np.random.default_rng(seed).standard_normal((n, 8)).astype(np.float32)
    return got / np.linalg.norm(got, axis=1, keepdims=True)


def _fill(store: LanceStore, texts: dict[str, str], seed: int = 0) -> None:
    rows = [_row(cid, text) for cid, text in texts.items()]
    store.commit(list(zip(rows, _vectors(len(rows), seed), strict=True)), set(), META, model="m")


def _searches(store: LanceStore) -> list[Any]:
    return [
        store.lexical(["ownership"], 4),
        store.lexical(["borrow", "checker"], 4),
        store.dense(_vectors(1, 9)[0], 4),
        sorted(store.states()),
    ]


def test_a_new_store_writes_its_text_columns_uncompressed(tmp_path: Path) -> None:
    store = LanceStore(tmp_path / "idx.lance", dim=8)
    _fill(store, TEXTS)
    schema = store._table("chunks").schema
    texts = [f.name for f in schema if f.type == store._pa.string()]
    assert {"chunk_id", "text", "body", "payload"} <= set(texts)
    for name in texts:
        assert schema.field(name).metadata == {k.encode(): v.encode() for k, v in UNCOMPRESSED.items()}
    rows = store.rows(list(TEXTS))
    assert {cid: r.text for cid, r in rows.items()} == TEXTS
    assert store.lexical(["ownership"], 4)[0][0] in TEXTS


def test_a_store_of_the_earlier_layout_is_edited_and_searched_as_before(tmp_path: Path) -> None:
    new = LanceStore(tmp_path / "new.lance", dim=8)
    old = LanceStore(tmp_path / "old.lance", dim=8)
    plain = old._pa.schema([f.remove_metadata() for f in old._schema("chunks")])
    old._chunks = old._db.create_table("chunks", schema=plain)  # as a store before this layout made it
    for store in (new, old):
        _fill(store, TEXTS)
        edited = {cid: text + " Edited." for cid, text in list(TEXTS.items())[:2]}
        _fill(store, edited, seed=1)  # replaced rows: a merge on the id
        store.commit([], {list(TEXTS)[3]}, META, model="m")
    assert old._table("chunks").schema.field("payload").metadata is None
    assert _searches(old) == _searches(new)
    first = next(iter(TEXTS))
    assert old.rows([first])[first].text.endswith(" Edited.")


def _many(n: int) -> dict[str, str]:
    """``n`` texts over the same few words, in varying numbers: BM25's statistics matter."""
    words = ["ownership", "borrow", "checker", "cargo", "trait", "object", "lifetime", "value"]
    return {
        f"d{i}|r=1|s={i}|p=000|b=000": " ".join(words[(i * j) % len(words)] for j in range(1, 4 + i % 9))
        for i in range(n)
    }


def test_an_edited_store_searches_as_a_freshly_built_one(tmp_path: Path) -> None:
    """The commit after edits, deletes and additions leaves BM25 scores (ids, order, scores)
    equal to a store built at once from the final rows: the FTS index is not left with
    unindexed rows or deleted rows' statistics."""
    texts = _many(300)
    edited = LanceStore(tmp_path / "edited.lance", dim=8)
    _fill(edited, texts)
    ids = list(texts)
    changes = {ids[1]: "ownership ownership cargo", ids[2]: "lifetime borrow"}
    added = {"new|r=1|s=1|p=000|b=000": "trait object ownership value"}
    edited.commit([], {ids[3], ids[4]}, {**META, "generation": "2"}, model="m")
    _fill(edited, changes | added, seed=1)
    final = {cid: t for cid, t in (texts | changes | added).items() if cid not in {ids[3], ids[4]}}
    fresh = LanceStore(tmp_path / "fresh.lance", dim=8)
    _fill(fresh, final)
    for terms in (
        ["ownership"],
        ["borrow", "checker"],
        ["trait", "object"],
        ["lifetime"],
        ["cargo", "value"],
    ):
        got, want = edited.lexical(terms, 20), fresh.lexical(terms, 20)
        assert got == want, terms
        assert got
    assert {cid for cid, _ in edited.lexical(["lifetime"], 400)} == {
        cid for cid, t in final.items() if "lifetime" in t.split()
    }
