"""Watch latency (docs/spec.md, "Watch"): save of a document → its chunk files current.

    python bench/watch_latency.py [--saves 60] [--corpus fastapi-en | none | PATH]
                                  [--debounce-ms 50] [--polling] [--profile] [--small-only]

A ``Watcher`` runs on a temp copy of a real corpus (default ``fastapi-en`` from
``../shared/corpora``: 155 documents, so the manifest has a realistic size; ``none``
for a corpus of just the two documents). Two documents are saved ``--saves`` times
each: one of about 20 KB (the corpus document nearest that size) and one of about
700 KB (fastapi's ``release-notes.md``, 702,899 bytes); generated Markdown stands in
when the corpora are absent. Each save is a small edit: one of five marker
paragraphs spread over the document gets a new number, the file is saved in place
or by temp-file-then-rename (alternately), and the clock starts when the save has
returned. A poller reads the chunk file that holds the marker until it shows the
new number: that is "current". The first three saves of each document are warm-up.

Per size it prints p50 / p95 / max of save → current, and a breakdown from the
watcher's own reports: the debounce wait and the ``Session.sync`` time, split into
the pipeline stages and the rest (lookup, stale files, change feed, manifest).
``--profile`` then runs cProfile over 20 direct ``Session.sync([doc])`` calls per size.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import random
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CORPORA = REPO.parent / "shared" / "corpora"
sys.path.insert(0, str(REPO))

from pipeline.run.ingest import Options, Session
from pipeline.run.watch import SyncReport, Watcher

MARKERS = 5
WARMUP = 3
TARGET_P95_MS = 250.0
POLL_S = 0.001


def generated(size: int, seed: int) -> str:
    """Realistic-looking Markdown: headings, paragraphs, lists, code, a table."""
    rng = random.Random(seed)
    words = [
        "the",
        "chunk",
        "file",
        "holds",
        "a",
        "verbatim",
        "slice",
        "of",
        "the",
        "canonical",
        "text",
        "with",
        "offsets",
        "into",
        "it",
        "and",
        "a",
        "stable",
        "address",
        "that",
        "survives",
        "edits",
        "so",
        "citations",
        "can",
        "be",
        "checked",
        "back",
        "against",
        "the",
        "source",
    ]

    def sentence() -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(8, 20))).capitalize() + "."

    def para() -> str:
        return " ".join(sentence() for _ in range(rng.randint(2, 6)))

    parts, n = ["# Generated guide\n"], 0
    while sum(map(len, parts)) < size:
        n += 1
        parts.append(f"## Section {n}\n")
        for _ in range(rng.randint(2, 5)):
            kind = rng.random()
            if kind < 0.6:
                parts.append(para() + "\n")
            elif kind < 0.75:
                parts.append("\n".join(f"- {para()[:80]}" for _ in range(rng.randint(3, 7))) + "\n")
            elif kind < 0.9:
                parts.append(
                    "```python\n"
                    + "\n".join(f"x{i} = {i} * 2" for i in range(rng.randint(3, 12)))
                    + "\n```\n"
                )
            else:
                parts.append(
                    "| a | b |\n|---|---|\n"
                    + "\n".join(f"| {i} | {rng.choice(words)} |" for i in range(6))
                    + "\n"
                )
    return "\n".join(parts)


def pick_documents(corpus: Path | None) -> tuple[tuple[str, str], tuple[str, str]]:
    """(relative path, text) of the ~20 KB and the ~700 KB document."""
    big = CORPORA / "fastapi-en" / "docs/en/docs/release-notes.md"
    large = (
        ("bench/large.md", big.read_text(encoding="utf-8"))
        if big.exists()
        else ("bench/large.md", generated(700_000, 2))
    )
    small: tuple[str, str] | None = None
    if corpus is not None:
        docs = [p for p in corpus.rglob("*.md") if p.stat().st_size < 60_000]
        if docs:
            best = min(docs, key=lambda p: abs(p.stat().st_size - 20_000))
            small = (best.relative_to(corpus).as_posix(), best.read_text(encoding="utf-8"))
    if small is None:
        small = ("bench/small.md", generated(20_000, 1))
    return small, large


def with_markers(text: str) -> str:
    """Five marker paragraphs at paragraph breaks spread over the text (not inside code)."""
    lines = text.split("\n")
    fence, breaks = False, []
    for i, line in enumerate(lines):
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
        elif (
            not fence
            and line == ""
            and i + 1 < len(lines)
            and lines[i + 1]
            and not lines[i + 1].startswith(("    ", "\t", "|", "-", "*", ">"))
        ):
            breaks.append(i)
    chosen = [breaks[int(len(breaks) * (k + 0.5) / MARKERS)] for k in range(MARKERS)]
    for k, i in sorted(enumerate(chosen), key=lambda x: -x[1]):
        lines.insert(i + 1, f"Edit marker m{k}-0000 for the watch benchmark.\n")
    return "\n".join(lines)


def chunk_files(out: Path, rel: str) -> list[Path]:
    folder, _, name = rel.rpartition("/")
    return list((out / folder).glob(f"doc_{name.rsplit('.', 1)[0]}__ch*.json"))


def holder(out: Path, rel: str, needle: bytes) -> Path | None:
    """The chunk file of ``rel`` whose bytes hold ``needle``."""
    for path in chunk_files(out, rel):
        try:
            if needle in path.read_bytes():
                return path
        except OSError:
            pass
    return None


def wait_current(
    out: Path, rel: str, needle: bytes, guess: Path | None, timeout: float = 10.0
) -> tuple[float, Path]:
    """Poll until a chunk file of ``rel`` shows ``needle``; returns (perf_counter time, that file)."""
    deadline = time.perf_counter() + timeout
    scan_at = time.perf_counter() + 0.5  # the edit moved to another chunk: look everywhere, now and then
    while time.perf_counter() < deadline:
        if guess is not None:
            try:
                if needle in guess.read_bytes():
                    return time.perf_counter(), guess
            except OSError:
                pass
        if guess is None or time.perf_counter() > scan_at:
            found = holder(out, rel, needle)
            if found is not None:
                return time.perf_counter(), found
            scan_at = time.perf_counter() + 0.5
        time.sleep(POLL_S)
    raise TimeoutError(f"{rel}: {needle.decode()} never showed up")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(
    root: Path,
    rel: str,
    saves: int,
    watcher: Watcher,
    watcher_reports: list[SyncReport],
    lock: threading.Lock,
) -> dict[str, Any]:
    corpus, out = root / "corpus", root / "chunks"
    path = corpus / rel
    text = path.read_text(encoding="utf-8")
    numbers = [0] * MARKERS
    guesses: list[Path | None] = [holder(out, rel, f"m{k}-0000".encode()) for k in range(MARKERS)]
    latencies: list[float] = []
    rows: list[dict[str, Any]] = []
    for i in range(saves):
        k = i % MARKERS
        old, new = f"m{k}-{numbers[k]:04d}", f"m{k}-{i + 1:04d}"
        numbers[k] = i + 1
        text = text.replace(old, new)
        with lock:
            seen = len(watcher_reports)
        if i % 2 == 0:  # in place
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
        else:  # temp file, then rename over
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)
        t0 = time.perf_counter()
        t1, guesses[k] = wait_current(out, rel, new.encode(), guesses[k])
        deadline = time.perf_counter() + 60
        while time.perf_counter() < deadline:  # the sync's end (feed, manifest) and its report, then idle
            with lock:
                mine = [r for r in watcher_reports[seen:] if any(d.path == rel for d in r.docs)]
            if mine and watcher.idle():
                break
            time.sleep(0.005)
        time.sleep(0.05)
        if i >= WARMUP:
            latencies.append((t1 - t0) * 1000)
            if mine:
                r = mine[-1]
                rows.append(
                    {
                        "sync_ms": r.ms,
                        "event_to_done_ms": r.latency_ms,
                        "stages_ms": {k: v * 1000 for k, v in r.summary.stage_seconds.items()},
                        "syncs": len(mine),
                    }
                )
    size = path.stat().st_size

    def med(key: str) -> float:
        return statistics.median(r[key] for r in rows) if rows else float("nan")

    stages: dict[str, float] = {}
    for name in sorted({s for r in rows for s in r["stages_ms"]}):
        stages[name] = statistics.median(r["stages_ms"].get(name, 0.0) for r in rows)
    return {
        "document": rel,
        "bytes": size,
        "chunks": len(chunk_files(out, rel)),
        "saves": len(latencies),
        "p50_ms": pct(latencies, 0.5),
        "p95_ms": pct(latencies, 0.95),
        "max_ms": max(latencies),
        "median_sync_ms": med("sync_ms"),
        "median_event_to_done_ms": med("event_to_done_ms"),
        "median_stage_ms": stages,
        "extra_syncs": sum(r["syncs"] - 1 for r in rows),
    }


def profile(root: Path, rels: list[str], n: int = 20) -> None:
    """cProfile over direct ``Session.sync([doc])`` calls (the watcher's work, minus the waiting)."""
    corpus = root / "corpus"
    with Session(Options(corpus, root / "chunks")) as session:
        for rel in rels:
            path = corpus / rel
            text = path.read_text(encoding="utf-8")
            prof = cProfile.Profile()
            started = time.perf_counter()
            for i in range(n):
                text = re.sub(r"m0-\d{4}", f"m0-{9000 + i:04d}", text)
                path.write_text(text, encoding="utf-8")
                prof.enable()
                session.sync([rel])
                prof.disable()
            per = (time.perf_counter() - started) / n * 1000
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(28)
            print(f"\n### cProfile: Session.sync([{rel!r}]) x {n}, {per:.1f} ms per call (incl. the save)\n")
            print("\n".join(buf.getvalue().splitlines()[:60]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--saves", type=int, default=60)
    ap.add_argument(
        "--corpus", default="fastapi-en", help="a corpus name under ../shared/corpora, a path, or none"
    )
    ap.add_argument("--debounce-ms", type=float, default=50.0)
    ap.add_argument("--polling", action="store_true")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--small-only", action="store_true", help="skip the ~700 KB document (quick runs)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()

    source: Path | None = None
    if args.corpus != "none":
        source = Path(args.corpus) if "/" in args.corpus else CORPORA / args.corpus
        if not source.is_dir():
            print(f"{source}: not found; using generated documents only", file=sys.stderr)
            source = None
    (small_rel, small), (large_rel, large) = pick_documents(source)
    with tempfile.TemporaryDirectory(prefix="chunkyard-watch-bench-") as tmp:
        root = Path(tmp)
        corpus = root / "corpus"
        if source is not None:
            shutil.copytree(source, corpus, ignore=shutil.ignore_patterns("SOURCE.txt"))
        for rel, text in ((small_rel, small), (large_rel, large)):
            (corpus / rel).parent.mkdir(parents=True, exist_ok=True)
            (corpus / rel).write_text(with_markers(text), encoding="utf-8")
        docs = sum(1 for _ in corpus.rglob("*.md"))
        reports: list[SyncReport] = []
        lock = threading.Lock()

        def on_sync(report: SyncReport) -> None:
            with lock:
                reports.append(report)

        opts = Options(corpus, root / "chunks", jobs=os.cpu_count() or 1)
        started = time.perf_counter()
        watcher = Watcher(opts, debounce=args.debounce_ms / 1000, polling=args.polling, on_sync=on_sync)
        with watcher:
            first = time.perf_counter() - started
            manifest_kb = (root / "chunks/.chunkyard/state.sqlite").stat().st_size / 1024
            results = [
                measure(root, rel, args.saves, watcher, reports, lock)
                for rel in ((small_rel,) if args.small_only else (small_rel, large_rel))
            ]
        print(
            f"\n## chunkyard watch latency: save → chunk file current ({args.saves} saves each, "
            f"{WARMUP} warm-up; debounce {args.debounce_ms:.0f} ms; "
            f"{'polling' if args.polling else 'inotify'})\n"
        )
        print(
            f"corpus: {docs} documents ({args.corpus}), state {manifest_kb:,.0f} KB; first sync {first:.2f} s; "
            f"python {sys.version.split()[0]}, {os.cpu_count()} cores\n"
        )
        print(
            "| document | KB | chunks | p50 ms | p95 ms | max ms | sync ms (median) | event→done ms | extra syncs |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in results:
            print(
                f"| {r['document']} | {r['bytes'] / 1024:,.0f} | {r['chunks']} | {r['p50_ms']:.0f} | {r['p95_ms']:.0f} "
                f"| {r['max_ms']:.0f} | {r['median_sync_ms']:.0f} | {r['median_event_to_done_ms']:.0f} | {r['extra_syncs']} |"
            )
        print(
            "\nmedian per-stage ms inside Session.sync (the rest of sync ms: lookup, stale files, feed, manifest):\n"
        )
        for r in results:
            stages = r["median_stage_ms"]
            rest = r["median_sync_ms"] - sum(stages.values())
            print(
                f"- {r['document']}: "
                + ", ".join(f"{k} {v:.1f}" for k, v in stages.items())
                + f"; rest {rest:.1f}"
            )
        verdict = "met" if results[0]["p95_ms"] <= TARGET_P95_MS else "MISSED"
        print(
            f"\ntarget p95 ≤ {TARGET_P95_MS:.0f} ms for the ~20 KB document: {verdict} ({results[0]['p95_ms']:.0f} ms)"
        )
        if args.json:
            args.json.write_text(
                json.dumps(
                    {"args": vars(args) | {"json": str(args.json)}, "documents": docs, "results": results},
                    indent=2,
                )
                + "\n"
            )
        if args.profile:
            profile(root, [small_rel] if args.small_only else [small_rel, large_rel])
    return 0


if __name__ == "__main__":
    sys.exit(main())
