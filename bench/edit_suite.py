"""Does a gold set keep its score through an edit suite? (issue 17, 000's citation stability)

    python bench/edit_suite.py [--corpora rust-book,fastapi-en,powershell-docs] [--max-bytes N] [--seed 17]

For each corpus with a gold set in ``bench/gold/``: a copy of the corpus (the part the
documented ``make bench-retrieval`` runs use: 1.6 MB, PowerShell's 1 MB) is chunked (``chunkyard ingest``) and indexed
(``chunkyard index``, the default embedder), then every document gets two of the edit
suite's six edits (``tests/test_redirects.py``: a paragraph inserted, a word changed, a
heading added or renamed, a section moved or deleted; seed 17, as the test does; ``--seed``
another draw of the same edits), and
the copy is ingested and indexed again *into the same output and index*. ``chunkyard eval``
scores the questions whose answer text is still in the edited document (its quote occurs
there exactly once) before and after, in every mode, with the default ``search`` settings;
the table gives the points each metric moved, and the per-question view which questions
moved and by how many ranks. The control: the edited copy chunked and indexed afresh into
a new output, scored the same way; where its ranks equal the updated index's, what moved
the score is the edited text, not the incremental path. Everything runs through the CLI, in a temp folder.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "tests"))

CORPORA = REPO.parent / "shared" / "corpora"
GOLD = HERE / "gold"
RESULTS = HERE / "results"
#: The part of each corpus the documented ``make bench-retrieval`` runs use (docs/benchmarks.md).
MAX_BYTES = {"powershell-docs": 1_000_000}
DEFAULT_MAX_BYTES = 1_600_000
METRICS = ("recall@1", "recall@5", "recall@10", "MRR@10", "nDCG@10", "recall@2000tok", "citation_match")
MODES = ("hybrid", "dense", "bm25")


def cli(*args: Any) -> dict[str, Any]:
    """``chunkyard ARGS --json`` in a subprocess; its JSON summary (exit code checked)."""
    cmd = [sys.executable, "-m", "pipeline", *map(str, args), "--json"]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(
            f"{' '.join(cmd[2:])}: exit {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    return json.loads(done.stdout)


def canonical(path: Path) -> str:
    from pipeline.stages.normalize import normalize

    return normalize(path.read_bytes(), path.name).text


def edit_corpus(corpus: Path, seed: int = 17) -> dict[str, str]:
    """Every document's text after two edits of the suite (as the test does), not yet written."""
    from test_redirects import EDITS, apply_edit

    rng = random.Random(seed)
    edited: dict[str, str] = {}
    for n, path in enumerate(sorted(corpus.rglob("*.md"))):
        rel = path.relative_to(corpus).as_posix()
        text = canonical(path)
        for kind in (EDITS[n % len(EDITS)], EDITS[(n + 3) % len(EDITS)]):
            try:
                text = apply_edit(text, rel, kind, rng)
            except (IndexError, ValueError):  # nothing of that kind to edit: the other edit only
                continue
        edited[rel] = text
    return edited


def per_question(pack: dict[str, Any], mode: str) -> dict[str, int | None]:
    """Question id → rank of the first relevant item (None: not in the list)."""
    return {r["id"]: r.get("first_hit") for r in pack.get("per_query") or [] if r["mode"] == mode}


