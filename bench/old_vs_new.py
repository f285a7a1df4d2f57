"""``make bench`` and ``make bench-scale`` for two checkouts in one run, interleaved.

    python bench/old_vs_new.py --old DIR bench [--corpora eips,rust-book,powershell-docs]
                               [--jobs 1,2] [--runs 3] [--peers langchain] [--scratch DIR]
    python bench/old_vs_new.py --old DIR scale [--size 1] [--steps first_ingest,no_change,...]
                               [--pairs 2] [--rounds 5] [--reuse DIR] [--trees old,new]

A redesign is "behaviour unchanged" only if it is not slower either. Two benchmark runs
minutes apart on a shared machine differ by more than most regressions (the load moves wall
times by a quarter), so this runs the old checkout (``--old DIR``, e.g. a ``git worktree``
of the commit before) and this one side by side: each measurement once for old, once for
new, the order swapped from one pair to the next, so that whatever the machine does meanwhile
falls on both alike. Each checkout runs its own code in its own interpreter:
``DIR/.venv/bin/chunkyard`` (``python3 -m venv DIR/.venv && DIR/.venv/bin/pip install -e
DIR``: chunking needs no extra) and this checkout's ``.venv``.

- ``bench``: ``bench/run.py``'s timed ``chunkyard ingest --full --target-tokens 512`` per
  ``--jobs`` value, old and new in turn each round, and the ``--peers`` once per round
  (from this checkout; they are the same code for both), after a warm-up round.
- ``scale``: ``bench/scale.py``'s steps at one size (N copies of ``../shared/corpora``),
  a corpus and an output folder per checkout, step by step: old, new. ``--pairs`` repeats
  the cheap steps (no-change, one edit, watch) to show how far two pairs differ. With
  ``--reuse DIR`` the corpora and outputs stay in ``DIR/Nx/{old,new}`` so that a 10× first
  ingest (minutes) can be its own run (``--steps first_ingest --trees old``).

Prints the side-by-side table (old, new, new / old) and writes it with the raw figures to
``bench/results/old-vs-new-{bench,scale}-STAMP.{md,json}``. Noise: each figure's spread
over its repeats, and the new / old ratio of every pair.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import run as bench_run  # bench/run.py: the make bench helpers
import scale as bench_scale  # bench/scale.py: the make bench-scale steps


class Tree:
    """One checkout: its name in the tables, its folder, its interpreter."""

    def __init__(self, name: str, root: Path) -> None:
        self.name, self.root = name, root.resolve()
        self.python = self.root / ".venv" / "bin" / "python"
        script = self.python.with_name("chunkyard")
        if not script.exists():
            raise SystemExit(
                f"old_vs_new: no {script}: make the checkout's own environment first "
                f"(python3 -m venv {self.root}/.venv && {self.root}/.venv/bin/pip install -e {self.root})"
            )
        self.command = [str(script)]

    def compile(self) -> None:
        """Bytecode for the checkout's modules, as ``bench/run.py`` writes for its own."""
        compileall.compile_dir(self.root / "pipeline", quiet=1)


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def on_tmpfs(path: Path) -> bool:
    """Whether ``path`` lies on a tmpfs: outputs there are removed right after each run."""
    best, kind = "", ""
    with open("/proc/mounts") as fh:
        for line in fh:
            _, mount, fstype = line.split()[:3]
            if str(path.resolve()).startswith(mount) and len(mount) > len(best):
                best, kind = mount, fstype
    return kind == "tmpfs"


def num(value: float) -> str:
    """Three significant digits, or a whole number with thousands separators from 1,000 on."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def spread(values: list[float]) -> str:
    """``min–max`` of the repeats, and the max over min as a percentage."""
    lo, hi = min(values), max(values)
    return f"{num(lo)}–{num(hi)} ({100 * (hi / lo - 1):.0f} %)" if lo > 0 else f"{lo}–{hi}"


def ordered(trees: list[Tree], pair: int) -> list[Tree]:
    """Old first in even pairs, new first in odd ones: neither always runs on a warmer machine."""
    return trees if pair % 2 == 0 else trees[::-1]


def row(what: str, old: list[float], new: list[float], unit: str = "s") -> dict[str, Any]:
    """Medians side by side, the ratio of the medians, the spreads and each pair's ratio."""
    mo, mn = statistics.median(old), statistics.median(new)
    pairs = [n / o for o, n in zip(old, new, strict=False) if o]
    return {
        "what": what,
        "unit": unit,
        "old": old,
        "new": new,
        "old_median": mo,
        "new_median": mn,
        "ratio": mn / mo if mo else None,
        "pair_ratios": pairs,
    }


