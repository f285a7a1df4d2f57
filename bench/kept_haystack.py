"""What ``bench/ann_order.py``, ``ann_late.py`` and ``ann_incremental.py`` read of a kept 1M haystack (issue 31).

A haystack kept by ``search_scale.py --keep DIR`` with the three English gold sets inside: its
store, the HNSW state and the graph's exact vectors file beside it, the gold questions embedded
through the kept embedding cache, and a graph made with ``pipeline.index.ann``'s settings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ENGLISH = ("rust-book", "fastapi-en", "powershell-docs")
#: Vectors read from the exact vectors file per call.
READ_BATCH = 50_000


class KeptHaystack:
    """The 1M store of ``keep``, its graph's state and its exact vectors."""

    def __init__(self, keep: Path) -> None:
        from pipeline.index import ann_vectors

        self.keep = keep
        self.store = keep / "store-1000000" / "index.sqlite"
        self.state = json.loads((self.store.parent / "index.sqlite.hnsw.json").read_text())
        self.vectors = ann_vectors.ExactVectors(self.store.parent / self.state["vectors"])

    def rowids(self, where: str = "", limit: int | None = None) -> list[tuple[int, str]]:
        """(rowid, chunk_id) of the store's chunks (``where``: an SQL condition), in rowid order."""
        from pipeline.index.scale_reader import StoreReader

        reader = StoreReader(self.store)
        try:
            sql = "SELECT rowid, chunk_id FROM chunks" + (f" WHERE {where}" if where else "") + " ORDER BY rowid"
            params: tuple[int, ...] = ()
            if limit is not None:
                sql, params = sql + " LIMIT ?", (limit,)
            return [(int(r), str(c)) for r, c in reader.conn.execute(sql, params)]
        finally:
            reader.close()

    def read(self, keys: Any) -> Any:
        """The exact float32 vectors of ``keys`` (rowids), one row each, in their order."""
        import numpy as np

        keys = [int(k) for k in keys]
        out = np.empty((len(keys), self.vectors.dim), dtype=np.float32)
        for at in range(0, len(keys), READ_BATCH):
            part = keys[at : at + READ_BATCH]
            found = self.vectors.read(part)
            out[at : at + len(part)] = np.stack([np.frombuffer(found[k], dtype=np.float32) for k in part])
        return out

    def restore_graph(self) -> Any:
        """The kept graph on disk, searched at the pipeline's breadth."""
        from usearch.index import Index

        from pipeline.index import ann

        graph = Index.restore(str(self.store.parent / self.state["file"]), view=True)
        graph.expansion_search = ann.EXPANSION_SEARCH
        return graph

    def embed(self, questions: list[str]) -> Any:
        """The questions' vectors by the default embedder (the kept cache first), unit length."""
        import numpy as np
        from embed_cache import CachedEmbed

        from pipeline.index.embedders import make_embedder

        embed = CachedEmbed(make_embedder("default"), self.keep / "embed-cache.sqlite", quiet=True)
        queries = np.asarray(embed(questions), dtype=np.float32)
        return queries / np.linalg.norm(queries, axis=1, keepdims=True)


def split(rowids: list[tuple[int, str]]) -> tuple[dict[str, int], Any, Any]:
    """``(rowid of chunk_id, the copies' rowids, the gold corpora's rowids)`` of a kept haystack
    (``KeptHaystack.rowids()``): a copy's chunk id starts with ``haystack/``."""
    import numpy as np

    rowid_of = {chunk_id: rowid for rowid, chunk_id in rowids}
    copies = sorted(r for c, r in rowid_of.items() if c.startswith("haystack/"))
    gold = sorted(r for c, r in rowid_of.items() if not c.startswith("haystack/"))
    return rowid_of, np.asarray(copies, dtype=np.uint64), np.asarray(gold, dtype=np.uint64)


def exact_truths(keep: Path, rowid_of: dict[str, int], questions: list[str]) -> list[set[int]]:
    """Each question's top 10 by exact dense search over the kept 1M (its ``--only exact`` run)."""
    runs = json.loads((keep / "runs-1000000-exact.json").read_text())["dense"]
    return [{rowid_of[item["chunk_id"]] for item in runs[q][:10]} for q in questions]


def recall_as_searched(found: Any, vectors_of: Any, queries: Any, truths: list[set[int]]) -> float:
    """Recall@10 against ``truths`` as a searcher ranks: each query's candidates (``found``, one
    key list per query, ``10 + TIE_MARGIN`` asked) scored by their exact vectors
    (``vectors_of(keys)``, one row each), the best 10 kept."""
    import numpy as np

    hits = 0
    for query, truth, keys in zip(queries, truths, found, strict=True):
        keys = [int(k) for k in keys]
        scores = vectors_of(keys) @ query if keys else np.zeros(0)
        hits += len({keys[i] for i in np.argsort(-scores)[:10]} & truth)
    return round(hits / max(1, sum(len(t) for t in truths)), 4)


def gold_questions(name: str) -> list[str]:
    """The questions of the gold set ``name``, in file order."""
    lines = (HERE / "gold" / f"{name}.jsonl").read_text().splitlines()
    return [json.loads(line)["question"] for line in lines if line.strip() and not line.startswith("#")]


def new_graph(ndim: int, expansion_add: int | None = None, connectivity: int | None = None) -> Any:
    """An empty HNSW graph with ``pipeline.index.ann``'s settings (but the knobs given)."""
    from usearch.index import Index

    from pipeline.index import ann

    return Index(
        ndim=ndim,
        metric="cos",
        dtype=ann.DTYPE,
        connectivity=ann.CONNECTIVITY if connectivity is None else connectivity,
        expansion_add=ann.EXPANSION_ADD if expansion_add is None else expansion_add,
        expansion_search=ann.EXPANSION_SEARCH,
    )
