"""A design the LanceDB store does not have, measured: its BM25 index built before the vectors.

The texts of a run are known when it plans, long before a cluster returns their vectors. If
the BM25 index lived in its own ``chunk_id, body`` table (pinned by version in ``meta.json``
so that readers see it change with the cursor), the parent could write and index it while
the cluster embeds, and after the last vector only the cache, the rows and the cursor
would remain. This bench splits ``bench/absorb.py``'s LanceDB work that way, with the
store's own functions: *early* (rows encoded, the ``body`` table written and indexed: no
vector needed; the rows' encoding is early here too, though a row's ``model_tokens`` comes
with its vector) and *late* (the cache batches, the vector column, ``add``, the cursor).
It also checks the design's premise: that table's BM25 results (ids, order, scores) equal
those of the ``chunks`` table as the store indexes it today, for a few questions.

Usage: ``python bench/lance_early_bm25.py [--vectors 20000]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from absorb import chunk_rows

QUESTIONS = [
    ["ownership"],
    ["borrow", "checker"],
    ["trait", "object"],
    ["cargo"],
    ["smart", "pointer"],
    ["thread"],
]


def _lexical(table: Any, terms: list[str], k: int = 20) -> list[tuple[str, float]]:
    from lancedb import query as lq

    phrase: Any = lq.PhraseQuery
    query = lq.BooleanQuery([(lq.Occur.SHOULD, phrase(t, "body")) for t in terms])
    found = table.search(query, query_type="fts").limit(k).select(["chunk_id", "_score"]).to_list()
    return [(r["chunk_id"], float(r["_score"])) for r in found]


def split(work: Path, rows: list[Any]) -> dict[str, Any]:
    import numpy as np
    import orjson

    from pipeline.index.lance_store import (
        _ROW_COLUMNS,
        UNCOMPRESSED,
        LanceStore,
        _row_columns,
        build_fts,
        utf8_column,
    )

    n = len(rows)
    vectors = np.random.default_rng(0).standard_normal((n, 384)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    store = LanceStore(work / "early.lance", dim=384)
    pa = store._pa
    began, cpu = time.perf_counter(), time.process_time()
    encoded = [r.encoded() for r in rows]
    columns: dict[str, Any] = dict(zip(_ROW_COLUMNS, zip(*map(_row_columns, rows), strict=True), strict=True))
    columns["row_digest"] = [digest for _, digest in encoded]
    columns["body"] = [store._analyze(r.embed_text) for r in rows]
    columns["payload"] = utf8_column(pa, [payload for payload, _ in encoded])
    schema = pa.schema([pa.field(c, pa.string(), metadata=UNCOMPRESSED) for c in ("chunk_id", "body")])
    lexicon = store._db.create_table("lexicon", schema=schema)
    lexicon.add(pa.table({"chunk_id": columns["chunk_id"], "body": columns["body"]}, schema=schema))
    build_fts(lexicon)
    early, early_cpu = time.perf_counter() - began, time.process_time() - cpu
    began, cpu = time.perf_counter(), time.process_time()
    store.cached("bench", [r.digest for r in rows])
    for i in range(0, n, 128):
        store.put_cache("bench", {r.digest: (vectors[i + j], 100) for j, r in enumerate(rows[i : i + 128])})
    store._write_cache()
    columns["vector"] = store._vector_column(vectors)
    store._table("chunks").add(pa.table(columns, schema=store._schema("chunks")))
    (store.path / "meta.json").write_bytes(orjson.dumps({"lexicon_version": str(lexicon.version)}))
    late, late_cpu = time.perf_counter() - began, time.process_time() - cpu
    today = LanceStore(work / "today.lance", dim=384)
    today.commit(list(zip(rows, vectors, strict=True)), set(), {"generation": "1"}, model="bench")
    equal = [_lexical(lexicon, q) == _lexical(today._chunks, q) for q in QUESTIONS]
    return {
        "vectors": n,
        "early_s": round(early, 3),
        "early_cpu_s": round(early_cpu, 3),
        "late_s": round(late, 3),
        "late_cpu_s": round(late_cpu, 3),
        "after_last_vector_per_s": round(n / late),
        "parent_total_per_s": round(n / (early + late)),
        "bm25_equal_per_question": equal,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vectors", type=int, default=20_000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cy-early-"))
    try:
        print(json.dumps(split(work, chunk_rows(work, args.vectors))), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
