"""``chunkyard search``: schema of every --json item, deterministic order, hostile queries, the eval's shape."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from index_support import run_ingest

from pipeline.errors import UsageError
from pipeline.evaluate.metrics import retrieved_from
from pipeline.index import Searcher, index, search
from pipeline.index.analyzer import query_terms
from pipeline.index.query import MISSING_Z, zscores

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "schemas" / "search.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.FormatChecker())

HOSTILE_DOC = """# Hostile words

The state-of-the-art splitter keeps "quoted phrases" and stars like a*b together.

## 中文部分

这是一个关于中文文本检索的段落，包含分词问题。

## Emoji

The crab 🦀 stands for Rust; the snake 🐍 for Python.

## Punctuation

Operators such as --force and C++ and ___ appear in code: `x -> y`.
"""


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("hostile")
    corpus, out = base / "corpus", base / "chunks"
    corpus.mkdir()
    (corpus / "hostile.md").write_text(HOSTILE_DOC, encoding="utf-8")
    (corpus / "plain.md").write_text(
        "# Plain\n\nNothing special lives in this document at all.\n", encoding="utf-8"
    )
    run_ingest(corpus, out)
    index(out)
    return out


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("sample")
    out = base / "chunks"
    run_ingest(ROOT / "corpus", out)
    index(out)
    return out


QUERIES = [
    "how long may a chunk be",
    "overlap between pieces",
    "configuration reference",
    "多言語",
    "windows",
]


@pytest.mark.parametrize("mode", ["hybrid", "dense", "bm25"])
def test_every_item_validates_and_the_order_is_the_tie_break(sample: Path, mode: str) -> None:
    with Searcher(sample) as searcher:
        for query in QUERIES:
            record = searcher.record(query, 10, mode)
            VALIDATOR.validate(record)
            items = record["items"]
            assert items, query
            keys = [(-i["score_norm"], i["section_id"], i["snippet_id"]) for i in items]
            assert keys == sorted(keys)
            assert [i["k_final"] for i in items] == list(range(1, len(items) + 1))
            for item in items:
                assert item["snippet_id"] == item["chunk_id"]
                assert item["source"] == mode
                got = retrieved_from(item)  # the shape the evaluation reads
                assert got.source == item["file"] and got.start == item["offsets"]["start"]
            again = searcher.record(query, 10, mode)
            assert [i["snippet_id"] for i in again["items"]] == [i["snippet_id"] for i in items]
            assert again["q_id"] == record["q_id"]


def test_hybrid_fuses_both_rankers(sample: Path) -> None:
    record = search(sample, "overlap between pieces", k=10, mode="hybrid")
    features = [i["features"] for i in record["items"]]
    assert any(f["bm25"] is not None and f["dense"] is not None for f in features)
    top = record["items"][0]
    assert top["score_norm"] == pytest.approx(1 / (1 + math.exp(-top["score_raw"] / 2)))
    with Searcher(sample, fusion="rrf", expand_tokens=0) as rrf:
        items = rrf("overlap between pieces", "hybrid", 10)
    assert 0 < items[0]["score_raw"] <= 2 / 61 + 1e-12


def test_zscore_fusion_keeps_a_hit_that_stands_far_out_in_one_list() -> None:
    """The fused score is the sum of each list's z-scores (a missing chunk counts MISSING_Z):
    the clear winner of one list beats a chunk that is merely middling in both, where
    reciprocal rank fusion puts the middling chunk first."""
    bm25 = [("star", 30.0), ("both", 5.0)] + [(f"b{i}", 4.9 - i * 0.01) for i in range(20)]
    dense = [("d0", 0.62), ("both", 0.61)] + [(f"d{i}", 0.6 - i * 0.001) for i in range(1, 18)]
    dense += [("star", 0.58)] + [(f"e{i}", 0.57 - i * 0.001) for i in range(5)]
    z_lex, z_vec = zscores(bm25), zscores(dense)
    assert sum(z_lex.values()) == pytest.approx(0.0, abs=1e-9)
    fused = {cid: z_lex.get(cid, MISSING_Z) + z_vec.get(cid, MISSING_Z) for cid in {*z_lex, *z_vec}}
    rrf = {cid: sum(1 / (60 + r) for r, (c, _) in [*enumerate(bm25, 1), *enumerate(dense, 1)] if c == cid)
           for cid in fused}  # fmt: skip
    assert max(fused, key=fused.__getitem__) == "star"
    assert max(rrf, key=rrf.__getitem__) == "both"
    assert zscores([("a", 1.0), ("b", 1.0)]) == {"a": 0.0, "b": 0.0} and zscores([]) == {}


def test_an_unknown_fusion_is_a_usage_error(sample: Path) -> None:
    with pytest.raises(UsageError, match="unknown fusion 'max'"):
        Searcher(sample, fusion="max")


@pytest.mark.parametrize(
    ("query", "terms"),
    [
        ("state-of-the-art", ["state", "of", "the", "art"]),
        ("Get-ChildItem -Recurse -Depth 2", ["Get", "ChildItem", "Recurse", "Depth", "2"]),
        ("set response_model=None", ["set", "response_model", "None"]),
        ("$Error error ERROR", ["Error"]),
        ("中文文本", ["中 文 文 本"]),
        ("हिन्दी भाषा", ["हिन्दी", "भाषा"]),
        ("🦀 --", []),
        ('say "hi"', ["say", "hi"]),
    ],
)
def test_query_terms_are_the_words(query: str, terms: list[str]) -> None:
    assert query_terms(query) == terms


@pytest.mark.parametrize(
    ("query", "expect"),
    [
        ("state-of-the-art", "state-of-the-art"),
        ('"quoted phrases"', "quoted phrases"),
        ("a*b", "a*b"),
        ("中文文本", "中文文本"),
        ("文本检索", "文本检索"),
        ("🦀", "🦀"),
        ("--force", "--force"),
        ("C++", "C++"),
        ("___", "___"),
        ("NEAR(state art) OR AND NOT", "state-of-the-art"),
        ("x -> y", "x -> y"),
    ],
)
def test_hostile_queries_never_crash_and_find_what_is_there(hostile: Path, query: str, expect: str) -> None:
    for mode in ("bm25", "hybrid"):
        record = search(hostile, query, k=5, mode=mode)
        VALIDATOR.validate(record)
        assert any(expect in item["text"] for item in record["items"]), (mode, query, record["items"])


def test_long_and_empty_queries(hostile: Path) -> None:
    long_query = ("state-of-the-art " * 700)[:10_240]
    record = search(hostile, long_query, k=3, mode="hybrid")
    assert record["items"] and "state-of-the-art" in record["items"][0]["text"]
    for empty in ("", "   \n\t"):
        record = search(hostile, empty, k=3)
        VALIDATOR.validate(record)
        assert record["items"] == [] and record["warnings"] == ["empty query: nothing to search for"]


def test_search_cli_json_and_table(sample: Path) -> None:
    cli = [sys.executable, "-m", "pipeline"]
    done = subprocess.run(
        [*cli, "search", "state of the art", "--out", str(sample), "--json", "-k", "3", "--mode", "bm25"],
        capture_output=True,
        text=True,
        check=True,
    )
    VALIDATOR.validate(json.loads(done.stdout))
    table = subprocess.run(
        [*cli, "search", "overlap", "--out", str(sample), "-k", "2"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "source:line" in table.stdout
    bad = subprocess.run(
        [*cli, "search", "x", "--out", str(sample), "--mode", "nope"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and "unknown search mode" in bad.stderr
    missing = subprocess.run(
        [*cli, "search", "x", "--out", str(sample.parent / "nowhere")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert missing.returncode == 2 and "chunkyard index" in missing.stderr


def test_dense_weight_weighs_the_dense_list_and_the_record_says_so(sample: Path) -> None:
    """``search --dense-weight W``: hybrid fuses BM25's z-scores plus W times the dense list's; at 0
    the order is BM25's (a chunk only the dense list holds counts MISSING_Z there, below them all).
    The record names the weights that ran, the language's when none is asked."""
    cli = [sys.executable, "-m", "pipeline", "search", "overlap between pieces", "--out", str(sample)]
    cli += ["--json", "--no-expand", "-k", "5"]

    def ask(*extra: str) -> dict[str, Any]:
        done = subprocess.run([*cli, *extra], capture_output=True, text=True, check=True)
        record: dict[str, Any] = json.loads(done.stdout)
        VALIDATOR.validate(record)
        return record

    default, bm25_only, zero = ask(), ask("--mode", "bm25"), ask("--dense-weight", "0")
    assert default["weights"] == {"bm25": 1.0, "dense": 1.0} and "weights" not in bm25_only
    assert zero["weights"] == {"bm25": 1.0, "dense": 0.0}
    assert [i["chunk_id"] for i in zero["items"]] == [i["chunk_id"] for i in bm25_only["items"]]
    heavy = ask("--dense-weight", "3")
    assert [i["chunk_id"] for i in heavy["items"]] != [i["chunk_id"] for i in zero["items"]]
    with pytest.raises(UsageError, match="not both 0"):
        Searcher(sample, weights=(0.0, 0.0))


