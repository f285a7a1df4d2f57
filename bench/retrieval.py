"""``make bench-retrieval``: chunkyard's chunks against its peers', same retriever, same relevance rule.

    python bench/retrieval.py [--corpora rust-book,fastapi-en,powershell-docs,d2l-zh,fastapi-zh-ja]
        [--chunkers a,b] [--k 50] [--embedder e5] [--lang cjk|jieba|words]

For each corpus with a gold set in ``bench/gold/<corpus>.jsonl``: every chunker of
``retrieval_peers`` chunks the corpus, one retriever indexes each chunk list, every
question is asked in every mode, and ``pipeline.evaluate`` scores the rankings (a hit is
a chunk of the answer's file covering ≥ 50 % of its span). One table per corpus, then
the paired view against chunkyard: per question, which chunker found the answer earlier
(a single recall over 70 questions moves ±12 points by chance; the paired count says
whether the difference is the same questions or noise). Results go to
``bench/results/retrieval-<corpus>.json``.

**The seam.** ``evaluate_chunkers(gold, chunk_sets, retriever)`` takes chunk lists and a
``Retriever``: a callable that indexes a chunk list and returns a ``Search`` (``modes``,
and ``search(query, mode, k)`` → ranked items). ``MemoryRetriever`` is the stand-in used
here: Okapi BM25 (k1 = 1.2, b = 0.75, SQLite FTS5's defaults) over the text each chunker
would embed, dense cosine when an embedder is available (issue 16's
``pipeline.index.embedders.make_embedder``; without it only ``bm25`` runs), and hybrid =
reciprocal rank fusion (k = 60) of the two top-50 lists, as ``chunkyard search`` did before
issue 17's z-score fusion (the ``<set>+zscore`` variant fuses a peer's lists as ``search`` now does).
Ties: score desc, then chunk id asc.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from pipeline.errors import PipelineError
from pipeline.evaluate.chunks import EvalChunk
from pipeline.evaluate.gold import GoldQuestion, load_gold
from pipeline.evaluate.metrics import ModeReport, evaluate_run
from pipeline.stages.tokens import Counter as TokenCounter

CORPORA = REPO.parent / "shared" / "corpora"
GOLD = HERE / "gold"
RESULTS = HERE / "results"
DEFAULT_CORPORA = "rust-book,fastapi-en,powershell-docs,eips,d2l-zh,fastapi-zh-ja,fastapi-zh"
#: The CJK sets' cut (``--max-bytes`` overrides; others 1.6 MB): the documents the questions cite
#: plus distractors, as measured for issue 33 (embedding CJK text is slow on a shared small CPU).
MAX_BYTES = {"d2l-zh": 1_200_000, "fastapi-zh-ja": 700_000, "fastapi-zh": 700_000}
#: Sets whose stand-in BM25 cuts CJK text into bigrams (``--lang`` overrides).
CJK_CORPORA = {"d2l-zh": "cjk", "fastapi-zh-ja": "cjk", "fastapi-zh": "cjk"}
RRF_K = 60
POOL = 50
COLUMNS = ("recall@1", "recall@5", "recall@10", "MRR@10", "nDCG@10", "recall@1000tok", "recall@2000tok")


class Search(Protocol):
    """An index over one chunk list."""

    modes: tuple[str, ...]

    def __call__(self, query: str, mode: str, k: int) -> list[dict[str, Any]]:
        """The ``k`` best chunks for ``query`` in ``mode``, as retrieved items (best first)."""
        ...


Retriever = Callable[[Sequence[EvalChunk]], Search]
Embed = Callable[[Sequence[str]], Any]  #: texts → an (n, dim) array of L2-normalised rows

_WORD = re.compile(r"\w+", re.UNICODE)


def words(text: str) -> list[str]:
    """The BM25 analyzer: lower-cased Unicode word characters."""
    return _WORD.findall(text.lower())


def cjk_words(text: str) -> list[str]:
    """The BM25 analyzer for CJK corpora (``--lang``): ``words`` with every run of CJK characters
    cut into its overlapping bigrams, as chunkyard's CJK analyzer cuts it (``pipeline.index.cjk``),
    so that every chunker's chunks are searched as chunkyard's are."""
    from pipeline.index.cjk import analyze

    return _WORD.findall(analyze(text.lower()))


def jieba_words(text: str) -> list[str]:
    """The BM25 analyzer with a Chinese word segmenter (``--lang jieba``; ``pip install jieba``):
    jieba's search-engine mode cuts the text into words and their sub-words."""
    import logging

    import jieba

    jieba.setLogLevel(logging.WARNING)
    return [w for w in (w.strip() for w in jieba.cut_for_search(text.lower())) if w and _WORD.fullmatch(w)]


