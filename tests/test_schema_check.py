"""The write path's schema check (SPEC §2): jsonschema-rs agrees with python-jsonschema, rule by rule,
and a record that fails the schema is never written: the run reports it and goes on.

``emit.check_record`` runs jsonschema-rs alone (fast); python-jsonschema is the reference. Each
case below breaks one kind of rule of ``schemas/chunk.schema.json`` (required, additionalProperties,
type, const, enum, pattern, minimum, maximum, minLength, maxLength, minItems, format, nested
objects): both validators must reject it, and ``check_record`` must name the field.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import chunk_md
from hypothesis import given
from hypothesis import strategies as st

import pipeline.run.worker as worker_mod
from pipeline.errors import SchemaError
from pipeline.run.emit import check_record, fast_validator, validator
from pipeline.run.ingest import Options, ingest

DOC = "---\ntitle: T\n---\n# Top\n\nSome text. More.\n\n## Sub\n\n```\ncode\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"


def _record() -> dict[str, Any]:
    return copy.deepcopy(chunk_md(DOC, "d/doc.md").records[1])


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(rec: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = rec
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return change


def _drop(path: str) -> Callable[[dict[str, Any]], None]:
    def change(rec: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = rec
        for key in parents:
            node = node[key]
        del node[last]

    return change


#: name → (how to break a valid record, the field the error must name)
BROKEN: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "required: anchor missing": (_drop("anchor"), ""),
    "required, nested: charEnd missing": (_drop("charOffsets.charEnd"), "charOffsets"),
    "additionalProperties: an extra field": (_set("extra", 1), ""),
    "additionalProperties, nested: metadata.extra": (_set("metadata.extra", 1), "metadata"),
    "type: chunkNumber a string": (_set("chunkNumber", "3"), "chunkNumber"),
    "type: headerPath not an array": (_set("headerPath", "Top"), "headerPath"),
    "type: prevId a number": (_set("prevId", 3), "prevId"),
    "type: integer, not a float": (_set("lineSpan.lineStart", 1.5), "lineSpan/lineStart"),
    "type: boolean option a string": (
        _set("metadata.chunkingOptions.context_prefix", "yes"),
        "metadata/chunkingOptions/context_prefix",
    ),
    "const: contentType": (_set("contentType", "page"), "contentType"),
    "const: schema_version": (_set("schema_version", "1.0.0"), "schema_version"),
    "const: chunkerVersion": (_set("metadata.chunkerVersion", "v2"), "metadata/chunkerVersion"),
    "enum: block_type": (_set("block_type", "prose"), "block_type"),
    "enum: blocks[0].type": (_set("blocks.0.type", "prose"), "blocks/0/type"),
    "pattern: id": (_set("id", "doc:x::chapter1"), "id"),
    "pattern: id with a leading zero": (_set("id", "doc:x::ch01"), "id"),
    "pattern: chunk_id r= of 9 hex": (_set("chunk_id", "d/doc|r=123456789|s=1|p=000|b=000"), "chunk_id"),
    "pattern: chunk_id with a blank": (_set("chunk_id", "d doc|r=12345678|s=1|p=000|b=000"), "chunk_id"),
    "pattern: section_id 1.0": (_set("section_id", "1.0"), "section_id"),
    "pattern: hash": (_set("hash", "sha1:" + "a" * 64), "hash"),
    "pattern: rev upper-case": (_set("rev", "ABCDEF12"), "rev"),
    "pattern: policyHash": (_set("metadata.policyHash", "xyz"), "metadata/policyHash"),
    "pattern: originalText blank": (_set("originalText", "  \n"), "originalText"),
    "pattern: doc_id with a pipe": (_set("doc_id", "a|b"), "doc_id"),
    "minimum: chunkNumber -1": (_set("chunkNumber", -1), "chunkNumber"),
    "minimum: lineStart 0": (_set("lineSpan.lineStart", 0), "lineSpan/lineStart"),
    "minimum: processingTimeMs": (_set("metadata.pipeline.processingTimeMs", -0.5), "metadata/pipeline"),
    "maximum: headerDepths 7": (_set("headerDepths", [1, 7]), "headerDepths/1"),
    "minLength: fileTitle empty": (_set("fileTitle", ""), "fileTitle"),
    "minLength: embedText empty": (_set("embedText", ""), "embedText"),
    "maxLength: anchor of 201": (_set("anchor", "x" * 201), "anchor"),
    "minItems: no blocks": (_set("blocks", []), "blocks"),
    "format: processedAt not a date-time": (
        _set("metadata.processedAt", "yesterday"),
        "metadata/processedAt",
    ),
    "format: processedAt month 13": (
        _set("metadata.processedAt", "2026-13-01T00:00:00.000Z"),
        "metadata/processedAt",
    ),
    "type: frontMatter a list": (_set("metadata.frontMatter", [1]), "metadata/frontMatter"),
}


def test_every_kind_of_schema_rule_is_covered() -> None:
    """The cases above break every keyword the schema uses (so a new keyword needs a case)."""
    schema = json.loads(_schema_text())
    used: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            used.update(k for k in node if k not in {"properties", "items", "description", "title", "$id"})
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    keywords = {k for k in used if k in _KEYWORDS}
    broken = {name.split(":")[0].split(",")[0] for name in BROKEN}
    assert keywords - {"$schema"} <= broken | {"type"}, keywords - broken


_KEYWORDS = {
    "required",
    "additionalProperties",
    "type",
    "const",
    "enum",
    "pattern",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "format",
}


def _schema_text() -> str:
    return (Path(__file__).resolve().parents[1] / "schemas" / "chunk.schema.json").read_text(encoding="utf-8")


def test_a_real_record_passes_both_validators() -> None:
    for rec in chunk_md(DOC, "d/doc.md").records:
        assert not list(validator().iter_errors(rec))
        assert fast_validator().is_valid(rec)
        check_record(rec, "d/doc.md")  # does not raise


@pytest.mark.parametrize("name", list(BROKEN))
def test_both_validators_reject_each_broken_rule_and_the_error_names_the_field(name: str) -> None:
    breaks, field = BROKEN[name]
    rec = _record()
    breaks(rec)
    assert list(validator().iter_errors(rec)), f"{name}: python-jsonschema accepts it"
    assert not fast_validator().is_valid(rec), f"{name}: jsonschema-rs accepts it"
    with pytest.raises(SchemaError) as caught:
        check_record(rec, "d/doc.md: d/doc_doc__ch1.json")
    message = str(caught.value)
    assert message.startswith("d/doc.md: d/doc_doc__ch1.json: field ")
    named = message.split(": field ", 1)[1].split(":", 1)[0]
    assert named.startswith(field or "(record)"), f"{name}: names {named!r}, not {field!r}"


_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 300),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.sampled_from(
        ["", " ", "doc:a::ch1", "a|r=12345678|s=1|p=000|b=000", "2026-01-01T00:00:00Z", "x" * 201]
    ),
    st.lists(st.integers(0, 9), max_size=2),
    st.just({}),
)
_PATHS = sorted(
    {
        "id", "prevId", "chunkNumber", "contentType", "doc_id", "chunk_id", "section_id", "block_type",
        "fileTitle", "headerPath", "headerDepths", "originalText", "embedText", "charOffsets.charStart",
        "lineSpan.lineEnd", "tokenStats.tokens", "tokenStats.tokenizer", "hash", "anchor", "rev", "blocks",
        "metadata.processedAt", "metadata.policyHash", "metadata.lang", "metadata.frontMatter",
        "metadata.pipeline.processingTimeMs", "schema_version", "extra", "metadata.extra",
    }
)  # fmt: skip


@given(st.lists(st.tuples(st.sampled_from(_PATHS), _VALUES), min_size=1, max_size=3))
def test_the_fast_validator_agrees_with_the_reference_on_random_changes(
    changes: list[tuple[str, Any]],
) -> None:
    rec = _record()
    for path, value in changes:
        _set(path, value)(rec)
    reference = not list(validator().iter_errors(rec))
    assert fast_validator().is_valid(rec) == reference, changes


# -- the refuse-to-write path: a run, a record that fails, nothing written -------------------


def _break_records_of(monkeypatch: pytest.MonkeyPatch, rel_path: str, field: str, value: Any) -> None:
    """Fault injection: ``chunk_document`` hands back one document's records with ``field`` broken.

    A valid pipeline never makes such a record (that is the point of the check), so the
    test plants one where the worker receives the chunks, before its schema check.
    """
    real = worker_mod.chunk_document

    def chunk_document(raw: bytes, rel: str, *args: Any, **kw: Any) -> Any:
        doc, chunks = real(raw, rel, *args, **kw)
        if rel == rel_path:
            chunks[-1].record[field] = value
        return doc, chunks

    monkeypatch.setattr(worker_mod, "chunk_document", chunk_document)


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_record_that_fails_the_schema_is_never_written_and_the_run_reports_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jobs: int
) -> None:
    corpus, out = tmp_path / "corpus", tmp_path / "chunks"
    corpus.mkdir()
    (corpus / "good.md").write_text("# Good\n\nFine.\n", encoding="utf-8")
    (corpus / "bad.md").write_text("# Bad\n\nFirst version.\n\n## Two\n\nText.\n", encoding="utf-8")
    first = ingest(Options(corpus=corpus, out=out, jobs=jobs))
    assert first.exit_code == 0
    before = {p.name: p.read_bytes() for p in out.glob("doc_bad__ch*.json")}
    assert len(before) == 2

    (corpus / "bad.md").write_text("# Bad\n\nSecond version.\n\n## Two\n\nText.\n\n## Three\n\nMore.\n")
    (corpus / "good.md").write_text("# Good\n\nFine, edited.\n", encoding="utf-8")
    _break_records_of(monkeypatch, "bad.md", "block_type", "prose")
    summary = ingest(Options(corpus=corpus, out=out, jobs=jobs))

    assert summary.exit_code == 1
    assert len(summary.failures) == 1
    failure = summary.failures[0]
    assert failure.startswith("bad.md: doc_bad__ch2.json: field block_type:"), failure
    assert "hint:" in failure
    # nothing of the failing document was written, not even its valid records; its old files stay
    assert {p.name: p.read_bytes() for p in out.glob("doc_bad__ch*.json")} == before
    assert not list(out.glob(".*.tmp"))
    # the other document went on
    assert "Fine, edited." in (out / "doc_good__ch0.json").read_text(encoding="utf-8")
    assert (summary.processed, summary.written, summary.changed) == (2, 1, 1)  # good.md's one file


def test_the_cli_reports_a_schema_failure_with_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from pipeline.cli.app import app

    corpus, out = tmp_path / "corpus", tmp_path / "chunks"
    corpus.mkdir()
    (corpus / "bad.md").write_text("# Bad\n\nText.\n", encoding="utf-8")
    _break_records_of(monkeypatch, "bad.md", "rev", "NOTHEX!!")
    result = CliRunner().invoke(app, ["ingest", str(corpus), "--out", str(out), "--json", "--jobs", "1"])
    assert result.exit_code == 1, result.output
    summary = json.loads(result.stdout)
    assert summary["failed"] == 1 and summary["failures"][0].startswith(
        "bad.md: doc_bad__ch0.json: field rev:"
    )
    assert not list(out.glob("doc_*.json"))
