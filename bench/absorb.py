"""The parent's side of ``index --executor ray``: how many vectors/s it absorbs, embedding left out.

With a cluster embedding, the parent's work per vector is what bounds the run: it hands
each returned batch to the vector cache (``put_cache``: SQLite, one transaction per batch;
LanceDB, one table version per group of batches) and, at the end, writes the rows, vectors
and BM25 text in one commit (LanceDB rebuilds its BM25 index there). This bench supplies
the vectors (random unit vectors, 384 dims) for real chunk rows (rust-book, repeated under
new ids up to ``--vectors``) and times both steps for each store, as the index's own code
runs them; ``total_per_s`` is to searchable (the commit returned), ``with_close_per_s``
adds the store's ``close`` (SQLite's one WAL checkpoint of the run, which its commit leaves
to the close), ``cpu_*`` the same in the process's CPU time (every thread), and
``without_bm25_per_s`` leaves out LanceDB's BM25 index build (``bm25_build_s``: once per
run, over every row's text; SQLite's FTS5 rows go in with the others and stay in every
figure).

``--edit-rows N`` times instead what one edited chunk costs a LanceDB store of N rows (built
first by commits of 50,000, untimed): the commit that replaces one row's text, which rebuilds
the whole BM25 index (Lance's index takes appended rows incrementally only through
``optimize()``, which also compacts, and counts deleted rows in its statistics until rebuilt).

Usage: ``python bench/absorb.py [--vectors 20000] [--batch 128] [--stores sqlite lancedb]
[--baselines] [--edit-rows 200000]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CORPUS = ROOT.parent / "shared" / "corpora" / "rust-book"


def chunk_rows(work: Path, wanted: int) -> list[Any]:
    """``wanted`` rows from rust-book's chunks: the real ones, then copies under new ids and texts."""
    import orjson

    from pipeline.index.rows import ChunkRow, digest_text
    from pipeline.run.ingest import Options, ingest

    out = work / "chunks"
    ingest(Options(corpus=CORPUS, out=out, jobs=2))
    base = []
    for path in sorted(out.rglob("*.json")):
        if ".chunkyard" in path.parts:
            continue
        record = orjson.loads(path.read_bytes())
        base.append(ChunkRow.from_record(record, path.relative_to(out).as_posix(), model_tokens=100))
    rows = []
    for i in range(wanted):
        row = base[i % len(base)]
        if i >= len(base):
            text = f"{row.embed_text} ({i})"
            row = replace(row, chunk_id=f"{row.chunk_id}~{i}", embed_text=text, digest=digest_text(text))
        rows.append(row)
    return rows


