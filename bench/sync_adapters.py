"""``make bench-adapters``: the LangChain and LlamaIndex syncs over a real corpus.

    python bench/sync_adapters.py [--corpus rust-book] [--scratch DIR]

The corpus (from ``../shared/corpora``) is copied to a scratch folder and ingested;
then, for each framework's own in-memory store with its fake embedding (counted):
the first sync, a sync with nothing new, and a sync after one paragraph of the largest
document was edited and the corpus ingested again. Prints seconds, texts embedded and
the cursor file's size; the embeddings are fakes, so the seconds are the sync's own cost.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CORPORA = ROOT.parent / "shared" / "corpora"
sys.path.insert(0, str(ROOT))


def edit_largest(corpus: Path) -> str:
    path = max(corpus.rglob("*.md"), key=lambda p: p.stat().st_size)
    lines = path.read_text(encoding="utf-8").split("\n")
    body = lines.index("---", 1) + 1 if lines[0] == "---" and "---" in lines[1:] else 0  # after front matter
    i = max(range(body, len(lines)), key=lambda n: len(lines[n]) if lines[n][:1].isalpha() else 0)
    lines[i] += " (edited)"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path.relative_to(corpus).as_posix()


def timed(fn: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="rust-book")
    ap.add_argument("--scratch", type=Path, default=None)
    args = ap.parse_args()
    from langchain_core.embeddings import DeterministicFakeEmbedding
    from langchain_core.vectorstores import InMemoryVectorStore
    from llama_index.core import StorageContext, VectorStoreIndex
    from llama_index.core.embeddings import MockEmbedding
    from llama_index.core.vector_stores import SimpleVectorStore

    from pipeline.adapters.langchain import sync_vectorstore
    from pipeline.adapters.llamaindex import sync_vector_store
    from pipeline.api import ingest

    class LcCount(DeterministicFakeEmbedding):
        n: int = 0

        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            self.n += len(texts)
            return super().embed_documents(texts)

    class LiCount(MockEmbedding):
        n: int = 0

        def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
            self.n += len(texts)
            return [self._get_vector() for _ in texts]

    scratch = Path(tempfile.mkdtemp(prefix="chunkyard-sync-", dir=args.scratch))
    try:
        corpus, out = scratch / "corpus", scratch / "chunks"
        shutil.copytree(CORPORA / args.corpus, corpus)
        summary, secs = timed(lambda: ingest(corpus, out, jobs=2))
        print(f"{args.corpus}: {summary.documents} documents, {summary.chunks} chunks, ingest {secs:.2f} s")
        lc_emb, li_emb = LcCount(size=16), LiCount(embed_dim=16)
        lc_store = InMemoryVectorStore(lc_emb)
        li_index = VectorStoreIndex(
            [],
            storage_context=StorageContext.from_defaults(vector_store=SimpleVectorStore()),
            embed_model=li_emb,
        )
        syncs = {
            "langchain": lambda: sync_vectorstore(out, lc_store, scratch / "lc.json"),
            "llamaindex": lambda: sync_vector_store(out, li_index, scratch / "li.json"),
        }
        counters = {"langchain": lc_emb, "llamaindex": li_emb}
        rows: list[dict[str, Any]] = []

        def round_(label: str) -> None:
            for name, sync in syncs.items():
                before = counters[name].n
                report, secs = timed(sync)
                rows.append(
                    {
                        "framework": name,
                        "sync": label,
                        "seconds": round(secs, 3),
                        "lines": report.changes,
                        "embedded": counters[name].n - before,
                        "deleted": report.deleted,
                    }
                )

        round_("first")
        round_("nothing new")
        edited = edit_largest(corpus)
        _, secs = timed(lambda: ingest(corpus, out, jobs=2))
        print(f"edited one paragraph of {edited}; ingest {secs:.2f} s")
        round_("one paragraph edited")
        for row in rows:
            print(
                "{framework:10} {sync:22} {seconds:8.3f} s  {lines:6} lines  {embedded:6} embedded".format(
                    **row
                )
            )
        sizes = {
            n: (scratch / f).stat().st_size for n, f in (("langchain", "lc.json"), ("llamaindex", "li.json"))
        }
        print(f"cursor files: {sizes} bytes ({sizes['langchain'] / max(summary.chunks, 1):.0f} B per chunk)")
        print(
            json.dumps({"corpus": args.corpus, "chunks": summary.chunks, "rows": rows, "cursor_bytes": sizes})
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
