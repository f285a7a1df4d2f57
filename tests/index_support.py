"""Helpers shared by the index tests: a chunk folder over a corpus copy, and 'store == chunk state'."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson

from pipeline.index.rows import digest_text
from pipeline.index.vector_store import open_store
from pipeline.run.ingest import Options, ingest

SAMPLE = Path(__file__).resolve().parents[1] / "corpus"


def copy_sample(dest: Path) -> Path:
    shutil.copytree(SAMPLE, dest)
    return dest


#: The sample's two long documents (61 of its 107 chunks).
LONG_SAMPLE_DOCS = ("deep-dive.md", "configuration.md")


def copy_short_sample(dest: Path) -> Path:
    """The sample but for its two long documents: seven documents, ~46 chunks, for a test that
    embeds the corpus more than once and needs no long section."""
    shutil.copytree(SAMPLE, dest, ignore=shutil.ignore_patterns(*LONG_SAMPLE_DOCS))
    return dest


def fresh_copy(template: Path, dest: Path) -> tuple[Path, Path]:
    """A copy of an indexed (corpus, chunks) pair: the index travels inside the chunk folder."""
    shutil.copytree(template, dest, symlinks=True)
    return dest / "corpus", dest / "chunks"


def run_ingest(corpus: Path, out: Path, **kw: Any) -> Any:
    return ingest(Options(corpus=corpus, out=out, jobs=1, **kw))


def chunk_state(out: Path) -> dict[str, tuple[str, str, str]]:
    """chunk_id → (chunk file, hash, digest of embedText), from the chunk files themselves."""
    state: dict[str, tuple[str, str, str]] = {}
    for path in sorted(out.rglob("*.json")):
        rel = path.relative_to(out)
        if rel.parts[0] == ".chunkyard":
            continue
        rec = orjson.loads(path.read_bytes())
        state[rec["chunk_id"]] = (rel.as_posix(), rec["hash"], digest_text(rec["embedText"]))
    return state


def store_state(out: Path, store: str | None = None) -> dict[str, tuple[str, str, str]]:
    """The same view of what the index holds."""
    db = open_store(out, store)
    try:
        return {cid: (s.file, s.hash, s.digest) for cid, s in db.states().items()}
    finally:
        db.close()


def vector_ids(out: Path) -> set[str]:
    """Ids in the SQLite store's vec0 table (every row must have its vector)."""
    import apsw
    import sqlite_vec

    conn = apsw.Connection(str(out / ".chunkyard" / "index.sqlite"))
    conn.enable_load_extension(True)
    conn.load_extension(sqlite_vec.loadable_path())
    try:
        return {row[0] for row in conn.execute("SELECT chunk_id FROM vectors")}
    finally:
        conn.close()
