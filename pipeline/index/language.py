"""A corpus's language, as far as the index cares: does its text need the CJK analyzer?

The language is decided once per index, when it is created (``chunkyard index`` on an empty
store, or ``--rebuild``), and kept in the index as its analyzer's name; later runs read and
write with that analyzer, so an incremental run analyzes as the first one did. In order:

1. ``--lang CODE`` (``zh``, ``ja``, ``ko``, ``zh-Hans``…, or ``cjk``: the bigram analyzer;
   any other code, such as ``en``: the default one). On an existing index a ``--lang`` that
   asks for another analyzer is refused with the rebuild command (an index never mixes two).
2. The index's own analyzer, when it has one.
3. Detection (``--lang auto``, the default) over the chunk files of the folder: a document
   is CJK when its front matter says so (``lang``/``language``: ``zh``, ``ja``, ``ko``…) or,
   without one, when CJK characters are at least ``CJK_SHARE`` of its letters; the corpus
   takes the bigram analyzer when at least ``CORPUS_SHARE`` of its documents are CJK. A few
   CJK words in an English corpus (a translator's name, one translated page) keep the default,
   so an English index keeps its analyzer and its ``index_hash``.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.chunkfolder import iter_chunk_files, read_chunk_file_or_none
from pipeline.index import embed_e5
from pipeline.index.analyzers import Analysis, analysis, with_cjk
from pipeline.index.vector_store import IndexMismatchError

#: A document is CJK when CJK characters are at least this share of its letters.
CJK_SHARE = 0.25
#: A corpus takes the CJK analyzer when at least this share of its documents are CJK (the
#: sample corpus, one Japanese-and-Chinese page in nine, keeps the default).
CORPUS_SHARE = 0.25
CJK_CODES = ("zh", "ja", "ko", "cjk")
_CJK = re.compile(
    "[\u2e80-\u2fdf\u3040-\u30ff\u3100-\u312f\u3190-\u31ff\u3400-\u4dbf\u4e00-\u9fff"
    "\uac00-\ud7af\uf900-\ufaff\uff66-\uff9f\U00020000-\U0002fa1f]"
)


def is_cjk_code(code: str) -> bool:
    """``zh``, ``zh-Hans``, ``ja_JP``, ``ko``, ``cjk``: True; ``en``, ``de``: False."""
    return re.split(r"[-_]", code.strip().lower(), maxsplit=1)[0] in CJK_CODES


def cjk_share(text: str) -> float:
    """CJK characters as a share of the text's letters (0 when it has none)."""
    letters = sum(1 for ch in text if unicodedata.category(ch)[0] == "L")
    return len(_CJK.findall(text)) / letters if letters else 0.0


@dataclass(frozen=True, slots=True)
class Choice:
    """The analyzer an index is built with, and why (``chunkyard index`` says it)."""

    analyzer: str
    cjk: bool
    reason: str


def choose(out: Path, lang: str | None, stored: Mapping[str, str], default_name: str, *, hint: str) -> Choice:
    """The analyzer for a run over the chunk folder ``out`` (see the module docstring).

    ``default_name``: the store's default analyzer; ``stored``: the index's meta (empty when
    new); ``hint``: the rebuild command, for the refusal.

    Raises:
        IndexMismatchError: ``analyzer_mismatch``: ``--lang`` asks an existing index for
            another analyzer than it was built with.
    """
    existing = stored.get("analyzer") if stored.get("embed_model") else None
    if lang and lang.lower() != "auto":
        cjk = is_cjk_code(lang)
        name = with_cjk(default_name, cjk)
        if existing and existing != name:
            raise IndexMismatchError(
                "analyzer_mismatch",
                f"--lang {lang}: the index was built with the analyzer {existing!r}, --lang {lang} "
                f"asks for {name!r} (hint: rebuild it: `{hint} --lang {lang}`)",
            )
        return Choice(name, cjk, f"--lang {lang}")
    if existing:
        return Choice(existing, existing.endswith(with_cjk("", True)), "the index's own")
    cjk_docs, docs = detect(out)
    cjk = docs > 0 and cjk_docs >= CORPUS_SHARE * docs
    return Choice(
        with_cjk(default_name, cjk),
        cjk,
        f"detected: {cjk_docs} of {docs} documents in Chinese, Japanese or Korean"
        + (" (front matter lang, else script)" if docs else ""),
    )


def detect(out: Path) -> tuple[int, int]:
    """(CJK documents, documents) among the chunk files under ``out``."""
    texts: dict[str, list[str]] = {}
    declared: dict[str, str] = {}
    for record in _records(out):
        doc = str(record.get("doc_id") or str(record.get("chunk_id", "")).split("|r=", 1)[0])
        texts.setdefault(doc, []).append(str(record.get("originalText", "")))
        front = (record.get("metadata") or {}).get("frontMatter") or {}
        code = front.get("lang") or front.get("language") if isinstance(front, dict) else None
        if isinstance(code, str) and code.strip():
            declared[doc] = code
    cjk = sum(
        1
        for doc, parts in texts.items()
        if (is_cjk_code(declared[doc]) if doc in declared else cjk_share("\n".join(parts)) >= CJK_SHARE)
    )
    return cjk, len(texts)


def _records(out: Path) -> Iterable[Mapping[str, Any]]:
    """Every chunk record under ``out``."""
    for rel in iter_chunk_files(out):
        record = read_chunk_file_or_none(out / rel)
        if record is not None and "chunk_id" in record:
            yield record


