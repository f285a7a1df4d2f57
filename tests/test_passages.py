"""``chunkyard search`` returns passages by default: a hit merged with the ranked neighbours of its
document (across headings; of its section with ``passage_scope="section"``), one citation span
that slices the source exactly, within the token budget, and accepted by ``check-citations`` as
it comes out of ``search --json`` (issue 17)."""

from __future__ import annotations

import json
import shutil
from itertools import pairwise
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from index_support import run_ingest
from typer.testing import CliRunner

from pipeline.chunkfolder import iter_chunk_files, read_chunk_file
from pipeline.cli.app import app
from pipeline.evaluate.gold import Sources
from pipeline.index.expand import DEFAULT_BUDGET
from pipeline.models import Policy
from pipeline.stages.tokens import Counter

pytest.importorskip("sqlite_vec", reason="the index extra: pip install -e '.[index]'")

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "schemas" / "search.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.FormatChecker())
QUERIES = [
    "how long may a chunk be",
    "how are long paragraphs split into chunks",
    "what does the overlap between pieces do",
    "configuration reference",
    "length normalisation of BM25",
]
runner = CliRunner()


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """corpus/ chunked small (64 tokens, 16 overlap) so sections hold several chunks, then indexed."""
    from pipeline.index import index

    base = tmp_path_factory.mktemp("passages")
    corpus, out = base / "corpus", base / "chunks"
    shutil.copytree(ROOT / "corpus", corpus)
    run_ingest(corpus, out, policy=Policy(target_tokens=64, overlap_tokens=16))
    index(out)
    return corpus, out


@pytest.fixture(scope="module")
def records(indexed: tuple[Path, Path]) -> dict[str, dict[str, Any]]:
    """chunk_id → chunk file record."""
    _, out = indexed
    recs = (read_chunk_file(out / rel) for rel in iter_chunk_files(out))
    return {r["chunk_id"]: r for r in recs}


def check_passages(
    record: dict[str, Any], corpus: Path, records: dict[str, dict[str, Any]], budget: int, scope: str = "document"
) -> tuple[int, int]:
    """Every item a valid passage; the number of items that merged more than one chunk, and of
    those that crossed a heading (chunks of more than one section)."""
    VALIDATOR.validate(record)
    sources = Sources(corpus)
    count = Counter("cl100k_base").count
    merged = crossed = 0
    seen: set[str] = set()
    for item in record["items"]:
        start, end = item["offsets"]["start"], item["offsets"]["end"]
        assert item["text"] == sources.get(item["file"]).text[start:end]  # one exact citation span
        ids = item["chunk_ids"]
        assert ids[0] == item["chunk_id"] == item["snippet_id"]
        assert not seen & set(ids), "a chunk is cited by one passage only"
        seen.update(ids)
        members = [records[c] for c in ids]
        assert {m["doc_id"] for m in members} == {item["doc_id"]}
        assert members[0]["section_id"] == item["section_id"]  # the hit's section, whatever the passage crosses
        if scope == "section":
            assert {m["section_id"] for m in members} == {item["section_id"]}
        crossed += len({m["section_id"] for m in members}) > 1
        assert start == min(m["charOffsets"]["charStart"] for m in members)
        assert end == max(m["charOffsets"]["charEnd"] for m in members)
        assert item["lineSpan"]["lineStart"] == min(m["lineSpan"]["lineStart"] for m in members)
        assert item["lineSpan"]["lineEnd"] == max(m["lineSpan"]["lineEnd"] for m in members)
        if len(ids) > 1:
            merged += 1
            assert item["tokens"] == count(item["text"]) <= budget  # the budget holds for the passage
            chain = sorted(members, key=lambda m: m["charOffsets"]["charStart"])
            assert all(a["nextId"] == b["id"] for a, b in pairwise(chain))
        else:
            assert item["tokens"] == members[0]["tokenStats"]["tokens"]
    return merged, crossed