ANALYZERS = {"": words, "words": words, "cjk": cjk_words, "jieba": jieba_words}


class MemoryRetriever:
    """BM25 + optional dense + RRF over one chunk list, in memory (the bench's stand-in for issue 16)."""

    def __init__(
        self, chunks: Sequence[EvalChunk], embed: Embed | None = None, fusion: str = "rrf",
        analyzer: Callable[[str], list[str]] = words,
    ) -> None:
        self.chunks = list(chunks)
        self.words = analyzer
        self.fusion = fusion  #: hybrid: ``rrf`` (k = 60) or ``zscore`` (chunkyard search's default since issue 17)
        self.postings: dict[str, list[tuple[int, int]]] = defaultdict(list)
        self.lengths = []
        for i, chunk in enumerate(self.chunks):
            terms = self.words(chunk.embed)
            self.lengths.append(len(terms))
            for term, tf in Counter(terms).items():
                self.postings[term].append((i, tf))
        self.avgdl = sum(self.lengths) / max(1, len(self.lengths))
        self.embed = embed
        self.vectors = embed([c.embed for c in self.chunks]) if embed and self.chunks else None
        self.modes: tuple[str, ...] = ("bm25", "dense", "hybrid") if embed else ("bm25",)

    def bm25(self, query: str, k1: float = 1.2, b: float = 0.75) -> list[tuple[int, float]]:
        n = len(self.chunks)
        scores: dict[int, float] = defaultdict(float)
        for term in set(self.words(query)):
            posting = self.postings.get(term, [])
            idf = math.log((n - len(posting) + 0.5) / (len(posting) + 0.5) + 1.0)
            for i, tf in posting:
                norm = k1 * (1.0 - b + b * self.lengths[i] / self.avgdl)
                scores[i] += idf * tf * (k1 + 1.0) / (tf + norm)
        return self._top(scores.items())

    def dense(self, query: str) -> list[tuple[int, float]]:
        assert self.embed is not None and self.vectors is not None
        sims = self.vectors @ getattr(self.embed, "embed_query", self.embed)([query])[0]
        return self._top(enumerate(sims.tolist()))

    def _top(self, scored: Any, limit: int = POOL) -> list[tuple[int, float]]:
        ranked = sorted(scored, key=lambda p: (-p[1], self.chunks[p[0]].chunk_id))
        return ranked[: max(limit, POOL)]

    def __call__(self, query: str, mode: str, k: int) -> list[dict[str, Any]]:
        if mode == "bm25":
            ranked = self.bm25(query)
        elif mode == "dense":
            ranked = self.dense(query)
        elif self.fusion == "zscore":  # as pipeline.index.query: z-scores per list, a missing chunk MISSING_Z
            from pipeline.index.query import MISSING_Z, zscores

            lists = [zscores([(str(i), s) for i, s in ranking[:POOL]]) for ranking in (self.bm25(query), self.dense(query))]
            ids = {int(i) for z in lists for i in z}
            ranked = self._top((i, sum(z.get(str(i), MISSING_Z) for z in lists)) for i in ids)
        else:
            fused: dict[int, float] = defaultdict(float)
            for ranking in (self.bm25(query), self.dense(query)):
                for r, (i, _) in enumerate(ranking[:POOL], 1):
                    fused[i] += 1.0 / (RRF_K + r)
            ranked = self._top(fused.items())
        return [{**self.chunks[i].as_item(), "score": s} for i, s in ranked[:k]]


def default_embedder(cache: Path | None = None, spec: str | None = None) -> Embed | None:
    """Issue 16's default embedder (all-MiniLM-L6-v2 int8 ONNX), or the one ``spec`` names
    (``--embedder e5``), behind the on-disk cache (``embed_cache``), when its extra is
    installed; else None (BM25 only)."""
    try:
        from pipeline.index.embedders import make_embedder

        model = make_embedder(spec)
        model.embed(["warm up"])  # a missing package shows here, not after the first chunker
    except (ImportError, PipelineError) as exc:  # the extra is missing: BM25 only
        print(f"  dense/hybrid skipped: no embedder ({exc})", file=sys.stderr)
        return None
    from embed_cache import CachedEmbed

    return CachedEmbed(model, cache or RESULTS / "embed-cache.sqlite")


