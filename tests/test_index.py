"""``chunkyard index``: the change feed into the SQLite store (real sqlite-vec, FTS5, ONNX model).

What is proved here: a first index equals the chunk files and reconcile finds nothing;
after each edit of the redirect suite (+ rename, delete) the embeddings computed equal the
embedded texts the index did not know; a failing embedder and a second writer leave the
previous index whole; another embedder or analyzer is refused with the rebuild command.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from index_support import chunk_state, copy_sample, fresh_copy, run_ingest, store_state, vector_ids
from test_redirects import EDITS, apply_edit

from pipeline.errors import UsageError
from pipeline.index import index, search
from pipeline.index.embed_onnx import OnnxEmbedder
from pipeline.index.embedders import make_embedder
from pipeline.index.vector_store import IndexMismatchError, store_lock

ROOT = Path(__file__).resolve().parents[1]
INDEX_SCHEMA = json.loads((ROOT / "schemas" / "index.schema.json").read_text())


class CountingEmbedder:
    """The real ONNX embedder, counting the texts it is asked to embed."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.inner = make_embedder(None)
        self.name, self.dim = self.inner.name, self.inner.dim
        self.normalized, self.max_tokens = self.inner.normalized, self.inner.max_tokens
        self.texts: list[str] = []
        self.fail_after = fail_after

    def embed(self, texts: Sequence[str]) -> Any:
        if self.fail_after is not None and len(self.texts) + len(texts) > self.fail_after:
            raise RuntimeError("the embedding service went away")
        self.texts.extend(texts)
        return self.inner.embed(texts)

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample corpus ingested and indexed once (93 chunks); tests take copies."""
    base = tmp_path_factory.mktemp("template")
    corpus, out = copy_sample(base / "corpus"), base / "chunks"
    run_ingest(corpus, out)
    index(out)
    return base


@pytest.fixture
def fresh(template: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the indexed sample corpus of its own."""
    return fresh_copy(template, tmp_path / "copy")


@pytest.fixture(scope="module")
def indexed(template: Path) -> tuple[Path, Path]:
    """The template itself, for tests that do not change it."""
    return template / "corpus", template / "chunks"


def test_first_index_equals_the_chunk_files_and_reconcile_finds_nothing(indexed: tuple[Path, Path]) -> None:
    _, out = indexed
    state = chunk_state(out)
    assert store_state(out) == state
    assert vector_ids(out) == set(state)
    report = index(out, reconcile=True)
    assert report.full and report.reconcile
    assert not any(report.fixed.values()), report.fixed
    assert (report.embedded, report.added, report.deleted, report.updated) == (0, 0, 0, 0)
    jsonschema.validate(report.as_dict(), INDEX_SCHEMA)


def test_a_second_run_without_changes_embeds_and_writes_nothing(indexed: tuple[Path, Path]) -> None:
    _, out = indexed
    before = search(out, "overlap", k=3)["index_hash"]
    report = index(out)
    assert (report.changes, report.embedded, report.added, report.deleted) == (0, 0, 0, 0)
    assert report.index_hash == before


def test_reconcile_repairs_a_store_that_drifted(fresh: tuple[Path, Path], tmp_path: Path) -> None:
    _, out = fresh
    import apsw

    conn = apsw.Connection(str(out / ".chunkyard" / "index.sqlite"))
    victim = sorted(chunk_state(out))[3]
    conn.execute("DELETE FROM chunks WHERE chunk_id = ?", (victim,))
    conn.execute(
        "INSERT INTO chunks(chunk_id, file, hash, digest, row_digest, model_tokens, policy_hash, doc_id,"
        " section_id, source_file, text, payload) VALUES ('ghost|r=0|s=1|p=000|b=000', 'x.json', 'h', 'd',"
        " 'r', 1, 'p', 'ghost', '1', 'x.md', 'boo', '{}')"
    )
    conn.close()
    report = index(out, reconcile=True)
    assert report.fixed["missing"] == [victim]
    assert report.fixed["extra"] == ["ghost|r=0|s=1|p=000|b=000"]
    assert report.embedded == 0  # the victim's vector came from the cache
    assert store_state(out) == chunk_state(out)
    assert not any(index(out, reconcile=True).fixed.values())


