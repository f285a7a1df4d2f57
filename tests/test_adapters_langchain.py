"""LangChain adapter, end to end with LangChain's own InMemoryVectorStore and fake embeddings."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("langchain_text_splitters")

from adapters_support import (
    POLICY,
    changed_texts,
    chunk_state,
    document,
    edit_one_paragraph,
    embed_texts,
    make_corpus,
    random_edit,
    run_ingest,
)
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.vectorstores import InMemoryVectorStore
from pydantic import Field

from pipeline.adapters.langchain import (
    ChunkyardLoader,
    ChunkyardTextSplitter,
    sync_vectorstore,
)
from pipeline.run.db import StateDB, db_path
from pipeline.run.feed import last_seq
from pipeline.run.ingest import Options, Session


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


@pytest.mark.parametrize("seed", range(4))
def test_random_edits_and_syncs_converge_embedding_only_new_texts(tmp_path: Path, seed: int) -> None:
    """Edits of every kind, a sync after some of them: the store always ends equal to the
    chunk folder, and each sync embeds exactly the texts the store did not hold under that id."""
    rng = random.Random(seed)
    corpus = make_corpus(tmp_path)
    out = tmp_path / "chunks"
    run_ingest(corpus, out)
    embedding = CountingEmbedding(size=4, texts=[])
    store = InMemoryVectorStore(embedding)
    cursor = tmp_path / "cursor.json"
    done: list[str] = []
    for step in range(12):
        done.append(random_edit(corpus, rng, step))
        run_ingest(corpus, out)
        if rng.random() < 0.5 and step < 11:
            continue
        before, now = held(store), embed_texts(out)
        embedding.texts.clear()
        sync_vectorstore(out, store, cursor, batch_size=rng.choice([1, 5, 128]))
        assert held(store) == now, done
        assert sorted(embedding.texts) == sorted(now[cid] for cid in changed_texts(before, now)), done


def test_a_sync_during_an_ingest_converges_after_it(tmp_path: Path) -> None:
    """A loader may follow a long run as it goes: a sync after each document, mid-run."""
    corpus = make_corpus(tmp_path, ("alpha", "beta", "gamma", "delta"))
    out = tmp_path / "chunks"
    run_ingest(corpus, out)
    store = InMemoryVectorStore(CountingEmbedding(size=4, texts=[]))
    cursor = tmp_path / "cursor.json"
    sync_vectorstore(out, store, cursor)
    for name in ("alpha", "gamma"):
        path = corpus / f"{name}.md"
        path.write_text(path.read_text().replace("## Part 0", "## Part zero"))  # every id moves
    edit_one_paragraph(corpus, "alpha")
    (corpus / "sub" / "beta.md").unlink()
    syncs: list[int] = []

    def on_result(_: object) -> None:
        syncs.append(sync_vectorstore(out, store, cursor).changes)

    opts = Options(corpus=corpus, out=out, policy=POLICY, doc_timeout=0, doc_memory_mb=0)
    with Session(opts) as session:
        assert session.sync(on_result=on_result).exit_code == 0
    assert any(syncs)  # it saw some lines mid-run
    sync_vectorstore(out, store, cursor)
    assert held(store) == embed_texts(out)


@pytest.mark.parametrize("how", ["cut", "other-form"])
def test_a_lost_cursor_reads_all_again_and_drops_what_is_gone(setup: Any, how: str) -> None:
    corpus, out, store, embedding, cursor = setup
    sync_vectorstore(out, store, cursor)
    (corpus / "sub" / "beta.md").unlink()
    edit_one_paragraph(corpus)
    run_ingest(corpus, out)
    if how == "cut":  # the feed compacted past the cursor (its floor rose above it)
        db = StateDB(db_path(out / ".chunkyard"))
        with db.transaction():
            db.set_meta(feed_floor=last_seq(out))
        db.close()
    else:  # a cursor kept from before the feed changed form (an upgrade)
        state = json.loads(cursor.read_bytes())
        state["cursor"] = "bytes:100" if state["cursor"].startswith("seq:") else "seq:3"
        cursor.write_text(json.dumps(state))
    before, now = held(store), embed_texts(out)
    embedding.texts.clear()
    report = sync_vectorstore(out, store, cursor)
    assert report.full and report.deleted > 0
    assert held(store) == now
    assert sorted(embedding.texts) == sorted(now[cid] for cid in changed_texts(before, now))
    embedding.texts.clear()
    again = sync_vectorstore(out, store, cursor, full=True)  # asked for: nothing to do
    assert again.full and again.embedded == again.deleted == 0 and embedding.texts == []
