"""The public Python API (pipeline.api, re-exported lazily from pipeline) and docs/api.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from adapters_support import POLICY, chunk_state, document, make_corpus, run_ingest

import pipeline
from pipeline.adapters.changes import CursorLostError
from pipeline.errors import StageError, UsageError
from pipeline.models import Policy

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "corpus"
VOLATILE = ("processedAt", "pipeline")


def stable(record: dict[str, Any]) -> dict[str, Any]:
    """A record without its volatile fields (SPEC §4: byte-identical apart from these)."""
    meta = {k: v for k, v in record["metadata"].items() if k not in VOLATILE}
    return {**record, "metadata": meta}


def test_chunk_file_gives_exactly_the_records_ingest_writes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    summary = pipeline.ingest(SAMPLE, out, doc_timeout=0, doc_memory_mb=0)
    assert summary.exit_code == 0 and summary.chunks > 0
    on_disk = {cid: stable(rec) for cid, rec in chunk_state(out).items()}
    in_memory: dict[str, dict[str, Any]] = {}
    for path in sorted(SAMPLE.rglob("*.md")):
        for rec in pipeline.chunk_file(path, root=SAMPLE):
            in_memory[rec["chunk_id"]] = stable(rec)
    assert in_memory == on_disk


def test_chunk_text_names_ids_after_the_path_and_follows_the_policy() -> None:
    text = document("one", sections=2, paragraphs=6)
    records = pipeline.chunk_text(text, path="guides/one.md", policy=POLICY)
    assert records[0]["id"] == "doc:guides/one::ch0"
    assert all(r["chunk_id"].startswith("guides/one|r=") for r in records)
    assert all(r["tokenStats"]["tokens"] <= POLICY.target_tokens for r in records)
    assert [r["chunkNumber"] for r in records] == list(range(len(records)))
    big = pipeline.chunk_text(text)  # default policy: 256 tokens, fewer chunks than POLICY
    assert big[0]["id"] == "doc:doc::ch0" and len(big) < len(records)
    assert pipeline.chunk_text("") == []


def test_chunk_file_errors_say_what_and_where(tmp_path: Path) -> None:
    bad = tmp_path / "bad.md"
    bad.write_bytes(b"# ok\n\n\xff\xfe broken\n")
    with pytest.raises(StageError, match="UTF-8"):
        pipeline.chunk_file(bad)
    with pytest.raises(UsageError, match="not inside"):
        pipeline.chunk_file(bad, root=SAMPLE)


def test_ingest_refuses_unknown_options(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="target_tokens"):
        pipeline.ingest(SAMPLE, tmp_path / "out", target_tokens=100)


def test_open_chunks_iterates_and_finds_by_any_id(tmp_path: Path) -> None:
    corpus = make_corpus(tmp_path)
    out = tmp_path / "chunks"
    run_ingest(corpus, out)
    state = chunk_state(out)
    folder = pipeline.open_chunks(out)
    records = list(folder)
    assert len(folder) == len(records) == len(state)
    assert {r["chunk_id"] for r in records} == set(state)
    assert folder.sources == ["alpha.md", "gamma.md", "sub/beta.md"]
    order = [(r["metadata"]["sourceFile"], r["chunkNumber"]) for r in records]
    assert order == sorted(order)
    rec = records[5]
    file = next(
        p for p in out.rglob("doc_*.json") if json.loads(p.read_text())["chunk_id"] == rec["chunk_id"]
    )
    assert folder[rec["chunk_id"]] == folder[rec["id"]] == folder[file.relative_to(out).as_posix()] == rec
    assert "nope" not in folder and folder.get("nope") is None
    with pytest.raises(KeyError):
        folder["nope"]
    # an edit that moves the outline retires ids: the old one still finds its text
    old = [r for r in records if r["metadata"]["sourceFile"] == "alpha.md" and r["section_id"] == "1.2"][-1]
    assert "## Part 1" not in old["originalText"]
    path = corpus / "alpha.md"
    path.write_text(path.read_text().replace("## Part 1", "## Part one"))
    run_ingest(corpus, out)
    again = pipeline.open_chunks(out)
    assert old["chunk_id"] not in chunk_state(out)
    assert again[old["chunk_id"]]["originalText"] == old["originalText"]
    with pytest.raises(UsageError, match="ingest"):
        pipeline.open_chunks(tmp_path / "missing")


def test_read_changes_resumes_after_a_cursor(tmp_path: Path) -> None:
    corpus = make_corpus(tmp_path)
    out = tmp_path / "chunks"
    assert list(pipeline.read_changes(out)) == []  # no feed yet
    run_ingest(corpus, out)
    first = list(pipeline.read_changes(out))
    state = chunk_state(out)
    assert sorted(c.chunk_id for c in first) == sorted(state)  # one write per chunk file
    assert {c.kind for c in first} == {"write"}
    assert all(state[c.chunk_id]["id"] == c.id and state[c.chunk_id]["hash"] == c.hash for c in first)
    cursor = first[-1].cursor
    assert list(pipeline.read_changes(out, after=cursor)) == []
    gamma = {cid for cid, rec in state.items() if rec["metadata"]["sourceFile"] == "gamma.md"}
    (corpus / "gamma.md").unlink()
    run_ingest(corpus, out)
    more = list(pipeline.read_changes(out, after=cursor))
    assert {c.kind for c in more} == {"delete"}
    assert {c.chunk_id for c in more} == gamma and {c.source for c in more} == {"gamma.md"}
    # from any change's cursor: the rest of the feed and nothing else
    every = list(pipeline.read_changes(out))
    for i in (0, 7, len(every) - 2):
        assert list(pipeline.read_changes(out, after=every[i].cursor)) == every[i + 1 :]


def test_read_changes_refuses_cursors_it_never_gave(tmp_path: Path) -> None:
    corpus = make_corpus(tmp_path, ("one",))
    out = tmp_path / "chunks"
    run_ingest(corpus, out)
    with pytest.raises(UsageError, match="cursor"):
        list(pipeline.read_changes(out, after="42"))
    other = "bytes:120"  # a cursor of the old JSON-lines feed's form
    with pytest.raises(CursorLostError):
        list(pipeline.read_changes(out, after=other))


def test_importing_pipeline_or_the_cli_loads_no_framework() -> None:
    code = (
        "import sys, pipeline, pipeline.cli.app; "
        "from pipeline import chunk_text, open_chunks, read_changes, ingest, search, update_index; "
        "import pipeline.adapters, pipeline.adapters.sync; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('langchain_core', 'langchain_text_splitters', 'langchain', 'llama_index', "
        "'numpy', 'onnxruntime', 'apsw', 'sqlite_vec', 'lancedb', 'ray')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
    lazy = "import sys, pipeline; print('pipeline.api' in sys.modules, 'mistletoe' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", lazy], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split() == ["False", "False"]  # the API loads on first use


def test_the_api_is_documented_and_typed() -> None:
    from pipeline import api

    for name in api.__all__:
        obj = getattr(pipeline, name)
        assert obj is getattr(api, name)
        if callable(obj) and not isinstance(obj, type) and name != "Cursor":
            assert obj.__doc__ and "Args:" in obj.__doc__, name
    with pytest.raises(AttributeError):
        pipeline.no_such_name  # noqa: B018


def test_policy_is_the_models_policy() -> None:
    assert pipeline.Policy is Policy
