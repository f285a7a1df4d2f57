"""Metrics on hand-made rankings whose answers were worked out by hand (see the comments)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pipeline.evaluate.gold import Sources, parse_gold
from pipeline.evaluate.metrics import Retrieved, evaluate_run, retrieved_from, score_query

WORDS = "".join(f"w{i:03d} " for i in range(200))  # 1,000 characters, every 5-char word unique


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    (tmp_path / "a.md").write_text(WORDS, encoding="utf-8")
    (tmp_path / "b.md").write_text(WORDS.upper(), encoding="utf-8")
    return tmp_path


def gold_of(corpus: Path, *spans: tuple[str, str, int, int]):
    lines = [json.dumps({"id": i, "question": f"q {i}?", "source": s, "start": a, "end": b}) for i, s, a, b in spans]
    return parse_gold(lines, "gold.jsonl", corpus)


def item(cid: str, source: str, start: int, end: int, tokens: int, **extra) -> dict:
    return {"chunk_id": cid, "source": source, "offsets": {"start": start, "end": end}, "tokens": tokens, **extra}


def test_hand_computed_run(corpus: Path) -> None:
    gold = gold_of(
        corpus, ("q1", "a.md", 100, 200), ("q2", "a.md", 500, 600), ("q3", "b.md", 0, 100), ("q4", "a.md", 0, 50)
    )
    run = {
        # q1: answer [100, 200). Coverages: other source 0; [0,140) 40 %; [140,400) 60 % (hit,
        # rank 3); [90,210) 100 % (strict hit, rank 4). Tokens 300+300+500+100: 1,000 holds the
        # top 2 (no hit), 2,000 all 4.
        "q1": [
            item("b1", "b.md", 100, 200, 300),
            item("a1", "a.md", 0, 140, 300),
            item("a2", "a.md", 140, 400, 500, originalText=WORDS[140:400]),
            item("a3", "a.md", 90, 210, 100),
        ],
        # q2: the answer itself at rank 1, but 1,200 tokens: no prefix fits 1,000; its text is
        # stale (not the source's slice), so its citation fails.
        "q2": [item("a5", "a.md", 500, 600, 1200, originalText="stale text")],
        # q3: ten misses then the answer at rank 11 (outside every @k), 10 tokens each: all 11
        # fit both budgets, so the budget recall finds it.
        "q3": [item(f"m{n}", "a.md", 0, 100, 10) for n in range(10)] + [item("b0", "b.md", 0, 100, 10)],
        # q4: absent from the run: nothing retrieved.
    }
    rep = evaluate_run(gold, run, sources=Sources(corpus))
    by_id = {s.id: s for s in rep.per_query}
    assert (by_id["q1"].first_hit, by_id["q1"].first_full_hit) == (3, 4)
    assert (by_id["q2"].first_hit, by_id["q3"].first_hit, by_id["q4"].first_hit) == (1, 11, None)
    assert by_id["q1"].fits == {1000: 2, 2000: 4}
    assert by_id["q2"].fits == {1000: 0, 2000: 1}
    assert [by_id[q].citation for q in ("q1", "q2", "q3", "q4")] == [True, False, None, None]
    m = rep.metrics
    assert m["recall@1"] == 0.25  # q2
    assert m["recall@5"] == m["recall@10"] == 0.5  # q1, q2
    assert m["MRR@10"] == pytest.approx((1 / 3 + 1) / 4)
    assert m["nDCG@10"] == pytest.approx((1 / math.log2(4) + 1) / 4)  # (0.5 + 1) / 4
    assert m["recall@1000tok"] == 0.25  # q3 only
    assert m["recall@2000tok"] == 0.75  # q1, q2, q3
    assert m["citation_match"] == 0.5  # q1 yes, q2 no; q3, q4 have no hit in the top 10
    s = rep.strict
    assert s["recall@1"] == 0.25 and s["recall@5"] == 0.5  # q1's full hit at rank 4
    assert s["MRR@10"] == pytest.approx((1 / 4 + 1) / 4)
    assert s["nDCG@10"] == pytest.approx((1 / math.log2(5) + 1) / 4)  # 0.35767
    assert s["recall@1000tok"] == 0.25 and s["recall@2000tok"] == 0.75
    assert "citation_match" not in s


def test_exactly_half_is_a_hit_and_just_under_is_not(corpus: Path) -> None:
    (q,) = gold_of(corpus, ("q", "a.md", 100, 200))
    assert score_query(q, [item("x", "a.md", 150, 900, 1)]).first_hit == 1  # 50/100
    assert score_query(q, [item("x", "a.md", 151, 900, 1)]).first_hit is None  # 49/100
    assert score_query(q, [item("x", "a.md", 0, 199, 1)]).first_full_hit is None  # 99/100
    assert score_query(q, [item("x", "b.md", 100, 200, 1)]).first_hit is None  # other file


def test_tokens_counted_from_text_when_absent(corpus: Path) -> None:
    (q,) = gold_of(corpus, ("q", "a.md", 0, 50))
    text = WORDS[:50]  # "w000 w001 …": cl100k gives each "w000"-like word several tokens
    items = [{"id": "x", "source_url": "a.md", "charStart": 0, "charEnd": 50, "text": text}]
    got = score_query(q, items, budgets=(1, 10_000))
    assert got.fits == {1: 0, 10_000: 1}


def test_citation_checks_rev(corpus: Path) -> None:
    (q,) = gold_of(corpus, ("q", "a.md", 0, 50))
    sources = Sources(corpus)
    rev = sources.get("a.md").rev
    good = item("x", "a.md", 0, 50, 5, originalText=WORDS[:50], rev=rev)
    assert score_query(q, [good], sources=sources).citation is True
    assert score_query(q, [{**good, "rev": "00000000"}], sources=sources).citation is False


def test_item_shapes() -> None:
    chunk_file = {
        "chunk_id": "d|r=1|s=1|p=000|b=000",
        "source_url": "https://example.com/d",  # front matter's URL: the path field wins
        "metadata": {"sourceFile": "d.md"},
        "charOffsets": {"charStart": 3, "charEnd": 9, "totalChars": 6},
        "tokenStats": {"tokens": 4},
        "originalText": "abcdef",
    }
    r = retrieved_from(chunk_file)
    assert r == Retrieved("d|r=1|s=1|p=000|b=000", "d.md", 3, 9, 4, None, "abcdef", None)
    search_item = {"snippet_id": "s", "source_url": "d.md", "offsets": {"start": 1, "end": 2, "unit": "char"},
                   "tokens": 7, "score_norm": 0.5}
    assert retrieved_from(search_item) == Retrieved("s", "d.md", 1, 2, 7, 0.5)
    # `chunkyard search` (issue 16): `source` names the ranker, `file` the document
    search_hit = {"chunk_id": "c", "snippet_id": "c", "source": "hybrid", "file": "guides/a.md",
                  "source_url": "https://example.com/a", "offsets": {"start": 5, "end": 9, "unit": "char"},
                  "tokens": 3, "score": 0.03, "score_norm": 0.9, "rev": "0badc0de", "text": "abcd"}
    assert retrieved_from(search_hit) == Retrieved("c", "guides/a.md", 5, 9, 3, 0.03, "abcd", "0badc0de")
    with pytest.raises(Exception, match="no source, start"):
        retrieved_from({"id": "x"}, "q9: item 1")
    with pytest.raises(Exception, match="token"):
        retrieved_from({**search_item, "offsets": {"start": 1, "end": 2, "unit": "token"}})
