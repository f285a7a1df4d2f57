"""``--jobs N`` writes exactly what ``--jobs 1`` writes, and results stay small (issue 6).

Every chunk file is compared byte for byte with the two volatile values blanked
(``processedAt``, ``processingTimeMs``); the manifests must agree on every
document's files, ids, hashes and tokens, and the change feeds on what moved.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
from conftest import SAMPLE_CORPUS, chunk_files, require

from pipeline.models import Policy
from pipeline.run.db import dump_state
from pipeline.run.feed import read_feed
from pipeline.run.ingest import Options, ingest
from pipeline.run.worker import Job, process_document

#: Manifest fields that must not depend on the number of workers.
DOC_KEYS = ("source_hash", "size", "files", "ids", "chunk_ids", "hashes", "tokens", "uid_rev")


def run(corpus: Path, out: Path, jobs: int, policy: Policy | None = None) -> dict[str, Any]:
    summary = ingest(Options(corpus=corpus, out=out, jobs=jobs, full=True, policy=policy or Policy()))
    assert not summary.failures, summary.failures
    return summary.as_dict()


def manifest_docs(root: Path) -> dict[str, dict[str, Any]]:
    docs = dump_state(root)["docs"]
    return {rel: {k: entry.get(k) for k in DOC_KEYS} for rel, entry in docs.items()}


def feed(root: Path) -> list[tuple[str, str, str]]:
    events = [line.event for line in read_feed(root, 0)]
    return sorted((e["event"], e.get("file", ""), e.get("hash", "")) for e in events)


def assert_same_output(one: Path, two: Path) -> None:
    files_one, files_two = chunk_files(one), chunk_files(two)
    assert files_one.keys() == files_two.keys()
    differ = [name for name in files_one if files_one[name] != files_two[name]]
    assert not differ, f"{len(differ)} files differ, e.g. {differ[:3]}"
    assert manifest_docs(one) == manifest_docs(two)
    assert feed(one) == feed(two)


@pytest.mark.parametrize("jobs", [2, 3])
def test_jobs_write_what_one_job_writes(tmp_path: Path, jobs: int) -> None:
    first = run(SAMPLE_CORPUS, tmp_path / "one", 1)
    second = run(SAMPLE_CORPUS, tmp_path / "many", jobs)
    assert first["chunks"] == second["chunks"] > 0
    assert_same_output(tmp_path / "one", tmp_path / "many")


def test_jobs_agree_on_another_policy(tmp_path: Path) -> None:
    policy = Policy(target_tokens=64, overlap_tokens=8, tokenizer="o200k_base")
    run(SAMPLE_CORPUS, tmp_path / "one", 1, policy)
    run(SAMPLE_CORPUS, tmp_path / "two", 2, policy)
    assert_same_output(tmp_path / "one", tmp_path / "two")


@pytest.mark.corpora
def test_jobs_agree_on_a_real_corpus(tmp_path: Path, corpora_dir: Path) -> None:
    corpus = corpora_dir / "rust-book"
    if not corpus.is_dir():
        require("corpora", f"{corpus} not found")
    run(corpus, tmp_path / "one", 1)
    run(corpus, tmp_path / "two", 2)
    assert_same_output(tmp_path / "one", tmp_path / "two")


def test_a_result_carries_no_chunk_text(tmp_path: Path) -> None:
    """What a worker sends back is a few ids per chunk, never the chunks: memory stays bounded."""
    doc = SAMPLE_CORPUS / "getting-started.md"
    job = Job(str(doc), "getting-started.md", str(tmp_path), Policy(), "2020-01-01T00:00:00.000Z")
    result = process_document(job)
    assert result.error is None and result.files
    sent = pickle.dumps(result)
    assert b"originalText" not in sent and b"embedText" not in sent
    text = doc.read_text(encoding="utf-8")
    assert text[200:260].encode() not in sent
    assert len(sent) < 1024 + 600 * len(result.files)