def corpus_of(gold_path: Path) -> str:
    """The corpus a gold set asks: its ``# corpus: NAME`` first line, else its file name."""
    first = gold_path.read_text(encoding="utf-8").split("\n", 1)[0]
    return first.removeprefix("# corpus:").split()[0] if first.startswith("# corpus:") else gold_path.stem


def bench_corpus(corpus: Path, gold_path: Path, max_bytes: int, scratch: Path) -> Path:
    """``corpus`` itself, or when its Markdown weighs more than ``max_bytes``, a copy of a part of it:
    every document the gold set cites, then the others in a fixed pseudo-random order
    (sha256 of the path) while they fit. Embedding 10 MB per chunker is hours on this CPU;
    the distractors keep the search as hard as a corpus of that size."""
    import hashlib
    import shutil

    from retrieval_peers import markdown_files

    files = markdown_files(corpus)
    sizes = {rel: (corpus / rel).stat().st_size for rel in files}
    if sum(sizes.values()) <= max_bytes:
        return corpus
    cited = {json.loads(line)["source"] for line in gold_path.read_text().splitlines()
             if line.strip() and not line.startswith("#")}
    chosen, used = [], 0
    for rel in sorted(files, key=lambda r: (r not in cited, hashlib.sha256(r.encode()).hexdigest())):
        if rel in cited or used + sizes[rel] <= max_bytes:
            chosen.append(rel)
            used += sizes[rel]
    root = scratch / f"{gold_path.stem}-{max_bytes // 1000}k"
    if not root.is_dir() or sorted(markdown_files(root)) != sorted(chosen):
        shutil.rmtree(root, ignore_errors=True)
        for rel in chosen:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(corpus / rel, root / rel)
    print(f"  {gold_path.stem}: {len(chosen)} of {len(files)} documents, {used / 1e6:.1f} of "
          f"{sum(sizes.values()) / 1e6:.1f} MB (--max-bytes {max_bytes})", file=sys.stderr)
    return root


def evaluate_chunkers(
    gold: Sequence[GoldQuestion],
    chunk_sets: Mapping[str, Sequence[EvalChunk]],
    retriever: Retriever,
    k: int = POOL,
    variants: Callable[[Mapping[str, Search]], Mapping[str, tuple[str, Callable[[], Search]]]] | None = None,
) -> dict[str, dict[str, ModeReport]]:
    """Per chunker and mode: the gold set's scores on what ``retriever`` finds in that chunker's chunks;
    then per variant (``variants(built searches)`` → name → (base set, make search)) the same."""
    out: dict[str, dict[str, ModeReport]] = {}
    built: dict[str, Search] = {}

    def score(name: str, search: Search) -> None:
        out[name] = {}
        for mode in search.modes:
            run = {q.id: search(q.question, mode, k) for q in gold}
            out[name][mode] = evaluate_run(gold, run, mode=mode)

    for name, chunks in chunk_sets.items():
        built[name] = retriever(chunks)
        score(name, built[name])
    for name, (_, make) in (variants(built) if variants else {}).items():
        score(name, make())
    return out


def paired(a: ModeReport, b: ModeReport, budget: int = 2000) -> dict[str, int]:
    """Per question, does ``a`` find the answer earlier than ``b`` (rank of first hit; within budget)?"""
    wins = losses = ties = budget_wins = budget_losses = 0
    for qa, qb in zip(a.per_query, b.per_query, strict=True):
        ra, rb = qa.first_hit or 10**6, qb.first_hit or 10**6
        wins, losses, ties = wins + (ra < rb), losses + (ra > rb), ties + (ra == rb)
        ina, inb = qa.metrics()[f"recall@{budget}tok"], qb.metrics()[f"recall@{budget}tok"]
        budget_wins, budget_losses = budget_wins + (ina > inb), budget_losses + (ina < inb)
    return {"earlier": wins, "later": losses, "same": ties, "budget_wins": budget_wins,
            "budget_losses": budget_losses}