@pytest.mark.parametrize("kind", [*EDITS, "rename_file", "delete_file"])
def test_each_edit_embeds_exactly_the_texts_that_changed(kind: str, fresh: tuple[Path, Path]) -> None:
    corpus, out = fresh
    known = {digest for _, _, digest in chunk_state(out).values()}
    doc = corpus / "guides" / "deep-dive.md"
    if kind == "rename_file":
        doc.rename(corpus / "guides" / "deep-dive-renamed.md")
    elif kind == "delete_file":
        doc.unlink()
    else:
        text = doc.read_text(encoding="utf-8")
        doc.write_text(apply_edit(text, "guides/deep-dive.md", kind, random.Random(7)), encoding="utf-8")
    run_ingest(corpus, out)
    embedder = CountingEmbedder()
    report = index(out, embedder=embedder)
    after = chunk_state(out)
    new_texts = {digest for _, _, digest in after.values()} - known
    assert report.embedded == len(embedder.texts) == len(new_texts), report
    assert store_state(out) == after
    assert vector_ids(out) == set(after)
    assert not any(index(out, reconcile=True).fixed.values())
    if kind in ("rename_file", "delete_file"):
        assert report.deleted > 0
    if kind == "rename_file":
        assert report.embedded == 0 and report.added > 0


def _meta(out: Path) -> dict[str, str]:
    from pipeline.index.vector_store import open_store

    db = open_store(out)
    try:
        return db.meta()
    finally:
        db.close()


def _from_scratch(out: Path, meta: dict[str, str]) -> tuple[str, str]:
    """(content digest, index_hash) computed from the chunk files alone, as a new index would."""
    from pipeline.index.identity import index_hash, set_digest

    records = [json.loads(p.read_bytes()) for p in sorted(out.rglob("*.json")) if ".chunkyard" not in p.parts]
    content = set_digest((r["chunk_id"], r["hash"]) for r in records)
    policies = {str(r["metadata"].get("policyHash", "")) for r in records}
    return content, index_hash("sqlite-vec", meta, policies, content)


def test_an_incremental_index_hash_equals_a_from_scratch_one(fresh: tuple[Path, Path]) -> None:
    """Each run updates the indexed set's digest by its own changes (no full read): after every
    edit of the suite, and after an index written before the summary was kept, it equals the
    digest computed from every chunk file."""
    corpus, out = fresh
    doc = corpus / "guides" / "deep-dive.md"
    rng = random.Random(11)
    for kind in EDITS:
        text = doc.read_text(encoding="utf-8")
        doc.write_text(apply_edit(text, "guides/deep-dive.md", kind, rng), encoding="utf-8")
        run_ingest(corpus, out)
        report = index(out)
        assert not report.full, kind
        meta = _meta(out)
        assert (meta["content"], meta["index_hash"]) == _from_scratch(out, meta), kind
        assert int(meta["chunks"]) == report.chunks == len(chunk_state(out))
    (corpus / "windows-notes.md").unlink()
    from pipeline.index.vector_store import open_store

    db = open_store(out)  # an index written by a chunkyard that kept no summary
    db._conn.execute(  # type: ignore[attr-defined]
        "DELETE FROM meta WHERE key IN ('content', 'truncated', 'policy_counts')"
    )
    db.close()
    run_ingest(corpus, out)
    report = index(out)
    meta = _meta(out)
    assert report.deleted > 0 and not report.full
    assert (meta["content"], meta["index_hash"]) == _from_scratch(out, meta)
    assert {"content", "truncated", "policy_counts"} <= set(meta)
    assert report.truncated == int(meta["truncated"])


def test_a_lost_cursor_reads_everything_again_and_drops_what_is_gone(
    fresh: tuple[Path, Path], tmp_path: Path
) -> None:
    corpus, out = fresh
    (corpus / "windows-notes.md").unlink()
    run_ingest(corpus, out)
    feed = out / ".chunkyard" / "changes.jsonl"
    if feed.exists():
        feed.write_bytes(b"")  # the feed was replaced: it no longer reaches the cursor
    else:  # the feed in the state database: compacted past the cursor (its floor rose)
        from pipeline.run.db import StateDB, db_path
        from pipeline.run.feed import last_seq

        db = StateDB(db_path(out / ".chunkyard"))
        with db.transaction():
            db.set_meta(feed_floor=last_seq(out))
        db.close()
    report = index(out)
    assert report.full and report.deleted > 0 and report.embedded == 0
    assert store_state(out) == chunk_state(out)


def test_a_failing_embedder_leaves_the_previous_index_searchable(
    fresh: tuple[Path, Path], tmp_path: Path
) -> None:
    corpus, out = fresh
    before = search(out, "configuration reference", k=5)
    state_before = store_state(out)
    for path in sorted(corpus.rglob("*.md"))[:4]:
        path.write_text(path.read_text(encoding="utf-8") + "\n\nA new closing paragraph.\n", encoding="utf-8")
    run_ingest(corpus, out)
    with pytest.raises(RuntimeError, match="went away"):
        index(out, embedder=CountingEmbedder(fail_after=0))
    assert store_state(out) == state_before
    again = search(out, "configuration reference", k=5)
    assert again["index_hash"] == before["index_hash"]
    assert [i["snippet_id"] for i in again["items"]] == [i["snippet_id"] for i in before["items"]]
    index(out)
    assert store_state(out) == chunk_state(out)


