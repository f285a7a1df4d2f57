"""In-process baselines for ``make bench``: one tool per process, files preloaded, timed passes.

    python bench/peers.py TOOL FILE_LIST [--runs N] [--target 512]

``FILE_LIST`` holds one absolute path per line. The files are read and decoded
before any timer starts; a warm-up pass, then ``--runs`` timed passes over all
of them. Prints one JSON object: the wall and CPU seconds of each pass, and the chunk count.

Tools:

- ``mistletoe``: ``mistletoe.Document(text)``, block and inline parsing, no
  chunking: the floor of any mistletoe-based pipeline on one core.
- ``langchain``: ``MarkdownHeaderTextSplitter`` (h1-h6) then
  ``RecursiveCharacterTextSplitter.from_language(Language.MARKDOWN)`` with cl100k
  token lengths, all in memory.
- ``chonkie``: ``RecursiveChunker`` with its default rules and the cl100k
  encoding. Its ``markdown`` recipe lives on the Hugging Face hub, which is not
  reachable offline, so the default rules stand in for it.

Each runs in its own process so imports (mistletoe's token registry above all:
chunkyard adds ``HtmlBlock`` to it) and memory never leak between tools.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path


def _mistletoe(target: int) -> Callable[[str], int]:
    from mistletoe.block_token import Document

    def run(text: str) -> int:
        Document(text)
        return 0

    return run


def _encoding() -> object:
    from pipeline.stages.tokens import get_encoding  # tiktoken's cl100k, vocabulary read offline

    return get_encoding("cl100k_base")


def _langchain(target: int) -> Callable[[str], int]:
    from langchain_text_splitters import (
        Language,
        MarkdownHeaderTextSplitter,
        RecursiveCharacterTextSplitter,
    )

    encode = _encoding().encode_ordinary  # type: ignore[attr-defined]
    headers = MarkdownHeaderTextSplitter([("#" * n, f"h{n}") for n in range(1, 7)])
    recursive = RecursiveCharacterTextSplitter.from_language(
        Language.MARKDOWN, chunk_size=target, chunk_overlap=0, length_function=lambda t: len(encode(t))
    )

    def run(text: str) -> int:
        return len(recursive.split_documents(headers.split_text(text)))

    return run


def _chonkie(target: int) -> Callable[[str], int]:
    from chonkie import RecursiveChunker

    chunker = RecursiveChunker(tokenizer=_encoding(), chunk_size=target)  # type: ignore[arg-type]

    def run(text: str) -> int:
        return len(chunker.chunk(text))

    return run


TOOLS: dict[str, Callable[[int], Callable[[str], int]]] = {
    "mistletoe": _mistletoe,
    "langchain": _langchain,
    "chonkie": _chonkie,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tool", choices=sorted(TOOLS))
    ap.add_argument("file_list", type=Path)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--target", type=int, default=512)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # pipeline, for the encoding
    paths = [p for p in args.file_list.read_text(encoding="utf-8").splitlines() if p]
    texts = [Path(p).read_bytes().decode("utf-8", "replace") for p in paths]
    run = TOOLS[args.tool](args.target)
    times: list[float] = []
    cpu: list[float] = []
    chunks = 0
    for i in range(args.runs + 1):  # the first pass warms up
        gc.collect()
        started, cpu_started = time.perf_counter(), time.process_time()
        chunks = sum(run(t) for t in texts)
        if i:
            times.append(time.perf_counter() - started)
            cpu.append(time.process_time() - cpu_started)
    json.dump({"tool": args.tool, "seconds": times, "cpu": cpu, "chunks": chunks}, sys.stdout)


if __name__ == "__main__":
    main()