def table(corpus: str, results: Mapping[str, Mapping[str, ModeReport]], stats: Mapping[str, Any]) -> str:
    """The Markdown table of one corpus (percent), chunkers by hybrid nDCG@10 (or the first mode)."""
    modes = sorted({m for r in results.values() for m in r}, key=("hybrid", "dense", "bm25").index)
    head = modes[0]
    order = sorted(results, key=lambda n: -results[n][head].metrics["nDCG@10"])
    n = next(iter(next(iter(results.values())).values())).questions
    lines = [f"### {corpus} ({n} questions)", "",
             "| chunks from | chunks | mean tokens | mode | " + " | ".join(COLUMNS) + " |",
             "|---|---:|---:|---|" + "---:|" * len(COLUMNS)]
    for name in order:
        for mode in modes:
            m = results[name][mode].metrics
            cells = " | ".join(f"{100 * m[c]:.1f}" for c in COLUMNS)
            s = stats[name]
            lines.append(f"| {name} | {s['chunks']} | {s['mean_tokens']:.0f} | {mode} | {cells} |")
    return "\n".join(lines) + "\n"


def paired_table(results: Mapping[str, Mapping[str, ModeReport]], ours: str) -> str:
    """Wins and losses of ``ours`` against each other chunker, question by question, per mode."""
    if ours not in results:
        return ""
    lines = [(f"Paired, {ours} vs each: questions answered earlier / later / same rank; "
              "within 2,000 tokens: found only by us / only by them"), "",
             "| vs | mode | earlier | later | same | 2k: only us | 2k: only them |", "|---|---|---:|---:|---:|---:|---:|"]
    for name, reports in results.items():
        if name == ours:
            continue
        for mode, rep in reports.items():
            p = paired(results[ours][mode], rep)
            lines.append(f"| {name} | {mode} | {p['earlier']} | {p['later']} | {p['same']} | "
                         f"{p['budget_wins']} | {p['budget_losses']} |")
    return "\n".join(lines) + "\n"


def html_page(corpus: str, gold: Sequence[GoldQuestion], results: Mapping[str, Mapping[str, ModeReport]]) -> bytes:
    """The corpus's results as one HTML page (issue 20): a chart per metric across chunkers (the
    headline mode), then each question's first hit per chunker, misses marked."""
    from pipeline.view import render_eval

    modes = sorted({m for r in results.values() for m in r}, key=("hybrid", "dense", "bm25").index)
    head = modes[0]
    pack = {name: dict(res[head].metrics) for name, res in results.items()}
    rows = [
        {"id": g.id, "question": g.question, "source": g.source, "start": g.start, "end": g.end,
         "mode": name, "first_hit": scored.first_hit, "items": []}
        for name, res in results.items()
        for g, scored in zip(gold, res[head].per_query, strict=True)
    ]  # fmt: skip
    return render_eval(pack, rows, title=f"make bench-retrieval: {corpus} ({head})")


