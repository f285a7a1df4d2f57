"""``chunkyard search``: BM25, dense, or both fused, with citations.

The answer is 004's retrieval result record (``schemas/search.schema.json``): the
envelope, ``q_id``, ``ranker``, ``k`` and ``items``; every item carries 001's citation
payload, its ``features`` {bm25, dense} and the text. Order is deterministic: score_norm
descending, then ``section_id``, then ``snippet_id`` (001 rule 5).

How the rankers' lists (``FUSE_DEPTH`` deep in hybrid mode) are fused and how scores are
normalised: ``pipeline.index.fusion``. How hits become passages: ``pipeline.index.passages``.
By default each hit is merged with the neighbours of its document that the search ranked
in its first ``MERGE_DEPTH``, the better-ranked first, up to ``expand_tokens`` tokens, into
one item: one citation span (``offsets`` cover the passage, ``text`` is exactly that slice
of the source, ``chunk_ids`` lists the merged chunks, hit first, ``tokens`` counts the
passage). The merge looks at a pool of at least ``FUSE_DEPTH`` ranked chunks, then the best
``k`` passages are returned, so ``-k 5`` gives the first five of ``-k 50``'s.
``expand_tokens=0`` (``--no-expand``) returns plain chunks.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Self

import blake3

from pipeline.errors import UsageError
from pipeline.index.analyzer import ANALYZER
from pipeline.index.expand import DEFAULT_BUDGET, SCOPES
from pipeline.index.fusion import FUSIONS, MISSING_Z, MODES, RRF_K, Candidate, fuse, score_norm, zscores
from pipeline.index.identity import check_compatible, rebuild_hint
from pipeline.index.language import default_analyzer, hybrid_weights, passage_budget, prompt_tokens, require
from pipeline.index.passages import MERGE_DEPTH, Passages
from pipeline.index.rows import ChunkRow
from pipeline.index.scale import open_scale_search
from pipeline.index.substring_guard import substring_ruled_out
from pipeline.index.vector_store import VectorStore, open_store, store_spec
from pipeline.index.windows import WINDOW_POOL, window_scorer

#: Each ranker's list in hybrid mode is this deep (or k, when k is larger).
FUSE_DEPTH = 50
SCHEMA_VERSION = "1.0.0"
#: A substring fallback (a query with no BM25 term, or none that matched) looks at most this far.
MAX_NEEDLE = 200


class Searcher:
    """An open index, ready for many queries (the eval asks hundreds).

    ``searcher(query, mode, k)`` returns the items (``pipeline.evaluate.run.SearchFn``);
    ``searcher.record(query, k, mode)`` the whole 004 record.
    """

    def __init__(
        self,
        out: Path | str,
        store: str | Path | None = None,
        embedder: Any = None,
        *,
        expand_tokens: int | None = None,
        corpus: Path | None = None,
        rrf_k: int = RRF_K,
        weights: tuple[float, float] | None = None,
        fusion: str = "zscore",
        passage_scope: str = "document",
        overlap_lexical: bool = True,
        bm25_window: int | None = None,
        prompt: int | None = None,
    ) -> None:
        if expand_tokens is not None and expand_tokens < 0:
            raise UsageError(f"expand_tokens must be 0 (off) or more, got {expand_tokens}")
        if prompt is not None and prompt < 0:
            raise UsageError(f"prompt must be 0 (fixed passages) or more tokens, got {prompt}")
        if fusion not in FUSIONS:
            raise UsageError(f"unknown fusion {fusion!r} (hint: one of {', '.join(FUSIONS)})")
        if weights is not None and (min(weights) < 0 or not sum(weights) > 0):
            raise UsageError(
                f"hybrid weights must be 0 or more, not both 0, got {weights} (hint: e.g. --dense-weight 1.5)"
            )
        if passage_scope not in SCOPES:
            raise UsageError(f"unknown passage scope {passage_scope!r} (hint: one of {', '.join(SCOPES)})")
        self.out = Path(out)
        self.passage_scope = passage_scope
        self.fusion = fusion
        self.rrf_k = rrf_k
        self._asked_weights = weights
        self._passages = Passages(self.out, corpus, passage_scope)
        self.db: VectorStore = open_store(self.out, store)
        self.use_meta(self.db.meta())
        if not self.meta.get("embed_model"):
            self.db.close()
            raise UsageError(f"{self.db.path}: the index is empty (hint: `chunkyard index --out {out}`)")
        self.expand_tokens = (
            passage_budget(self.meta, DEFAULT_BUDGET) if expand_tokens is None else expand_tokens
        )
        """The passage budget (``None`` asked: the language's, ``language.passage_budget``)."""
        self.prompt = (prompt_tokens(self.meta) if prompt is None else prompt) or None
        """The prompt a hybrid search's passages share (``expand.shared_budget``; ``None`` asked: the
        language's, ``language.prompt_tokens``; 0 or none: every passage may take the whole budget).
        BM25 or dense alone keep fixed passages."""
        self._embedder = embedder
        self._store_arg = store
        self.overlap_lexical = overlap_lexical
        """Hybrid on SQLite: BM25 in a second thread while this one embeds (one query's
        latency); off where callers already fill the cores with queries of their own (a
        server), to spare each query two thread hand-offs."""
        self._executor: ThreadPoolExecutor | None = None
        self._lexical_db: VectorStore | None = None
        self._scale = open_scale_search(self.db.kind, self.db.path, int(self.meta.get("dim", "0") or 0))
        counts = self._scale.counts if self._scale is not None else None  # a lookup at scale
        self._windows = window_scorer(
            self.db, self.meta, self.out, self._passages.read_record, bm25_window, counts
        )
        """BM25 over each chunk with its neighbours (``pipeline.index.windows``): the CJK
        analyzer's default; ``bm25_window`` 0 ranks each chunk alone."""
        hint = rebuild_hint(str(out), str(store) if store else None, None)
        require(self.db.analyzer, default_analyzer(self.db), where=str(self.db.path), hint=hint)
        wanted: dict[str, str] = {"analyzer": self.db.analyzer}
        if embedder is not None and not isinstance(embedder, str):
            from pipeline.index.identity import embedder_config

            wanted.update(embedder_config(embedder))
        elif isinstance(embedder, str):
            wanted.update(self._config_of(embedder))
        check_compatible(self.meta, wanted, where=str(self.db.path), hint=hint)

    def _config_of(self, spec: str) -> dict[str, str]:
        from pipeline.index.identity import embedder_config

        self._embedder = self._make(spec)
        return embedder_config(self._embedder)

    @staticmethod
    def _make(spec: str) -> Any:
        from pipeline.index.embedders import make_embedder

        return make_embedder(spec)

    def use_meta(self, meta: dict[str, str]) -> None:
        """Answer as the index whose meta is ``meta`` (a server passes the one it read before each
        query, so that a commit's identity and weights reach its next answer): the records'
        identity, and ``weights``."""
        self.meta = meta
        self.weights = self._asked_weights or hybrid_weights(meta)
        """Hybrid fusion: ``w_bm25 * z_bm25 + w_dense * z_dense`` (or, with ``fusion="rrf"``,
        ``w_bm25 / (rrf_k + rank) + w_dense / (rrf_k + rank)``): the ones asked, else the index's
        (``language.hybrid_weights``: a kept ``index --dense-weight``, else the language's, so
        that a weak dense side never drags BM25 down)."""

    @property
    def embedder(self) -> Any:
        if self._embedder is None or isinstance(self._embedder, str):
            self._embedder = self._make(self._embedder or self.meta.get("embed_spec") or "default")
        return self._embedder

    def close(self) -> None:
        if self._windows is not None:
            self._windows.close()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        if self._lexical_db is not None:
            self._lexical_db.close()
        if self._scale is not None:
            self._scale.close()
        self.db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __call__(self, query: str, mode: str = "hybrid", k: int = 10) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.record(query, k, mode)["items"]
        return items

    def record(
        self, query: str, k: int = 10, mode: str = "hybrid", expand_tokens: int | None = None
    ) -> dict[str, Any]:
        """004's retrieval result record for ``query``: the best ``k`` passages by ``mode``
        (chunks when ``expand_tokens`` is 0; ``None``: the searcher's own setting)."""
        budget = self.expand_tokens if expand_tokens is None else expand_tokens
        if mode not in MODES:
            raise UsageError(f"unknown search mode {mode!r} (hint: one of {', '.join(MODES)})")
        if k < 1:
            raise UsageError(f"k must be at least 1, got {k}")
        warnings: list[str] = []
        ranked: list[Candidate] = []
        pool = max(k, FUSE_DEPTH) if budget else k
        if not query.strip():
            warnings.append("empty query: nothing to search for")
        else:
            ranked = self._rank(query, mode, pool, warnings)
        rows = self._payloads(ranked, pool, mode)
        items = [
            self._item(rows[cid], score, features, k_pos, mode)
            for cid, score, features, k_pos in ranked
            if cid in rows
        ]
        items.sort(key=lambda it: (-it["score_norm"], it["section_id"], it["snippet_id"]))
        items = items[:pool]
        if budget:
            ids = {row.id: cid for cid, row in rows.items()}
            prompt = self.prompt if mode == "hybrid" else None
            items = self._passages.merge(items, budget, warnings, ids, limit=k, prompt=prompt)  # the first k
        items = items[:k]
        for final, item in enumerate(items, 1):
            item["k_final"] = final
        return {
            "schema_version": SCHEMA_VERSION,
            "event": "retrieve.run",
            "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "trace_id": str(uuid.uuid4()),
            "agent_id": "retriever",
            "mem_rev": f"r{self.meta.get('generation', '0')}",
            "mem_hash": self.meta.get("index_hash", ""),
            "q_id": "q_" + blake3.blake3(query.encode("utf-8")).hexdigest()[:16],
            "query": query,
            "ranker": mode,
            "k": k,
            "index_hash": self.meta.get("index_hash", ""),
            "embed_model": self.meta.get("embed_model", ""),
            "analyzer": self.meta.get("analyzer", self.db.analyzer),
            "store": self.db.kind,
            "warnings": warnings,
            "expand_tokens": budget,
            **({"weights": {"bm25": self.weights[0], "dense": self.weights[1]}} if mode == "hybrid" else {}),
            "items": items,
        }

    def _rank(self, query: str, mode: str, k: int, warnings: list[str]) -> list[Candidate]:
        """``(chunk_id, score_raw, features, k_pos)`` candidates, before the tie-break."""
        depth = max(k, FUSE_DEPTH) if mode == "hybrid" else k
        lexical_depth = max(depth, WINDOW_POOL) if self._windows is not None else depth
        bm25: list[tuple[str, float]] = []
        dense: list[tuple[str, float]] = []
        lexical: Future[tuple[list[tuple[str, float]], bool]] | None = None
        by_substring = False
        if mode == "hybrid" and self.db.kind == "sqlite-vec" and self.overlap_lexical:
            # BM25 on a second connection in a thread while this one embeds and runs the KNN:
            # SQLite, onnxruntime and numpy all release the GIL, so the two overlap on 2 cores
            lexical = self._pool().submit(self._lexical, self._second_db(), query, lexical_depth)
        elif mode in ("hybrid", "bm25"):
            bm25, by_substring = self._lexical(self.db, query, lexical_depth)
        if mode in ("hybrid", "dense"):
            vector = getattr(self.embedder, "embed_query", self.embedder.embed)([query])[0]
            scaled = self._scale.dense(vector, depth) if self._scale is not None else None
            dense = self.db.dense(vector, depth) if scaled is None else scaled
        if lexical is not None:
            bm25, by_substring = lexical.result()
        if self._windows is not None and bm25 and not by_substring:
            files = {cid: row.file for cid, row in self.db.rows([cid for cid, _ in bm25]).items()}
            bm25 = self._windows.rescore(query, bm25, files, self.db.meta().get("generation", ""), depth)
        if self._scale is not None:
            warnings.extend(self._scale.warnings())
        if by_substring:
            warnings.append("no BM25 term matched: chunks containing the query's text instead")
        return fuse(bm25, dense, mode, self.weights, self.fusion, self.rrf_k)

    def _score_norm(self, score: float, mode: str) -> float:
        return score_norm(score, mode, self.rrf_k, sum(self.weights), self.fusion)

    def _payloads(self, ranked: list[Candidate], k: int, mode: str) -> dict[str, ChunkRow]:
        """The stored rows of the candidates that can make the first ``k``: those whose
        ``score_norm`` reaches the k-th best (the tie-break needs their ``section_id``); the
        others too only if some of those are gone (another run deleted them meanwhile)."""
        if len(ranked) <= k:
            return self.db.rows([cid for cid, *_ in ranked])
        floor = sorted((self._score_norm(score, mode) for _, score, _, _ in ranked), reverse=True)[k - 1]
        first = [cid for cid, score, _, _ in ranked if self._score_norm(score, mode) >= floor]
        rows = self.db.rows(first)
        if len(rows) < len(first):
            rows = self.db.rows([cid for cid, *_ in ranked])
        return rows

    def _lexical(self, db: VectorStore, query: str, depth: int) -> tuple[list[tuple[str, float]], bool]:
        """BM25 hits (the scale index's while it is current), else chunks containing the
        query's text (then ``True``: say so). The query is analyzed by the index's analyzer."""
        analysis = require(
            db.analyzer, default_analyzer(db), where=str(db.path), hint="chunkyard index --rebuild"
        )
        terms = analysis.query_terms(query)
        scaled = self._scale.lexical(terms, depth) if self._scale is not None else None
        hits = db.lexical(terms, depth) if scaled is None else scaled
        if hits:
            return hits, False
        needle = " ".join(query.split())[:MAX_NEEDLE]
        if db.kind == "sqlite-vec" and db.analyzer == ANALYZER and substring_ruled_out(needle, terms):
            return [], False  # no chunk can hold it: no scan of every row's text
        hits = db.substring(needle, depth)
        return hits, bool(hits)

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chunkyard-bm25")
        return self._executor

    def _second_db(self) -> VectorStore:
        if self._lexical_db is None:
            self._lexical_db = open_store(self.out, self._store_arg)
        return self._lexical_db

    def _item(
        self, row: ChunkRow, score: float, features: Mapping[str, float | None], k_pos: int, mode: str
    ) -> dict[str, Any]:
        return {
            "chunk_id": row.chunk_id,
            "doc_id": row.doc_id,
            "section_id": row.section_id,
            "snippet_id": row.chunk_id,
            "source_url": row.source_url,
            "offsets": {"start": row.start, "end": row.end, "unit": "char"},
            "tokens": row.tokens,
            "index_hash": self.meta.get("index_hash", ""),
            "embed_model": self.meta.get("embed_model", ""),
            "analyzer": row.analyzer,
            "rev": row.rev,
            "score": self._score_norm(score, mode),
            "score_raw": score,
            "score_norm": self._score_norm(score, mode),
            "k_pos": k_pos,
            "k_final": 0,
            "source": mode,
            "features": dict(features),
            "file": row.source_file,
            "chunk_file": row.file,
            "lineSpan": {"lineStart": row.line_start, "lineEnd": row.line_end},
            "title": row.title,
            "breadcrumb": row.breadcrumb,
            "text": row.text,
        }


def search(
    out: Path | str,
    query: str,
    k: int = 10,
    mode: str = "hybrid",
    store: str | Path | None = None,
    embedder: Any = None,
    expand_tokens: int | None = None,
    dense_weight: float | None = None,
) -> dict[str, Any]:
    """One query against the index of the chunk folder ``out``: 004's retrieval result record,
    items merged into passages of at most ``expand_tokens`` tokens (0: plain chunks; ``None``:
    the index language's budget, ``language.passage_budget``); in hybrid mode the dense list
    weighs ``dense_weight`` against BM25's 1 (``None``: the index's, ``language.hybrid_weights``).

    Raises:
        UsageError: no index, an unknown mode, ``k`` < 1.
        IndexMismatchError: ``embedder`` (or this chunkyard's analyzer) differs from the index's.
    """
    weights = None if dense_weight is None else (1.0, dense_weight)
    with Searcher(out, store, embedder, expand_tokens=expand_tokens, weights=weights) as searcher:
        return searcher.record(query, k, mode)


def live_index_hash(out: Path | str, store: str | Path | None = None) -> str | None:
    """The live index's ``index_hash`` (for ``check-citations``), ``None`` when there is no index."""
    _, path = store_spec(Path(out), store)
    if not path.exists():
        return None
    db = open_store(Path(out), store)
    try:
        return db.meta().get("index_hash") or None
    finally:
        db.close()


__all__: Sequence[str] = (
    "FUSIONS",
    "MERGE_DEPTH",
    "MISSING_Z",
    "MODES",
    "Searcher",
    "live_index_hash",
    "score_norm",
    "search",
    "zscores",
)
