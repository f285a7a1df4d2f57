"""``chunkyard search``: BM25, dense, or both fused by z-score, with citations.

The answer is 004's retrieval result record (``schemas/search.schema.json``): the
envelope, ``q_id``, ``ranker``, ``k`` and ``items``; every item carries 001's citation
payload, its ``features`` {bm25, dense} and the text. Order is deterministic: score_norm
descending, then ``section_id``, then ``snippet_id`` (001 rule 5).

Hybrid fusion (issue 17): each ranker's list (``FUSE_DEPTH`` deep) is turned into z-scores
(its score minus the list's mean, over the list's standard deviation), a chunk missing from
one list counts ``MISSING_Z`` (-3) there, and the fused score is the weighted sum (equal
weights). Unlike reciprocal rank fusion it keeps how far a hit stands out: a chunk far
ahead in one list is not overtaken by chunks that are middling in both. Measured on the
three gold sets of ``bench/gold`` against RRF (k = 60), same index, same passages:
+3.1 / +0.9 / +2.0 nDCG@10 alone, +3.6 / +1.9 / +2.9 with the query's words as BM25 terms
(Rust book, FastAPI, PowerShell; ``docs/benchmarks.md``).
``fusion="rrf"`` keeps reciprocal rank fusion (``rrf_k``).

Scores: ``score_raw`` is the ranker's own (BM25 positive, higher is better; cosine
similarity; the fused z-score sum, or the RRF sum); ``score_norm`` maps it into [0, 1]
without looking at the other hits (BM25 s/(1+s), cosine (1+c)/2, the logistic function of
the z-score sum over the weights' sum, RRF divided by its maximum 2/61), so it never makes
ties that the raw scores did not have.

Passages (issue 17): by default each hit is merged with the neighbours of its document that
the search ranked in its first ``MERGE_DEPTH`` (30), across headings
(``passage_scope="document"``; ``"section"`` keeps a passage inside the hit's section),
the better-ranked neighbour first, up to ``expand_tokens`` (768) tokens of text, into one
item: one citation span (``offsets`` cover the passage, ``text`` is exactly that slice of
the source, ``chunk_ids`` lists the merged chunks, hit first, ``tokens`` counts the
passage). The merge looks at a pool of at least ``FUSE_DEPTH`` ranked chunks, then the best
``k`` passages are returned, so ``-k 5`` gives the first five of ``-k 50``'s. A document whose source changed
since it was chunked is not merged (its hits stay chunks; a warning names it).
``expand_tokens=0`` (``--no-expand``) returns plain chunks.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Self

import blake3

from pipeline.errors import PipelineError, UsageError
from pipeline.index.expand import DEFAULT_BUDGET, SCOPES, ChunkFiles, ChunkSpan, expand
from pipeline.index.identity import check_compatible, rebuild_hint
from pipeline.index.language import hybrid_weights, require
from pipeline.index.store import ChunkRow, VectorStore, analyzer_of, open_store, store_spec

MODES = ("hybrid", "dense", "bm25")
#: Hybrid fusion: ``zscore`` (the default) or ``rrf`` (reciprocal rank, ``RRF_K``).
FUSIONS = ("zscore", "rrf")
RRF_K = 60
#: A chunk missing from one ranker's list counts this z-score there (below almost all it holds).
MISSING_Z = -3.0
#: Each ranker's list in hybrid mode is this deep (or k, when k is larger).
FUSE_DEPTH = 50
SCHEMA_VERSION = "1.0.0"
#: A passage grows only into neighbours ranked this high in the pool (hits ranked lower stay
#: chunks): 25-35 are equally good on the gold sets; the whole pool of 50 spends the prompt's
#: budget on text ranked 40th (docs/benchmarks.md).
MERGE_DEPTH = 30
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
        expand_tokens: int = DEFAULT_BUDGET,
        corpus: Path | None = None,
        rrf_k: int = RRF_K,
        weights: tuple[float, float] | None = None,
        fusion: str = "zscore",
        passage_scope: str = "document",
    ) -> None:
        if expand_tokens < 0:
            raise UsageError(f"expand_tokens must be 0 (off) or more, got {expand_tokens}")
        if fusion not in FUSIONS:
            raise UsageError(f"unknown fusion {fusion!r} (hint: one of {', '.join(FUSIONS)})")
        if passage_scope not in SCOPES:
            raise UsageError(f"unknown passage scope {passage_scope!r} (hint: one of {', '.join(SCOPES)})")
        self.out = Path(out)
        self.expand_tokens = expand_tokens
        self.passage_scope = passage_scope
        self.fusion = fusion
        self.rrf_k = rrf_k
        self.weights = weights or (1.0, 1.0)
        """Hybrid fusion: ``w_bm25 * z_bm25 + w_dense * z_dense`` (or, with ``fusion="rrf"``,
        ``w_bm25 / (rrf_k + rank) + w_dense / (rrf_k + rank)``; the bench tunes them)."""
        self._corpus = corpus
        self._store: Any = False  # the chunk folder's store, opened on the first passage
        self._texts: dict[str, tuple[tuple[int, int] | None, str | None]] = {}
        self._counter: Callable[[str], int] | None = None
        self.db: VectorStore = open_store(self.out, store)
        self.meta = self.db.meta()
        if not self.meta.get("embed_model"):
            self.db.close()
            raise UsageError(f"{self.db.path}: the index is empty (hint: `chunkyard index --out {out}`)")
        if weights is None:  # the language's: a weak dense side never drags BM25 down
            self.weights = hybrid_weights(self.meta)
        self._embedder = embedder
        self._store_arg = store
        self._executor: ThreadPoolExecutor | None = None
        self._lexical_db: VectorStore | None = None
        hint = rebuild_hint(str(out), str(store) if store else None, None)
        require(self.db.analyzer, analyzer_of(self.db.kind), where=str(self.db.path), hint=hint)
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

    @property
    def embedder(self) -> Any:
        if self._embedder is None or isinstance(self._embedder, str):
            self._embedder = self._make(self._embedder or self.meta.get("embed_spec") or "default")
        return self._embedder

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        if self._lexical_db is not None:
            self._lexical_db.close()
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
        ranked: list[tuple[str, float, dict[str, float | None], int]] = []
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
            items = self._merge(items, budget, warnings, {row.id: cid for cid, row in rows.items()})
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
            "items": items,
        }

    def _chunk_store(self) -> Any:
        """The chunk folder's store (``pipeline.audit.store``), opened once; ``None`` when it cannot be."""
        if self._store is False:
            from pipeline.audit.store import open_store

            try:
                self._store = open_store(self.out, self._corpus)
            except PipelineError:
                self._store = None
        return self._store

    def _source_text(self, rel: str) -> str | None:
        """The current canonical text of the source ``rel`` (``None`` when it cannot be read).

        Kept across queries while the file's (mtime, size) stay the same: a long-lived
        searcher (eval, a bench) normalizes each source once, and never merges from a copy
        older than the file."""
        store = self._chunk_store()
        if store is None:
            return None
        try:
            st = (store.corpus / rel).stat()
            stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = None
        kept = self._texts.get(rel)
        if kept is None or kept[0] != stamp or stamp is None:
            doc = store.source(rel) if stamp is not None else None
            kept = (stamp, doc.text if doc is not None else None)
            self._texts[rel] = kept
        return kept[1]

    def _merge(
        self, items: list[dict[str, Any]], budget: int, warnings: list[str], ids: Mapping[str, str]
    ) -> list[dict[str, Any]]:
        """``items`` (best first) merged into passages (``pipeline.index.expand``, ranked neighbours
        only, within ``passage_scope``).

        A hit whose source no longer holds its text at its offsets (edited since ingest, or
        gone) is kept as a chunk, with a warning: a passage is read from the source.
        """
        files = ChunkFiles(self.out, ids)  # ids: a ranked neighbour's chunk id without its file
        stale: set[str] = set()
        for item in items:
            files.remember(item["chunk_id"], item["chunk_file"])
            text = self._source_text(item["file"])
            start, end = item["offsets"]["start"], item["offsets"]["end"]
            if text is None or text[start:end] != item["text"]:
                stale.add(item["file"])
        for rel in sorted(stale):
            warnings.append(
                f"{rel}: the source changed since it was chunked; its hits are not merged "
                f"(hint: chunkyard ingest, then chunkyard index --out {self.out})"
            )

        def lookup(chunk_id: str) -> ChunkSpan | None:
            span = files(chunk_id)
            return None if span is None or span.source in stale else span

        def text_of(source: str, start: int, end: int) -> str:
            return (self._source_text(source) or "")[start:end]

        merged = expand(
            items,
            lookup,
            budget,
            text_of=text_of,
            ranked_only=True,
            count=self._count,
            scope=self.passage_scope,
            depth=MERGE_DEPTH,
        )
        for item in merged:
            item.setdefault("chunk_ids", [item["chunk_id"]])
        return merged

    @property
    def _count(self) -> Callable[[str], int]:
        """The chunks' token counter (the policy's tokenizer, cl100k by default), made once."""
        if self._counter is None:
            from pipeline.stages.tokens import Counter

            store = self._chunk_store()
            policy = (store.manifest.get("policy") or {}) if store is not None else {}
            self._counter = Counter(str(policy.get("tokenizer") or "cl100k_base")).count
        return self._counter

    def _rank(
        self, query: str, mode: str, k: int, warnings: list[str]
    ) -> list[tuple[str, float, dict[str, float | None], int]]:
        """``(chunk_id, score_raw, features, k_pos)`` candidates, before the tie-break."""
        depth = max(k, FUSE_DEPTH) if mode == "hybrid" else k
        bm25: list[tuple[str, float]] = []
        dense: list[tuple[str, float]] = []
        lexical: Future[tuple[list[tuple[str, float]], bool]] | None = None
        by_substring = False
        if mode == "hybrid" and self.db.kind == "sqlite-vec":
            # BM25 on a second connection in a thread while this one embeds and runs the KNN:
            # SQLite, onnxruntime and numpy all release the GIL, so the two overlap on 2 cores
            lexical = self._pool().submit(self._lexical, self._second_db(), query, depth)
        elif mode in ("hybrid", "bm25"):
            bm25, by_substring = self._lexical(self.db, query, depth)
        if mode in ("hybrid", "dense"):
            vector = getattr(self.embedder, "embed_query", self.embedder.embed)([query])[0]
            dense = self.db.dense(vector, depth)
        if lexical is not None:
            bm25, by_substring = lexical.result()
        if by_substring:
            warnings.append("no BM25 term matched: chunks containing the query's text instead")
        lex = {cid: (rank, score) for rank, (cid, score) in enumerate(bm25, 1)}
        vec = {cid: (rank, score) for rank, (cid, score) in enumerate(dense, 1)}
        z_lex, z_vec = zscores(bm25), zscores(dense)
        out: list[tuple[str, float, dict[str, float | None], int]] = []
        for cid in sorted(lex.keys() | vec.keys()):
            features = {
                "bm25": lex[cid][1] if cid in lex else None,
                "dense": vec[cid][1] if cid in vec else None,
            }
            if mode == "bm25":
                out.append((cid, lex[cid][1], features, lex[cid][0]))
            elif mode == "dense":
                out.append((cid, vec[cid][1], features, vec[cid][0]))
            else:
                pairs = [
                    (w, p[0]) for w, p in zip(self.weights, (lex.get(cid), vec.get(cid)), strict=True) if p
                ]
                if self.fusion == "rrf":
                    fused = sum(w / (self.rrf_k + r) for w, r in pairs)
                else:
                    w_lex, w_vec = self.weights
                    fused = w_lex * z_lex.get(cid, MISSING_Z) + w_vec * z_vec.get(cid, MISSING_Z)
                out.append((cid, fused, features, min(r for _, r in pairs)))
        return out

    def _normalize(self, score: float, mode: str) -> float:
        return normalize(score, mode, self.rrf_k, sum(self.weights), self.fusion)

    def _payloads(
        self, ranked: list[tuple[str, float, dict[str, float | None], int]], k: int, mode: str
    ) -> dict[str, ChunkRow]:
        """The stored rows of the candidates that can make the first ``k``: those whose
        ``score_norm`` reaches the k-th best (the tie-break needs their ``section_id``); the
        others too only if some of those are gone (another run deleted them meanwhile)."""
        if len(ranked) <= k:
            return self.db.rows([cid for cid, *_ in ranked])
        floor = sorted((self._normalize(score, mode) for _, score, _, _ in ranked), reverse=True)[k - 1]
        first = [cid for cid, score, _, _ in ranked if self._normalize(score, mode) >= floor]
        rows = self.db.rows(first)
        if len(rows) < len(first):
            rows = self.db.rows([cid for cid, *_ in ranked])
        return rows

    @staticmethod
    def _lexical(db: VectorStore, query: str, depth: int) -> tuple[list[tuple[str, float]], bool]:
        """BM25 hits, else chunks containing the query's text (then ``True``: say so)."""
        terms = require(
            db.analyzer, analyzer_of(db.kind), where=str(db.path), hint="chunkyard index --rebuild"
        )
        hits = db.lexical(terms.query_terms(query), depth)
        if hits:
            return hits, False
        hits = db.substring(" ".join(query.split())[:MAX_NEEDLE], depth)
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
            "score": self._normalize(score, mode),
            "score_raw": score,
            "score_norm": self._normalize(score, mode),
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


