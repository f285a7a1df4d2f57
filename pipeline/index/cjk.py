"""The BM25 side for Chinese, Japanese and Korean text: overlapping character bigrams.

CJK text has no spaces between words, and ``pipeline.index.analyzer`` indexes it one
character a token and asks each run of CJK characters in a query as one exact phrase: a
learner's question ("pytorch 优化器里设置 weight decay，怎么让 bias 不衰减") almost never
repeats the document's phrase, so a run that is not verbatim in a chunk finds nothing.

This analyzer does what Lucene's ``CJKAnalyzer`` does (``CJKBigramFilter``): a run of CJK
characters becomes its overlapping bigrams (``中文文本`` → ``中文 文文 文本``; a run of one
character stays a unigram), at index time and at query time alike, and each query bigram
is a term of its own, OR-ed with the others, so BM25 ranks the chunks sharing most of the
question's bigrams first, whatever the order of the words. Text without CJK characters is
analyzed exactly as the default analyzer does (same words, same quoting), so an English
query in a CJK index behaves as in an English one.
"""

from __future__ import annotations

import re

from pipeline.index.analyzer import MAX_TERMS, may_hold_cjk, words

#: The analyzer names' suffix for this analysis (the default's is ``+cjk-chars``). The first
#: version, ``+cjk-bigrams``, cut runs at 々, 〆 and 〇; an index built with it is refused with the
#: rebuild command (``language.require``), so an index is never read with another analysis.
BIGRAMS = "+cjk-bigrams2"

#: A run of CJK characters: the CJK blocks, and 々 (the iteration mark: 様々, 人々), 〆 and 〇
#: (written inside words and numbers: 二〇二六), which sit among the CJK punctuation marks.
_RUN = re.compile(
    "[\u2e80-\u2fdf\u3005-\u3007\u3040-\u30ff\u3100-\u312f\u3190-\u31ff\u3400-\u4dbf\u4e00-\u9fff"
    "\uac00-\ud7af\uf900-\ufaff\uff66-\uff9f\U00020000-\U0002fa1f]+"
)


def run_bigrams(run: str) -> list[str]:
    """A run of CJK characters as its overlapping bigrams; one character stays itself."""
    if len(run) < 2:
        return [run]
    return [run[i : i + 2] for i in range(len(run) - 1)]


def _pieces(text: str) -> list[str]:
    """``text`` cut into its non-CJK stretches and its CJK runs' bigrams, in order."""
    out: list[str] = []
    at = 0
    for m in _RUN.finditer(text):
        if m.start() > at:
            out.append(text[at : m.start()])
        out.extend(run_bigrams(m.group()))
        at = m.end()
    if at < len(text):
        out.append(text[at:])
    return out


def analyze(text: str) -> str:
    """The text as the full-text index gets it: every CJK run replaced by its bigrams, spaced."""
    if not (may_hold_cjk(text) and _RUN.search(text)):
        return text
    return " ".join(_pieces(text))


def query_terms(query: str) -> list[str]:
    """The query's terms: its words (as the default analyzer cuts them), each CJK run of a word
    replaced by its bigrams, each bigram a term; de-duplicated ignoring case, in order, at most
    ``MAX_TERMS``."""
    seen: dict[str, str] = {}
    for word in words(query):
        for piece in _pieces(word) if _RUN.search(word) else [word]:
            term = piece.strip()
            if term and term.casefold() not in seen:
                seen[term.casefold()] = term
                if len(seen) >= MAX_TERMS:
                    return list(seen.values())
    return list(seen.values())
