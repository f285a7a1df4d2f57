"""Recall at 1M of chunks added to an existing graph, by the ``expansion_add`` they are added at (issue 31).

    python bench/ann_incremental.py --keep DIR build --graph FILE
    python bench/ann_incremental.py --keep DIR add --graph FILE [--expansion-add 128 1024 ...] [--threads 0]

``DIR`` is a kept 1M haystack with the three English gold sets (``search_scale.py --keep DIR``,
its exact rankings done: ``DIR/runs-1000000-exact.json``). ``build`` makes the graph of the
copies alone with ``pipeline.index.ann``'s settings (a fresh build's) and saves it to ``FILE``:
the existing index. ``add``, for each ``--expansion-add``, restores that graph as a compaction
does (``Index.restore``, loaded), adds every gold chunk's vector at that breadth (the chunks a
user added later), and prints the seconds the add took (and per vector) and, per gold set, the
recall@10 of its questions against exact dense search the way a searcher asks
(``k + TIE_MARGIN`` candidates at ``EXPANSION_SEARCH``, re-ranked by their exact vectors).
``--timing N`` adds only N of them (spread over the gold) and prints the time alone.
``--policy`` adds the gold through ``ann.HnswIndex``'s own compaction instead (a copy of the
graph as an index's, the gold journalled past ``JOURNAL_MAX_KEYS``, ``EXPANSION_ADD_EXISTING``
set to each ``--expansion-add``): what ``chunkyard index`` does, timed from load to save.
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
    from kept_haystack import (
        ENGLISH,
        KeptHaystack,
        exact_truths,
        gold_questions,
        new_graph,
        recall_as_searched,
        split,
    )

    from pipeline.index import ann
    from pipeline.index.vector_store import TIE_MARGIN

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, required=True)
    parser.add_argument("step", choices=["build", "add"])
    parser.add_argument("--graph", type=Path, required=True)
    parser.add_argument("--expansion-add", type=int, nargs="+", default=[ann.EXPANSION_ADD])
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--policy", action="store_true", help="add through HnswIndex's compaction")
    parser.add_argument(
        "--timing", type=int, default=0, help="add only this many gold vectors (spread), no recall"
    )
    args = parser.parse_args()

    haystack = KeptHaystack(args.keep)
    rowid_of, copies, gold = split(haystack.rowids())
    if args.step == "build":
        started = time.perf_counter()
        vectors = haystack.read(copies)
        log: dict[str, Any] = {"read_s": round(time.perf_counter() - started)}
        graph = new_graph(vectors.shape[1])
        started = time.perf_counter()
        graph.add(copies, vectors, threads=0)
        log["build_s"] = round(time.perf_counter() - started)
        graph.save(str(args.graph))
        print(json.dumps({**log, "copies": len(copies), "file": str(args.graph)}))
        return

    from usearch.index import Index

    gold_vectors = haystack.read(gold)
    asked = {name: gold_questions(name) for name in ENGLISH}
    queries = {name: haystack.embed(questions) for name, questions in asked.items()}
    truths = {name: exact_truths(args.keep, rowid_of, questions) for name, questions in asked.items()}

    def recall(search: Any, name: str) -> float:
        found = [search(query, 10 + TIE_MARGIN) for query in queries[name]]
        return recall_as_searched(found, haystack.read, queries[name], truths[name])

    for expansion_add in args.expansion_add:
        result: dict[str, Any] = {"expansion_add": expansion_add, "gold": len(gold)}
        if args.policy:
            scratch = Path(tempfile.mkdtemp(prefix="ann-incremental-", dir=args.graph.parent))
            try:
                store = scratch / "index.sqlite"
                index = ann.HnswIndex(store, gold_vectors.shape[1])
                shutil.copyfile(args.graph, scratch / index._file_name("g0"))
                index._write_state(
                    {"file": index._file_name("g0"), "generation": "g0", "count": len(copies), "dtype": ann.DTYPE,
                     "removed": 0, "journal": "", "journal_bytes": 0, "journal_keys": 0, "vectors": ""}
                )  # fmt: skip
                ann.EXPANSION_ADD_EXISTING = expansion_add
                started = time.perf_counter()
                index.apply([], (gold, gold_vectors), "g1")  # past JOURNAL_MAX_KEYS: a compaction
                result["compaction_s"] = round(time.perf_counter() - started, 1)
                reader = ann.HnswIndex(store, gold_vectors.shape[1])  # a searcher's
                for name in ENGLISH:
                    result[name] = recall(reader.search, name)
                reader.close()
                index.close()
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
        else:
            graph = Index.restore(str(args.graph))
            graph.expansion_add, graph.expansion_search = expansion_add, ann.EXPANSION_SEARCH
            started = time.perf_counter()
            picked = slice(None, None, max(1, len(gold) // args.timing)) if args.timing else slice(None)
            graph.add(gold[picked], gold_vectors[picked], threads=args.threads)
            seconds = time.perf_counter() - started
            added = len(gold[picked])
            result.update(
                added=added, add_s=round(seconds, 2), ms_per_vector=round(1000 * seconds / added, 2)
            )
            if args.timing:
                print(json.dumps(result), flush=True)
                continue
            for name in ENGLISH:
                result[name] = recall(lambda query, k, graph=graph: graph.search(query, k).keys, name)
            del graph
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
