"""One ONNX session with all cores, or several with fewer threads each? (issue 30)

Embeds the same real chunk texts (rust-book's, the first ``--texts``) with the default
ONNX model in several configurations and prints texts/s for each:

- ``1x{cores}``: one process, one session of ``cores`` threads (the local default's shape);
- ``{cores}x1``: ``cores`` processes, one single-thread session each, the texts split
  between them (what ``--executor ray`` with one-CPU actors does on one machine);
- batch sizes 8 / 32 / 128 texts per model call for ``1x{cores}``;
- no length bucketing: the texts shuffled and cut into batches in that order (padding to
  the longest of each random batch) against sorted by length (the default).

Each configuration loads its session before the clock starts. Run it under ``nice`` and
quote the load: on a shared machine only ratios from one run mean anything.

With ``--batches 8 16 32 --rounds 3`` it times only those batch sizes (one session of
``cores`` threads; ``cores`` single-thread sessions in this process, the default; with
``--split`` also in as many processes; sorted),
alternating them round after round, and prints each round and the medians: close
configurations need several alternated runs to rank.

Usage: ``python bench/embed_sessions.py [--texts 600] [--cores 2] [--batches N ... --rounds R [--split]]``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CORPUS = ROOT.parent / "shared" / "corpora" / "rust-book"


def texts_of(count: int) -> list[str]:
    """The embedded texts of rust-book's first ``count`` chunks (in chunk-file order)."""
    import orjson

    from pipeline.run.ingest import Options, ingest

    work = Path(tempfile.mkdtemp(prefix="cy-sessions-"))
    try:
        ingest(Options(corpus=CORPUS, out=work / "chunks", jobs=2))
        paths = sorted(p for p in (work / "chunks").rglob("*.json") if ".chunkyard" not in p.parts)
        return [orjson.loads(p.read_bytes())["embedText"] for p in paths[:count]]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _embed(texts: list[str], threads: int, batch: int, bucket: bool, parallel: bool = False) -> float:
    """Seconds to embed ``texts`` with one session of ``threads`` (loaded before the clock)."""
    from pipeline.index.embed_onnx import OnnxEmbedder

    embedder = OnnxEmbedder(threads=threads, batch_size=batch, parallel=parallel)
    embedder.embed(["warm up"] * (batch * threads if parallel else 1))  # every session it uses loaded
    started = time.perf_counter()
    if bucket:
        embedder.embed(texts)  # sorted by length inside, cut into batches of ``batch``
    else:
        for i in range(0, len(texts), batch):  # each random batch pads to its own longest text
            embedder.embed(texts[i : i + batch])
    return time.perf_counter() - started


def _worker(texts: list[str], threads: int, batch: int, start: object, out: mp.Queue) -> None:
    from pipeline.index.embed_onnx import OnnxEmbedder

    embedder = OnnxEmbedder(threads=threads, batch_size=batch)
    embedder.embed(["warm up"])
    start.wait()  # type: ignore[attr-defined]
    t = time.perf_counter()
    embedder.embed(texts)
    out.put((t, time.perf_counter()))


def several(texts: list[str], processes: int, threads: int, batch: int) -> float:
    """Wall seconds for ``processes`` sessions of ``threads`` each, the texts dealt in turn."""
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    parts = [texts[i::processes] for i in range(processes)]
    procs = [ctx.Process(target=_worker, args=(p, threads, batch, start, out)) for p in parts]
    for p in procs:
        p.start()
    time.sleep(8)  # every session loaded (a loaded machine is slow to spawn)
    start.set()
    spans = [out.get() for _ in procs]
    for p in procs:
        p.join()
    return max(e for _, e in spans) - min(s for s, _ in spans)


def alternate(texts: list[str], cores: int, batches: list[int], rounds: int, split: bool) -> int:
    """Each configuration once per round, in turn (the order rotates each round); medians at
    the end. A configuration is a batch size for one session of ``cores`` threads, for
    ``cores`` single-thread sessions side by side in this process (``OnnxEmbedder``'s
    default) and, with ``split``, for ``cores`` single-thread sessions in as many processes."""
    import statistics

    shuffled = texts[:]
    random.Random(0).shuffle(shuffled)
    configs = [(f"1x{cores} batch {b}", 1, b) for b in batches]
    configs += [(f"{cores} lanes batch {b}", 0, b) for b in batches]
    if split:
        configs += [(f"{cores}x1 batch {b}", cores, b) for b in batches]
    seen: dict[str, list[float]] = {name: [] for name, _, _ in configs}
    for r in range(rounds):
        for name, processes, batch in configs[r % len(configs) :] + configs[: r % len(configs)]:
            if processes <= 1:  # 0: the default, ``cores`` single-thread sessions in this process
                rate = len(texts) / _embed(shuffled, cores, batch, True, parallel=processes == 0)
            else:
                rate = len(texts) / several(shuffled, processes, 1, batch)
            seen[name].append(rate)
            print(json.dumps({"round": r, "config": name, "texts_per_s": round(rate, 1)}), flush=True)
    medians = {name: round(statistics.median(v), 1) for name, v in seen.items()}
    print(json.dumps({"texts": len(texts), "median_texts_per_s": medians}), flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--texts", type=int, default=600)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--batches", type=int, nargs="+", help="only these batch sizes, alternated")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of --batches")
    parser.add_argument(
        "--split", action="store_true", help="with --batches: also CORES single-thread sessions"
    )
    args = parser.parse_args()
    texts = texts_of(args.texts)
    if args.batches:
        return alternate(texts, args.cores, args.batches, args.rounds, args.split)
    shuffled = texts[:]
    random.Random(0).shuffle(shuffled)
    n, cores = len(texts), args.cores
    runs = {
        f"1x{cores} batch 32 sorted": lambda: _embed(shuffled, cores, 32, True),
        f"{cores}x1 batch 32 sorted": lambda: several(shuffled, cores, 1, 32),
        f"1x{cores} batch 8 sorted": lambda: _embed(shuffled, cores, 8, True),
        f"1x{cores} batch 128 sorted": lambda: _embed(shuffled, cores, 128, True),
        f"1x{cores} batch 32 unsorted": lambda: _embed(shuffled, cores, 32, False),
        "1x1 batch 32 sorted": lambda: _embed(shuffled, 1, 32, True),
    }
    for name, run in runs.items():
        seconds = run()
        print(
            json.dumps(
                {
                    "config": name,
                    "texts": n,
                    "seconds": round(seconds, 2),
                    "texts_per_s": round(n / seconds, 1),
                }
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