def default_analyzer(db: Any) -> str:
    """The default analyzer of an open store's kind: its class's ``analyzer`` (an open store's own
    ``analyzer`` is its index's, which may be the CJK one)."""
    return str(getattr(type(db), "analyzer", db.analyzer))


def require(name: str, default_name: str, *, where: str, hint: str) -> Analysis:
    """The analyzer ``name`` (``analyzers.analysis``), or the refusal to read an index built with
    one this chunkyard does not know.

    Raises:
        IndexMismatchError: ``analyzer_mismatch``, with the rebuild command.
    """
    found = analysis(name, default_name)
    if found is None:
        raise IndexMismatchError(
            "analyzer_mismatch",
            f"{where}: the index's BM25 analyzer is {name!r}, this chunkyard reads with {default_name!r} "
            f"or {with_cjk(default_name, True)!r} (hint: rebuild it: `{hint}`)",
        )
    return found


def embedder_for(choice: Choice) -> tuple[str, str]:
    """The embedder spec a new index takes when no ``--embedder`` is given, and why: the default
    for a corpus not in Chinese, Japanese or Korean; for one that is, the multilingual model
    (``e5``) when its extra is installed, since the default was trained on English and ranks CJK
    text little better than chance (chosen on the d2l-zh gold set: docs/benchmarks.md), else the
    default with the hint to install it. The multilingual model costs several times the CPU."""
    if not choice.cjk:
        return "default", "the default"
    if embed_e5.available():
        return "e5", (
            f"the multilingual model, for a corpus in Chinese, Japanese or Korean ({choice.reason}); "
            "slower to index than the default (--embedder default for it)"
        )
    return "default", (
        f"the default, an English model, for a corpus in Chinese, Japanese or Korean ({choice.reason}); "
        f"its hybrid search leans on BM25 (dense weight {CJK_DENSE}); the multilingual model ranks CJK "
        f"text far better ({embed_e5.INSTALL_HINT})"
    )


#: The dense side's weight (BM25's is 1) in hybrid search over CJK text embedded by the default
#: model. It was trained on English: its vectors of Chinese or Japanese carry little, and at
#: equal weight they pull the hits BM25 ranks well down (docs/benchmarks.md, the d2l-zh set, with
#: the BM25 windows of ``pipeline.index.windows``).
CJK_DENSE = 0.1
#: The dense side's weight over CJK text embedded by a multilingual model (``MULTILINGUAL``),
#: which ranks it about as well as BM25 does (chosen on the d2l-zh set: docs/benchmarks.md).
CJK_DENSE_MULTILINGUAL = 0.7
#: Embedders trained on many languages, CJK included (the index's ``embed_model``).
MULTILINGUAL = (embed_e5.E5_NAME,)
#: The passage budget (``search --expand``) over CJK text. cl100k spends about a token per
#: Chinese or Japanese character, so a budget holds far less text there than in English; the
#: English default's passages cut the answer's context short (docs/benchmarks.md, d2l-zh). Half
#: a 2,000-token prompt, so that two full passages fit in one.
CJK_PASSAGE_TOKENS = 1000


#: The prompt the passages of a hybrid search over CJK text embedded by a multilingual model share
#: (``expand.shared_budget``): the first passage takes ``CJK_PASSAGE_TOKENS``, each later one half of
#: what this prompt has left, at least half that budget, so that a large first passage does not
#: crowd the next places out of the prompt (chosen on the d2l-zh set for that configuration; with
#: the default model, or BM25 or dense alone, it cost answers in the top 5 there: docs/benchmarks.md).
CJK_PROMPT_TOKENS = 2 * CJK_PASSAGE_TOKENS


def is_cjk_index(meta: Mapping[str, str]) -> bool:
    """Whether the index whose meta is ``meta`` was built with the CJK analyzer."""
    return meta.get("analyzer", "").endswith(with_cjk("", True))


def passage_budget(meta: Mapping[str, str], default: int) -> int:
    """The passage budget of search over the index whose meta is ``meta`` when none is asked:
    ``default``, or ``CJK_PASSAGE_TOKENS`` for an index with the CJK analyzer."""
    return CJK_PASSAGE_TOKENS if is_cjk_index(meta) else default


def prompt_tokens(meta: Mapping[str, str]) -> int | None:
    """The prompt the passages of a hybrid search over the index whose meta is ``meta`` share when
    none is asked: ``CJK_PROMPT_TOKENS`` for an index with the CJK analyzer embedded by a
    multilingual model (``MULTILINGUAL``), else none (fixed passages)."""
    multilingual = meta.get("embed_model", "") in MULTILINGUAL
    return CJK_PROMPT_TOKENS if is_cjk_index(meta) and multilingual else None


def hybrid_weights(meta: Mapping[str, str]) -> tuple[float, float]:
    """(BM25, dense) weights of hybrid search over the index whose meta is ``meta``: the dense
    weight its ``index --dense-weight`` stored (``dense_weight``), else equal, except an index
    with the CJK analyzer, whose dense side counts ``CJK_DENSE``, or ``CJK_DENSE_MULTILINGUAL``
    when a multilingual model embedded it."""
    if meta.get("dense_weight"):
        return (1.0, float(meta["dense_weight"]))
    if is_cjk_index(meta):
        multilingual = meta.get("embed_model", "") in MULTILINGUAL
        return (1.0, CJK_DENSE_MULTILINGUAL if multilingual else CJK_DENSE)
    return (1.0, 1.0)
