"""BM25 over a chunk and its neighbours, and the passage budget, for CJK indexes (issue 33).

Real components: corpora written here, ``chunkyard ingest``, the SQLite index (FTS5, sqlite-vec)
with the default ONNX embedder, ``Searcher``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from index_support import run_ingest

from pipeline.index.bm25_exact import bm25 as _bm25
from pipeline.index.bm25_exact import occurrences as _occurrences
from pipeline.index.expand import DEFAULT_BUDGET
from pipeline.index.language import CJK_PASSAGE_TOKENS, CJK_PROMPT_TOKENS
from pipeline.index.query import Searcher
from pipeline.index.sync import index

pytest.importorskip("sqlite_vec")

FILLER = "这是一段用来占位的说明文字，它描述了天气、城市和河流，与问题无关。" * 4
ZH = {
    # the question's two halves in two adjacent sections (two chunks) of one document
    "rnn.md": f"# 循环网络\n\n## 门控\n\n遗忘门控制记忆的保留。{FILLER}\n\n## 单元\n\n{FILLER}候选单元负责写入新信息。\n",
    # one half, repeated, in a short document: BM25 over each chunk alone ranks it first
    "memory.md": "# 记忆\n\n候选单元，候选单元。\n",
    "other.md": f"# 其他\n\n{FILLER}\n",
}
EN = {
    "gates.md": "# Gates\n\nThe forget gate decides what to keep.\n\n## Cells\n\nThe candidate cell writes new data.\n",
    "memory.md": "# Memory\n\nA candidate cell, a candidate cell.\n",
}


def _indexed(docs: dict[str, str], root: Path) -> Path:
    corpus, out = root / "corpus", root / "chunks"
    corpus.mkdir(parents=True)
    for name, text in docs.items():
        (corpus / name).write_text(text, encoding="utf-8")
    run_ingest(corpus, out)
    index(out, embedder="default")
    return out


@pytest.fixture(scope="module")
def zh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _indexed(ZH, tmp_path_factory.mktemp("zh"))


def test_a_question_split_over_adjacent_chunks_is_found_by_its_window(zh: Path) -> None:
    question = "遗忘门和候选单元"
    with Searcher(zh, expand_tokens=0, bm25_window=0) as alone, Searcher(zh, expand_tokens=0) as windowed:
        chunks = [(h["file"], h["offsets"]["start"]) for h in alone(question, "bm25", 5)]
        assert len({start for file, start in chunks if file == "rnn.md"}) == 2  # the premise: two chunks
        assert chunks[0][0] == "memory.md"  # each chunk alone: the repeated half wins
        first = windowed(question, "bm25", 5)[0]
        assert (first["file"], first["offsets"]["start"]) in chunks and first["file"] == "rnn.md"
        assert "遗忘门" in first["text"]  # the window's own chunk, not its neighbour's text


def test_the_passage_budget_and_the_windows_follow_the_language(zh: Path, tmp_path: Path) -> None:
    with Searcher(zh) as searcher:
        assert searcher.expand_tokens == CJK_PASSAGE_TOKENS
        assert searcher.record("候选单元", 3)["expand_tokens"] == CJK_PASSAGE_TOKENS
        assert searcher.prompt is None  # embedded by the default model: fixed passages
    with Searcher(zh, expand_tokens=300, prompt=CJK_PROMPT_TOKENS) as searcher:
        assert searcher.expand_tokens == 300  # asked for: kept
        assert searcher.prompt == CJK_PROMPT_TOKENS
    with Searcher(zh, prompt=0) as searcher:
        assert searcher.prompt is None  # 0: fixed passages
    en = _indexed(EN, tmp_path / "en")
    with Searcher(en) as searcher, Searcher(en, bm25_window=3) as asked:
        assert searcher.expand_tokens == DEFAULT_BUDGET
        assert searcher.prompt is None  # English passages: fixed
        question = "forget gate and candidate cell"
        # no windows on an English index, asked for or not: BM25 over each chunk, as before
        assert [h["score_raw"] for h in searcher(question, "bm25", 5)] == [
            h["score_raw"] for h in asked(question, "bm25", 5)
        ]


def test_window_bm25_counts_terms_and_phrases_over_the_texts_as_one() -> None:
    assert _occurrences(("ab",), ["ab", "x", "ab"]) == 2
    assert _occurrences(("a", "b"), ["a", "b", "a", "b", "b"]) == 2
    assert _occurrences(("a", "a"), ["a", "a", "a"]) == 2  # overlapping runs count
    terms = [(("遗忘",), 2.0), (("单元",), 1.0)]
    apart = _bm25(terms, [["遗忘", "x"]], 2.0) + _bm25(terms, [["单元", "y"]], 2.0)
    together = _bm25(terms, [["遗忘", "x"], ["单元", "y"]], 4.0)
    assert together > max(_bm25(terms, [["遗忘", "x"]], 2.0), _bm25(terms, [["单元", "y"]], 2.0))
    assert together == pytest.approx(apart)  # same term counts, same length relative to the average
    assert _bm25(terms, [["z"]], 1.0) == 0.0


def test_a_chunk_whose_neighbours_hold_the_question_is_ranked_by_its_window(tmp_path: Path) -> None:
    # the middle section holds none of the question's bigrams, its two neighbours one half each:
    # BM25 over each chunk alone never lists it; its window holds the whole question
    doc = f"# 循环网络\n\n## 甲\n\n遗忘门控制记忆。{FILLER}\n\n## 乙\n\n{FILLER}\n\n## 丙\n\n候选单元负责写入。{FILLER}\n"
    out = _indexed({"rnn.md": doc}, tmp_path)
    question = "遗忘门和候选单元"
    with Searcher(out, expand_tokens=0, bm25_window=0) as alone, Searcher(out, expand_tokens=0) as windowed:
        listed = alone(question, "bm25", 10)
        assert len(listed) == 2 and not any("## 乙" in h["text"] for h in listed)  # the premise
        middle = [h for h in windowed(question, "bm25", 10) if "## 乙" in h["text"]]
        assert len(middle) == 1 and middle[0]["file"] == "rnn.md"
        assert middle[0]["score_raw"] > 0  # scored by its window, not only listed


def test_a_shared_prompt_bounds_the_hybrid_passages_only(zh: Path) -> None:
    """``Searcher(prompt=…)`` hands the prompt to the merge in hybrid mode (``expand.shared_budget``);
    BM25 or dense alone keep fixed passages."""
    question, budget = "遗忘门和候选单元", 400
    with (
        Searcher(zh, expand_tokens=budget, prompt=0) as fixed,
        Searcher(zh, expand_tokens=budget, prompt=1) as shared,
    ):
        grown = [len(p["chunk_ids"]) for p in fixed(question, "hybrid", 5)]
        assert max(grown) > 1  # the premise: without a prompt a passage merges its ranked neighbour
        # a prompt of 1 token: every passage gets half the budget
        for passage in shared(question, "hybrid", 5):
            assert len(passage["chunk_ids"]) == 1 or passage["tokens"] <= budget // 2
        assert [len(p["chunk_ids"]) for p in shared(question, "hybrid", 5)] != grown
        for mode in ("bm25", "dense"):
            assert shared(question, mode, 5) == fixed(question, mode, 5)
