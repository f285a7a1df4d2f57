"""``make bench-index``: the index's speed on real corpora (issue 16's closing figures).

1. embedding throughput (chunks/s, with the thread cap used) over real chunk texts;
2. the time to ``chunkyard index`` the given corpora (default: eips + rust-book +
   powershell-docs, the 18 MB benchmark corpus; ``--corpora all``: every corpus of
   ``../shared/corpora``, ~42k chunks; many minutes to hours on 2 cores);
3. query latency p50 / p95 per mode (hybrid, dense, bm25) inside one ``Searcher`` over
   every gold question (bench/gold, tests/gold), and the wall time of ``chunkyard search``;
4. re-index after a one-paragraph edit: ``chunkyard ingest`` and ``chunkyard index`` as a
   user runs them (fresh processes), timed apart, several edits; then ``--reconcile``;
5. ``watch --index``: save of a 20 KB document (71 sections) → its new text searchable, p50 / p95.

``--keep DIR`` builds the corpus copy, chunks and index in DIR and leaves them there: the
next run re-uses them (its ingest and index find nothing to do, the embedding cache in the
index answers), so the latency figures can be taken again without hours of embedding.
The edits are undone at the end (and indexed), so DIR stays the corpora as they are.

Usage: ``python bench/index_bench.py [--corpora all | rust-book eips ...] [--keep DIR]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CORPORA = ROOT.parent / "shared" / "corpora"
DEFAULT = ["eips", "rust-book", "powershell-docs"]
MODES = ("hybrid", "dense", "bm25")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpora", nargs="+", default=DEFAULT, help="corpus names, or 'all'")
    parser.add_argument("--queries", type=int, default=0, help="questions to time (0: every gold question)")
    parser.add_argument("--cli-queries", type=int, default=10, help="`chunkyard search` runs to time")
    parser.add_argument("--edits", type=int, default=5, help="one-paragraph edits to time")
    parser.add_argument("--sample", type=int, default=512, help="texts for the throughput figure")
    parser.add_argument("--keep", type=Path, help="build (or re-use) corpus, chunks and index here")
    parser.add_argument("--watch-only", action="store_true", help="only the watch --index latency")
    parser.add_argument("--no-watch", action="store_true", help="skip the watch --index latency")
    args = parser.parse_args()
    if args.watch_only:
        print(json.dumps(watch_latency(), indent=2))
        return
    names = (
        sorted(p.name for p in CORPORA.iterdir() if p.is_dir()) if args.corpora == ["all"] else args.corpora
    )
    scratch = args.keep or Path(tempfile.mkdtemp(prefix="bench-index-"))
    try:
        result = run(names, scratch, args)
        if not args.no_watch:
            result |= watch_latency()
        print(json.dumps(result, indent=2))
    finally:
        if args.keep is None:
            shutil.rmtree(scratch, ignore_errors=True)


def run(names: list[str], scratch: Path, args: argparse.Namespace) -> dict[str, Any]:
    from pipeline.index import index
    from pipeline.index.embedders import make_embedder
    from pipeline.run.ingest import Options, ingest

    corpus, out = scratch / "corpus", scratch / "chunks"
    for name in names:
        if not (corpus / name).exists():
            shutil.copytree(CORPORA / name, corpus / name, ignore=shutil.ignore_patterns(".git"))
    t0 = time.perf_counter()
    ingest(Options(corpus=corpus, out=out))
    ingest_s = time.perf_counter() - t0
    texts = [json.loads(p.read_bytes())["embedText"] for p in sorted(out.rglob("doc_*.json"))[: args.sample]]
    embedder = make_embedder(None)
    embedder.embed(texts[:8])  # load the model
    t0 = time.perf_counter()
    embedder.embed(texts)
    per_s = len(texts) / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    report = index(out)
    index_s = time.perf_counter() - t0
    questions = _questions(args.queries)
    result: dict[str, Any] = {
        "corpora": names,
        "chunks": report.chunks,
        "ingest_s": round(ingest_s, 2),
        "embed_chunks_per_s": round(per_s, 1),
        "embed_threads": getattr(embedder, "threads", None),
        "index_s": round(index_s, 1),
        "index_embedded": report.embedded,
        "index_reused": bool(report.embedded == 0 and not report.full),
        "truncated": report.truncated,
        "queries": len(questions),
        "load_before_queries": os.getloadavg()[0],
    }
    result |= query_latency(out, questions)
    result |= cli_latency(out, questions[: args.cli_queries])
    result |= edit_latency(corpus, out, args.edits)
    result["reconcile_fixed"] = sum(len(v) for v in index(out, reconcile=True).fixed.values())
    result["load_after"] = os.getloadavg()[0]
    return result


def _pcts(ms: list[float]) -> tuple[float, float]:
    ms = sorted(ms)
    return round(statistics.median(ms), 1), round(
        ms[max(0, math.ceil(0.95 * len(ms)) - 1)], 1
    )  # nearest rank


def query_latency(out: Path, questions: list[str]) -> dict[str, float]:
    """p50 / p95 per mode inside one ``Searcher`` (as ``eval`` asks), after a few warm-up queries."""
    from pipeline.index import Searcher

    found: dict[str, float] = {}
    with Searcher(out) as ask:
        for mode in MODES:
            for warm in ("warm up", "the vectors load on the second query", "third"):
                ask(warm, mode, 10)
            took = []
            for q in questions:
                t0 = time.perf_counter()
                ask(q, mode, 10)
                took.append((time.perf_counter() - t0) * 1000)
            found[f"{mode}_p50_ms"], found[f"{mode}_p95_ms"] = _pcts(took)
    return found


def cli_latency(out: Path, questions: list[str]) -> dict[str, float]:
    """Wall time of ``chunkyard search QUERY --json`` (a fresh process: start, model load, one query)."""
    took = []
    for q in questions:
        t0 = time.perf_counter()
        _cli("search", q, "--out", str(out), "--json")
        took.append((time.perf_counter() - t0) * 1000)
    if not took:
        return {}
    p50, p95 = _pcts(took)
    return {"cli_search_p50_ms": p50, "cli_search_p95_ms": p95}


def edit_latency(corpus: Path, out: Path, edits: int) -> dict[str, Any]:
    """``chunkyard ingest`` then ``chunkyard index`` after a one-paragraph edit, timed apart.

    Each edit adds a new paragraph in the middle of one mid-sized document; the document is
    restored (and indexed, untimed) at the end.
    """
    if edits < 1:
        return {}
    docs = sorted(corpus.rglob("*.md"), key=lambda p: (not 4000 < p.stat().st_size < 40000, p))
    doc = docs[0]  # the first mid-sized document (else the first at all)
    original = doc.read_bytes()
    text = original.decode("utf-8")
    cut = text.find("\n\n", len(text) // 2)
    ingest_s, index_s, embedded = [], [], []
    try:
        for i in range(edits):
            added = f"\n\nOne paragraph added by the benchmark, edit {i}, about zebracorn{i} and nothing.\n"
            doc.write_text(text[:cut] + added + text[cut:], encoding="utf-8")
            t0 = time.perf_counter()
            _cli("ingest", str(corpus), "--out", str(out), "--quiet")
            ingest_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            report = json.loads(_cli("index", "--out", str(out), "--json"))
            index_s.append(time.perf_counter() - t0)
            embedded.append(report["embedded"])
    finally:
        doc.write_bytes(original)
        _cli("ingest", str(corpus), "--out", str(out), "--quiet")
        _cli("index", "--out", str(out), "--quiet")
    return {
        "edit_doc": str(doc.relative_to(corpus)),
        "edit_ingest_s": [round(x, 3) for x in ingest_s],
        "edit_index_s": [round(x, 3) for x in index_s],
        "edit_embedded": embedded,
        "edit_ingest_median_s": round(statistics.median(ingest_s), 3),
        "edit_index_median_s": round(statistics.median(index_s), 3),
    }


def _cli(*argv: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", *argv], capture_output=True, text=True, check=False, cwd=ROOT
    )
    if done.returncode not in (0, 1):
        raise RuntimeError(f"chunkyard {' '.join(argv[:2])} failed ({done.returncode}): {done.stderr[-500:]}")
    return done.stdout


def watch_latency(saves: int = 20) -> dict[str, float]:
    """``watch --index``: from the save of a 20 KB document to its new text being searchable."""
    import subprocess

    from pipeline.index import search

    scratch = Path(tempfile.mkdtemp(prefix="bench-watch-index-"))
    try:
        corpus, out = scratch / "corpus", scratch / "chunks"
        shutil.copytree(ROOT / "corpus", corpus)
        paragraph = "Words about indexing a corpus of Markdown while it is being edited. " * 4
        body = "\n\n".join(f"## Part {i}\n\n{paragraph}" for i in range(71))
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
    """Questions of the gold sets (bench/gold, tests/gold), else generic ones; ``n`` = 0: all."""
    found: list[str] = []
    for path in [
        *sorted((ROOT / "bench" / "gold").glob("*.jsonl")),
        ROOT / "tests" / "gold" / "corpus.jsonl",
    ]:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                found.append(json.loads(line)["question"])
    found = found or ["how do I borrow a value", "what is a trait object", "install the module"]
    return found if n <= 0 else (found * (n // len(found) + 1))[:n]


if __name__ == "__main__":
    main()
