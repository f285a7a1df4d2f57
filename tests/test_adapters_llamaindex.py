"""LlamaIndex adapter, end to end with LlamaIndex's own SimpleVectorStore and MockEmbedding."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("llama_index.core")

from adapters_support import (
    POLICY,
    changed_texts,
    chunk_state,
    document,
    edit_one_paragraph,
    embed_texts,
    make_corpus,
    run_ingest,
)
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.schema import Document, MetadataMode, NodeRelationship
from llama_index.core.vector_stores import SimpleVectorStore
from pydantic import Field

from pipeline.adapters.llamaindex import (
    ChunkyardNodeParser,
    ChunkyardReader,
    sync_vector_store,
)
from pipeline.errors import UsageError


class CountingEmbedding(MockEmbedding):
    """LlamaIndex's mock embedding, keeping the texts it is asked to embed."""

    texts: list[str] = Field(default_factory=list)

    def _get_text_embedding(self, text: str) -> list[float]:
        self.texts.append(text)
        return super()._get_text_embedding(text)

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        self.texts.extend(texts)
        return [super(CountingEmbedding, self)._get_text_embedding(t) for t in texts]


class FlakyStore(SimpleVectorStore):
    """A SimpleVectorStore whose next ``add`` can be made to fail."""

    fail: bool = False

    def add(self, nodes: Any, **kwargs: Any) -> list[str]:
        if self.fail:
            raise ConnectionError("store unreachable")
        return super().add(nodes, **kwargs)


class StrictStore(SimpleVectorStore):
    """A store that refuses an id it holds already (as FAISS does), and can fail half-way."""

    half: bool = False

    def add(self, nodes: Any, **kwargs: Any) -> list[str]:
        clash = [n.node_id for n in nodes if n.node_id in self.data.embedding_dict]
        if clash:
            raise ValueError(f"ids exist already: {clash[:3]}")
        if self.half:
            super().add(nodes[: len(nodes) // 2], **kwargs)
            raise ConnectionError("store went away half-way")
        return super().add(nodes, **kwargs)


def held(index: VectorStoreIndex) -> dict[str, str]:
    """node id → text, as the index would hand them to a query (vector ids, docstore texts)."""
    ids = set(index.vector_store.data.embedding_dict)
    return {i: index.docstore.get_node(i).get_content() for i in ids}


def originals(out: Path) -> dict[str, str]:
    return {cid: rec["originalText"] for cid, rec in chunk_state(out).items()}


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path, VectorStoreIndex, CountingEmbedding, Path]:
    corpus = make_corpus(tmp_path)
    out = tmp_path / "chunks"
    run_ingest(corpus, out)
    embedding = CountingEmbedding(embed_dim=4, texts=[])
    store = FlakyStore()
    index = VectorStoreIndex(
        [], storage_context=StorageContext.from_defaults(vector_store=store), embed_model=embedding
    )
    return corpus, out, index, embedding, tmp_path / "li-cursor.json"


def test_reader_nodes_have_exact_offsets_links_and_embed_text(setup: Any) -> None:
    corpus, out, *_ = setup
    nodes = ChunkyardReader(out).load_nodes()
    state = chunk_state(out)
    assert sorted(n.node_id for n in nodes) == sorted(state)
    by_file_id = {rec["id"]: cid for cid, rec in state.items()}
    for node in nodes:
        rec = state[node.node_id]
        source = (corpus / rec["metadata"]["sourceFile"]).read_text()
        assert source[node.start_char_idx : node.end_char_idx] == node.text == rec["originalText"]
        assert node.get_content(MetadataMode.EMBED) == rec["embedText"]
        assert node.get_content(MetadataMode.LLM) == rec["embedText"]
        rels = node.relationships
        assert rels[NodeRelationship.PARENT].node_id == rec["parentId"]
        prev, nxt = rels.get(NodeRelationship.PREVIOUS), rels.get(NodeRelationship.NEXT)
        assert (prev.node_id if prev else None) == (by_file_id[rec["prevId"]] if rec["prevId"] else None)
        assert (nxt.node_id if nxt else None) == (by_file_id[rec["nextId"]] if rec["nextId"] else None)


def test_node_parser_chunks_documents_in_memory(tmp_path: Path) -> None:
    text = document("delta") + "\n| a | b |\n|---|---|\n" + "| 1 | 2 |\n" * 60
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "delta.md").write_text(text)
    run_ingest(corpus, tmp_path / "out")
    on_disk = sorted(chunk_state(tmp_path / "out").values(), key=lambda r: r["chunkNumber"])
    doc = Document(text=text, id_="delta-doc", metadata={"file_name": "delta.md", "team": "docs"})
    nodes = ChunkyardNodeParser(policy=POLICY).get_nodes_from_documents([doc])
    assert [n.node_id for n in nodes] == [r["chunk_id"] for r in on_disk]
    for node, rec in zip(nodes, on_disk, strict=True):
        assert text[node.start_char_idx : node.end_char_idx] == node.text == rec["originalText"]
        assert node.get_content(MetadataMode.EMBED) == rec["embedText"]  # split tables' headers too
        assert node.ref_doc_id == "delta-doc" and node.metadata["team"] == "docs"
    assert any(r["embedText"].count("| a | b |") and not r["originalText"].startswith("| a") for r in on_disk)


