"""LangChain adapter, end to end with LangChain's own InMemoryVectorStore and fake embeddings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("langchain_text_splitters")

from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.vectorstores import InMemoryVectorStore
from pydantic import Field

from pipeline.adapters.langchain import (
    ChunkyardLoader,
    ChunkyardTextSplitter,
    sync_vectorstore,
)
from tests.adapters_support import (
    POLICY,
    changed_texts,
    chunk_state,
    document,
    edit_one_paragraph,
    embed_texts,
    make_corpus,
    run_ingest,
)


class CountingEmbedding(DeterministicFakeEmbedding):
    """LangChain's fake embedding, counting the texts it is asked to embed."""

    texts: list[str] = Field(default_factory=list)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self.texts.extend(texts)
        return super().embed_documents(texts)


class FlakyStore(InMemoryVectorStore):
    """An in-memory store whose next ``add_documents`` or ``delete`` can be made to fail."""

    fail: str = ""

    def add_documents(self, documents: Any, **kwargs: Any) -> list[str]:
        if self.fail == "add":
            raise ConnectionError("store unreachable")
        return super().add_documents(documents, **kwargs)

    def delete(self, ids: Any = None, **kwargs: Any) -> None:
        if self.fail == "delete":
            raise ConnectionError("store unreachable")
        super().delete(ids, **kwargs)


def held(store: InMemoryVectorStore) -> dict[str, str]:
    return {doc_id: entry["text"] for doc_id, entry in store.store.items()}


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path, FlakyStore, CountingEmbedding, Path]:
    corpus = make_corpus(tmp_path)
    out = tmp_path / "chunks"
    run_ingest(corpus, out)
    embedding = CountingEmbedding(size=8, texts=[])
    return corpus, out, FlakyStore(embedding), embedding, tmp_path / "lc-cursor.json"


def test_loader_one_document_per_chunk_with_citation_metadata(setup: Any) -> None:
    corpus, out, *_ = setup
    docs = ChunkyardLoader(out).load()
    state = chunk_state(out)
    assert sorted(d.id for d in docs) == sorted(state)
    for doc in docs:
        rec = state[doc.id]
        assert doc.page_content == rec["embedText"]
        meta = doc.metadata
        assert meta["snippet_id"] == meta["chunk_id"] == doc.id
        assert meta["doc_id"] == doc.id.split("|r=")[0]
        source = (corpus / meta["source"]).read_text()
        assert source[meta["char_start"] : meta["char_end"]] == rec["originalText"]
        assert meta["rev"] == rec["rev"] and meta["section_id"] == rec["section_id"]
        assert all(isinstance(v, str | int) for v in meta.values()), meta  # flat, for any store


def test_splitter_gives_the_records_ingest_writes(tmp_path: Path) -> None:
    text = document("delta") + "\n```python\n" + "x = 1\n" * 80 + "```\n"
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "delta.md").write_text(text)
    run_ingest(corpus, tmp_path / "out")
    on_disk = sorted(chunk_state(tmp_path / "out").values(), key=lambda r: r["chunkNumber"])
    splitter = ChunkyardTextSplitter(POLICY, path="delta.md")
    assert splitter.split_text(text) == [r["embedText"] for r in on_disk]
    docs = splitter.create_documents([text], [{"source": "delta.md", "team": "docs"}])
    assert [d.id for d in docs] == [r["chunk_id"] for r in on_disk]
    for doc, rec in zip(docs, on_disk, strict=True):
        start = doc.metadata["start_index"]
        assert text[start : start + len(rec["originalText"])] == rec["originalText"]
        assert doc.metadata["team"] == "docs"
    fence = "```python\n" + "x = 1\n" * 80 + "```"
    assert sum(fence in t for t in splitter.split_text(text)) == 1  # a code block is never cut
    original = ChunkyardTextSplitter(POLICY, content="original", path="delta.md")
    assert original.split_text(text) == [r["originalText"] for r in on_disk]


def test_sync_embeds_only_what_changed(setup: Any) -> None:
    corpus, out, store, embedding, cursor = setup
    report = sync_vectorstore(out, store, cursor)
    first = embed_texts(out)
    assert held(store) == first
    assert report.embedded == len(embedding.texts) == len(first)

    before = dict(first)
    edit_one_paragraph(corpus)
    run_ingest(corpus, out)
    after = embed_texts(out)
    changed = changed_texts(before, after)
    alpha = [cid for cid in after if cid.startswith("alpha|")]
    assert 1 <= len(changed) < len(alpha)  # the edit changes some chunks, not the document
    embedding.texts.clear()
    report = sync_vectorstore(out, store, cursor)
    assert held(store) == after
    assert sorted(embedding.texts) == sorted(after[cid] for cid in changed)
    assert report.embedded == len(changed)

    embedding.texts.clear()
    assert sync_vectorstore(out, store, cursor).changes == 0  # nothing new in the feed
    assert embedding.texts == []


def test_sync_follows_deletes_and_moved_ids(setup: Any) -> None:
    corpus, out, store, embedding, cursor = setup
    sync_vectorstore(out, store, cursor)
    (corpus / "sub" / "beta.md").unlink()
    text = (corpus / "gamma.md").read_text()
    (corpus / "gamma.md").write_text(text.replace("## Part 1", "## Part one"))  # the outline moves
    run_ingest(corpus, out)
    embedding.texts.clear()
    report = sync_vectorstore(out, store, cursor)
    now = embed_texts(out)
    assert held(store) == now
    assert not any(cid.startswith("sub/beta|") for cid in held(store))
    assert report.deleted > 0


@pytest.mark.parametrize("fail", ["add", "delete"])
def test_a_failing_store_leaves_the_cursor_and_the_next_sync_converges(setup: Any, fail: str) -> None:
    corpus, out, store, _, cursor = setup
    sync_vectorstore(out, store, cursor)
    edit_one_paragraph(corpus)
    (corpus / "gamma.md").unlink()
    run_ingest(corpus, out)
    saved = cursor.read_bytes()
    store.fail = fail
    with pytest.raises(ConnectionError):
        sync_vectorstore(out, store, cursor)
    state = json.loads(cursor.read_bytes())
    assert state["cursor"] == json.loads(saved)["cursor"]
    store.fail = ""
    sync_vectorstore(out, store, cursor)
    assert held(store) == embed_texts(out)
