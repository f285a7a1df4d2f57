"""The BM25 analyzers an index may be built with, by name, and which one a language picks.

An index keeps its analyzer's name in its meta (and so in ``index_hash``): every run and
every query reads it from there and analyzes with the same functions (001 rule 4: the read
path is the write path). Two analyses exist, each under the store's own tokenizer name:

- ``…+cjk-chars`` (``pipeline.index.analyzer``): every CJK character a token, a query's CJK
  run one exact phrase. The default, and the analyzer of every index built before languages
  were told apart: an index without CJK text keeps this name, hence its ``index_hash``.
- ``…+cjk-bigrams2`` (``pipeline.index.cjk``): overlapping bigrams, each query bigram a term
  of its own (Lucene's ``CJKAnalyzer``). Chosen for Chinese, Japanese and Korean corpora.
  (``…+cjk-bigrams``, its first version, is unknown now: such an index is rebuilt.)

Text without CJK characters is analyzed the same by both, so the choice only matters where
CJK text is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from pipeline.index import analyzer as chars
from pipeline.index import cjk

CHARS = "+cjk-chars"


@dataclass(frozen=True, slots=True)
class Analysis:
    """One analyzer: its name (kept in the index), the text as the full-text index gets it, a query's terms."""

    name: str
    analyze: Callable[[str], str]
    query_terms: Callable[[str], list[str]]


def base_of(name: str) -> str:
    """The store tokenizer part of an analyzer name (``fts5:porter …``), without the CJK suffix."""
    for suffix in (CHARS, cjk.BIGRAMS):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def with_cjk(default_name: str, bigrams: bool) -> str:
    """The analyzer name of a store whose default is ``default_name``, with bigrams or characters."""
    return base_of(default_name) + (cjk.BIGRAMS if bigrams else CHARS)


@cache
def analysis(name: str, default_name: str) -> Analysis | None:
    """The functions of the analyzer ``name`` for a store whose default analyzer is
    ``default_name``; ``None`` for a name this chunkyard does not know (an index written by
    another version, or by another store's tokenizer: ``language.require`` refuses it)."""
    if name == default_name:
        return Analysis(name, chars.analyze, chars.query_terms)
    if name == with_cjk(default_name, True):
        return Analysis(name, cjk.analyze, cjk.query_terms)
    return None
