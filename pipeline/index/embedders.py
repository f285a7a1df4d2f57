"""Embedders: chunk texts in, float32 vectors out, behind one small interface, and their table.

An embedder is named by a spec, ``PREFIX:MODEL``; the prefix picks an entry of
``EMBEDDERS``, a factory that makes the embedder for ``MODEL``. The built-in entries are
given as ``"module:function"`` paths, so this module imports none of them (they import it
for the protocol) and a model's runtime (onnxruntime, torch) loads only when it is asked for:

* ``onnx`` (``pipeline.index.embed_onnx``): the offline default, all-MiniLM-L6-v2 as int8
  ONNX on the CPU; the specs ``None``, ``"default"``, ``"onnx"`` and
  ``"onnx:all-MiniLM-L6-v2-int8"`` name it.
* ``st`` (``pipeline.index.embed_st``): ``st:NAME``, a sentence-transformers model by name or path.
* ``e5`` (``pipeline.index.embed_e5``): multilingual-e5-small, 4-bit, offline (extra
  ``multilingual``); for Chinese, Japanese and Korean text.
* ``openai`` (``pipeline.index.embed_openai``): ``openai:MODEL@http://HOST:PORT/v1``, an
  OpenAI-compatible ``/v1/embeddings`` server (``pipeline.index.serve_embeddings`` serves the
  ONNX model).

Adding one: write a factory ``(model, *, threads=None, device=None) -> Embedder`` and
``register_embedder("mine", factory)`` (or ``"package.module:factory"``); ``mine:MODEL``
then works wherever a spec does (``--embedder``, ``update_index``, the eval).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from pipeline.errors import PipelineError, UsageError
from pipeline.index.registry import Registry

if TYPE_CHECKING:
    import numpy

#: The embedder a new index gets when none is named.
DEFAULT_EMBEDDER = "onnx:all-MiniLM-L6-v2-int8"
#: Specs that name the default.
DEFAULT_ALIASES = frozenset({"default", "onnx"})
#: Threads an in-process model may use inside one matrix product; ``CHUNKYARD_EMBED_THREADS`` overrides.
DEFAULT_THREADS = 2
#: Texts per model call: sorted by length, so a batch pads to near its own longest text.
DEFAULT_BATCH = 32
THREADS_ENV = "CHUNKYARD_EMBED_THREADS"


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


class EmbedderFactory(Protocol):
    """Makes the embedder for the ``MODEL`` part of a spec (``""`` when the spec has none)."""

    def __call__(self, model: str, *, threads: int | None = None, device: str | None = None) -> Embedder:
        """``threads``: the in-process model's thread cap; ``device``: where it runs
        (``None``: the factory's default; a factory that cannot honour it raises ``UsageError``)."""
        ...


#: Embedder factories by spec prefix.
EMBEDDERS: Registry[EmbedderFactory] = Registry("embedder")
#: How each prefix is written, for the message that lists them.
_USAGE: dict[str, str] = {}


def register_embedder(
    prefix: str, factory: str | EmbedderFactory, *, usage: str = "", replace: bool = False
) -> None:
    """Make ``PREFIX:MODEL`` specs name embedders made by ``factory`` (or its ``"module:attr"`` path).

    Args:
        usage: how the spec is written, for error messages (default ``PREFIX:MODEL``).
    """
    EMBEDDERS.add(prefix, factory, replace=replace)
    _USAGE[prefix] = usage or f"{prefix}:MODEL"


register_embedder("onnx", "pipeline.index.embed_onnx:make_onnx", usage=DEFAULT_EMBEDDER)
register_embedder("st", "pipeline.index.embed_st:make_st")
register_embedder("openai", "pipeline.index.embed_openai:make_openai", usage="openai:MODEL@URL")
register_embedder("e5", "pipeline.index.embed_e5:make_e5", usage="e5")


def make_embedder(
    spec: str | None = None, *, threads: int | None = None, device: str | None = None
) -> Embedder:
    """The embedder a spec names (see the module docstring); ``None`` is the offline default.

    Args:
        threads: the in-process model's thread cap (default 2, or ``CHUNKYARD_EMBED_THREADS``).
        device: where the model runs (``cpu``, ``cuda``, ``cuda:1``), for factories that can
            choose; ``None``: the factory's default.

    Raises:
        UsageError: an unknown prefix or model, a missing extra.
    """
    prefix, _, model = (DEFAULT_EMBEDDER if spec is None or spec in DEFAULT_ALIASES else spec).partition(":")
    if prefix not in EMBEDDERS:
        known = ", ".join(repr(_USAGE[name]) for name in EMBEDDERS if name != "onnx")
        raise UsageError(
            f"unknown embedder {spec!r}; use 'default' (= {DEFAULT_EMBEDDER!r}) or one of {known}"
        )
    return EMBEDDERS.get(prefix)(model, threads=threads, device=device)


def threads_from_env() -> int:
    """``CHUNKYARD_EMBED_THREADS``, else ``DEFAULT_THREADS``.

    Raises:
        UsageError: the variable is set to something other than a whole number >= 1.
    """
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
