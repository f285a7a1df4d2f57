"""Issue 17's edit suite on the bench's gold sets: does a gold set keep its score after edits?

    python bench/edit_suite.py [--corpora rust-book,fastapi-en,powershell-docs]

Per corpus (the bench's cut of it, as ``bench/retrieval.py`` makes it): a copy is ingested
at the default policy and indexed (the bench's cached embedder), every gold question is
asked through ``Searcher()`` with default settings (passages, hybrid, as ``chunkyard search``);
then every document is edited twice (the six edits of ``tests/test_redirects.py``:
paragraph inserted, word changed, heading added, heading renamed, section moved, section
deleted; two per document, seeded), re-ingested into the same folder and re-indexed into the
same index, and the questions whose answer text is still there (exactly once) are asked
again. Printed and written to ``bench/results/edit-suite.json``: per mode, each metric before
and after on those questions, and the points it moved (one question of 62-78 is 1.3-1.6
points). ``tests/test_eval_cli.py`` holds the same check on ``corpus/``.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "tests"))

from retrieval import CORPORA, DEFAULT_CORPORA, GOLD, RESULTS, bench_corpus, default_embedder

from pipeline.evaluate.gold import load_gold
from pipeline.evaluate.metrics import evaluate_run

METRICS = ("recall@5", "recall@10", "MRR@10", "nDCG@10", "recall@2000tok")
MODES = ("hybrid", "dense", "bm25")


def ingest(corpus: Path, out: Path) -> None:
    subprocess.run([sys.executable, "-m", "pipeline", "ingest", str(corpus), "--out", str(out), "--quiet"],
                   check=True, cwd=REPO)


def scores(out: Path, corpus: Path, gold_path: Path, embed: object) -> dict[str, dict[str, float]]:
    """Every question through ``Searcher()`` (default settings), per mode, after ``index``."""
    from pipeline.index.query import Searcher
    from pipeline.index.sync import index

    index(out, embedder=embed)
    gold = load_gold(gold_path, corpus)
    with Searcher(out, embedder=embed, corpus=corpus) as searcher:
        return {mode: dict(evaluate_run(gold, {q.id: searcher(q.question, mode, 50) for q in gold},
                                        mode=mode).metrics) for mode in MODES}


def edit_all(corpus: Path, seed: int = 17) -> int:
    """Two edits of ``tests/test_redirects.EDITS`` per document (as test_eval_cli's suite); the count edited."""
    from test_eval_cli import load_gold_text
    from test_redirects import EDITS, apply_edit

    rng = random.Random(seed)
    edited_docs = 0
    for n, path in enumerate(sorted(corpus.rglob("*.md"))):
        rel = path.relative_to(corpus).as_posix()
        text = load_gold_text(path)
        edited = text
        for kind in (EDITS[n % len(EDITS)], EDITS[(n + 3) % len(EDITS)]):
            try:
                edited = apply_edit(edited, rel, kind, rng)
            except (IndexError, ValueError):  # no paragraph or section to edit: the other edit only
                continue
        if edited != text:
            path.write_text(edited, encoding="utf-8")
            edited_docs += 1
    return edited_docs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpora", default=DEFAULT_CORPORA)
    ap.add_argument("--max-bytes", default="powershell-docs=1000000,*=1600000",
                    help="the cut per corpus (as the retrieval tables were run)")
    args = ap.parse_args()
    cuts = dict(part.split("=") for part in args.max_bytes.split(","))
    embed = default_embedder()
    report = {}
    for name in args.corpora.split(","):
        gold_path = GOLD / f"{name}.jsonl"
        started = time.perf_counter()
        source = bench_corpus(CORPORA / name, gold_path, int(cuts.get(name, cuts["*"])), RESULTS / "corpora")
        work = RESULTS / "edit-suite" / name
        shutil.rmtree(work, ignore_errors=True)
        corpus, out = work / "corpus", work / "chunks"
        shutil.copytree(source, corpus)
        ingest(corpus, out)
        gold = [json.loads(line) for line in gold_path.read_text().splitlines() if line.strip()]
        edited = edit_all(corpus)
        alive = [g for g in gold if (corpus / g["source"]).read_text(encoding="utf-8").count(g["quote"]) == 1]
        subset = work / "alive.jsonl"
        subset.write_text("".join(json.dumps(g) + "\n" for g in alive))
        # before: the index of the unedited corpus (gold offsets resolved in the bench's unedited cut)
        before = scores(out, source, subset, embed)
        ingest(corpus, out)
        after = scores(out, corpus, subset, embed)
        moved = {m: {k: round(100 * (after[m][k] - before[m][k]), 1) for k in METRICS} for m in MODES}
        report[name] = {"questions": len(gold), "alive": len(alive), "documents_edited": edited,
                        "before": before, "after": after, "moved": moved,
                        "seconds": round(time.perf_counter() - started, 1)}
        print(f"{name}: {len(alive)}/{len(gold)} answers kept, {edited} documents edited; points moved:")
        for m in MODES:
            print(f"  {m:6} " + "  ".join(
                f"{k} {100 * before[m][k]:.1f}->{100 * after[m][k]:.1f} ({moved[m][k]:+.1f})" for k in METRICS))
    (RESULTS / "edit-suite.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
