"""Which BM25 engine prunes best here? Tantivy (Python binding) against LanceDB's native FTS, and FTS5.

    python bench/bm25_engines.py [--docs 200000] [--queries 0]

The issue's set-up (issue 31): the shared corpora cut into 1,000-character pieces,
replicated with three words changed per copy up to ``--docs`` texts. Every text is
tokenized once with FTS5's own tokenizer (``pipeline.index.fts_tokens``: the analyzer of
the SQLite store), and each engine indexes the tokens joined by spaces with a white-space
tokenizer and no filters, so all three see the same terms. Queries: every gold question
(``bench/gold``), its words analyzed the same way, OR-ed, top 50. Reported per engine:
build seconds, index bytes, query p50 / p95 / max (warm: one untimed pass first), and
RSS after the queries.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
CORPORA = HERE.parent.parent / "shared" / "corpora"
K = 50


def pieces(limit: int) -> list[str]:
    found: list[str] = []
    for path in sorted(CORPORA.rglob("*.md")):
        text = path.read_text(errors="replace")
        found.extend(text[i : i + 1000] for i in range(0, len(text), 1000))
    return found


def haystack(n: int, seed: int = 31) -> list[str]:
    base = pieces(n)
    rng = random.Random(seed)
    vocab = sorted({w for t in base[:5000] for w in t.split() if w.isalpha()})
    out = list(base[:n])
    while len(out) < n:
        words = base[len(out) % len(base)].split(" ")
        for _ in range(3):
            words[rng.randrange(len(words))] = rng.choice(vocab)
        out.append(" ".join(words))
    return out


def questions(limit: int) -> list[str]:
    qs = [json.loads(line)["question"] for g in sorted((HERE / "gold").glob("*.jsonl"))
          for line in g.read_text().splitlines() if line.strip()]
    return qs[:limit] if limit else qs


def timed(fn: Any, qs: list[list[list[str]]]) -> dict[str, float]:
    for q in qs:
        fn(q)
    times = []
    for q in qs:
        t = time.perf_counter()
        fn(q)
        times.append((time.perf_counter() - t) * 1000)
    times.sort()
    return {"p50_ms": round(statistics.median(times), 1), "p95_ms": round(times[int(0.95 * (len(times) - 1))], 1),
            "max_ms": round(times[-1], 1)}


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def size_of(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def run_tantivy(docs: list[str], qs: list[list[list[str]]], where: Path) -> dict[str, Any]:
    import tantivy

    builder = tantivy.SchemaBuilder()
    builder.add_integer_field("row", stored=False, fast=True, indexed=False)
    builder.add_text_field("body", stored=False, tokenizer_name="whitespace", index_option="position")
    schema = builder.build()
    t = time.perf_counter()
    index = tantivy.Index(schema, path=str(where))
    writer = index.writer(heap_size=200_000_000, num_threads=1)
    for i, body in enumerate(docs):
        writer.add_document(tantivy.Document(row=i, body=body))
    writer.commit()
    writer.wait_merging_threads()
    build = time.perf_counter() - t
    index.reload()
    searcher = index.searcher()

    def ask(q: list[list[str]]) -> Any:
        subs = [(tantivy.Occur.Should, tantivy.Query.term_query(schema, "body", t[0]) if len(t) == 1
                 else tantivy.Query.phrase_query(schema, "body", t)) for t in q]
        hits = searcher.search(tantivy.Query.boolean_query(subs), K, count=False).hits
        return searcher.fast_field_values("row", [a for _, a in hits])

    return {"build_s": round(build, 1), "bytes": size_of(where), "segments": searcher.num_segments,
            **timed(ask, qs), "rss_mb": round(rss_mb())}


def run_lance(docs: list[str], qs: list[list[list[str]]], where: Path) -> dict[str, Any]:
    import lancedb
    import pyarrow as pa

    t = time.perf_counter()
    db = lancedb.connect(str(where))
    table = db.create_table("t", pa.table({"row": pa.array(range(len(docs)), pa.uint64()), "body": docs}))
    table.create_fts_index("body", base_tokenizer="whitespace", lower_case=False, stem=False,
                           remove_stop_words=False, ascii_folding=False, with_position=False,
                           max_token_length=None)
    build = time.perf_counter() - t

    def ask(q: list[list[str]]) -> Any:
        text = " ".join(tok for term in q for tok in term)
        return table.search(text, query_type="fts").select(["row"]).limit(K).to_list()

    return {"build_s": round(build, 1), "bytes": size_of(where), **timed(ask, qs), "rss_mb": round(rss_mb())}


def run_fts5(docs: list[str], qs: list[list[list[str]]], where: Path) -> dict[str, Any]:
    import apsw

    from pipeline.index.analyzer import fts5_query

    t = time.perf_counter()
    conn = apsw.Connection(str(where))
    conn.execute("CREATE VIRTUAL TABLE fts USING fts5(body, tokenize='ascii')")  # already tokenized
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO fts(rowid, body) VALUES (?, ?)", list(enumerate(docs, 1)))
    conn.execute("COMMIT")
    build = time.perf_counter() - t

    def ask(q: list[list[str]]) -> Any:
        match = fts5_query([" ".join(term) for term in q])
        return list(conn.execute("SELECT rowid FROM fts WHERE fts MATCH ? ORDER BY bm25(fts) LIMIT ?", (match, K)))

    return {"build_s": round(build, 1), "bytes": size_of(where), **timed(ask, qs), "rss_mb": round(rss_mb())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=200_000)
    parser.add_argument("--queries", type=int, default=0)
    parser.add_argument("--engines", nargs="+", default=["tantivy", "lance", "fts5"])
    args = parser.parse_args()
    from pipeline.index.analyzer import query_terms
    from pipeline.index.fts_tokens import Fts5Tokens

    tokens = Fts5Tokens()
    t = time.perf_counter()
    docs = [" ".join(tokens.document(text)) for text in haystack(args.docs)]
    tokenize_s = time.perf_counter() - t
    qs = [[tokens.query(term) for term in query_terms(q)] for q in questions(args.queries)]
    qs = [[t for t in q if t] for q in qs]
    result: dict[str, Any] = {"docs": len(docs), "queries": len(qs), "tokenize_s": round(tokenize_s, 1),
                              "load": os.getloadavg()}
    scratch = Path(tempfile.mkdtemp(prefix="bm25-engines-"))
    try:
        for engine in args.engines:
            where = scratch / engine
            if engine != "fts5":
                where.mkdir()
            result[engine] = {"tantivy": run_tantivy, "lance": run_lance, "fts5": run_fts5}[engine](docs, qs, where)
            print(engine, result[engine], file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