def test_search_html_shows_each_hit_inside_its_source(sample: Path, tmp_path: Path) -> None:
    """``search --html FILE`` (issue 20): one page whose hits are the ``--json`` items, each with its source."""
    cli = [sys.executable, "-m", "pipeline"]
    page = tmp_path / "hits.html"
    args = ["search", "overlap between pieces", "--out", str(sample), "-k", "3"]
    done = subprocess.run([*cli, *args, "--json"], capture_output=True, text=True, check=True)
    items = json.loads(done.stdout)["items"]
    assert items
    subprocess.run([*cli, *args, "--html", str(page)], capture_output=True, text=True, check=True)
    html = page.read_text(encoding="utf-8")
    assert "<script src" not in html and "http://" not in html.split("<body", 1)[0]  # self-contained
    meta = json.loads(re.search(r'<script type="application/json"[^>]*>(.*?)</script>', html, re.DOTALL)[1])
    assert [it["snippet_id"] for it in meta["record"]["items"]] == [it["snippet_id"] for it in items]
    for item, ctx in zip(items, meta["contexts"], strict=True):
        assert ctx is not None and ctx["path"] == item["file"]
    missing = subprocess.run(
        [*cli, *args, "--html", str(tmp_path / "no" / "dir" / "x.html")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert missing.returncode == 2 and "x.html" in missing.stderr


def test_index_cli_json_validates(sample: Path) -> None:
    schema = json.loads((ROOT / "schemas" / "index.schema.json").read_text())
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "index", "--out", str(sample), "--reconcile", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(done.stdout)
    jsonschema.validate(report, schema)
    assert report["reconcile"] and not any(report["fixed"].values())
    assert report["truncated"] >= 0 and report["max_tokens"] == 256


def test_watch_index_makes_a_save_searchable(tmp_path: Path) -> None:
    """``watch --index``: after the save's sync, the index holds the new text (waits on events)."""
    import queue
    import signal
    import threading

    corpus, out = tmp_path / "corpus", tmp_path / "chunks"
    corpus.mkdir()
    (corpus / "a.md").write_text("# A\n\nThe first version of this page.\n", encoding="utf-8")
    cmd = [sys.executable, "-m", "pipeline", "watch", str(corpus), "--out", str(out), "--json", "--index"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[dict[str, object]] = queue.Queue()

    def pump() -> None:
        for line in proc.stdout or ():
            if line.strip().startswith("{"):
                lines.put(json.loads(line))

    threading.Thread(target=pump, daemon=True).start()

    def next_index() -> dict[str, object]:
        while True:
            event = lines.get(timeout=120)
            if event.get("event") == "index":
                return event

    try:
        first = next_index()
        assert first["added"] == 1
        (corpus / "a.md").write_text("# A\n\nA zebracorn appeared in the second version.\n", encoding="utf-8")
        second = next_index()
        assert second["updated"] + second["added"] >= 1 and second["embedded"] == 1
        found = search(out, "zebracorn", k=1, mode="bm25")
        assert found["items"] and "zebracorn" in found["items"][0]["text"]
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
