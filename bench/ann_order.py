"""Does the order vectors reach an HNSW graph change its recall? (issue 31, after the 1M haystack)

    python bench/ann_order.py --keep DIR [--copies 200000] [--variants order knobs]

Reads the vectors of a kept 1M haystack (``search_scale.py --keep DIR`` with the three English
gold sets inside: the graph's vectors file and the store's chunk ids): ``--copies`` haystack
copies and every gold chunk, and the gold questions' vectors from the embedding cache. The truth
is the exact top 10 of each question over copies + gold (numpy); each variant's graph, made
with ``pipeline.index.ann``'s settings, is searched at its breadth and its recall@10 printed
(all questions, and only the gold chunks among the truth), without the searcher's exact
re-ranking: the variants compare with each other, not with the bench's figures.

``order``: the gold chunks inserted (A) before the copies, (B) after them in one batch,
(C) into the saved graph of the copies, restored (a compaction), (D) the same after removing
as many other copies (a compaction's removals). ``knobs``: B with a wider ``expansion_add``
or more connectivity (and the graph's memory).
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))


def main() -> None:
    import numpy as np
    from kept_haystack import ENGLISH, KeptHaystack, gold_questions, new_graph

    from pipeline.index import ann

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, required=True)
    parser.add_argument("--copies", type=int, default=200_000)
    parser.add_argument("--removed", type=int, default=4758, help="D: copies removed before the gold is added")
    parser.add_argument("--variants", nargs="+", default=["order", "knobs"], choices=["order", "knobs"])
    args = parser.parse_args()

    haystack = KeptHaystack(args.keep)
    gold = [rowid for rowid, _ in haystack.rowids("chunk_id NOT LIKE 'haystack/%'")]
    extra = args.removed
    copies = [rowid for rowid, _ in haystack.rowids("chunk_id LIKE 'haystack/%'", limit=args.copies + extra)]
    gold_keys, gold_vectors = np.asarray(gold, dtype=np.uint64), haystack.read(gold)
    copy_keys, copy_vectors = np.asarray(copies, dtype=np.uint64), haystack.read(copies)
    hay_keys, hay_vectors = copy_keys[: args.copies], copy_vectors[: args.copies]
    other_keys = copy_keys[args.copies :]
    questions = [question for name in ENGLISH for question in gold_questions(name)]
    queries = haystack.embed(questions)
    every = np.vstack([hay_vectors, gold_vectors])
    every_keys = np.concatenate([hay_keys, gold_keys])
    scores = queries @ (every / np.linalg.norm(every, axis=1, keepdims=True)).T
    truth = [set(every_keys[np.argsort(-row)[:10]].tolist()) for row in scores]
    is_gold = set(gold)

    def recall(graph: Any) -> list[float]:
        found = [{int(k) for k in row[:10]} for row in graph.search(queries, 10).keys]
        every_hit = [len(t & f) / 10 for t, f in zip(truth, found, strict=True)]
        gold_hit = [len({k for k in t if k in is_gold} & f) / max(1, len({k for k in t if k in is_gold}))
                    for t, f in zip(truth, found, strict=True)]
        return [round(float(np.mean(every_hit)), 4), round(float(np.mean(gold_hit)), 4)]

    def new(expansion_add: int = ann.EXPANSION_ADD, connectivity: int = ann.CONNECTIVITY) -> Any:
        return new_graph(gold_vectors.shape[1], expansion_add, connectivity)

    def restored(path: Path) -> Any:
        from usearch.index import Index

        graph = Index.restore(str(path))
        graph.expansion_add, graph.expansion_search = ann.EXPANSION_ADD, ann.EXPANSION_SEARCH
        return graph

    result: dict[str, Any] = {"copies": args.copies, "gold": len(gold), "questions": len(questions)}
    scratch = Path(tempfile.mkdtemp(prefix="ann-order-"))
    try:
        if "order" in args.variants:
            first = new()
            first.add(np.concatenate([gold_keys, hay_keys]), np.vstack([gold_vectors, hay_vectors]), threads=0)
            result["A gold first"] = recall(first)
            last = new()
            last.add(np.concatenate([hay_keys, gold_keys]), np.vstack([hay_vectors, gold_vectors]), threads=0)
            result["B gold last"] = recall(last)
            built = new()
            built.add(hay_keys, hay_vectors, threads=0)
            built.save(str(scratch / "copies"))
            added = restored(scratch / "copies")
            added.add(gold_keys, gold_vectors, threads=0)
            result["C restored, gold added"] = recall(added)
            built = new()
            built.add(copy_keys, copy_vectors, threads=0)
            built.save(str(scratch / "more"))
            swapped = restored(scratch / "more")
            swapped.remove(other_keys)
            swapped.add(gold_keys, gold_vectors, threads=0)
            result["D restored, copies removed, gold added"] = recall(swapped)
            print(json.dumps(result), file=sys.stderr, flush=True)
        for expansion_add, connectivity in ((256, 16), (512, 16), (128, 24)) if "knobs" in args.variants else ():
            started = time.perf_counter()
            graph = new(expansion_add, connectivity)
            graph.add(np.concatenate([hay_keys, gold_keys]), np.vstack([hay_vectors, gold_vectors]), threads=0)
            name = f"B, expansion_add {expansion_add}, connectivity {connectivity}"
            result[name] = [*recall(graph), round(graph.memory_usage / 1e6), round(time.perf_counter() - started)]
            print(json.dumps(result), file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
