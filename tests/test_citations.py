"""`chunkyard check-citations`: 001's validator for an answer's citation block, against real chunks."""

from __future__ import annotations

import copy as copying
import json
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest
from typer.testing import CliRunner

from pipeline.audit.answer import CODES, LOADER_SIDE, REQUIRED, SCHEMA_PATH
from pipeline.audit.chunk_state import open_store
from pipeline.audit.citations import check_answer
from pipeline.audit.resolve import resolve
from pipeline.cli.app import app
from pipeline.run.db import dump_state
from pipeline.run.ingest import Options, ingest

ROOT = Path(__file__).resolve().parent.parent
DEEP = "guides/deep-dive.md"
runner = CliRunner()


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("citations")
    corpus, chunks = base / "corpus", base / "chunks"
    shutil.copytree(ROOT / "corpus", corpus, copy_function=shutil.copyfile)
    assert not ingest(Options(corpus=corpus, out=chunks, jobs=1)).failures
    return chunks


def chunk_ids(out: Path, rel: str = DEEP) -> list[str]:
    ids: list[str] = dump_state(out)["docs"][rel]["chunk_ids"]
    return ids


def payload(out: Path, chunk_id: str) -> dict[str, Any]:
    """A citation as a retriever built on chunkyard would emit it: `resolve --json`."""
    cit = resolve(open_store(out), chunk_id).payload()
    cit["index_hash"] = "faiss:2f7d9a"  # loader-side fields ride along unchecked
    cit["embed_model"] = "bge-small:mean"
    cit["score_norm"] = 0.8
    return cit


