"""Every consumer of the change feed plans with the one planner, so one history gives one set of writes.

The same history — edits (chunks whose ids stay but move to other chunk files), headings
renamed and documents moved or renamed (redirects), deletions, and a compaction that lifts
the feed's floor past every cursor — is followed by the index
(``chunkyard index``: SQLite store, the offline ONNX embedder), LangChain's
``InMemoryVectorStore`` and a LlamaIndex ``SimpleVectorStore``, each syncing after every
step. Each sync's writes are compared: the ids whose embedded text a consumer writes
(upserts) and the ids it removes (deletes) must be the same for all three, and each ends
holding exactly the chunk folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("llama_index.core")
pytest.importorskip("onnxruntime")
pytest.importorskip("sqlite_vec")

from adapters_support import chunk_state, document, edit_one_paragraph, make_corpus, run_ingest
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.vectorstores import InMemoryVectorStore
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.vector_stores import SimpleVectorStore
from pydantic import Field

from pipeline.adapters.langchain import sync_vectorstore
from pipeline.adapters.llamaindex import sync_vector_store
from pipeline.index import index
from pipeline.index.embedders import make_embedder
from pipeline.index.vector_store import open_store
from pipeline.run.changes import read_changes
from pipeline.run.db import StateDB, db_path
from pipeline.run.feed import last_seq


class RecordingLangChainStore(InMemoryVectorStore):
    """LangChain's in-memory store, noting the ids each call adds and deletes."""

    def __init__(self) -> None:
        super().__init__(DeterministicFakeEmbedding(size=8))
        self.added: set[str] = set()
        self.deleted: set[str] = set()

    def add_documents(self, documents: Any, **kwargs: Any) -> list[str]:
        self.added |= set(kwargs.get("ids") or [d.id for d in documents])
        return super().add_documents(documents, **kwargs)

    def delete(self, ids: Any = None, **kwargs: Any) -> None:
        self.deleted |= set(ids or ())
        super().delete(ids, **kwargs)


class RecordingLlamaStore(SimpleVectorStore):
    """LlamaIndex's simple store, noting the node ids each call adds and deletes."""

    added: set[str] = Field(default_factory=set)
    deleted: set[str] = Field(default_factory=set)

    def add(self, nodes: Any, **kwargs: Any) -> list[str]:
        self.added = self.added | {n.node_id for n in nodes}
        return super().add(nodes, **kwargs)

    def delete_nodes(self, node_ids: Any = None, filters: Any = None, **kwargs: Any) -> None:
        self.deleted = self.deleted | set(node_ids or ())
        super().delete_nodes(node_ids, filters, **kwargs)


def writes(added: set[str], deleted: set[str]) -> tuple[set[str], set[str]]:
    """(upserts, deletes) of one sync: an id deleted and added again (a replace) is an upsert."""
    return set(added), deleted - added


def index_digests(out: Path) -> dict[str, str]:
    db = open_store(out, None)
    try:
        return {cid: state.digest for cid, state in db.states().items()}
    finally:
        db.close()


def lift_the_floor(out: Path) -> None:
    """Compaction past every cursor: the feed's floor rises to its last line."""
    db = StateDB(db_path(out / ".chunkyard"))
    with db.transaction():
        db.set_meta(feed_floor=last_seq(out))
    db.close()


def test_one_history_gives_the_same_upserts_and_deletes_to_the_index_and_both_frameworks(
    tmp_path: Path,
) -> None:
    corpus = make_corpus(tmp_path)
    (corpus / "stable.md").write_text("---\ndoc_id: stable\n---\n" + document("stable"))
    out = tmp_path / "chunks"
    embedder = make_embedder(None)
    lc = RecordingLangChainStore()
    li = RecordingLlamaStore()
    li_model = MockEmbedding(embed_dim=4)

    def edit_headings() -> None:
        path = corpus / "gamma.md"
        path.write_text(path.read_text().replace("## Part 1", "## Part one"))

    def move_stable() -> None:  # a document with a front-matter doc_id to another folder
        (corpus / "zz").mkdir()  # a path sorting after the old one
        (corpus / "stable.md").rename(corpus / "zz" / "stable.md")

    def delete_beta() -> None:
        (corpus / "sub" / "beta.md").unlink()

    def rename_and_add() -> None:
        (corpus / "alpha.md").rename(corpus / "alpha-renamed.md")
        (corpus / "delta.md").write_text(document("delta", sections=2))

    def edit_then_compact() -> None:
        edit_one_paragraph(corpus, "gamma")

    steps: list[tuple[str, Any]] = [
        ("first", lambda: None),
        ("edit", lambda: edit_one_paragraph(corpus)),
        ("headings", edit_headings),
        ("move with doc_id", move_stable),
        ("delete", delete_beta),
        ("rename + add", rename_and_add),
        ("compaction past the cursor", edit_then_compact),
    ]
    kinds: set[str] = set()
    moved = redirected = 0
    for name, step in steps:
        step()
        run_ingest(corpus, out)
        kinds |= {change.kind for change in read_changes(out)}
        if name == "compaction past the cursor":
            lift_the_floor(out)

        before = index_digests(out) if (out / ".chunkyard" / "index.sqlite").exists() else {}
        report = index(out, embedder=embedder)
        after = index_digests(out)
        index_writes = (
            {cid for cid, digest in after.items() if before.get(cid) != digest},
            before.keys() - after.keys(),
        )
        assert (report.added + report.updated, report.deleted) == tuple(map(len, index_writes)), name
        moved, redirected = moved + report.moved, redirected + report.redirected

        lc.added, lc.deleted = set(), set()
        lc_report = sync_vectorstore(out, lc, tmp_path / "lc-cursor.json")
        li.added, li.deleted = set(), set()
        li_report = sync_vector_store(out, li, tmp_path / "li-cursor.json", embed_model=li_model)

        assert writes(lc.added, lc.deleted) == index_writes, name
        assert writes(li.added, li.deleted) == index_writes, name
        if name == "compaction past the cursor":  # one recovery rule: every chunk file is read
            assert report.full and lc_report.full and li_report.full
            assert report.reason == "the feed no longer reaches the cursor"
        else:
            assert not (lc_report.full or li_report.full), name

        live = {cid: rec["embedText"] for cid, rec in chunk_state(out).items()}
        assert set(after) == set(live) == set(lc.store) == set(li.data.embedding_dict), name
        assert {cid: entry["text"] for cid, entry in lc.store.items()} == live, name
    assert {"write", "delete", "redirect"} <= kinds  # the history exercised every kind of line
    assert moved and redirected  # ids that moved to other chunk files, ids an edit retired
