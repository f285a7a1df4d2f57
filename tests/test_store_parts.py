"""Many new rows are written in parts, the next part's values made on a second thread
(``pipeline.index.sqlite_rows``): the store holds and finds exactly what one part gives."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.index import sqlite_rows
from pipeline.index.analyzer import query_terms
from pipeline.index.rows import ChunkRow, digest_text
from pipeline.index.sqlite_store import SqliteStore

WORDS = ["borrow", "owner", "value", "thread", "vector", "index", "chunk", "lexical", "search", "cache"]


def _rows(n: int) -> list[ChunkRow]:
    rows = []
    for i in range(n):
        text = " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(3 + i % 5)) + f" 中文{i % 4}"
        rows.append(
            ChunkRow(
                chunk_id=f"d{i // 10}|r=1|s={i}|p=000|b=000", file=f"d{i // 10}.json", id=f"doc:{i}",
                hash=f"blake3:{i}", digest=digest_text(text), doc_id=f"d{i // 10}", section_id=str(i),
                source_url="d.md", source_file="d.md", start=0, end=len(text), line_start=1, line_end=1,
                tokens=len(text.split()), rev="r", analyzer="verbatim", policy_hash="p", title="T",
                breadcrumb="T", text=text, embed_text=text, model_tokens=3,
            )
        )  # fmt: skip
    return rows


def _store(path: Path, rows: list[ChunkRow], vectors: np.ndarray) -> list[object]:
    store = SqliteStore(path, vectors.shape[1])
    try:
        store.commit(list(zip(rows, vectors, strict=True)), set(), {"generation": "1"}, model="m")
        dump = [sorted(store.states().items())]
        for word in [*WORDS, "中文2"]:
            dump.append(store.lexical(query_terms(word), 20))
        for i in range(0, len(rows), 7):
            dump.append(store.dense(vectors[i], 10))
        found = store.rows([r.chunk_id for r in rows])
        dump.append([found[r.chunk_id] == r for r in rows])
        return dump
    finally:
        store.close()


def test_rows_written_in_parts_are_the_rows_written_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = _rows(53)
    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((len(rows), 16)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    once = _store(tmp_path / "once.sqlite", rows, vectors)
    monkeypatch.setattr(sqlite_rows, "PART", 5)  # 11 parts: the threaded path
    parts = _store(tmp_path / "parts.sqlite", rows, vectors)
    assert parts == once
    assert all(once[-1]) and len(once[0]) == len(rows)  # type: ignore[arg-type]
    assert sum(1 for hits in once[1:-1] if hits) == len(once) - 2  # every query found something
