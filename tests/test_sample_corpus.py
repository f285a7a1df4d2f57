"""The sample corpus (``corpus/``) end to end: golden chunk files, the schema, the checker."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from conftest import SAMPLE_CORPUS, SCHEMA, TESTS, check_golden, chunk_md, invariant_errors, stable

from pipeline.models import Policy
from pipeline.run.ingest import Options, ingest

GOLDEN = TESTS / "golden" / "sample-corpus.golden.json"


@pytest.fixture(scope="module")
def sample_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sample") / "chunks"
    summary = ingest(Options(corpus=SAMPLE_CORPUS, out=out, policy=Policy(), jobs=1))
    assert summary.failures == []
    assert summary.documents == len(sources())
    return out


def sources() -> list[Path]:
    return sorted(p for p in SAMPLE_CORPUS.rglob("*") if p.suffix in (".md", ".markdown"))


def chunk_files(out: Path) -> dict[str, dict[str, Any]]:
    return {
        p.relative_to(out).as_posix(): json.loads(p.read_bytes())
        for p in sorted(out.rglob("doc_*.json"))
        if ".chunkyard" not in p.parts
    }


def test_sample_corpus_matches_golden(sample_out: Path) -> None:
    got = {rel: stable(rec) for rel, rec in chunk_files(sample_out).items()}
    assert got
    check_golden(GOLDEN, got)


def test_every_chunk_file_matches_the_schema(sample_out: Path, validate_schema) -> None:
    for rel, rec in chunk_files(sample_out).items():
        assert validate_schema(rec) == [], rel


def test_files_on_disk_are_what_chunk_document_returns(sample_out: Path, invariants) -> None:
    files = chunk_files(sample_out)
    expected: dict[str, dict[str, Any]] = {}
    for src in sources():
        rel = src.relative_to(SAMPLE_CORPUS).as_posix()
        result = chunk_md(src.read_bytes(), rel)
        assert invariants(result) == [], rel
        expected.update({c.rel_file: stable(c.record) for c in result.chunks})
    assert {rel: stable(rec) for rel, rec in files.items()} == expected


def test_the_output_tree_mirrors_the_corpus(sample_out: Path) -> None:
    folders = {Path(rel).parent.as_posix() for rel in chunk_files(sample_out)}
    corpus_folders = {src.relative_to(SAMPLE_CORPUS).parent.as_posix() for src in sources()}
    assert folders == corpus_folders
    assert not [
        p for p in sample_out.rglob("*.json") if ".chunkyard" not in p.parts and not p.name.startswith("doc_")
    ]


def test_independent_checker_passes(sample_out: Path, checker) -> None:
    with redirect_stdout(io.StringIO()) as printed:
        code = checker.main(
            ["--corpus", str(SAMPLE_CORPUS), "--chunks", str(sample_out), "--schema", str(SCHEMA)]
        )
    assert code == 0, printed.getvalue()


def test_invariants_hold_with_the_independent_headings(sample_out: Path, checker) -> None:
    for src in sources():
        result = chunk_md(src.read_bytes(), src.relative_to(SAMPLE_CORPUS).as_posix())
        heads = [h for h, _ in checker.Outline(result.text).headings]
        assert list(invariant_errors(result, heads)) == [], src.name


def test_golden_records_match_the_schema(validate_schema) -> None:
    """The golden file and the schema never drift: its records, volatile fields put back, validate."""
    for rel, rec in json.loads(GOLDEN.read_text(encoding="utf-8")).items():
        rec["metadata"]["processedAt"] = "2024-01-01T00:00:00Z"
        rec["metadata"]["pipeline"]["processingTimeMs"] = 0.5
        assert validate_schema(rec) == [], rel