def test_a_second_writer_waits_or_fails_fast(indexed: tuple[Path, Path]) -> None:
    _, out = indexed
    with store_lock(out / ".chunkyard" / "index.sqlite"), pytest.raises(UsageError, match="being indexed"):
        index(out, wait=False)


class OtherWindow(OnnxEmbedder):
    """A second real embedder config: the same ONNX model, known under another name and window.

    It stands for 'another model' in the identity checks (the vectors are the model's own).
    """

    name = "onnx:all-MiniLM-L6-v2-int8@window128"
    max_tokens = 128


def test_another_embedder_is_refused_with_the_rebuild_command(indexed: tuple[Path, Path]) -> None:
    _, out = indexed
    with pytest.raises(IndexMismatchError) as caught:
        index(out, embedder=OtherWindow())
    assert caught.value.code == "mismatch_index_hash"
    assert "--rebuild" in str(caught.value)
    with pytest.raises(IndexMismatchError) as again:
        search(out, "overlap", embedder=OtherWindow())
    assert again.value.code == "mismatch_index_hash"


def test_another_analyzer_is_refused(fresh: tuple[Path, Path], tmp_path: Path) -> None:
    _, out = fresh
    import apsw

    conn = apsw.Connection(str(out / ".chunkyard" / "index.sqlite"))  # as an older chunkyard wrote it
    conn.execute("UPDATE meta SET value = 'fts5:unicode61' WHERE key = 'analyzer'")
    conn.close()
    for call in (lambda: search(out, "overlap"), lambda: index(out)):
        with pytest.raises(IndexMismatchError) as caught:
            call()
        assert caught.value.code == "analyzer_mismatch"
        assert "chunkyard index --out" in str(caught.value)


def test_check_citations_follows_the_live_index_hash(fresh: tuple[Path, Path], tmp_path: Path) -> None:
    _, out = fresh
    cli = [sys.executable, "-m", "pipeline"]
    found = subprocess.run(
        [*cli, "search", "how long may a chunk be", "--out", str(out), "-k", "2", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    item = json.loads(found.stdout)["items"][0]
    answer = tmp_path / "answer.json"
    answer.write_text(json.dumps({"citations": [item], "answer": "About 512 tokens."}))
    ok = subprocess.run(
        [*cli, "check-citations", str(answer), "--out", str(out), "--json"], capture_output=True, check=False
    )
    assert ok.returncode == 0, ok.stdout
    report = index(out, embedder=OtherWindow(), rebuild=True)
    assert report.reason == "rebuild" and report.index_hash != item["index_hash"]
    assert store_state(out) == chunk_state(out)
    assert not (out / ".chunkyard" / "index.sqlite.rebuild").exists()
    bad = subprocess.run(
        [*cli, "check-citations", str(answer), "--out", str(out), "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 1
    assert json.loads(bad.stdout)["code"] == "mismatch_index_hash"


def test_a_locked_database_fails_the_run_and_keeps_the_index(fresh: tuple[Path, Path]) -> None:
    """Another process holds SQLite's write lock for the whole run: StoreError, nothing lost."""
    import apsw

    from pipeline.index.vector_store import StoreError

    corpus, out = fresh
    before = store_state(out)
    (corpus / "getting-started.md").write_text("# Getting started\n\nAll new text.\n", encoding="utf-8")
    run_ingest(corpus, out)
    holder = apsw.Connection(str(out / ".chunkyard" / "index.sqlite"))
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StoreError, match="locked"):
            index(out)
        assert search(out, "configuration", k=1, mode="bm25")["items"]  # readers still read
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert store_state(out) == before
    index(out)
    assert store_state(out) == chunk_state(out)


def _small_files() -> None:
    """In the child: files may not grow past 64 KB (a full disk, as SQLite sees it)."""
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))


def test_a_full_disk_fails_the_run_and_keeps_the_index(fresh: tuple[Path, Path]) -> None:
    corpus, out = fresh
    before = store_state(out)
    for path in sorted(corpus.rglob("*.md")):
        path.write_text(
            path.read_text(encoding="utf-8") + "\n\nA closing paragraph, new.\n", encoding="utf-8"
        )
    run_ingest(corpus, out)
    full = subprocess.run(
        [sys.executable, "-m", "pipeline", "index", "--out", str(out), "--json"],
        capture_output=True,
        text=True,
        check=False,
        preexec_fn=_small_files,
    )
    assert full.returncode == 2, full.stdout + full.stderr
    assert "could not be written" in full.stderr or "disk" in full.stderr.lower(), full.stderr
    assert store_state(out) == before
    assert search(out, "configuration", k=1, mode="bm25")["items"]
    index(out)
    assert store_state(out) == chunk_state(out)