def absorb(kind: str, path: Path, rows: list[Any], batch: int) -> dict[str, float]:
    """Seconds to cache every vector batch by batch, then to commit them all: the parent's work."""
    import numpy as np

    from pipeline.index import lance_store
    from pipeline.index.vector_store import open_at

    bm25_s = [0.0]
    build = lance_store.build_fts

    def timed_build(table: Any) -> None:  # the commit's BM25 build, timed where the store calls it
        began = time.perf_counter()
        build(table)
        bm25_s[0] += time.perf_counter() - began

    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((len(rows), 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    db = open_at(kind, path, dim=384)
    lance_store.build_fts = timed_build
    try:
        cpu = time.process_time()
        started = time.perf_counter()
        db.cached("bench", [r.digest for r in rows])  # as the index asks first: which ones to embed
        for i in range(0, len(rows), batch):
            part = rows[i : i + batch]
            db.put_cache("bench", {r.digest: (vectors[i + j], 100) for j, r in enumerate(part)})
        cached, cpu_cached = time.perf_counter(), time.process_time()
        meta = {"embed_model": "bench", "dim": "384", "generation": "1", "chunks": str(len(rows))}
        db.commit(list(zip(rows, vectors, strict=True)), set(), meta, model="bench")
        done, cpu_done = time.perf_counter(), time.process_time()
    finally:
        lance_store.build_fts = build
        db.close()  # SQLite: the run's WAL checkpoint (after the commit: searchable before it)
    closed, cpu_closed = time.perf_counter(), time.process_time()
    n = len(rows)
    return {
        "close_s": round(closed - done, 3),
        "bm25_build_s": round(bm25_s[0], 3),
        "without_bm25_per_s": round(n / (done - started - bm25_s[0])),
        "with_close_per_s": round(n / (closed - started)),
        "vectors": n,
        "cache_s": round(cached - started, 3),
        "commit_s": round(done - cached, 3),
        "cache_per_s": round(n / (cached - started)),
        "commit_per_s": round(n / (done - cached)),
        "total_per_s": round(n / (done - started)),
        "us_per_vector": round((done - started) / n * 1e6, 1),
        "cpu_cache_per_s": round(n / max(cpu_cached - cpu, 1e-9)),
        "cpu_commit_per_s": round(n / max(cpu_done - cpu_cached, 1e-9)),
        "cpu_total_per_s": round(n / max(cpu_done - cpu, 1e-9)),
        "cpu_with_close_per_s": round(n / max(cpu_closed - cpu, 1e-9)),
    }


def baselines(work: Path, rows: list[Any], kinds: list[str]) -> dict[str, float]:
    """What bounds each store, measured alone in the same run: vec0 inserts of the same vectors
    into a ``vectors`` table like the store's (one transaction); LanceDB's BM25 index built
    over the same analyzed texts (its commit rebuilds it)."""
    import numpy as np

    from pipeline.index.analyzer import LANCE_ANALYZER
    from pipeline.index.analyzers import analysis
    from pipeline.index.sqlite_db import open_database

    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((len(rows), 384)).astype(np.float32)
    n, found = len(rows), {}
    if "sqlite" in kinds:
        conn = open_database(work / "vec0.sqlite")
        conn.execute(
            "CREATE VIRTUAL TABLE vectors USING vec0(chunk_id TEXT PRIMARY KEY, "
            "embedding float[384] distance_metric=cosine)"
        )
        started = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT INTO vectors(chunk_id, embedding) VALUES (?, ?)",
            [(r.chunk_id, v.tobytes()) for r, v in zip(rows, vectors, strict=True)],
        )
        conn.execute("COMMIT")
        found["vec0_alone_per_s"] = round(n / (time.perf_counter() - started))
        conn.close()
    if "lancedb" in kinds:
        import lancedb

        from pipeline.index.lance_store import build_fts

        analyzer = analysis(LANCE_ANALYZER, LANCE_ANALYZER)
        assert analyzer is not None
        table = lancedb.connect(str(work / "fts.lance")).create_table(
            "t", data=[{"body": analyzer.analyze(r.embed_text)} for r in rows]
        )
        started = time.perf_counter()
        build_fts(table)
        found["lance_fts_build_alone_per_s"] = round(n / (time.perf_counter() - started))
    return found


def edit_commit(work: Path, rows: list[Any], wanted: int) -> dict[str, float]:
    """Seconds to commit one edited chunk (its text replaced, a new vector) into a LanceDB
    store of ``wanted`` rows: ``rows`` repeated under new ids and texts up to that size."""
    import numpy as np

    from pipeline.index.rows import digest_text
    from pipeline.index.vector_store import open_at

    def row(i: int) -> Any:
        base = rows[i % len(rows)]
        if i < len(rows):
            return base
        text = f"{base.embed_text} [{i}]"
        return replace(base, chunk_id=f"{base.chunk_id}#{i}", embed_text=text, digest=digest_text(text))

    rng = np.random.default_rng(1)
    db = open_at("lancedb", work / "edit.lance", dim=384)
    meta = {"embed_model": "bench", "dim": "384", "chunks": str(wanted)}
    began = time.perf_counter()
    for generation, start in enumerate(range(0, wanted, 50_000), start=1):
        part = [row(i) for i in range(start, min(wanted, start + 50_000))]
        vectors = rng.standard_normal((len(part), 384)).astype(np.float32)
        db.commit(
            list(zip(part, vectors, strict=True)),
            set(),
            {**meta, "generation": str(generation)},
            model="bench",
        )
    built = time.perf_counter() - began
    edited = row(5)
    text = edited.embed_text + " rewritten"
    edited = replace(edited, embed_text=text, digest=digest_text(text))
    vector = rng.standard_normal(384).astype(np.float32)
    cpu, began = time.process_time(), time.perf_counter()
    db.commit([(edited, vector)], set(), {**meta, "generation": "7"}, model="bench")
    wall, cpu = time.perf_counter() - began, time.process_time() - cpu
    found = db.lexical(["rewritten"], 3)
    db.close()
    if not found or found[0][0] != edited.chunk_id:
        raise SystemExit(f"the edited chunk {edited.chunk_id} is not found by its new word: {found}")
    return {
        "rows": wanted,
        "build_s": round(built, 1),
        "edit_commit_s": round(wall, 3),
        "edit_cpu_s": round(cpu, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vectors", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=128, help="vectors per cache write (a returned batch)")
    parser.add_argument("--stores", nargs="+", default=["sqlite", "lancedb"])
    parser.add_argument(
        "--baselines",
        action="store_true",
        help="also time what bounds each store, alone (vec0, Lance's BM25 build)",
    )
    parser.add_argument(
        "--edit-rows",
        type=int,
        default=0,
        help="time one edited chunk's commit into a LanceDB store of N rows",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cy-absorb-"))
    try:
        rows = chunk_rows(work, args.vectors)
        if args.edit_rows:
            print("edit", json.dumps(edit_commit(work, rows, args.edit_rows)), flush=True)
            return 0
        results = {}
        for kind in args.stores:
            path = work / ("index.sqlite" if kind == "sqlite" else "index.lance")
            results[kind] = absorb("lancedb" if kind == "lancedb" else "sqlite", path, rows, args.batch)
            print(kind, json.dumps(results[kind]), flush=True)
        if args.baselines:
            print("alone", json.dumps(baselines(work, rows, args.stores)), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
