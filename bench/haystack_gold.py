"""More gold sets into a kept haystack, through ``chunkyard index``'s incremental path (issue 31).

    python bench/haystack_gold.py --keep DIR --size 1000000 --gold fastapi-en powershell-docs rust-book

``DIR`` holds a store ``bench/search_scale.py --keep DIR --sizes SIZE`` built with fewer gold
sets (its ``.built`` stamp says how many gold chunks). Building a million again takes about an
hour here; this commits the missing gold chunks (real vectors, from the embedding cache) and
deletes as many copies, the last ones the build made, so the store holds what a fresh build
with these gold sets holds: the same ``SIZE`` chunks, the copies' texts and vectors unchanged
(the copies are drawn in one seeded sequence, so the first ``n`` of a longer draw are the
``n`` a shorter one makes). Both scale indexes follow as ``chunkyard index`` makes them follow
an edit: Tantivy applies the change, the HNSW graph journals it or, past its journal's limit,
compacts (loads, removes and adds, rewrites the graph and its vectors file): the compaction's
time at that size is printed with the others. Then ``search_scale.py --keep DIR --gold ...``
measures as after a build (``--only scale|exact|alone``).

``--regraph`` then rebuilds the HNSW graph from the store in one batch, in a fresh build's
insertion order: the gold chunks first, then the copies (a build commits the gold rows first
and the graph adds rows in rowid order; gold chunks journalled into a built graph, or added
after the copies, are other cases: the bench's figures say which).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from search_scale import GOLD_SETS, log, prepare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, required=True, help="the search_scale.py --keep folder")
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--gold", nargs="+", required=True, choices=sorted(GOLD_SETS))
    parser.add_argument("--distinct", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=31)
    parser.add_argument("--regraph", action="store_true",
                        help="only: rebuild the graph from the store, the gold chunks inserted first")
    parser.add_argument("--rebuild-bm25", action="store_true",
                        help="only: rebuild Tantivy from the store (the deleted copies out of its statistics)")
    args = parser.parse_args()
    if args.regraph:
        regraph(args.keep / f"store-{args.size}" / "index.sqlite")
        return
    if args.rebuild_bm25:
        rebuild_bm25(args.keep / f"store-{args.size}" / "index.sqlite")
        return

    from pipeline.index.identity import index_hash
    from pipeline.index.scale import SCALE_ENV, ScaleSync
    from pipeline.index.scale_reader import StoreReader
    from pipeline.index.sqlite_store import SqliteStore

    store = args.keep / f"store-{args.size}" / "index.sqlite"
    built = store.with_name(store.name + ".built")
    size, seed, old_gold, old_originals = (int(v) for v in built.read_text().split())
    if (size, seed, old_originals) != (args.size, args.seed, args.distinct):
        raise SystemExit(f"{built}: built as {built.read_text()!r}, not size {args.size} seed {args.seed}")
    _, gold, originals, _ = prepare(args.keep, args.distinct, args.gold)
    reader = StoreReader(store)
    present = reader.rowids([row.chunk_id for row, _ in gold])
    reader.close()
    upserts = [(row, vector) for row, vector in gold if row.chunk_id not in present]
    if len(present) != old_gold or len(present) + len(upserts) != len(gold):
        raise SystemExit(f"{store}: {len(present)} of {len(gold)} gold chunks stored, the stamp says {old_gold}")
    kept, made = size - len(gold), size - old_gold  # the copies wanted, the copies there
    deletes = [f"haystack/c{n // len(originals) + 1:04d}/{originals[n % len(originals)].chunk_id}"
               for n in range(kept, made)]
    log(f"{store}: {len(upserts)} gold chunks in, {len(deletes)} copies out")

    os.environ[SCALE_ENV] = "on"
    db = SqliteStore(store)
    stored = db.meta()
    meta = {**stored, "generation": str(int(stored["generation"]) + 1), "chunks": str(size)}
    meta["index_hash"] = index_hash("sqlite-vec", meta, [], meta["generation"])
    sync = ScaleSync(store, int(meta["dim"]))
    load_before = os.getloadavg()
    started = time.perf_counter()
    replaced = sync.before(upserts, deletes)
    if len(replaced) != len(deletes):
        raise SystemExit(f"{store}: {len(replaced)} of the {len(deletes)} copies to delete are stored")
    db.commit(upserts, deletes, meta, model=meta["embed_model"])
    committed = time.perf_counter()
    sync.after(replaced, upserts, meta, stored)
    done = time.perf_counter()
    db.close()
    built.write_text(f"{size} {seed} {len(gold)} {len(originals)}")
    result = {
        "added": len(upserts), "deleted": len(deletes), "store_s": round(committed - started, 1),
        "scale_s": round(done - committed, 1), "rebuilt": sync.rebuilt,
        **{f"{name}_s": round(s, 1) for name, s in sync.seconds.items()},
        "load_before": load_before, "load_after": os.getloadavg(),
    }  # fmt: skip
    (args.keep / f"gold-added-{size}.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


def regraph(store: Path) -> None:
    """The graph and its vectors file rebuilt from ``store``: every gold row, then every copy
    (each in rowid order), as a fresh build of these gold sets inserts them."""
    import numpy as np

    from pipeline.index import ann
    from pipeline.index.scale import stamp
    from pipeline.index.scale_reader import StoreReader
    from pipeline.index.sqlite_store import SqliteStore

    db = SqliteStore(store)
    meta = db.meta()
    db.close()
    reader = StoreReader(store)
    started = time.perf_counter()
    keys, vectors = reader.vectors(int(meta["dim"]))
    ids = reader.ids([int(k) for k in keys])
    reader.close()
    copy = np.fromiter((ids[int(k)].startswith("haystack/") for k in keys), dtype=bool, count=len(keys))
    order = np.lexsort((keys, copy))  # gold first, each part by rowid
    read = time.perf_counter() - started
    log(f"{store}: {int((~copy).sum())} gold and {int(copy.sum())} copies read in {read:.0f} s; building")
    ann.remove(store)
    ann.HnswIndex(store, int(meta["dim"])).rebuild(keys[order], vectors[order], stamp(meta))
    result = {"read_s": round(read, 1), "graph_s": round(time.perf_counter() - started - read, 1),
              "gold": int((~copy).sum()), "copies": int(copy.sum()), "load_after": os.getloadavg()}
    (store.parent.parent / "regraph.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


def rebuild_bm25(store: Path) -> None:
    """Tantivy rebuilt from ``store`` (an applied change leaves deleted rows in its BM25
    statistics until a merge; a fresh build has none)."""
    from pipeline.index import bm25_tantivy
    from pipeline.index.scale_reader import StoreReader

    reader = StoreReader(store)
    started = time.perf_counter()
    lexical = bm25_tantivy.TantivyBm25(bm25_tantivy.folder_for(store))
    (chunks,) = next(iter(reader.conn.execute("SELECT count(*) FROM chunks")))
    lexical.rebuild(reader.texts(), reader.generation(), chunks=int(chunks))
    lexical.close()
    reader.close()
    result = {"bm25_rebuild_s": round(time.perf_counter() - started, 1), "load_after": os.getloadavg()}
    (store.parent.parent / "rebuild-bm25.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
