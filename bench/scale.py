"""State that scales (issue 15): the cost of a change at 1× and 10× of ``../shared/corpora``.

    python bench/scale.py [--sizes 1,10] [--saves 12] [--rounds 5] [--scratch DIR] [--keep]
                          [--reuse DIR] [--steps no_change,one_edit,watch,validate]

For each size N the corpus is ``N`` copies of ``../shared/corpora`` (``copy-00`` …), built
at run time in a temp folder from hard links (never committed; every edit here replaces a
file, so the shared corpora are never written). With ``--reuse DIR`` size N lives in
``DIR/Nx`` instead and is kept: its corpus is built and first ingested only if missing, so a
profile-and-change loop pays the 10× first ingest once. Then, each through the real CLI in a
subprocess whose peak RSS (``VmHWM`` of the chunkyard process itself, sampled) is kept:

- the first ingest; a no-change run (median of 3); one edited document (a paragraph
  appended, median of 3), with what the feed said of it (``text`` / ``moved`` lines);
- ``watch``: save → the chunk file shows the save and the feed has moved on, p50 / p95,
  for saves 1.5 s apart and 0.25 s apart;
- ``validate``: wall and peak RSS;
- at the smallest size only: the feed's lines after one clean ingest and after
  ``--rounds`` full re-ingests of a corpus edited each round (the retention rule bounds it).

The issue's targets (10×): one edit ≤ 0.5 s, watch p95 ≤ 250 ms (both intervals), a
no-change run ≤ 1.5 s, parent peak RSS ≤ 200 MB, and the 10× edit and save times
within 1.5× of 1×'s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CORPORA = REPO.parent / "shared" / "corpora"
CHUNKYARD = [sys.executable, "-m", "pipeline"]
EDITED = "rust-book/src/ch17-01-futures-and-syntax.md"
SAVED = "rust-book/src/ch13-01-closures.md"


def build(root: Path, copies: int) -> Path:
    """``copies`` hard-linked copies of the shared corpora under ``root/corpus``."""
    corpus = root / "corpus"
    for i in range(copies):
        shutil.copytree(CORPORA, corpus / f"copy-{i:02d}", copy_function=os.link)
    return corpus


def replace(path: Path, text: str) -> None:
    """Write by temp file and rename: a hard-linked original is never changed."""
    tmp = path.with_name(f".{path.name}.bench")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def vm_hwm(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run(args: list[str]) -> tuple[float, int, dict[str, Any]]:
    """Wall seconds, peak RSS of the chunkyard process, and its ``--json`` output."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        [*CHUNKYARD, *args, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO
    )
    peak = 0
    while proc.poll() is None:
        peak = max(peak, vm_hwm(proc.pid))
        time.sleep(0.01)
    out, err = proc.communicate()
    wall = time.perf_counter() - started
    try:
        data = json.loads(out)
    except ValueError:
        data = {"stderr": err.decode()[-2000:]}
    return wall, peak, data


def feed_stats(out: Path) -> tuple[int, int]:
    """Lines the feed holds, and the last seq given."""
    conn = sqlite3.connect(f"file:{out}/.chunkyard/state.sqlite?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT count(*) FROM feed").fetchone()[0]
        seq = conn.execute("SELECT seq FROM sqlite_sequence WHERE name='feed'").fetchone()
        return int(rows), int(seq[0]) if seq else 0
    finally:
        conn.close()


def last_seq(out: Path) -> int:
    """The last seq the feed gave: what the watch probe polls (a ``count(*)`` of the feed would
    cost the probe itself more at 10× than at 1×)."""
    conn = sqlite3.connect(f"file:{out}/.chunkyard/state.sqlite?mode=ro", uri=True)
    try:
        row = conn.execute("SELECT seq FROM sqlite_sequence WHERE name='feed'").fetchone()
        return int(row[0]) if row else 0
    finally:
        conn.close()