def run_corpus(name: str, max_bytes: int | None, scratch: Path, seed: int = 17) -> dict[str, Any]:
    from retrieval import bench_corpus

    gold_path = GOLD / f"{name}.jsonl"
    limit = max_bytes or MAX_BYTES.get(name, DEFAULT_MAX_BYTES)
    source = bench_corpus(CORPORA / name, gold_path, limit, scratch / "parts")
    corpus, out = scratch / name / "corpus", scratch / name / "chunks"
    shutil.copytree(source, corpus)
    started = time.perf_counter()
    first = cli("ingest", corpus, "--out", out)
    indexed = cli("index", "--out", out)
    edited = edit_corpus(corpus, seed)
    gold = [json.loads(line) for line in gold_path.read_text().splitlines() if line.strip()]
    alive = [g for g in gold if edited.get(g["source"], "").count(g["quote"]) == 1]
    subset = scratch / name / "alive.jsonl"
    subset.write_text("".join(json.dumps(g) + "\n" for g in alive))
    before = cli("eval", subset, "--out", out, "--per-query")
    for rel, text in edited.items():
        (corpus / rel).write_text(text, encoding="utf-8")
    second = cli("ingest", corpus, "--out", out)
    reindexed = cli("index", "--out", out)
    after = cli("eval", subset, "--out", out, "--per-query")
    # the control: the edited corpus chunked and indexed from nothing. Where its ranks equal
    # the updated index's, what moved is the edited text, not the incremental path
    fresh_out = scratch / name / "fresh"
    cli("ingest", corpus, "--out", fresh_out)
    cli("index", "--out", fresh_out)
    fresh = cli("eval", subset, "--out", fresh_out, "--per-query")
    moved = {
        mode: {
            m: round(100 * (after["modes"][mode]["metrics"][m] - before["modes"][mode]["metrics"][m]), 2)
            for m in METRICS
        }
        for mode in MODES
    }
    ranks = {}
    for mode in MODES:
        a, b = per_question(before, mode), per_question(after, mode)
        ranks[mode] = {q: [a[q], b.get(q)] for q in a if a[q] != b.get(q)}
    differs = {
        mode: sorted(
            q for q, rank in per_question(after, mode).items() if per_question(fresh, mode).get(q) != rank
        )
        for mode in MODES
    }
    return {
        "corpus": name,
        "seed": seed,
        "fresh_differs": differs,
        "documents": first.get("documents"),
        "chunks": [first.get("chunks"), second.get("chunks")],
        "written_by_edits": second.get("written"),
        "index": {"first": _brief(indexed), "after_edits": _brief(reindexed)},
        "questions": len(gold),
        "alive": len(alive),
        "before": {mode: before["modes"][mode]["metrics"] for mode in MODES},
        "after": {mode: after["modes"][mode]["metrics"] for mode in MODES},
        "moved_points": moved,
        "rank_changes": ranks,
        "seconds": round(time.perf_counter() - started, 1),
    }


def _brief(report: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "added",
        "updated",
        "moved",
        "deleted",
        "redirected",
        "embedded",
        "cache_hits",
        "chunks",
        "seconds",
    )
    return {k: report[k] for k in keys if k in report}


def render(results: list[dict[str, Any]]) -> str:
    lines = ["# Edit suite: points each metric moved (after − before), default search", ""]
    lines.append("| corpus | alive / questions | mode | " + " | ".join(METRICS) + " | questions that moved |")
    lines.append("|---|---|---|" + "---:|" * len(METRICS) + "---:|")
    for r in results:
        for mode in MODES:
            cells = " | ".join(f"{r['moved_points'][mode][m]:+.2f}" for m in METRICS)
            lines.append(
                f"| {r['corpus']} | {r['alive']} / {r['questions']} | {mode} | {cells} | "
                f"{len(r['rank_changes'][mode])} |"
            )
    lines.append("")
    for r in results:
        lines.append(
            f"- {r['corpus']} (seed {r.get('seed', 17)}): {r['documents']} documents, chunks {r['chunks'][0]} → {r['chunks'][1]}, "
            f"{r['written_by_edits']} chunk files written by the edits; index after the edits "
            f"{r['index']['after_edits']}; {r['seconds']} s"
        )
        unlike = {mode: qs for mode, qs in r["fresh_differs"].items() if qs}
        lines.append(
            "  - the updated index against the edited corpus chunked and indexed afresh: "
            + (f"ranks differ: {unlike}" if unlike else "every question at the same rank, every mode")
        )
        for mode in MODES:
            if r["rank_changes"][mode]:
                shown = ", ".join(f"{q} {a}→{b}" for q, (a, b) in sorted(r["rank_changes"][mode].items()))
                lines.append(f"  - {mode}: first relevant rank {shown}")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpora", default="rust-book,fastapi-en,powershell-docs")
    ap.add_argument(
        "--max-bytes", type=int, default=None, help="a part of each corpus (default: the bench's)"
    )
    ap.add_argument("--seed", type=int, default=17, help="the edits' random seed (default 17, as the test)")
    ap.add_argument("--keep", type=Path, default=None, help="work here and keep it (default: a temp folder)")
    args = ap.parse_args()
    if not CORPORA.is_dir():
        raise SystemExit(f"{CORPORA}: the shared corpora are not here (hint: run beside ../shared)")
    scratch = args.keep or Path(tempfile.mkdtemp(prefix="chunkyard-edit-suite-"))
    results = []
    try:
        for name in [c for c in args.corpora.split(",") if c]:
            if (scratch / name).exists():
                shutil.rmtree(scratch / name)
            print(f"{name} …", file=sys.stderr, flush=True)
            results.append(run_corpus(name, args.max_bytes, scratch, args.seed))
            print(render(results[-1:]), file=sys.stderr, flush=True)
    finally:
        if args.keep is None:
            shutil.rmtree(scratch, ignore_errors=True)
    RESULTS.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (RESULTS / f"edit-suite-{stamp}.json").write_text(
        json.dumps({"load": os.getloadavg(), "results": results}, indent=1)
    )
    text = render(results)
    (RESULTS / "edit-suite-latest.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