def chunk_stats(chunks: Sequence[EvalChunk]) -> dict[str, Any]:
    from pipeline.stages.tokens import Counter as TokenCounter

    count = TokenCounter("cl100k_base").count
    tokens = [c.tokens if c.tokens is not None else count(c.text) for c in chunks]
    return {"chunks": len(chunks), "mean_tokens": sum(tokens) / max(1, len(tokens))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpora", default=DEFAULT_CORPORA)
    ap.add_argument("--chunkers", default="", help="comma-separated subset (default: all); chunkyard-N, "
                    "chunkyard-wpN (wordpiece budget), chunkyard-N-original (no breadcrumb), or a peer")
    ap.add_argument("--variants", default="search,search+merge0",
                    help="search-side variants: search[+merge<B>|+expand<B>|+rrf<K>|+wd<W>|+section][@<set>] (chunkyard's own "
                    "index and search, default settings unless changed), <set>+merge<B> / <set>+expand<B> "
                    "(stand-in, hit + ranked / any same-section neighbours, B tokens), "
                    "<set>+multi<W> (several vectors per chunk, windows of W wordpieces)")
    ap.add_argument("--tag", default="", help="suffix of the result files (retrieval-<corpus><tag>.json)")
    ap.add_argument("--ours", default="search", help="the row the paired view compares with every other")
    ap.add_argument("--k", type=int, default=POOL, help="ranked items per question (enough to fill 2,000 tokens)")
    ap.add_argument("--no-dense", action="store_true", help="BM25 only, even when an embedder is available")
    ap.add_argument("--fusion", default="rrf", choices=("rrf", "zscore"),
                    help="the stand-in's hybrid fusion for every chunker (chunkyard search: zscore)")
    ap.add_argument("--embedder", default=None, help="embedder spec for every chunker (default: the default model)")
    ap.add_argument("--lang", default="", choices=("", "words", "cjk", "jieba"),
                    help="the stand-in's BM25 analyzer: cjk cuts CJK runs into bigrams, as chunkyard does for CJK "
                    "corpora; jieba segments Chinese words; words: \\w+ runs (default: cjk for d2l-zh and "
                    "fastapi-zh-ja, else words)")
    ap.add_argument("--max-bytes", type=int, default=None,
                    help="a larger corpus is cut to the gold set's documents plus others up to this size")
    args = ap.parse_args()

    from retrieval_peers import chunk_sets
    from retrieval_variants import variant_searches

    embed = None if args.no_dense else default_embedder(spec=args.embedder)
    RESULTS.mkdir(parents=True, exist_ok=True)
    scratch = RESULTS / "retrieval-chunks"
    report = []
    for corpus in args.corpora.split(","):
        gold_path = GOLD / f"{corpus}.jsonl"
        root = CORPORA / (corpus_of(gold_path) if gold_path.is_file() else corpus)
        if not root.is_dir() or not gold_path.is_file():
            print(f"{corpus}: skipped (no corpus at {root} or no gold set at {gold_path})", file=sys.stderr)
            continue
        max_bytes = args.max_bytes or MAX_BYTES.get(corpus, 1_600_000)
        # a run over another cut is another corpus to the summary (``retrieval_summary`` merges by name)
        label = corpus if max_bytes == MAX_BYTES.get(corpus, 1_600_000) else f"{corpus}@{max_bytes // 1000}k"
        root = bench_corpus(root, gold_path, max_bytes, RESULTS / "corpora")
        gold = load_gold(gold_path, root)
        started = time.perf_counter()
        sets, recovery, dirs = chunk_sets(root, scratch, [c for c in args.chunkers.split(",") if c] or None)
        names = [v for v in args.variants.split(",") if v]
        count = TokenCounter("cl100k_base").count
        made: dict[str, tuple[str, Callable[[], Search]]] = {}

        def variants(built: Mapping[str, Search], sets: Any = sets, dirs: Any = dirs, made: Any = made,
                     names: Any = names, count: Any = count) -> Mapping[str, tuple[str, Callable[[], Search]]]:
            made.update(variant_searches(names, built, sets, dirs, embed, count))
            return made  # type: ignore[no-any-return]

        analyzer = ANALYZERS[args.lang or CJK_CORPORA.get(corpus, "words")]
        results = evaluate_chunkers(
            gold, sets, lambda chunks, a=analyzer: MemoryRetriever(chunks, embed, args.fusion, a), args.k, variants
        )
        stats = {name: chunk_stats(chunks) for name, chunks in sets.items()}
        stats.update({name: stats[base] for name, (base, _) in made.items()})
        text = table(corpus, results, stats) + "\n" + paired_table(results, args.ours)
        text += "\nOffsets recovered by search (given / exact / whitespace-blind / anchors / lost): " + ", ".join(
            f"{n} {r['given']}/{r['exact']}/{r['spacing']}/{r['anchors']}/{r['lost']}" for n, r in recovery.items()
        ) + "\n"
        print(text)
        report.append(text)
        (RESULTS / f"retrieval-{corpus}{args.tag}.json").write_text(json.dumps({
            "corpus": label, "questions": len(gold), "seconds": round(time.perf_counter() - started, 1),
            "retriever": "MemoryRetriever (BM25 k1=1.2 b=0.75" + (", dense, RRF k=60)" if embed else ")"),
            "embedder": getattr(embed, "name", None), "analyzer": analyzer.__name__,
            "chunks": stats, "offset_recovery": recovery,
            "metrics": {n: {m: {"metrics": r.metrics, "strict": r.strict} for m, r in res.items()}
                        for n, res in results.items()},
            "per_query": {n: {m: [{"id": s.id, "first_hit": s.first_hit, "fits": dict(s.fits)} for s in r.per_query]
                              for m, r in res.items()} for n, res in results.items()},
        }, indent=1) + "\n")
        (RESULTS / f"retrieval-{corpus}{args.tag}.html").write_bytes(html_page(corpus, gold, results))
    (RESULTS / f"retrieval{args.tag}.md").write_text("\n".join(report))


if __name__ == "__main__":
    main()