def last_changes(out: Path, after: int) -> dict[str, int]:
    conn = sqlite3.connect(f"file:{out}/.chunkyard/state.sqlite?mode=ro", uri=True)
    try:
        counts: dict[str, int] = {}
        for (line,) in conn.execute("SELECT line FROM feed WHERE seq > ?", (after,)):
            e = json.loads(line)
            key = e.get("change") or e.get("event", "?")
            counts[key] = counts.get(key, 0) + 1
        return counts
    finally:
        conn.close()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def shows(folder: Path, stem: str, marker: str) -> bool:
    for path in folder.glob(f"doc_{stem}__ch*.json"):
        try:
            if marker in path.read_text(encoding="utf-8"):
                return True
        except OSError:
            continue
    return False


def watch(corpus: Path, out: Path, saves: int) -> dict[str, Any]:
    """Save → chunk file and feed current, for saves 1.5 s and 0.25 s apart."""
    proc = subprocess.Popen(
        [*CHUNKYARD, "watch", str(corpus), "--out", str(out), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
    )
    assert proc.stdout is not None
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            peak[0] = max(peak[0], vm_hwm(proc.pid))

    threading.Thread(target=sample, daemon=True).start()
    started = time.perf_counter()
    for line in proc.stdout:
        if b'"ready"' in line:
            break
    ready = time.perf_counter() - started
    doc = corpus / "copy-00" / SAVED
    original = doc.read_text(encoding="utf-8")
    folder = out / "copy-00" / Path(SAVED).parent
    stem = Path(SAVED).stem
    result: dict[str, Any] = {"ready_s": round(ready, 2)}
    n = 0
    for interval in (1.5, 0.25):
        times: list[float] = []
        for i in range(saves + 2):
            n += 1
            marker = f"Scale probe {n} {time.time_ns()}."
            seq = last_seq(out)
            replace(doc, original + f"\n\n{marker}\n")
            t0 = time.perf_counter()
            deadline = t0 + 30
            while not (shows(folder, stem, marker) and last_seq(out) > seq):
                if time.perf_counter() > deadline:
                    break
                time.sleep(0.002)
            took = (time.perf_counter() - t0) * 1000
            if i >= 2:  # two warm-up saves
                times.append(took)
            time.sleep(max(0.0, interval - took / 1000))
        result[f"save_{interval}s"] = {
            "p50_ms": round(statistics.median(times), 1),
            "p95_ms": round(pct(times, 0.95), 1),
            "max_ms": round(max(times), 1),
        }
    replace(doc, original)
    stop.set()
    proc.terminate()
    proc.wait(30)
    result["peak_rss_mb"] = round(peak[0] / 2**20)
    return result


STEPS = ("no_change", "one_edit", "watch", "validate")


def load() -> str:
    """The 1-, 5- and 15-minute load averages, for every figure quoted."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def one_size(
    root: Path, copies: int, saves: int, rounds: int, steps: tuple[str, ...] = STEPS
) -> dict[str, Any]:
    corpus = root / "corpus"
    if not corpus.is_dir():
        build(root, copies)
    out = root / "out"
    docs = sum(1 for p in corpus.rglob("*") if p.suffix in (".md", ".markdown"))
    r: dict[str, Any] = {"copies": copies, "documents": docs, "load_before": load()}
    if (out / ".chunkyard" / "state.sqlite").is_file():  # --reuse: ingested before
        wall, peak, first = run(["ingest", str(corpus), "--out", str(out)])
        r["first_ingest"] = {"s": "reused", "peak_rss_mb": "-"}
    else:
        wall, peak, first = run(["ingest", str(corpus), "--out", str(out)])
        r["first_ingest"] = {"s": round(wall, 2), "peak_rss_mb": round(peak / 2**20)}
    r["chunks"] = first.get("chunks")
    r["state_mb"] = round((out / ".chunkyard" / "state.sqlite").stat().st_size / 2**20, 1)
    if "no_change" not in steps:
        return _rest(r, corpus, out, saves, rounds, steps)
    noop = [run(["ingest", str(corpus), "--out", str(out)]) for _ in range(3)]
    r["no_change"] = {
        "s": round(statistics.median(w for w, _, _ in noop), 3),
        "peak_rss_mb": round(max(p for _, p, _ in noop) / 2**20),
    }
    return _rest(r, corpus, out, saves, rounds, steps)


def _rest(
    r: dict[str, Any], corpus: Path, out: Path, saves: int, rounds: int, steps: tuple[str, ...]
) -> dict[str, Any]:
    if "one_edit" in steps:
        _one_edit(r, corpus, out)
    if "watch" in steps:
        r["watch"] = watch(corpus, out, saves)
    if "validate" in steps:
        wall, peak, report = run(["validate", "--out", str(out), "--corpus", str(corpus)])
        r["validate"] = {"s": round(wall, 2), "peak_rss_mb": round(peak / 2**20), "code": report.get("code")}
    if rounds:
        r["feed_retention"] = retention(corpus, out, rounds)
    r["load_after"] = load()
    return r


def _one_edit(r: dict[str, Any], corpus: Path, out: Path) -> None:
    doc = corpus / "copy-00" / EDITED
    original = doc.read_text(encoding="utf-8")
    edits = []
    for i in range(3):
        seq = last_seq(out)
        replace(doc, original + f"\n\nScale edit {i}: one more paragraph of words at the end.\n")
        wall, peak, summary = run(["ingest", str(corpus), "--out", str(out)])
        edits.append((wall, peak, summary.get("written"), last_changes(out, seq)))
    hinted = []
    for i in range(3):  # the same edit, named: ``ingest --changed FILE`` (no walk)
        replace(doc, original + f"\n\nScale hint {i}: one more paragraph of words at the end.\n")
        wall, peak, summary = run(["ingest", str(corpus), "--out", str(out), "--changed", str(doc)])
        hinted.append((wall, peak, summary.get("written")))
    replace(doc, original)
    r["one_edit"] = {
        "s": round(statistics.median(e[0] for e in edits), 3),
        "peak_rss_mb": round(max(e[1] for e in edits) / 2**20),
        "written": edits[-1][2],
        "feed": edits[-1][3],
    }
    r["one_edit_changed"] = {
        "s": round(statistics.median(e[0] for e in hinted), 3),
        "peak_rss_mb": round(max(e[1] for e in hinted) / 2**20),
        "written": hinted[-1][2],
    }
    r["walk_floor"] = walk_floor(corpus)
    run(["ingest", str(corpus), "--out", str(out)])


#: The least a whole-corpus run can do in Python: a fresh interpreter lists every folder
#: and ``stat``s every document (no database, no chunkyard import).
FLOOR = """
import os, sys, time
t = time.perf_counter(); n = 0; stack = [sys.argv[1]]
while stack:
    with os.scandir(stack.pop()) as it:
        for e in it:
            if e.is_dir():
                stack.append(e.path)
            elif e.name.endswith(".md"):
                e.stat(); n += 1
print(time.perf_counter() - t)
"""


def walk_floor(corpus: Path) -> dict[str, float]:
    """The floor of a plain ``ingest``'s walk: interpreter start + scandir + a stat per document."""
    walls, walks = [], []
    for _ in range(3):
        started = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-c", FLOOR, str(corpus)], capture_output=True, text=True, check=True
        )
        walls.append(time.perf_counter() - started)
        walks.append(float(out.stdout))
    return {
        "process_s": round(statistics.median(walls), 3),
        "walk_stat_s": round(statistics.median(walks), 3),
    }