@pytest.fixture
def two_sections(out: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Two citations from one section, one from another."""
    ids = chunk_ids(out)
    sections: dict[str, list[str]] = {}
    for cid in ids:
        sections.setdefault(cid.split("|s=")[1].split("|")[0], []).append(cid)
    same = next(v for v in sections.values() if len(v) >= 2)
    other = next(v for v in sections.values() if v is not same)
    return payload(out, same[0]), payload(out, same[1]), payload(out, other[0])


def check(out: Path, answer: Any, **kw: Any) -> list[tuple[str, str, str]]:
    report = check_answer(answer, open_store(out), **kw)
    return [(p.code, p.where, p.field) for p in report.problems]


def codes(out: Path, answer: Any, **kw: Any) -> set[str]:
    return {c for c, _, _ in check(out, answer, **kw)}


def test_schema_is_valid_2020_12() -> None:
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    assert schema["$schema"].endswith("2020-12/schema")
    jsonschema.Draft202012Validator.check_schema(schema)
    required = schema["$defs"]["citation"]["required"]
    assert tuple(required) == REQUIRED
    assert not set(LOADER_SIDE) & set(required)


def test_good_answer_is_ok(out: Path, two_sections: tuple[dict[str, Any], ...]) -> None:
    a, b, _ = two_sections
    assert check(out, {"citations": [a, b], "answer": "Because."}) == []


def test_sub_span_and_bare_list_are_ok(out: Path, two_sections: tuple[dict[str, Any], ...]) -> None:
    a = copying.deepcopy(two_sections[0])
    a["offsets"] = {"start": a["offsets"]["start"] + 2, "end": a["offsets"]["end"] - 2, "unit": "char"}
    a["tokens"] = 3  # a sub-span has its own count
    assert check(out, [a]) == []


def test_segments_fence_each_segment_alone(out: Path, two_sections: tuple[dict[str, Any], ...]) -> None:
    a, b, c = two_sections
    answer = {"segments": [{"citations": [a, b], "text": "one"}, {"citations": [c], "text": "two"}]}
    assert check(out, answer) == []
    answer["segments"][1]["citations"].append(a)  # type: ignore[attr-defined]
    assert check(out, answer) == [("cross_section_reuse", "segments[1].citations[1]", "section_id")]


@pytest.mark.parametrize("answer", [{"answer": "no block"}, {"citations": [], "answer": "x"}, []])
def test_empty_citations(out: Path, answer: Any) -> None:
    assert check(out, answer)[0][0] == "empty_citations"


@pytest.mark.parametrize("name", REQUIRED)
def test_missing_field(out: Path, two_sections: tuple[dict[str, Any], ...], name: str) -> None:
    a = copying.deepcopy(two_sections[0])
    del a[name]
    assert (f"missing_{name}", "citations[0]", name) in check(out, {"citations": [a]})


def test_loader_side_fields_are_optional(out: Path, two_sections: tuple[dict[str, Any], ...]) -> None:
    a = copying.deepcopy(two_sections[0])
    for name in (*LOADER_SIDE, "doc_id"):
        a.pop(name, None)
    assert check(out, {"citations": [a]}) == []


@pytest.mark.parametrize(
    "offsets",
    [
        {"start": 50, "end": 50, "unit": "char"},
        {"start": 60, "end": 10, "unit": "char"},
        {"start": 0, "end": 10, "unit": "token"},
        {"start": 0, "end": 10},
        "0-10",
    ],
)
def test_bad_offsets(out: Path, two_sections: tuple[dict[str, Any], ...], offsets: Any) -> None:
    a = copying.deepcopy(two_sections[0])
    a["offsets"] = offsets
    found = check(out, {"citations": [a]})
    assert found and found[0][0] == "bad_offsets" and found[0][1] == "citations[0]"


def test_offsets_outside_the_chunk(out: Path, two_sections: tuple[dict[str, Any], ...]) -> None:
    a = copying.deepcopy(two_sections[0])
    a["offsets"]["end"] += 1
    assert check(out, {"citations": [a]}) == [("bad_offsets", "citations[0]", "offsets")]


def test_cross_section_reuse_and_whitelists(out: Path, two_sections: tuple[dict[str, Any], ...]) -> None:
    a, _, c = two_sections
    answer: dict[str, Any] = {"citations": [a, c], "answer": "x"}
    assert check(out, answer) == [("cross_section_reuse", "citations[1]", "section_id")]
    assert check(out, answer, allow_cross_section=True) == []
    assert check(out, {**answer, "allow_cross_section": True}) == []


def test_same_section_path_in_two_documents_is_cross_section(out: Path) -> None:
    a = payload(out, chunk_ids(out)[0])
    other = next(c for c in chunk_ids(out, "getting-started.md") if f"|s={a['section_id']}|" in c)
    assert check(out, {"citations": [a, payload(out, other)]})[0][0] == "cross_section_reuse"


@pytest.mark.parametrize(
    ("name", "value", "code"),
    [
        ("analyzer", "lowercase+ascii_fold", "analyzer_mismatch"),
        ("rev", "3b91f2a0", "rev_mismatch"),
        ("section_id", "9.9", "section_mismatch"),
        ("doc_id", "handbook_2024", "doc_mismatch"),
        ("source_url", "https://example.org/elsewhere", "source_mismatch"),
        ("tokens", 1, "tokens_mismatch"),
    ],
)
def test_field_against_the_chunk(
    out: Path, two_sections: tuple[dict[str, Any], ...], name: str, value: Any, code: str
) -> None:
    a = copying.deepcopy(two_sections[0])
    a[name] = value
    assert check(out, {"citations": [a]}) == [(code, "citations[0]", name)]


def test_unknown_and_redirected_snippets(out: Path, two_sections: tuple[dict[str, Any], ...]) -> None:
    a = copying.deepcopy(two_sections[0])
    live = a["snippet_id"]
    a["snippet_id"] = live.split("|r=")[0] + "|r=00000000|" + live.split("|", 2)[2]
    report = check_answer({"citations": [a]}, open_store(out))
    assert report.code == "unknown_snippet"
    assert live in report.problems[0].message  # the live id at the same place is suggested
    a["snippet_id"] = a["id"]
    report = check_answer({"citations": [a]}, open_store(out))
    assert report.code == "unknown_snippet" and live in report.problems[0].message
    store = open_store(out)
    store.redirects = {"old|r=00000000|s=1|p=000|b=000": live}  # a redirect planted in memory
    a["snippet_id"] = "old|r=00000000|s=1|p=000|b=000"
    assert [p.code for p in check_answer({"citations": [a]}, store).problems] == ["redirected_snippet"]


def test_wrong_type_is_schema_invalid(out: Path, two_sections: tuple[dict[str, Any], ...]) -> None:
    a = copying.deepcopy(two_sections[0])
    a["tokens"] = "188"
    assert ("schema_invalid", "citations[0]", "tokens") in check(out, {"citations": [a]})


def test_first_failure_is_the_return_code(out: Path, two_sections: tuple[dict[str, Any], ...]) -> None:
    a, b, _ = (copying.deepcopy(x) for x in two_sections)
    b["rev"] = "00000000"
    del a["analyzer"]
    report = check_answer({"citations": [a, b]}, open_store(out))
    assert report.code == "missing_analyzer"
    assert report.counts() == {"missing_analyzer": 1, "rev_mismatch": 1}
    assert all(p.code in CODES and p.fix for p in report.problems)


# --- the command line ----------------------------------------------------------------------


def invoke(*args: str) -> Any:
    return runner.invoke(app, ["check-citations", *args], env={"COLUMNS": "250"})


def write(tmp_path: Path, answer: Any, name: str = "answer.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(answer, ensure_ascii=False), encoding="utf-8")
    return str(path)


def test_cli_ok(out: Path, tmp_path: Path, two_sections: tuple[dict[str, Any], ...]) -> None:
    a, b, _ = two_sections
    result = invoke(write(tmp_path, {"citations": [a, b], "answer": "x"}), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "ok" in result.output


def test_cli_resolve_json_round_trips(out: Path, tmp_path: Path) -> None:
    """What `resolve --json` prints is a citation `check-citations` accepts."""
    result = runner.invoke(app, ["resolve", chunk_ids(out)[2], "--out", str(out), "--json"])
    assert result.exit_code == 0
    cit = orjson.loads(result.stdout)
    assert invoke(write(tmp_path, {"citations": [cit], "answer": "x"}), "--out", str(out)).exit_code == 0


def test_cli_problems_exit_one_with_json(
    out: Path, tmp_path: Path, two_sections: tuple[dict[str, Any], ...]
) -> None:
    a, _, c = (copying.deepcopy(x) for x in two_sections)
    a["analyzer"] = "lowercase"
    path = write(tmp_path, {"citations": [a, c], "answer": "x"})
    result = invoke(path, "--out", str(out), "--json")
    assert result.exit_code == 1
    doc = orjson.loads(result.stdout)
    assert doc["code"] == "analyzer_mismatch" and not doc["ok"]
    assert doc["counts"] == {"analyzer_mismatch": 1, "cross_section_reuse": 1}
    assert all(p["fix"] and p["field"] for p in doc["problems"])
    assert invoke(path, "--out", str(out), "--allow-cross-section", "--json").exit_code == 1
    result = invoke(path, "--out", str(out))
    assert "analyzer_mismatch" in result.output and "cross_section_reuse" in result.output


def test_cli_invalid_json_and_usage_errors(out: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"citations": [', encoding="utf-8")
    result = invoke(str(bad), "--out", str(out), "--json")
    assert result.exit_code == 1 and orjson.loads(result.stdout)["code"] == "invalid_json"
    assert invoke(str(tmp_path / "absent.json"), "--out", str(out)).exit_code == 2
    assert invoke(str(bad), "--out", str(tmp_path / "no-chunks")).exit_code == 2
    help_text = runner.invoke(app, ["check-citations", "--help"]).output
    assert "--allow-cross-section" in help_text and "--out" in help_text


def citation_from_record(rec: dict[str, Any]) -> dict[str, Any]:
    """001's payload built from one chunk record alone: every field a copy of a record field."""
    return {
        "doc_id": rec["doc_id"],
        "section_id": rec["section_id"],
        "snippet_id": rec["chunk_id"],
        "source_url": rec["source_url"],
        "offsets": {
            "start": rec["charOffsets"]["charStart"],
            "end": rec["charOffsets"]["charEnd"],
            "unit": "char",
        },
        "tokens": rec["tokenStats"]["tokens"],
        "rev": rec["rev"],
        "analyzer": rec["metadata"]["analyzer"],
    }


def test_a_citation_is_built_from_a_chunk_record_alone(out: Path) -> None:
    """Issue 13: `doc_id` is in the record, so a loader needs no id parsing to cite (001)."""
    records = [orjson.loads(p.read_bytes()) for p in sorted(out.rglob("*.json")) if ".chunkyard" not in p.parts]
    assert len(records) > 10
    for rec in records:
        assert rec["chunk_id"].startswith(rec["doc_id"] + "|r=")
        assert resolve(open_store(out), rec["chunk_id"]).payload()["doc_id"] == rec["doc_id"]
    one_per_section = {(r["doc_id"], r["section_id"]): r for r in records}.values()
    for rec in one_per_section:
        assert check(out, {"citations": [citation_from_record(rec)], "answer": "x"}) == []
    wrong = citation_from_record(next(iter(one_per_section)))
    wrong["doc_id"] = "doc:" + wrong["doc_id"]  # the parentId form is not the doc id
    assert [c for c, _, _ in check(out, {"citations": [wrong], "answer": "x"})] == ["doc_mismatch"]


def test_cli_takes_the_corpus_as_every_command_does(
    out: Path, tmp_path: Path, two_sections: tuple[dict[str, Any], ...]
) -> None:
    """SPEC §7: ``--corpus`` on check-citations too; a corpus that is not there is a usage error."""
    a, b, _ = two_sections
    path = write(tmp_path, {"citations": [a, b], "answer": "x"})
    corpus = out.parent / "corpus"
    result = invoke(path, "--out", str(out), "--corpus", str(corpus), "--json")
    assert result.exit_code == 0, result.output
    assert orjson.loads(result.stdout)["ok"] is True
    result = invoke(path, "--out", str(out), "--corpus", str(tmp_path / "no-corpus"), "--json")
    assert result.exit_code == 2, result.output
    assert "no-corpus" in orjson.loads(result.stdout)["error"]
