"""The substring fallback is skipped only when it provably finds nothing (``substring_guard``).

Real FTS5 tokens (``Fts5Tokens``: FTS5's own tokenizer through apsw), real texts (the sample
corpus) and texts made to stress the argument (CJK next to Latin, ``_``, combining marks,
case, punctuation). Each needle is a piece of a text cut at random places (mid-word too);
whenever the guard says "ruled out", BM25's OR of the needle's terms must match that text
(so an empty BM25 result could not have come from a store holding it).
"""

from __future__ import annotations

import random
from pathlib import Path

from pipeline.index.analyzer import analyze, query_terms
from pipeline.index.fts_tokens import Fts5Tokens
from pipeline.index.substring_guard import substring_ruled_out

REPO = Path(__file__).resolve().parents[1]
MADE = [
    "reshape的时候怎么让它自动算出一个维度，不想自己做除法",
    "relu激活函数的定义: ReLU(x) = max(x, 0)，在pytorch里是torch.relu",
    "set response_model=None and use JSONResponse; the response_model is ignored",
    "Cafe\u0301 au lait, cafe, CAFÉ and café are four spellings; Straße and STRASSE two",
    "x+=1 is slow in a loop; use list.append() then ''.join(parts) instead",
    "クエリパラメータを任意にするには Optional[str] = None を使う",
    "GPU上聚合 160MB 的梯度要多久？参数服务器会成为瓶颈。",
    "___ a__b __init__ ü\u0308ber naïve résumé",
]


def _texts() -> list[str]:
    found = [p.read_text(encoding="utf-8") for p in sorted((REPO / "corpus").rglob("*.md"))]
    return found + MADE


def _matches(tokens: Fts5Tokens, body: list[str], term: str) -> bool:
    """Whether FTS5's phrase of ``term`` stands in ``body`` (the text's tokens), side by side."""
    phrase = tokens.query(term)
    if not phrase:
        return False
    return any(body[i : i + len(phrase)] == phrase for i in range(len(body) - len(phrase) + 1))


def test_ruled_out_only_when_bm25_would_have_matched_the_text_holding_the_needle() -> None:
    tokens = Fts5Tokens()
    rng = random.Random(31)
    ruled = checked = 0
    try:
        for text in _texts():
            body = tokens.document(text)
            for _ in range(200 if len(text) > 200 else 60):
                start = rng.randrange(len(text))
                needle = " ".join(text[start : start + rng.randint(1, 80)].split())
                if not needle:
                    continue
                checked += 1
                terms = query_terms(needle)
                if substring_ruled_out(needle, terms):
                    ruled += 1
                    assert any(_matches(tokens, body, t) for t in terms), (needle, terms)
    finally:
        tokens.close()
    assert checked > 500 and ruled > checked // 2, (ruled, checked)  # the guard does skip most scans


def test_edges_that_may_be_parts_of_words_are_not_taken_as_whole() -> None:
    assert not substring_ruled_out("ello wor", query_terms("ello wor"))  # both words may be cut
    assert substring_ruled_out("ello big wor", query_terms("ello big wor"))  # 'big' is whole
    assert not substring_ruled_out("relu激活函数", query_terms("relu激活函数"))  # 'relu' may be cut
    assert substring_ruled_out("激活函数", query_terms("激活函数"))  # CJK at both ends: whole
    assert substring_ruled_out("不想自己做除法", query_terms("不想自己做除法"))
    assert not substring_ruled_out("+= ==", query_terms("+= =="))  # no word at all: scan
    assert not substring_ruled_out("a ___ b", query_terms("a ___ b"))  # '___' has no token
    assert analyze("中") == " 中 "


def test_a_searcher_still_falls_back_to_substrings_that_bm25_cannot_see(tmp_path: Path) -> None:
    """End to end on a real index: a needle of parts of words (BM25 finds nothing) still finds
    its chunk through the scan; a sentence found nowhere comes back empty, without it."""
    import re

    from index_support import copy_sample, run_ingest

    from pipeline.index import Searcher, index
    from pipeline.index.vector_store import open_store

    corpus, out = copy_sample(tmp_path / "corpus"), tmp_path / "chunks"
    run_ingest(corpus, out)
    index(out)
    db = open_store(out)
    try:
        needle = ""
        for row in db.rows([cid for cid, _ in db.lexical(["chunk"], 50)]).values():
            for first, second in re.findall(r"\b([a-z]{7,}) ([a-z]{5,})\b", row.text):
                candidate = f"{first[3:]} {second[:3]}"
                if not db.lexical(query_terms(candidate), 5):
                    needle = candidate
                    break
            if needle:
                break
        assert needle, "no needle of word parts in the sample"
        assert not substring_ruled_out(needle, query_terms(needle))
        expected = db.substring(needle, 5)
        assert expected
    finally:
        db.close()
    with Searcher(out, expand_tokens=0) as ask:
        record = ask.record(needle, 5, "bm25")
        assert {it["chunk_id"] for it in record["items"]} == {cid for cid, _ in expected}  # ties ordered apart
        assert all(needle in it["text"] for it in record["items"])
        nowhere = ask.record("参数服务器会成为瓶颈吗", 5, "bm25")
        assert nowhere["items"] == []
