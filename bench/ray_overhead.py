"""Ray's overhead against the local pool, and what the parent pays per document (issue 19).

    python bench/ray_overhead.py [--runs 3] [--corpora rust-book,fastapi-en]

The corpora (from ``../shared/corpora``) are copied into one temp corpus. Each run
chunks it into a fresh output folder:

- ``local``: ``chunkyard ingest --jobs 2`` (the process pool);
- ``ray``: ``chunkyard ingest --executor ray`` on a two-node Ray cluster (one CPU each),
  started for the benchmark inside a loopback-only namespace (``tests/ray_support.py``:
  Ray never binds the host's address; needs root for ``unshare``).

Per executor it prints the wall time of the command (process start, Ray's connect and
file system probe included) and the run's own ``seconds``. Then one instrumented run
per executor, in-process, splits the parent's time: recording each result (``session.record_result``:
manifest entry, change feed), taking results from Ray (``ray.get``), connecting. The
worker's side is the sum of the stage timings. From those two per-document costs it
estimates what a cluster of N nodes gives: the workers scale with the CPUs, the
parent's per-result cost does not (it is the one writer).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPORA = ROOT.parent / "shared" / "corpora"
sys.path.insert(0, str(ROOT / "tests"))

from ray_support import LoopbackCluster, unshare_problem

#: One instrumented run in-process: where the parent's time goes.
PROBE = r"""
import json, sys, time
from pathlib import Path
import pipeline.run.session as session_mod
from pipeline.run.ingest import Options, Session, ingest

spent = {"record": 0.0, "collect": 0.0, "connect": 0.0, "sync": 0.0}
def timed(key, fn):  # CPU time of the parent's main thread: what it cannot hand to a worker
    def wrapper(*a, **k):
        t = time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            spent[key] += time.thread_time() - t
    return wrapper
session_mod.record_result = timed("record", session_mod.record_result)
Session.sync = timed("sync", Session.sync)
executor = sys.argv[3]
if executor == "ray":
    import pipeline.run.ray_executor as rx
    rx.RayExecutor._collect = timed("collect", rx.RayExecutor._collect)
    rx.RayExecutor._connect = timed("connect", rx.RayExecutor._connect)
kw = {"executor": "ray", "address": sys.argv[4]} if executor == "ray" else {}
summary = ingest(Options(corpus=Path(sys.argv[1]), out=Path(sys.argv[2]), jobs=2, **kw))
assert not summary.failures, summary.failures
print(json.dumps({
    **spent,
    "seconds": summary.seconds,
    "docs": summary.processed,
    "chunks": summary.chunks,
    "worker_seconds": sum(summary.stage_seconds.values()),
}))
"""


def make_corpus(names: list[str], into: Path) -> Path:
    for name in names:
        shutil.copytree(CORPORA / name, into / name, ignore=shutil.ignore_patterns("SOURCE.txt"))
    return into


def timed_run(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, dict[str, object]]:
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return wall, json.loads(proc.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--corpora", default="rust-book,fastapi-en")
    args = parser.parse_args()
    problem = unshare_problem()
    if problem:
        raise SystemExit(f"no Ray cluster for the benchmark: {problem}")
    work = Path(tempfile.mkdtemp(prefix="cy-bench-ray-"))
    cluster = None
    try:
        corpus = make_corpus(args.corpora.split(","), work / "corpus")
        chunkyard = str(Path(sys.executable).parent / "chunkyard")
        started = time.perf_counter()
        cluster = LoopbackCluster()
        print(f"cluster (2 nodes x 1 CPU) up in {time.perf_counter() - started:.1f} s")
        walls: dict[str, list[float]] = {"local": [], "ray": []}
        secs: dict[str, list[float]] = {"local": [], "ray": []}
        docs = 0
        for i in range(args.runs):
            out = work / f"local{i}"
            wall, summary = timed_run(
                [chunkyard, "ingest", str(corpus), "--out", str(out), "--jobs", "2", "--json"]
            )
            walls["local"].append(wall)
            secs["local"].append(float(summary["seconds"]))  # type: ignore[arg-type]
            docs = int(summary["processed"])  # type: ignore[call-overload]
            out = work / f"ray{i}"
            wall, summary = timed_run(
                cluster.command(cluster.chunkyard("ingest", str(corpus), "--out", str(out), "--json")),
                cluster.env(),
            )
            walls["ray"].append(wall)
            secs["ray"].append(float(summary["seconds"]))  # type: ignore[arg-type]
        print(f"corpus: {args.corpora} ({docs} documents); median of {args.runs} runs, fresh output each")
        for name in ("local", "ray"):
            print(
                f"  {name:5s}  command {statistics.median(walls[name]):6.2f} s   "
                f"run (summary.seconds) {statistics.median(secs[name]):6.2f} s"
            )
        split = {}
        for name in ("local", "ray"):
            cmd = [
                sys.executable,
                "-c",
                PROBE,
                str(corpus),
                str(work / f"probe-{name}"),
                name,
                "127.0.0.1:6390",
            ]
            if name == "ray":
                cmd = cluster.command(cmd)
            _, split[name] = timed_run(cmd, cluster.env())
        print("  per document, CPU of the parent's thread (the serial part) and of the workers:")
        for name, s in split.items():
            n = max(1, int(s["docs"]))  # type: ignore[call-overload]
            sync = float(s["sync"]) - float(s["connect"])  # type: ignore[arg-type]
            print(
                f"  {name:5s}  parent: record {1000 * float(s['record']) / n:.3f} ms, "  # type: ignore[arg-type]
                f"take from Ray {1000 * float(s['collect']) / n:.3f} ms, "  # type: ignore[arg-type]
                f"whole sync {1000 * sync / n:.2f} ms (connect + probe {float(s['connect']):.2f} s apart); "  # type: ignore[arg-type]
                f"workers: {1000 * float(s['worker_seconds']) / n:.2f} ms"  # type: ignore[arg-type]
            )
        s = split["ray"]
        n = max(1, int(s["docs"]))  # type: ignore[call-overload]
        worker = float(s["worker_seconds"]) / n  # type: ignore[arg-type]
        marginal = (float(s["record"]) + float(s["collect"])) / n  # type: ignore[arg-type]
        whole = (float(s["sync"]) - float(s["connect"])) / n  # type: ignore[arg-type]
        print(
            f"  the parent's serial cost caps a run at ~{1 / marginal:,.0f} documents/s (per result) "
            f"and ~{1 / whole:,.0f} documents/s (whole sync: discovery, manifest, fixed costs)"
        )
        for nodes, cores in ((10, 8), (10, 32)):
            cpus = nodes * cores
            print(
                f"  {nodes} nodes x {cores} cores: workers {cpus / worker:,.0f} docs/s; "
                f"with the parent: {min(cpus / worker, 1 / whole):,.0f} to {min(cpus / worker, 1 / marginal):,.0f} docs/s"
            )
    finally:
        if cluster is not None:
            cluster.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
