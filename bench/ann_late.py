"""Recall at 1M of chunks inserted after the copies, at a wider ``expansion_add`` (issue 31).

    python bench/ann_late.py --keep DIR [--expansion-add 256] [--gold-last]

``DIR`` is a kept 1M haystack with the three English gold sets (``search_scale.py --keep DIR``,
its exact rankings done: ``DIR/runs-1000000-exact.json``). Builds an HNSW graph in memory of
every vector of the graph's vectors file with ``pipeline.index.ann``'s settings but
``--expansion-add``, the gold chunks inserted after the copies (``--gold-last``) or before, and
prints, per gold set, the recall@10 of its questions against exact dense search the way a
searcher asks (``k + TIE_MARGIN`` candidates, re-ranked by their exact vectors), beside the
same for the kept graph on disk.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))


def main() -> None:
    import numpy as np
    from kept_haystack import (
        ENGLISH,
        KeptHaystack,
        exact_truths,
        gold_questions,
        new_graph,
        recall_as_searched,
        split,
    )

    from pipeline.index.vector_store import TIE_MARGIN

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, required=True)
    parser.add_argument("--expansion-add", type=int, default=256)
    parser.add_argument("--gold-last", action="store_true")
    args = parser.parse_args()

    haystack = KeptHaystack(args.keep)
    rowid_of, copies, gold = split(haystack.rowids())
    started = time.perf_counter()
    order = np.concatenate([copies, gold] if args.gold_last else [gold, copies])
    vectors = haystack.read(order)
    log = {"read_s": round(time.perf_counter() - started)}
    graph = new_graph(vectors.shape[1], expansion_add=args.expansion_add)
    started = time.perf_counter()
    graph.add(order, vectors, threads=0)
    log["build_s"] = round(time.perf_counter() - started)
    print(json.dumps(log), file=sys.stderr, flush=True)
    kept = haystack.restore_graph()
    position = {int(k): i for i, k in enumerate(order)}

    def recall(index: Any, queries: Any, truths: list[set[int]]) -> float:
        found = index.search(queries, 10 + TIE_MARGIN).keys
        return recall_as_searched(found, lambda keys: vectors[[position[k] for k in keys]], queries, truths)

    result: dict[str, Any] = {**log, "expansion_add": args.expansion_add, "gold_last": args.gold_last}
    for name in ENGLISH:
        questions = gold_questions(name)
        queries = haystack.embed(questions)
        truths = exact_truths(args.keep, rowid_of, questions)
        result[name] = {"built": recall(graph, queries, truths), "kept": recall(kept, queries, truths)}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