def retention(corpus: Path, out: Path, rounds: int) -> dict[str, Any]:
    """The feed after one clean ingest, and after ``rounds`` full re-ingests of an edited corpus."""
    clean = feed_stats(out)
    docs = sorted(p for p in corpus.rglob("*.md"))
    for i in range(rounds):
        for doc in docs[i::20]:  # 5 % of the documents edited each round
            replace(doc, doc.read_text(encoding="utf-8") + f"\n\nRound {i}: an added paragraph.\n")
        run(["ingest", str(corpus), "--out", str(out), "--full"])
    after = feed_stats(out)
    return {
        "clean_lines": clean[0],
        "after_lines": after[0],
        "ratio": round(after[0] / max(clean[0], 1), 2),
        "seq_given": after[1],
    }


def _cell(r: dict[str, Any], step: str, *keys: str) -> str:
    got = r.get(step)
    if got is None:
        return "-"
    for key in keys[:-1]:
        got = got[key]
    return str(got[keys[-1]])


def table(results: list[dict[str, Any]]) -> None:
    """The issue's metrics per size, then the 10×-over-1× ratios the issue bounds (≤ 1.5)."""
    print(
        "\n| size | docs | chunks | first ingest s / MB | no-change s / MB | one edit s / MB "
        "| one edit --changed s | walk floor s | watch p95 ms (1.5 s / 0.25 s) / MB | validate s / MB "
        "| load before → after |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['copies']}× | {r['documents']:,} | {r['chunks']:,} "
            f"| {r['first_ingest']['s']} / {r['first_ingest']['peak_rss_mb']} "
            f"| {_cell(r, 'no_change', 's')} / {_cell(r, 'no_change', 'peak_rss_mb')} "
            f"| {_cell(r, 'one_edit', 's')} / {_cell(r, 'one_edit', 'peak_rss_mb')} "
            f"| {_cell(r, 'one_edit_changed', 's')} | {_cell(r, 'walk_floor', 'process_s')} "
            f"| {_cell(r, 'watch', 'save_1.5s', 'p95_ms')} / {_cell(r, 'watch', 'save_0.25s', 'p95_ms')} "
            f"/ {_cell(r, 'watch', 'peak_rss_mb')} "
            f"| {_cell(r, 'validate', 's')} / {_cell(r, 'validate', 'peak_rss_mb')} "
            f"| {r['load_before']} → {r['load_after']} |"
        )
    small, big = results[0], results[-1]
    if len(results) > 1:
        for step, keys in (
            ("one_edit", ("s",)),
            ("one_edit_changed", ("s",)),
            ("watch", ("save_1.5s", "p95_ms")),
            ("watch", ("save_0.25s", "p95_ms")),
        ):
            if step in small and step in big:
                a, b = float(_cell(small, step, *keys)), float(_cell(big, step, *keys))
                print(
                    f"{step} {'/'.join(keys)}: {big['copies']}× / {small['copies']}× = {b / a:.2f} (issue: ≤ 1.5)"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,10", help="comma-separated copies of ../shared/corpora")
    parser.add_argument("--saves", type=int, default=12)
    parser.add_argument(
        "--rounds", type=int, default=5, help="full re-ingests for the feed's retention (smallest size)"
    )
    parser.add_argument("--scratch", type=Path, default=None, help="where to build (default: a temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep the corpora and outputs")
    parser.add_argument(
        "--reuse", type=Path, default=None, help="keep size N in DIR/Nx and reuse it next time"
    )
    parser.add_argument("--steps", default=",".join(STEPS), help="which measurements (default: all)")
    args = parser.parse_args()
    if not CORPORA.is_dir():
        sys.exit(f"{CORPORA}: the shared corpora are not here; nothing to measure")
    sizes = [int(s) for s in args.sizes.split(",") if s]
    results = []
    steps = tuple(s for s in args.steps.split(",") if s)
    for k, copies in enumerate(sizes):
        if args.reuse is not None:
            root = args.reuse / f"{copies}x"
            root.mkdir(parents=True, exist_ok=True)
        else:
            root = Path(tempfile.mkdtemp(prefix=f"chunkyard-scale-{copies}x-", dir=args.scratch))
        try:
            res = one_size(root, copies, args.saves, args.rounds if k == 0 else 0, steps)
        finally:
            if not args.keep and args.reuse is None:
                shutil.rmtree(root, ignore_errors=True)
        results.append(res)
        print(json.dumps(res, indent=2), flush=True)
    table(results)
    if results and "feed_retention" in results[0]:
        print(f"\nfeed retention: {results[0]['feed_retention']}")


if __name__ == "__main__":
    main()