def test_default_items_are_passages_that_slice_the_source_within_the_budget(indexed, records) -> None:
    from pipeline.index.query import Searcher

    corpus, out = indexed
    for scope in ("document", "section"):
        merged = crossed = 0
        with Searcher(out, **({} if scope == "document" else {"passage_scope": scope})) as searcher:
            assert searcher.expand_tokens == DEFAULT_BUDGET
            for budget in (DEFAULT_BUDGET, 120):
                for mode in ("hybrid", "dense", "bm25"):
                    for query in QUERIES:
                        record = searcher.record(query, 20, mode, expand_tokens=budget)
                        assert record["expand_tokens"] == budget and not record["warnings"]
                        assert [i["k_final"] for i in record["items"]] == list(range(1, len(record["items"]) + 1))
                        m, c = check_passages(record, corpus, records, budget, scope)
                        merged, crossed = merged + m, crossed + c
        assert merged >= 10, "64-token chunks: ranked neighbours merge often"
        if scope == "document":
            assert crossed >= 3, "by default a passage runs across headings of its document"
        else:
            assert crossed == 0


def test_an_unknown_passage_scope_is_refused(indexed) -> None:
    from pipeline.errors import UsageError
    from pipeline.index.query import Searcher

    _, out = indexed
    with pytest.raises(UsageError, match="unknown passage scope 'page'"):
        Searcher(out, passage_scope="page")


def test_passages_are_deterministic_and_the_first_k_do_not_depend_on_k(indexed) -> None:
    from pipeline.index.query import Searcher

    _, out = indexed

    def key(record: dict[str, Any]) -> list[tuple[Any, ...]]:
        return [(i["chunk_ids"], i["offsets"]["start"], i["offsets"]["end"], i["score_raw"]) for i in record["items"]]

    with Searcher(out) as searcher:
        for query in QUERIES:
            wide = searcher.record(query, 50, "hybrid")
            assert key(searcher.record(query, 50, "hybrid")) == key(wide)
            assert key(searcher.record(query, 5, "hybrid")) == key(wide)[:5]
            # passages rank as their hits did: the 001 order holds
            order = [(-i["score_norm"], i["section_id"], i["snippet_id"]) for i in wide["items"]]
            assert order == sorted(order)


def test_no_expand_gives_the_plain_chunks(indexed, records) -> None:
    from pipeline.index.query import Searcher

    _, out = indexed
    with Searcher(out, expand_tokens=0) as searcher:
        record = searcher.record(QUERIES[1], 10, "hybrid")
    VALIDATOR.validate(record)
    assert record["expand_tokens"] == 0 and len(record["items"]) == 10
    for item in record["items"]:
        chunk = records[item["chunk_id"]]
        assert "chunk_ids" not in item and item["text"] == chunk["originalText"]
        assert (item["offsets"]["start"], item["offsets"]["end"]) == (
            chunk["charOffsets"]["charStart"],
            chunk["charOffsets"]["charEnd"],
        )
    cli = runner.invoke(app, ["search", QUERIES[1], "--out", str(out), "--json", "--no-expand", "-k", "10"])
    assert cli.exit_code == 0, cli.output
    assert [i["chunk_id"] for i in json.loads(cli.stdout)["items"]] == [i["chunk_id"] for i in record["items"]]