def test_sync_embeds_only_what_changed(setup: Any) -> None:
    corpus, out, index, embedding, cursor = setup
    report = sync_vector_store(out, index, cursor)
    first = embed_texts(out)
    assert held(index) == originals(out)
    state = chunk_state(out)
    by_file_id = {rec["id"]: cid for cid, rec in state.items()}
    for cid, rec in state.items():  # the links the sync made point at the neighbours' chunk ids
        rels = index.docstore.get_node(cid).relationships
        for key, rel in ((rec["prevId"], NodeRelationship.PREVIOUS), (rec["nextId"], NodeRelationship.NEXT)):
            assert (rels[rel].node_id if rel in rels else None) == (by_file_id[key] if key else None)
    assert sorted(embedding.texts) == sorted(first.values())
    assert report.embedded == len(first)

    edit_one_paragraph(corpus)
    run_ingest(corpus, out)
    after = embed_texts(out)
    changed = changed_texts(first, after)
    assert 1 <= len(changed) < len([c for c in after if c.startswith("alpha|")])
    embedding.texts.clear()
    report = sync_vector_store(out, index, cursor)
    assert held(index) == originals(out)
    assert sorted(embedding.texts) == sorted(after[cid] for cid in changed)
    assert report.embedded == len(changed)

    (corpus / "sub" / "beta.md").unlink()
    run_ingest(corpus, out)
    embedding.texts.clear()
    sync_vector_store(out, index, cursor)
    assert held(index) == originals(out)
    assert not any(i.startswith("sub/beta|") for i in held(index))
    assert embedding.texts == []


def test_a_bare_vector_store_with_an_embed_model(setup: Any) -> None:
    corpus, out, _, embedding, cursor = setup
    store = SimpleVectorStore()
    with pytest.raises(UsageError, match="embed_model"):
        sync_vector_store(out, store, cursor)
    sync_vector_store(out, store, cursor, embed_model=embedding)
    assert set(store.data.embedding_dict) == set(chunk_state(out))
    edit_one_paragraph(corpus)
    run_ingest(corpus, out)
    sync_vector_store(out, store, cursor, embed_model=embedding)
    assert set(store.data.embedding_dict) == set(chunk_state(out))


def test_a_failing_store_leaves_the_cursor_and_the_next_sync_converges(setup: Any) -> None:
    corpus, out, index, _, cursor = setup
    sync_vector_store(out, index, cursor)
    edit_one_paragraph(corpus)
    (corpus / "gamma.md").unlink()
    run_ingest(corpus, out)
    saved = json.loads(cursor.read_bytes())["cursor"]
    index.vector_store.fail = True
    with pytest.raises(ConnectionError):
        sync_vector_store(out, index, cursor)
    assert json.loads(cursor.read_bytes())["cursor"] == saved
    index.vector_store.fail = False
    sync_vector_store(out, index, cursor)
    assert held(index) == originals(out)


def test_a_half_applied_add_is_replaced_not_doubled(setup: Any) -> None:
    corpus, out, _, embedding, cursor = setup
    store = StrictStore()
    sync_vector_store(out, store, cursor, embed_model=embedding)
    edit_one_paragraph(corpus)
    (corpus / "gamma.md").write_text(document("gamma", heading="Section"))  # new ids for a whole document
    run_ingest(corpus, out)
    store.half = True
    with pytest.raises(ConnectionError):
        sync_vector_store(out, store, cursor, embed_model=embedding, batch_size=8)
    store.half = False
    sync_vector_store(out, store, cursor, embed_model=embedding, batch_size=8)
    assert set(store.data.embedding_dict) == set(chunk_state(out))
