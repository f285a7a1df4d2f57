"""The index's extension points: the embedder and store tables, and the embed step's executor.

A plugin adds an embedder or a store kind without touching the base modules; an executor
that yields batches out of order (as Ray actors would) builds the same index, vector for
vector, as the local one. Real ONNX model, real SQLite store.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("sqlite_vec")

from index_support import copy_short_sample, run_ingest, store_state

from pipeline.errors import UsageError
from pipeline.index import index
from pipeline.index.analyzer import ANALYZER
from pipeline.index.embed_onnx import OnnxEmbedder
from pipeline.index.embed_step import EmbedBatch, EmbeddedBatch, EmbedExecutor, LocalEmbedExecutor
from pipeline.index.embedders import EMBEDDERS, Embedder, make_embedder, register_embedder
from pipeline.index.registry import Registry
from pipeline.index.vector_store import STORES, StoreKind, open_store, register_store, store_spec


def test_a_registry_loads_a_path_on_first_use_and_names_what_it_knows() -> None:
    table: Registry[object] = Registry("widget")
    table.add("store", "pipeline.index.sqlite_store:SqliteStore")
    assert "store" in table and table.names() == ["store"]
    assert table.get("store").__name__ == "SqliteStore"
    with pytest.raises(UsageError, match="registered already"):
        table.add("store", object())
    with pytest.raises(UsageError, match=r"unknown widget 'other' \(hint: one of store\)"):
        table.get("other")
    with pytest.raises(UsageError, match="without ':'"):
        table.add("a:b", object())


def test_a_registered_embedder_is_named_by_its_prefix() -> None:
    made: list[tuple[str, int | None, str | None]] = []

    def factory(model: str, *, threads: int | None = None, device: str | None = None) -> Embedder:
        made.append((model, threads, device))
        return OnnxEmbedder(threads=threads)

    register_embedder("plugin", factory)
    try:
        embedder = make_embedder("plugin:any-model", threads=1, device="cpu")
        assert made == [("any-model", 1, "cpu")]
        assert embedder.embed(["one text"]).shape == (1, embedder.dim)
        with pytest.raises(UsageError, match=r"unknown embedder 'word2vec'.*'plugin:MODEL'"):
            make_embedder("word2vec")
    finally:
        EMBEDDERS.remove("plugin")
    assert "plugin" not in EMBEDDERS


def test_the_onnx_embedder_refuses_a_device_it_cannot_use() -> None:
    with pytest.raises(UsageError, match="CPU only"):
        make_embedder("default", device="cuda")
    with pytest.raises(UsageError, match="unknown embedder 'onnx:other'"):
        make_embedder("onnx:other")


def test_a_registered_store_kind_is_chosen_by_prefix_and_suffix(tmp_path: Path) -> None:
    register_store(StoreKind("sqlite2", "pipeline.index.sqlite_store:SqliteStore", ANALYZER, ".sqlite2"))
    try:
        assert store_spec(tmp_path, f"sqlite2:{tmp_path / 'a.db'}") == ("sqlite2", tmp_path / "a.db")
        assert store_spec(tmp_path, tmp_path / "b.sqlite2") == ("sqlite2", tmp_path / "b.sqlite2")
        assert store_spec(tmp_path, tmp_path / "c.db")[0] == "sqlite"  # the first kind is the default
        db = open_store(tmp_path, tmp_path / "b.sqlite2", dim=4, create=True)
        try:
            assert db.meta() == {} and db.states() == {}
        finally:
            db.close()
    finally:
        STORES.remove("sqlite2")


class ReversedExecutor:
    """Every batch embedded, yielded last first: the order an executor of many workers may give."""

    def __init__(self) -> None:
        self.batches = 0

    def run(self, embedder: Embedder, batches: Sequence[EmbedBatch]) -> Iterator[EmbeddedBatch]:
        done = list(LocalEmbedExecutor().run(embedder, batches))
        self.batches = len(done)
        yield from reversed(done)


def test_an_executor_yielding_out_of_order_builds_the_same_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = copy_short_sample(tmp_path / "corpus")
    monkeypatch.setenv("CHUNKYARD_INDEX_BATCH", "8")  # several batches
    outs = []
    for name, executor in (("local", None), ("reversed", ReversedExecutor())):
        out = tmp_path / name
        run_ingest(corpus, out)
        checked: EmbedExecutor | None = executor
        report = index(out, executor=checked)
        outs.append((out, report))
        if isinstance(executor, ReversedExecutor):
            assert executor.batches > 1
    (local, first), (other, second) = outs
    assert first.embedded == second.embedded > 8
    assert first.index_hash == second.index_hash
    assert store_state(local) == store_state(other)
    a, b = open_store(local), open_store(other)
    try:
        ids = sorted(a.states())
        for cid in ids[:20]:
            rows_a, rows_b = a.rows([cid]), b.rows([cid])
            assert rows_a == rows_b
        model = first.embed_model
        digests = {state.digest for state in a.states().values()}
        va, vb = a.cached(model, digests), b.cached(model, digests)
        assert va.keys() == vb.keys() == digests
        for digest in digests:
            assert (va[digest][0] == vb[digest][0]).all() and va[digest][1] == vb[digest][1]
    finally:
        a.close()
        b.close()
