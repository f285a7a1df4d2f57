"""Time to searchable, locally and with ``index --executor ray``; the parent's cost per vector (issue 30).

From nothing to a searchable index: ``chunkyard ingest CORPUS`` then ``chunkyard index``,
fresh processes, wall time of each, for

- ``local``: the local default (in this process: one single-thread ONNX session per CPU);
- ``ray``: ``index --executor ray`` on a one-node Ray cluster with all of this machine's
  CPUs (``--num-cpus``), started for the benchmark inside a loopback-only namespace
  (``tests/ray_support.py``; needs root for ``unshare``), with the default actors (one per
  node, of all its CPUs), with ``--per-cpu-too`` also one one-CPU actor per CPU, and with
  ``--one-actor-too`` also ``--actors 1 --cpus-per-actor CPUS`` named. Ray's start (``ray start``) is not counted; the
  driver's connect and the actors' model loads are.

Then the parent's absorption (``bench/absorb.py``): vectors/s into each store with the
vectors supplied, embedding out of the figure.

The default corpus is rust-book (1.5 MB): the 18 MB benchmark corpus costs ~1,000 CPU-s of
embedding per configuration, too much for a shared 2-core machine (``--corpus`` takes another).

Usage: ``python bench/index_ray_bench.py [--corpus rust-book] [--limit N] [--cpus 2] [--vectors 20000]
[--skip-ray] [--one-actor-too] [--per-cpu-too] [--skip-absorb]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CORPORA = ROOT.parent / "shared" / "corpora"
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))


def timed(args: list[str], run: Any = None) -> tuple[float, dict[str, Any]]:
    """Wall seconds of a command and its ``--json`` report."""
    started = time.perf_counter()
    if run is None:
        proc = subprocess.run(args, check=False, capture_output=True, text=True)
    else:
        proc = run(args, timeout=3600)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    return seconds, json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}


def to_searchable(corpus: Path, out: Path, index_args: list[str], run: Any = None) -> dict[str, Any]:
    chunkyard = str(BIN / "chunkyard")
    ingest_s, _ = timed([chunkyard, "ingest", str(corpus), "--out", str(out), "--quiet"], run)
    index_s, report = timed([chunkyard, "index", "--out", str(out), "--json", *index_args], run)
    return {
        "ingest_s": round(ingest_s, 1),
        "index_s": round(index_s, 1),
        "searchable_s": round(ingest_s + index_s, 1),
        "chunks": report.get("chunks"),
        "embedded_on": report.get("embedded_on"),
    }


def one_node_cluster(cpus: int) -> Any:
    """A one-node Ray cluster of ``cpus`` CPUs inside a loopback-only namespace."""
    from ray_support import FENCES, HEAD_PORT, LoopbackCluster

    cluster = LoopbackCluster(nodes=0)  # the namespace only
    fences = FENCES.replace("--num-cpus=1", f"--num-cpus={cpus}").split()
    started = cluster.run(
        [
            str(BIN / "ray"),
            "start",
            "--head",
            f"--port={HEAD_PORT}",
            *fences,
            "--include-dashboard=false",
            f"--temp-dir={cluster.temp}/head",
        ]
    )
    if started.returncode != 0:
        cluster.close()
        raise SystemExit(f"ray start failed: {started.stderr[-2000:]}")
    return cluster


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", default="rust-book")
    parser.add_argument("--cpus", type=int, default=2, help="the Ray node's CPUs (this machine's cores)")
    parser.add_argument("--vectors", type=int, default=20_000, help="vectors for the absorption figure")
    parser.add_argument("--skip-ray", action="store_true")
    parser.add_argument("--limit", type=int, default=0, help="the corpus's first N documents only (0: all)")
    parser.add_argument("--skip-absorb", action="store_true")
    parser.add_argument("--one-actor-too", action="store_true", help="also time one actor of all the CPUs")
    parser.add_argument("--per-cpu-too", action="store_true", help="also time one one-CPU actor per CPU")
    args = parser.parse_args()
    corpus = CORPORA / args.corpus
    work = Path(tempfile.mkdtemp(prefix="cy-tts-"))
    results: dict[str, Any] = {"corpus": args.corpus, "limit": args.limit}
    try:
        if args.limit:
            subset = work / "corpus"
            for path in sorted(corpus.rglob("*.md"))[: args.limit]:
                (subset / path.relative_to(corpus)).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, subset / path.relative_to(corpus))
            corpus = subset
        results["local"] = to_searchable(corpus, work / "local", [])
        print("local", json.dumps(results["local"]), flush=True)
        if not args.skip_ray:
            from ray_support import ADDRESS, unshare_problem

            problem = unshare_problem()
            if problem:
                print(f"ray: skipped ({problem})", flush=True)
            else:
                cluster = one_node_cluster(args.cpus)
                try:
                    configs: list[tuple[str, list[str]]] = [("ray default", [])]
                    if args.per_cpu_too:
                        configs.append(
                            (f"ray {args.cpus}x1", ["--actors", str(args.cpus), "--cpus-per-actor", "1"])
                        )
                    if args.one_actor_too:
                        configs.append(
                            (f"ray 1x{args.cpus}", ["--actors", "1", "--cpus-per-actor", str(args.cpus)])
                        )
                    for name, extra in configs:
                        out = work / name.replace(" ", "-")
                        flags = ["--executor", "ray", "--address", ADDRESS, *extra]
                        results[name] = to_searchable(corpus, out, flags, cluster.run)
                        ratio = results[name]["index_s"] / results["local"]["index_s"]
                        results[name]["index_vs_local"] = round(ratio, 2)
                        print(name, json.dumps(results[name]), flush=True)
                finally:
                    cluster.close()
        if args.skip_absorb:
            return 0
        from absorb import absorb, chunk_rows

        rows = chunk_rows(work / "absorb", args.vectors)
        for kind in ("sqlite", "lancedb"):
            path = work / "absorb" / ("index.sqlite" if kind == "sqlite" else "index.lance")
            results[f"absorb {kind}"] = absorb(kind, path, rows, 128)
            print(f"absorb {kind}", json.dumps(results[f"absorb {kind}"]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
