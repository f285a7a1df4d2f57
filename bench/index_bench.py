"""``make bench-index``: the index's speed on real corpora (issue 16's closing figures).

1. embedding throughput (chunks/s) of the default embedder over real chunk texts;
2. the time to ``chunkyard index`` the given corpora (default: eips + rust-book +
   powershell-docs, the 18 MB benchmark corpus; many minutes on 2 cores);
3. hybrid query latency p50 / p95 over the index (questions from the gold sets);
4. re-index after a one-paragraph edit (ingest + index);
5. ``watch --index``: save of a 20 KB document → its new text searchable, p50 / p95.

Usage: ``python bench/index_bench.py [--corpora rust-book eips ...] [--queries 100]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CORPORA = ROOT.parent / "shared" / "corpora"
DEFAULT = ["eips", "rust-book", "powershell-docs"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpora", nargs="+", default=DEFAULT)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--sample", type=int, default=512, help="texts for the throughput figure")
    parser.add_argument("--watch-only", action="store_true", help="only the watch --index latency")
    args = parser.parse_args()
    if args.watch_only:
        print(json.dumps(watch_latency(), indent=2))
        return

    from pipeline.index import Searcher, index
    from pipeline.index.embedders import make_embedder
    from pipeline.run.ingest import Options, ingest

    scratch = Path(tempfile.mkdtemp(prefix="bench-index-"))
    try:
        corpus, out = scratch / "corpus", scratch / "chunks"
        for name in args.corpora:
            shutil.copytree(CORPORA / name, corpus / name, ignore=shutil.ignore_patterns(".git"))
        t0 = time.perf_counter()
        ingest(Options(corpus=corpus, out=out))
        ingest_s = time.perf_counter() - t0
        texts = [
            json.loads(p.read_bytes())["embedText"] for p in sorted(out.rglob("doc_*.json"))[: args.sample]
        ]
        embedder = make_embedder(None)
        embedder.embed(texts[:8])  # load the model
        t0 = time.perf_counter()
        embedder.embed(texts)
        per_s = len(texts) / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        report = index(out)
        index_s = time.perf_counter() - t0
        questions = _questions(args.queries)
        latencies = []
        with Searcher(out) as ask:
            ask("warm up", "hybrid", 10)
            for q in questions:
                t0 = time.perf_counter()
                ask(q, "hybrid", 10)
                latencies.append((time.perf_counter() - t0) * 1000)
        latencies.sort()
        doc = next(p for p in sorted(corpus.rglob("*.md")) if p.stat().st_size > 4000)
        text = doc.read_text(encoding="utf-8")
        cut = text.find("\n\n", len(text) // 2)
        doc.write_text(text[:cut] + "\n\nOne paragraph added by the benchmark, about nothing.\n" + text[cut:])
        t0 = time.perf_counter()
        ingest(Options(corpus=corpus, out=out))
        edit_ingest = time.perf_counter() - t0
        t1 = time.perf_counter()
        again = index(out)
        edit_index = time.perf_counter() - t1
        result = {
            "corpora": args.corpora,
            "chunks": report.chunks,
            "ingest_s": round(ingest_s, 2),
            "embed_chunks_per_s": round(per_s, 1),
            "index_s": round(index_s, 1),
            "truncated": report.truncated,
            "query_p50_ms": round(statistics.median(latencies), 1),
            "query_p95_ms": round(latencies[int(0.95 * (len(latencies) - 1))], 1),
            "queries": len(latencies),
            "edit_ingest_s": round(edit_ingest, 3),
            "edit_index_s": round(edit_index, 3),
            "edit_embedded": again.embedded,
        }
        result |= watch_latency()
        print(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def watch_latency(saves: int = 20) -> dict[str, float]:
    """``watch --index``: from the save of a 20 KB document to its new text being searchable."""
    import subprocess

    from pipeline.index import search

    scratch = Path(tempfile.mkdtemp(prefix="bench-watch-index-"))
    try:
        corpus, out = scratch / "corpus", scratch / "chunks"
        shutil.copytree(ROOT / "corpus", corpus)
        paragraph = "Words about indexing a corpus of Markdown while it is being edited. " * 4
        body = "\n\n".join(f"## Part {i}\n\n{paragraph}" for i in range(64))
        doc = corpus / "big.md"
        doc.write_text(f"# Big\n\n{body}\n", encoding="utf-8")
        cmd = [sys.executable, "-m", "pipeline", "watch", str(corpus), "--out", str(out), "--json", "--index"]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        stream = proc.stdout
        assert stream is not None

        def next_index() -> dict[str, object]:
            for line in stream:
                if line.startswith("{") and '"event":"index"' in line.replace(" ", ""):
                    event: dict[str, object] = json.loads(line)
                    return event
            raise RuntimeError("watch ended")

        next_index()
        took = []
        for i in range(saves):
            token = f"zebracorn{i}x"
            text = doc.read_text(encoding="utf-8").replace("## Part 7\n\n", f"## Part 7\n\n{token} ", 1)
            t0 = time.perf_counter()
            doc.write_text(text, encoding="utf-8")
            next_index()  # a save can be seen twice (truncate, write): wait for the run that has it
            while not search(out, token, k=1, mode="bm25")["items"]:
                next_index()
            took.append((time.perf_counter() - t0) * 1000)
        proc.terminate()
        proc.wait(timeout=60)
        took.sort()
        return {
            "watch_index_p50_ms": round(statistics.median(took), 1),
            "watch_index_p95_ms": round(took[int(0.95 * (len(took) - 1))], 1),
            "doc_kb": round(doc.stat().st_size / 1024, 1),
        }
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _questions(n: int) -> list[str]:
    """Questions of the gold sets (bench/gold), else generic ones."""
    found: list[str] = []
    for path in sorted((ROOT / "bench" / "gold").glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                found.append(json.loads(line)["question"])
    found = found or ["how do I borrow a value", "what is a trait object", "install the module"]
    return (found * (n // len(found) + 1))[:n]


if __name__ == "__main__":
    main()
