"""The gold sets resolve (every quote found exactly once in its source), and bad lines say how to fix them."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from pipeline.evaluate.gold import KINDS, GoldError, load_gold, parse_gold

ROOT = Path(__file__).resolve().parents[2]
CORPORA = ROOT.parent / "shared" / "corpora"
BENCH_GOLD = sorted((ROOT / "bench" / "gold").glob("*.jsonl"))


def gold_corpus(path: Path) -> str:
    """The corpus a bench gold set asks: its ``# corpus: NAME`` first line, else its file name
    (``fastapi-zh.jsonl`` asks ``fastapi-zh-ja``'s Chinese pages)."""
    first = path.read_text(encoding="utf-8").split("\n", 1)[0]
    if first.startswith("# corpus:"):
        return first.removeprefix("# corpus:").split()[0]
    return path.stem


def check_set(path: Path, corpus: Path, at_least: int) -> None:
    gold = load_gold(path, corpus)  # raises on any quote missing or not unique
    assert len(gold) >= at_least
    lines = path.read_text(encoding="utf-8").splitlines()
    raw = [json.loads(line) for line in lines if line.strip() and not line.startswith("#")]
    for q, line in zip(gold, raw, strict=True):
        assert line.get("kind") in KINDS, f"{path.name}:{q.line}: give every question a kind"
        assert len(q.text) >= 30, f"{path.name}:{q.line}: quote the whole answer"
        assert q.text == q.text.strip("\n") and not q.text.endswith(" "), f"{path.name}:{q.line}: trim the quote"
        # a user's question, not a phrase lifted from the passage
        assert q.question.lower().rstrip("?") not in q.text.lower(), f"{path.name}:{q.line}: question copied"
    kinds = Counter(line["kind"] for line in raw)
    assert len(kinds) == len(KINDS), f"{path.name}: answers in every kind, got {dict(kinds)}"
    assert len({q.source for q in gold}) >= min(10, len(gold) // 4), f"{path.name}: spread over documents"
    assert len({q.question.lower() for q in gold}) == len(gold), f"{path.name}: a question asked twice"


def test_sample_corpus_gold_set() -> None:
    check_set(ROOT / "tests" / "gold" / "corpus.jsonl", ROOT / "corpus", at_least=20)


@pytest.mark.parametrize("path", BENCH_GOLD, ids=lambda p: p.stem)
def test_shared_corpora_gold_sets(path: Path) -> None:
    corpus = CORPORA / gold_corpus(path)
    if not corpus.is_dir():
        pytest.skip(f"{corpus} is absent")
    check_set(path, corpus, at_least=40)


def test_bench_sets_exist() -> None:
    assert {p.stem for p in BENCH_GOLD} >= {"rust-book", "fastapi-en", "powershell-docs"}


def test_quote_is_resolved_in_canonical_text(tmp_path: Path) -> None:
    (tmp_path / "w.md").write_bytes(b"\xef\xbb\xbf# T\r\n\r\nThe answer spans\r\ntwo lines here.\r\n")
    (q,) = parse_gold([json.dumps({"id": 1, "question": "?", "source": "w.md",
                                   "quote": "The answer spans\ntwo lines here."})], "g.jsonl", tmp_path)
    assert (q.id, q.start, q.end) == ("1", 5, 37)  # BOM gone, CRLF → LF before counting
    assert q.text == "The answer spans\ntwo lines here."


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "g.jsonl:1: gold: not valid JSON"),
        ('["x"]', "not an object"),
        ('{"question": "?", "source": "a.md", "quote": "alpha beta gamma delta epsilon"}', "missing field 'id'"),
        ('{"id": "x", "question": "?", "source": "nope.md", "quote": "alpha beta gamma delta"}', "cannot be read"),
        ('{"id": "x", "question": "?", "source": "../a.md", "quote": "alpha beta gamma delta"}', "corpus-relative"),
        ('{"id": "x", "question": "?", "source": "a.md"}', "no answer span"),
        ('{"id": "x", "question": "?", "source": "a.md", "quote": "alpha"}', "shorter than"),
        ('{"id": "x", "question": "?", "source": "a.md", "quote": "alpha beta gamma zeta eta"}', "edited or moved"),
        ('{"id": "x", "question": "?", "source": "a.md", "quote": "alpha beta gamma delta  epsilon"}',
         "other whitespace"),
        ('{"id": "x", "question": "?", "source": "a.md", "quote": "repeat repeat repeat repeat"}',
         "occurs 2 times in a.md (lines 2 and 3)"),
        ('{"id": "x", "question": "?", "source": "a.md", "quote": "xoxoxoxoxoxoxoxoxoxoxoxo"}',
         "occurs 3 times"),  # overlapping occurrences are ambiguous too
        ('{"id": "x", "question": "?", "source": "a.md", "quote": "alpha beta gamma delta", "start": 0, "end": 5}',
         "disagree with the quote, found at 0..22"),
        ('{"id": "x", "question": "?", "source": "a.md", "start": 5, "end": 999}', "outside a.md"),
        ('{"id": "x", "question": "?", "source": "a.md", "start": 0, "end": 9, "kind": "poem"}', "kind 'poem'"),
    ],
)
def test_bad_lines_name_the_line_and_the_fix(tmp_path: Path, line: str, message: str) -> None:
    (tmp_path / "a.md").write_text("alpha beta gamma delta epsilon\nrepeat repeat repeat repeat\n"
                                   "repeat repeat repeat repeat\nxoxoxoxoxoxoxoxoxoxoxoxoxoxo\n", encoding="utf-8")
    with pytest.raises(GoldError, match="hint: ") as err:
        parse_gold([line], "g.jsonl", tmp_path)
    assert message in str(err.value)
    assert str(err.value).startswith("g.jsonl:1: gold: ")


def test_duplicate_ids_and_empty_files(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("x" * 50, encoding="utf-8")
    line = '{"id": "q", "question": "?", "source": "a.md", "start": 0, "end": 9}'
    with pytest.raises(GoldError, match=r"g\.jsonl:3: gold: id 'q' already used on line 1"):
        parse_gold([line, "# a comment", line], "g.jsonl", tmp_path)
    with pytest.raises(GoldError, match="no gold lines"):
        parse_gold(["", "# nothing"], "g.jsonl", tmp_path)
