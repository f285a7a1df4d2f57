"""Embedding throughput of one or more embedders over the same chunk texts (issue 33: what the
multilingual option costs to index beside the default).

    python bench/embed_rate.py --chunks bench/results/retrieval-chunks/d2l-zh-1200k-256 --sample 256 default e5

Takes ``--sample`` chunks of a chunk folder (a fixed pseudo-random choice), the text each
embeds as ``chunkyard index`` embeds it, and prints per embedder spec the chunks per second of
wall time and per CPU second of this process (one warm-up call first: the model's load is
not counted). Embedding is most of an index run's time; run it under the measurement lock.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.evaluate.chunks import load_chunk_files
from pipeline.index.embedders import make_embedder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("specs", nargs="+", help="embedder specs (default, e5, onnx:…)")
    ap.add_argument("--chunks", type=Path, required=True, help="a chunk folder (made by chunkyard ingest)")
    ap.add_argument("--sample", type=int, default=256, help="chunks to embed")
    ap.add_argument("--seed", type=int, default=5)
    args = ap.parse_args()
    chunks = load_chunk_files(args.chunks)
    texts = [c.embed for c in random.Random(args.seed).sample(chunks, min(args.sample, len(chunks)))]
    for spec in args.specs:
        embedder = make_embedder(spec)
        embedder.embed(["warm up"])
        wall, cpu = time.perf_counter(), time.process_time()
        embedder.embed(texts)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        print(f"{spec} ({embedder.name}): {len(texts)} chunks, {len(texts) / wall:.2f} chunks/s, "
              f"{len(texts) / cpu:.2f} per CPU second ({wall:.1f} s wall, {cpu:.1f} s CPU)")


if __name__ == "__main__":
    main()