def render(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| figure | old (median; spread) | new (median; spread) | new / old | each pair's new / old |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "–"
        pairs = ", ".join(f"{p:.2f}" for p in r["pair_ratios"])
        lines.append(
            f"| {r['what']} | {num(r['old_median'])} {r['unit']}; {spread(r['old'])} "
            f"| {num(r['new_median'])} {r['unit']}; {spread(r['new'])} | **{ratio}** | {pairs} |"
        )
    return "\n".join(lines)


def write(kind: str, text: str, data: dict[str, Any]) -> None:
    results = HERE / "results"
    results.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (results / f"old-vs-new-{kind}-{stamp}.md").write_text(text + "\n", encoding="utf-8")
    (results / f"old-vs-new-{kind}-{stamp}.json").write_text(
        json.dumps(data, indent=2) + "\n", encoding="utf-8"
    )
    print(text)
    print(f"\nwritten: {results / f'old-vs-new-{kind}-{stamp}.md'}")


# -- make bench -----------------------------------------------------------------------------


def bench(trees: list[Tree], args: argparse.Namespace) -> None:
    names = [n.strip() for n in args.corpora.split(",") if n.strip()]
    files = bench_run.documents(args.root, names)
    mb = sum(f.stat().st_size for f in files) / 1e6
    scratch = args.scratch / "old-vs-new-scratch"
    if scratch.exists():
        print(f"removing the previous outputs ({scratch})", flush=True)
        shutil.rmtree(scratch)
        if not on_tmpfs(scratch):
            bench_run.wait_out_deletes()
    scratch.mkdir(parents=True)
    tmpfs = on_tmpfs(scratch)
    corpus, file_list = bench_run.link_corpus(scratch, args.root, names, files)
    jobs = [int(j) for j in args.jobs.split(",")]
    peers = [p for p in args.peers.split(",") if p and bench_run.peer_available(p)]
    before = load()
    print(f"{', '.join(names)}: {len(files)} documents, {mb:.2f} MB; load {before}", flush=True)
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {(t.name, j): [] for t in trees for j in jobs}
    theirs: dict[str, list[float]] = {p: [] for p in peers}
    first = 0 if args.warmup else 1  # round 0 is the warm-up; without one (a loaded machine) it is skipped
    for round_ in range(first, args.runs + 1):
        label = "warm-up" if round_ == 0 else f"run {round_}"
        for j in jobs:
            for tree in ordered(trees, round_):
                got = bench_run.chunkyard_once(corpus, j, scratch, f"{tree.name} {label}", tree.command)
                if tmpfs:
                    shutil.rmtree(got["out"])
                if round_:
                    runs[(tree.name, j)].append(got)
        if round_:
            for p in peers:
                theirs[p].append(bench_run.peer_once(p, file_list, label)["seconds"])
    old, new = trees
    rows = []
    for j in jobs:
        o, n = runs[(old.name, j)], runs[(new.name, j)]
        chunks = {r["chunks"] for r in o + n}
        if len(chunks) != 1:
            print(
                f"  warning: old and new made different numbers of chunks: {sorted(chunks)}", file=sys.stderr
            )
        rows.append(row(f"jobs={j}: wall", [r["seconds"] for r in o], [r["seconds"] for r in n]))
        rows.append(row(f"jobs={j}: CPU (user + system)", [r["cpu"] for r in o], [r["cpu"] for r in n]))
        rows.append(
            row(
                f"jobs={j}: worker stages (summed)",
                [sum(r["stage_seconds"].values()) for r in o],
                [sum(r["stage_seconds"].values()) for r in n],
            )
        )
        rows.append(row(f"jobs={j}: peak RSS", [r["rss_mb"] for r in o], [r["rss_mb"] for r in n], "MB"))
        rows.append(row(f"jobs={j}: tree PSS", [r["pss_mb"] for r in o], [r["pss_mb"] for r in n], "MB"))
    text = [
        f"## old ({old.root}) vs new ({new.root}): make bench, interleaved",
        (
            f"{', '.join(names)}: {len(files)} documents, {mb:.2f} MB, {next(iter(chunks))} chunks; "
            f"{args.runs} rounds{' after a warm-up' if args.warmup else ''}; outputs on {'tmpfs' if tmpfs else 'disk'}; "
            f"load {before} before, {load()} after\n"
        ),
        render(rows),
    ]
    for p in peers:
        top = max(jobs)
        ms = statistics.median(theirs[p])
        for tree in trees:
            mine = statistics.median(r["seconds"] for r in runs[(tree.name, top)])
            text.append(f"- {tree.name} jobs={top} vs {p} ({ms:.2f} s): {ms / mine:.2f}× its MB/s")
    raw = {f"{t} jobs={j}": got for (t, j), got in runs.items()}
    write(
        "bench", "\n".join(text), {"rows": rows, "runs": raw, "peers": theirs, "mb": mb, "files": len(files)}
    )


# -- make bench-scale -----------------------------------------------------------------------

SCALE_STEPS = ("first_ingest", "no_change", "one_edit", "watch", "validate", "retention")
#: (row name, path into scale.py's result, unit) for the side-by-side table.
SCALE_FIGURES = (
    ("first ingest", ("first_ingest", "s"), "s"),
    ("first ingest peak RSS", ("first_ingest", "peak_rss_mb"), "MB"),
    ("feed lines after the first ingest", ("feed", "lines"), "lines"),
    ("state database after the first ingest", ("feed", "state_mb"), "MB"),
    ("no-change run (median of 3)", ("no_change", "s"), "s"),
    ("no-change peak RSS", ("no_change", "peak_rss_mb"), "MB"),
    ("one edit, plain ingest (median of 3)", ("one_edit", "s"), "s"),
    ("one edit, --changed FILE", ("one_edit_changed", "s"), "s"),
    ("one edit peak RSS", ("one_edit", "peak_rss_mb"), "MB"),
    ("watch save p50, 1.5 s apart", ("watch", "save_1.5s", "p50_ms"), "ms"),
    ("watch save p95, 1.5 s apart", ("watch", "save_1.5s", "p95_ms"), "ms"),
    ("watch save p95, 0.25 s apart", ("watch", "save_0.25s", "p95_ms"), "ms"),
    ("watch peak RSS", ("watch", "peak_rss_mb"), "MB"),
    ("validate", ("validate", "s"), "s"),
    ("validate peak RSS", ("validate", "peak_rss_mb"), "MB"),
    ("feed lines after --rounds re-ingests of 5 % edits / clean", ("feed_retention", "ratio"), "×"),
)


def use(tree: Tree) -> None:
    """Point ``bench/scale.py``'s subprocesses at ``tree``: its interpreter, in its folder."""
    bench_scale.CHUNKYARD = [str(tree.python), "-m", "pipeline"]
    bench_scale.REPO = tree.root


def grow(home: Path, copies: int) -> None:
    """The copies of ``../shared/corpora`` under ``home/corpus`` that are not there yet (hard links).

    A 10× first ingest takes longer than one measurement should hold the machine: with
    ``--reuse`` and ``--upto`` it can be made in parts (5 copies, then 10), each an ingest
    of the copies added since; the state it ends in is the one a single ingest makes.
    """
    for i in range(copies):
        target = home / "corpus" / f"copy-{i:02d}"
        if not target.is_dir():
            shutil.copytree(bench_scale.CORPORA, target, copy_function=os.link)


def scale_step(step: str, tree: Tree, home: Path, r: dict[str, Any], args: argparse.Namespace) -> None:
    use(tree)
    corpus, out = home / "corpus", home / "out"
    if step == "first_ingest":
        wall, peak, first = bench_scale.run(["ingest", str(corpus), "--out", str(out)])
        r["first_ingest"] = {"s": round(wall, 2), "peak_rss_mb": round(peak / 2**20)}
        r["chunks"] = first.get("chunks")
        r["feed"] = {"lines": bench_scale.feed_stats(out)[0]}
        r["feed"]["state_mb"] = round((out / ".chunkyard" / "state.sqlite").stat().st_size / 2**20, 1)
    elif step == "no_change":
        noop = [bench_scale.run(["ingest", str(corpus), "--out", str(out)]) for _ in range(3)]
        r["no_change"] = {
            "s": round(statistics.median(w for w, _, _ in noop), 3),
            "peak_rss_mb": round(max(p for _, p, _ in noop) / 2**20),
        }
    elif step == "one_edit":
        bench_scale._one_edit(r, corpus, out)
    elif step == "watch":
        r["watch"] = bench_scale.watch(corpus, out, args.saves)
    elif step == "validate":
        wall, peak, report = bench_scale.run(["validate", "--out", str(out), "--corpus", str(corpus)])
        r["validate"] = {"s": round(wall, 2), "peak_rss_mb": round(peak / 2**20), "code": report.get("code")}
    elif step == "retention":
        r["feed_retention"] = bench_scale.retention(corpus, out, args.rounds)
    print(f"  {tree.name} {step}: {json.dumps(r)}", flush=True)


def pick(r: dict[str, Any], path: tuple[str, ...]) -> float | None:
    got: Any = r
    for key in path:
        if not isinstance(got, dict) or key not in got:
            return None
        got = got[key]
    return float(got) if isinstance(got, int | float) else None


def scale(trees: list[Tree], args: argparse.Namespace) -> None:
    steps = [s for s in args.steps.split(",") if s]
    unknown = set(steps) - set(SCALE_STEPS)
    if unknown:
        raise SystemExit(f"old_vs_new: unknown steps {sorted(unknown)}; choose from {', '.join(SCALE_STEPS)}")
    if args.reuse is not None:
        top = args.reuse / f"{args.size}x"
    else:
        top = Path(tempfile.mkdtemp(prefix=f"chunkyard-old-vs-new-{args.size}x-", dir=args.scratch))
    before = load()
    homes = {}
    for tree in trees:
        homes[tree.name] = top / tree.name
        grow(homes[tree.name], args.size)
    fresh = [t.name for t in trees if not (homes[t.name] / "out" / ".chunkyard" / "state.sqlite").is_file()]
    if fresh and "first_ingest" not in steps:
        steps.insert(0, "first_ingest")
    repeated = {"no_change", "one_edit", "watch"}
    results: dict[str, list[dict[str, Any]]] = {t.name: [] for t in trees}
    try:
        for step in steps:
            for pair in range(args.pairs if step in repeated else 1):
                for tree in ordered(trees, pair):
                    if step == "first_ingest" and tree.name not in fresh and args.reuse is not None:
                        continue
                    r: dict[str, Any] = {}
                    scale_step(step, tree, homes[tree.name], r, args)
                    results[tree.name].append(r)
    finally:
        if args.reuse is None and not args.keep:
            shutil.rmtree(top, ignore_errors=True)
    rows = []
    for what, path, unit in SCALE_FIGURES:
        got = {t.name: [v for r in results[t.name] if (v := pick(r, path)) is not None] for t in trees}
        if all(got.values()):
            rows.append(row(what, got[trees[0].name], got[trees[1].name], unit))
    text = [
        f"## old ({trees[0].root}) vs new ({trees[1].root}): make bench-scale at {args.size}×, interleaved",
        f"steps {', '.join(steps)}; {args.pairs} pairs of the repeated steps; load {before} before, {load()} after\n",
        render(rows),
    ]
    write("scale", "\n".join(text), {"size": args.size, "rows": rows, "results": results})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", type=Path, required=True, help="the other checkout (its .venv made)")
    ap.add_argument("--new", type=Path, default=REPO, help="the checkout to compare (default: this one)")
    sub = ap.add_subparsers(dest="what", required=True)
    b = sub.add_parser("bench", help="make bench's throughput")
    b.add_argument("--corpora", default=bench_run.DEFAULT_CORPORA)
    b.add_argument("--root", type=Path, default=bench_scale.CORPORA)
    b.add_argument("--jobs", default="1,2")
    b.add_argument("--runs", type=int, default=3)
    b.add_argument(
        "--warmup", type=int, default=1, help="1: an untimed round first (0: none, to fit a time box)"
    )
    b.add_argument("--peers", default="langchain", help="comma-separated; '' for none")
    b.add_argument(
        "--scratch", type=Path, default=HERE / "results", help="a tmpfs path removes each output at once"
    )
    s = sub.add_parser("scale", help="make bench-scale's steps at one size")
    s.add_argument("--size", type=int, default=1)
    s.add_argument("--steps", default=",".join(SCALE_STEPS))
    s.add_argument("--pairs", type=int, default=2, help="repeats of the no-change, one-edit and watch steps")
    s.add_argument("--saves", type=int, default=12)
    s.add_argument("--rounds", type=int, default=5)
    s.add_argument(
        "--trees", default="old,new", help="which checkouts (old,new; one only: a --reuse first ingest)"
    )
    s.add_argument("--reuse", type=Path, default=None, help="keep corpora and outputs in DIR/Nx/{old,new}")
    s.add_argument("--upto", type=int, default=0, help="with one of --trees: only this many copies yet")
    s.add_argument("--scratch", type=Path, default=None)
    s.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    trees = [Tree("old", args.old), Tree("new", args.new)]
    for tree in trees:
        tree.compile()
    if args.what == "bench":
        bench(trees, args)
    else:
        chosen = [t for t in trees if t.name in args.trees.split(",")]
        if len(chosen) == 1:  # one checkout's step alone, into --reuse: a long first ingest
            if args.reuse is None:
                raise SystemExit(
                    "old_vs_new: --trees with one checkout needs --reuse DIR (kept for the pairs)"
                )
            for step in args.steps.split(","):
                r: dict[str, Any] = {}
                home = args.reuse / f"{args.size}x" / chosen[0].name
                grow(home, args.upto or args.size)
                scale_step(step, chosen[0], home, r, args)
            return
        scale(trees, args)


if __name__ == "__main__":
    main()