def normalize(
    score: float, mode: str, rrf_k: int = RRF_K, weight_sum: float = 2.0, fusion: str = "zscore"
) -> float:
    """``score_norm`` in [0, 1] from the raw score alone (see the module docstring): a z-score
    sum through the logistic function (over ``weight_sum``), an RRF sum divided by its maximum,
    ``weight_sum / (rrf_k + 1)``."""
    if mode == "bm25":
        return score / (1.0 + score) if score > 0 else 0.0
    if mode == "dense":
        return min(1.0, max(0.0, (1.0 + score) / 2.0))
    if fusion == "rrf":
        return min(1.0, score / (weight_sum / (rrf_k + 1)))
    return 1.0 / (1.0 + math.exp(-score / (weight_sum or 1.0)))


def zscores(ranked: Sequence[tuple[str, float]]) -> dict[str, float]:
    """Each chunk's score in one ranker's list as a z-score within that list (0 for all when
    the scores are all equal)."""
    if not ranked:
        return {}
    scores = [score for _, score in ranked]
    mean = sum(scores) / len(scores)
    sd = math.sqrt(sum((x - mean) ** 2 for x in scores) / len(scores))
    return {cid: (score - mean) / sd if sd > 0 else 0.0 for cid, score in ranked}


def search(
    out: Path | str,
    query: str,
    k: int = 10,
    mode: str = "hybrid",
    store: str | Path | None = None,
    embedder: Any = None,
    expand_tokens: int = DEFAULT_BUDGET,
) -> dict[str, Any]:
    """One query against the index of the chunk folder ``out``: 004's retrieval result record,
    items merged into passages of at most ``expand_tokens`` tokens (0: plain chunks).

    Raises:
        UsageError: no index, an unknown mode, ``k`` < 1.
        IndexMismatchError: ``embedder`` (or this chunkyard's analyzer) differs from the index's.
    """
    with Searcher(out, store, embedder, expand_tokens=expand_tokens) as searcher:
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


__all__: Sequence[str] = ("FUSIONS", "MODES", "Searcher", "live_index_hash", "normalize", "search", "zscores")
