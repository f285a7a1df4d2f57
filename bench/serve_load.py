"""``make bench-serve``: ``chunkyard serve`` under load on loopback, and save → found with ``--watch``.

1. One client for a few seconds: serve's warm latency, one query at a time. Then load: N clients (threads, one keep-alive connection each) ask the gold questions of the
   corpora over ``GET /v1/search`` for T seconds, then stop; p50/p95/p99 latency,
   queries/s and errors. Bounded: N ≤ 64, T ≤ 600, and every request has a timeout.
2. The CLI for comparison: ``chunkyard search QUESTION --json`` run M times (each call loads
   the model and the index), median wall time; the ratio to serve's warm p50 (one client).
3. ``--watch``: ``serve --watch`` on a copy of the corpus while C clients query; the script
   saves a new document R times, each with a word of its own, and times save → the first
   search that finds it (a probe queries every 20 ms); p50/p95.

The corpus is copied into DIR (``--keep DIR`` keeps and re-uses it, index included; a
temporary folder otherwise). Default: the 18 MB benchmark corpus (eips, rust-book,
powershell-docs; indexing it takes many minutes on 2 cores); ``--small``: six FastAPI
documents (28 gold questions), indexed in seconds.

The clients cycle through the gold questions, so past the first round every query's vector
comes from serve's query cache; ``--query-cache 0`` measures every query embedded.

``--processes N`` serves with ``chunkyard serve --processes N`` (N processes on one port; the
server's CPU time is then its whole process tree's); the clients start once each of the N
has answered (a process still loading its model and vectors would take the CPU of the first phase).

Usage: ``python bench/serve_load.py [--small] [--clients 16] [--seconds 60] [--watch] [--keep DIR]
[--query-cache 0] [--processes 2]``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]
CORPORA = ROOT.parent / "shared" / "corpora"
GOLD = ROOT / "bench" / "gold"
DEFAULT = ["eips", "rust-book", "powershell-docs"]
SMALL = (
    "docs/en/docs/tutorial/metadata.md",
    "docs/en/docs/fastapi-cli.md",
    "docs/en/docs/tutorial/cors.md",
    "docs/en/docs/advanced/middleware.md",
    "docs/en/docs/tutorial/body-nested-models.md",
    "docs/en/docs/tutorial/extra-models.md",
)
CHUNKYARD = [sys.executable, "-m", "pipeline"]


def prepare(args: argparse.Namespace, work: Path) -> tuple[Path, Path, list[str]]:
    """``(corpus, chunks, questions)``: the corpus copied into ``work``, ingested and indexed."""
    corpus, chunks = work / "corpus", work / "chunks"
    questions: list[str] = []
    if args.small:
        rows = [json.loads(line) for line in (GOLD / "fastapi-en.jsonl").read_text().splitlines()]
        questions = [r["question"] for r in rows if r["source"] in SMALL]
        for rel in SMALL if not corpus.exists() else ():
            (corpus / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(CORPORA / "fastapi-en" / rel, corpus / rel)
    else:
        for name in args.corpora:
            gold = GOLD / f"{name}.jsonl"
            if gold.exists():
                questions += [json.loads(line)["question"] for line in gold.read_text().splitlines()]
            if not (corpus / name).exists():
                shutil.copytree(CORPORA / name, corpus / name, ignore=shutil.ignore_patterns(".git"))
    if not questions:
        questions = ["how do I install it", "configuration options", "error handling"]
    t0 = time.perf_counter()
    subprocess.run([*CHUNKYARD, "ingest", str(corpus), "--out", str(chunks), "-q"], check=True)
    subprocess.run([*CHUNKYARD, "index", "--out", str(chunks), "-q"], check=True)
    say(f"ingest + index: {time.perf_counter() - t0:.1f} s (re-used when --keep names a built folder)")
    return corpus, chunks, questions


def say(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Server:
    """``chunkyard serve`` on a free loopback port, stopped (SIGTERM, then SIGKILL) at the end."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [*CHUNKYARD, "serve", *args, "--port", str(self.port), "--quiet"],
            cwd=cwd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def get(self, path: str, conn: http.client.HTTPConnection | None = None) -> tuple[int, Any]:
        own = conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            own.request("GET", path)
            resp = own.getresponse()
            return resp.status, json.loads(resp.read())
        finally:
            if conn is None:
                own.close()

    def wait(self, check: Any, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"chunkyard serve exited with {self.proc.returncode}")
            try:
                if check():
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise SystemExit(f"chunkyard serve not ready within {timeout} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))] if ordered else 0.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time so far of process ``pid`` and every live process below it
    (``serve --processes N``'s server processes), from Linux ``/proc`` (0 elsewhere)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        child = int(stat.parent.name)
        parents[child] = int(fields[1])
        times[child] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    tree = {pid}
    grew = True
    while grew:
        below = {p for p, parent in parents.items() if parent in tree} - tree
        tree |= below
        grew = bool(below)
    return sum(times.get(p, 0.0) for p in tree)


def hammer(server: Server, questions: list[str], clients: int, seconds: float) -> dict[str, Any]:
    """``clients`` threads asking ``questions`` in turn for ``seconds``; latencies (ms), errors,
    and the server's CPU time per query (what bounds queries/s on a machine of N cores)."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors: list[str] = []
    deadline = time.monotonic() + seconds

    def client(n: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        i = n * 7
        while time.monotonic() < deadline:
            q = questions[i % len(questions)]
            i += 1
            t0 = time.perf_counter()
            try:
                status, body = server.get(f"/v1/search?q={quote(q)}&k=10", conn)
            except (OSError, http.client.HTTPException, ValueError) as exc:
                errors.append(repr(exc))
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
                continue
            if status != 200 or not isinstance(body, dict) or "items" not in body:
                errors.append(f"{status}: {str(body)[:200]}")
                continue
            latencies[n].append((time.perf_counter() - t0) * 1000)
        conn.close()

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    cpu_before = cpu_seconds(server.proc.pid)
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    cpu = cpu_seconds(server.proc.pid) - cpu_before
    flat = [x for part in latencies for x in part]
    return {
        "clients": clients,
        "seconds": round(elapsed, 1),
        "queries": len(flat),
        "errors": len(errors),
        "error_samples": errors[:3],
        "qps": round(len(flat) / elapsed, 1),
        "p50_ms": round(percentile(flat, 50), 1),
        "p95_ms": round(percentile(flat, 95), 1),
        "p99_ms": round(percentile(flat, 99), 1),
        "server_cpu_ms_per_query": round(cpu * 1000 / len(flat), 1) if flat else None,
        "server_cpu_share": round(cpu / elapsed, 2),
    }


def cli_latency(chunks: Path, questions: list[str], calls: int) -> float:
    """Median wall time (ms) of ``chunkyard search Q --json``: a fresh process each time."""
    times = []
    for q in questions[:calls]:
        t0 = time.perf_counter()
        subprocess.run(
            [*CHUNKYARD, "search", q, "--out", str(chunks), "--json"], check=True, capture_output=True
        )
        times.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(times), 1) if times else 0.0


def save_to_found(
    corpus: Path, chunks: Path, questions: list[str], clients: int, rounds: int, timeout: float
) -> dict[str, Any]:
    """``serve --watch``: save a new document ``rounds`` times while ``clients`` query; save → found (ms)."""
    server = Server(["--out", str(chunks), "--watch", str(corpus)], corpus.parent)
    try:
        server.wait(lambda: (server.get("/v1/health")[1]["writer"] or {}).get("syncs", 0) >= 1)
        load: dict[str, Any] = {}
        background = threading.Thread(
            target=lambda: load.update(hammer(server, questions, clients, rounds * 3.0 + 30)), daemon=True
        )
        background.start()
        found_ms: list[float] = []
        writer_ms: list[float] = []  # save -> committed, as the writer measured it
        misses = 0
        probe = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        for r in range(rounds):
            word = f"probeword{int(time.time() * 1000)}x{r}"
            doc = corpus / f"serve-probe-{r}.md"
            saved = time.perf_counter()
            doc.write_text(f"# Probe {r}\n\nThe {word} appears here only.\n", encoding="utf-8")
            while True:
                _, record = server.get(f"/v1/search?q={word}&mode=bm25&k=1", probe)
                if any(item["file"] == doc.name for item in record.get("items", [])):
                    found_ms.append((time.perf_counter() - saved) * 1000)
                    writer = server.get("/v1/health", probe)[1]["writer"] or {}
                    if writer.get("last_latency_ms") is not None:
                        writer_ms.append(float(writer["last_latency_ms"]))
                    break
                if time.perf_counter() - saved > timeout:
                    misses += 1
                    break
                time.sleep(0.02)
            time.sleep(1.0)
        probe.close()
        for r in range(rounds):
            (corpus / f"serve-probe-{r}.md").unlink(missing_ok=True)
        background.join()
        return {
            "rounds": rounds,
            "found": len(found_ms),
            "misses": misses,
            "p50_ms": round(percentile(found_ms, 50), 1),
            "p95_ms": round(percentile(found_ms, 95), 1),
            "max_ms": round(max(found_ms), 1) if found_ms else 0.0,
            "writer_p50_ms": round(percentile(writer_ms, 50), 1),
            "writer_p95_ms": round(percentile(writer_ms, 95), 1),
            "queries_meanwhile": load,
        }
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpora", nargs="+", default=DEFAULT, help="corpus names under ../shared/corpora")
    parser.add_argument(
        "--small", action="store_true", help="six FastAPI documents instead (seconds to index)"
    )
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients (at most 64)")
    parser.add_argument("--seconds", type=float, default=60.0, help="load duration (at most 600)")
    parser.add_argument(
        "--single-seconds", type=float, default=10.0, help="one client first: the warm latency"
    )
    parser.add_argument("--workers", type=int, default=2, help="serve --workers")
    parser.add_argument("--processes", type=int, default=1, help="serve --processes")
    parser.add_argument(
        "--query-cache", type=int, default=None, help="serve --query-cache (0: every query embedded)"
    )
    parser.add_argument("--cli-calls", type=int, default=5, help="`chunkyard search` runs to time")
    parser.add_argument("--watch", action="store_true", help="also time save -> found under serve --watch")
    parser.add_argument("--watch-clients", type=int, default=8, help="clients querying during --watch")
    parser.add_argument("--rounds", type=int, default=10, help="saves to time with --watch")
    parser.add_argument("--keep", type=Path, help="build (or re-use) corpus, chunks and index here")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    if not 1 <= args.clients <= 64 or not 0 < args.seconds <= 600:
        parser.error("--clients must be 1-64 and --seconds 0-600")
    holder = None if args.keep else tempfile.TemporaryDirectory(prefix="chunkyard-serve-bench-")
    work = args.keep or Path(holder.name)  # type: ignore[union-attr]
    work.mkdir(parents=True, exist_ok=True)
    try:
        corpus, chunks, questions = prepare(args, work)
        cache = [] if args.query_cache is None else ["--query-cache", str(args.query_cache)]
        processes = ["--processes", str(args.processes)] if args.processes != 1 else []
        server = Server(
            ["--out", str(chunks), "--workers", str(args.workers), *processes, *cache],
            work,
        )
        try:
            answered: set[int] = set()  # warm processes: none may still be loading during a phase

            def every_process_answered() -> bool:
                answered.add(server.get("/v1/health")[1]["process"])
                return len(answered) >= args.processes

            server.wait(every_process_answered)
            status = server.get("/v1/health")[1]["index"]
            say(f"serving {status['chunks']:,} chunks; 1 client for {args.single_seconds:g} s")
            single = hammer(server, questions, 1, args.single_seconds)
            say(f"{args.clients} clients for {args.seconds:g} s")
            load = hammer(server, questions, args.clients, args.seconds)
        finally:
            server.stop()
        cli_ms = cli_latency(chunks, questions, args.cli_calls)
        result: dict[str, Any] = {
            "corpus": "fastapi-subset" if args.small else "+".join(args.corpora),
            "chunks": status["chunks"],
            "workers": args.workers,
            "processes": args.processes,
            "query_cache": args.query_cache,
            "one_client": single,
            "load": load,
            "cli_median_ms": cli_ms,
            "cli_over_serve_p50": round(cli_ms / single["p50_ms"], 1) if single["p50_ms"] else None,
        }
        if args.watch:
            result["watch"] = save_to_found(
                corpus, chunks, questions, args.watch_clients, args.rounds, timeout=60.0
            )
        text = json.dumps(result, indent=2)
        print(text)
        if args.json:
            args.json.write_text(text + "\n", encoding="utf-8")
        return 1 if load["errors"] or single["errors"] else 0
    finally:
        if holder is not None:
            holder.cleanup()


if __name__ == "__main__":
    raise SystemExit(main())