def test_check_citations_accepts_a_passage_copied_from_search_and_refuses_a_tampered_one(
    indexed, records, tmp_path: Path
) -> None:
    _, out = indexed
    found = runner.invoke(app, ["search", QUERIES[0], "--out", str(out), "--json", "-k", "20"])
    assert found.exit_code == 0, found.output
    items = json.loads(found.stdout)["items"]
    passage = next(i for i in items if len(i["chunk_ids"]) >= 2)

    def check(citation: dict[str, Any]) -> dict[str, Any]:
        answer = tmp_path / "answer.json"
        answer.write_text(json.dumps({"citations": [citation], "answer": "…"}))
        result = runner.invoke(app, ["check-citations", str(answer), "--out", str(out), "--json"])
        report: dict[str, Any] = json.loads(result.stdout)
        assert result.exit_code == (0 if report["ok"] else 1), result.output
        return report

    assert check(passage)["code"] == "ok"
    # a passage that runs across a heading (chunks of two sections of one document) is valid too
    crossing = None
    for query in QUERIES:
        listed = runner.invoke(app, ["search", query, "--out", str(out), "--json", "-k", "20"])
        crossing = crossing or next(
            (i for i in json.loads(listed.stdout)["items"] if len({records[c]["section_id"] for c in i["chunk_ids"]}) > 1),
            None,
        )
    assert crossing is not None, "some passage of the five queries crosses a heading"
    assert check(crossing)["code"] == "ok"
    # without chunk_ids the span is larger than the one chunk it names: 001's bad_offsets
    plain = {k: v for k, v in passage.items() if k != "chunk_ids"}
    assert check(plain)["code"] == "bad_offsets"
    # a chunk of another document listed in the passage
    other = next(c for c, r in records.items() if r["doc_id"] != passage["doc_id"])
    assert check({**passage, "chunk_ids": [*passage["chunk_ids"], other]})["code"] == "bad_passage"
    # the hit not among its chunk_ids
    assert check({**passage, "chunk_ids": passage["chunk_ids"][1:]})["code"] == "bad_passage"
    # a chunk skipped: the hit and the chunk two after it in its section, without the one between
    by_id = {r["id"]: r for r in records.values()}

    def two_after(chunk_id: str) -> str | None:
        hit = records[chunk_id]
        between = by_id.get(hit.get("nextId") or "")
        after = by_id.get(between.get("nextId") or "") if between else None
        same = after is not None and after["section_id"] == hit["section_id"] == between["section_id"]  # type: ignore[index]
        return after["chunk_id"] if same and after is not None else None

    item = next(i for i in items if two_after(i["chunk_id"]))
    skipped = {**item, "chunk_ids": [item["chunk_id"], two_after(item["chunk_id"])]}
    report = check(skipped)
    assert report["code"] == "bad_passage" and "not one run" in report["problems"][0]["message"]


def test_a_source_edited_since_ingest_is_not_merged(indexed, tmp_path: Path) -> None:
    """A passage is read from the source: when the source no longer holds the chunks' text, its hits
    stay plain chunks (their own text, from the index) and a warning names the file."""
    from pipeline.index.query import Searcher

    corpus, _ = indexed
    copy = tmp_path / "copy"
    shutil.copytree(corpus.parent, copy, symlinks=True)
    with Searcher(copy / "chunks", corpus=copy / "corpus") as searcher:
        before = searcher.record(QUERIES[0], 20, "bm25")
    target = next(i["file"] for i in before["items"] if len(i["chunk_ids"]) > 1)
    path = copy / "corpus" / target
    path.write_text("# Replaced\n\nNothing of the old text.\n" + path.read_text(encoding="utf-8"), encoding="utf-8")
    with Searcher(copy / "chunks", corpus=copy / "corpus") as searcher:
        after = searcher.record(QUERIES[0], 20, "bm25")
    assert any(target in w and "not merged" in w for w in after["warnings"])
    stale = [i for i in after["items"] if i["file"] == target]
    assert stale and all(i["chunk_ids"] == [i["chunk_id"]] for i in stale)
    VALIDATOR.validate(after)


def test_a_searcher_kept_open_sees_a_source_edited_after_its_first_query(indexed, tmp_path: Path) -> None:
    """The source texts a searcher keeps between queries follow the files: the same searcher
    that merged a document's hits before the edit does not merge them after it."""
    from pipeline.index.query import Searcher

    corpus, _ = indexed
    copy = tmp_path / "copy"
    shutil.copytree(corpus.parent, copy, symlinks=True)
    with Searcher(copy / "chunks", corpus=copy / "corpus") as searcher:
        before = searcher.record(QUERIES[0], 20, "bm25")
        target = next(i["file"] for i in before["items"] if len(i["chunk_ids"]) > 1)
        path = copy / "corpus" / target
        path.write_text("# Replaced\n\nNothing of the old text.\n" + path.read_text(encoding="utf-8"), encoding="utf-8")
        after = searcher.record(QUERIES[0], 20, "bm25")
    assert not any(target in w for w in before["warnings"])
    assert any(target in w and "not merged" in w for w in after["warnings"])
    assert all(i["chunk_ids"] == [i["chunk_id"]] for i in after["items"] if i["file"] == target)
