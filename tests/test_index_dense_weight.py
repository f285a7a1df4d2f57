"""``chunkyard index --dense-weight W``: hybrid search's dense weight kept in the index for every
reader (search, eval, serve's handle), kept across runs and rebuilds, changed by a run that
changes nothing else, and ranking after an edit as a fresh build with the same weight does.

Real components: the SQLite index, the ONNX embedder, the CLI in a subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from index_support import copy_short_sample, run_ingest

from pipeline.index import index, search
from pipeline.serve.handle import open_index

ROOT = Path(__file__).resolve().parents[1]
QUERY = "overlap between pieces"


def ranked(out: Path, query: str = QUERY, store: Path | None = None, **kw: Any) -> list[tuple[str, float]]:
    record = search(out, query, k=8, mode="hybrid", store=store, expand_tokens=0, **kw)
    return [(item["chunk_id"], item["score_raw"]) for item in record["items"]]


def generation(out: Path) -> str:
    return str(search(out, QUERY, k=1, mode="bm25", expand_tokens=0)["mem_rev"])


@pytest.fixture()
def chunks(tmp_path: Path) -> tuple[Path, Path]:
    corpus = copy_short_sample(tmp_path / "corpus")
    out = tmp_path / "chunks"
    run_ingest(corpus, out)
    return corpus, out


def test_the_index_keeps_its_weight_for_every_reader(chunks: tuple[Path, Path]) -> None:
    _, out = chunks
    first = index(out, dense_weight=0.0)
    assert (first.dense_weight, first.dense_weight_reason) == (0.0, "--dense-weight")
    bm25 = search(out, QUERY, k=8, mode="bm25", expand_tokens=0)["items"]
    hybrid = search(out, QUERY, k=8, mode="hybrid", expand_tokens=0)
    assert hybrid["weights"] == {"bm25": 1.0, "dense": 0.0}
    # BM25's order, then the chunks only the dense list holds (MISSING_Z in BM25's)
    assert bm25 and [i["chunk_id"] for i in hybrid["items"][: len(bm25)]] == [i["chunk_id"] for i in bm25]
    # a per-call weight still wins over the index's
    assert search(out, QUERY, mode="hybrid", dense_weight=1.0)["weights"]["dense"] == 1.0

    handle = open_index(out, workers=1)  # a server's handle, opened before the weight changes
    assert handle.search(QUERY, 5)["weights"]["dense"] == 0.0
    before, hash_before = generation(out), search(out, QUERY, k=1)["index_hash"]
    again = index(out)  # nothing changed, no weight asked: the index's own, no commit
    assert (again.dense_weight, again.dense_weight_reason) == (0.0, "the index's own (an earlier --dense-weight)")
    assert generation(out) == before
    changed = index(out, dense_weight=2.0)  # only the weight: a commit, same content and index_hash
    assert changed.dense_weight == 2.0 and generation(out) != before
    assert search(out, QUERY, k=1)["index_hash"] == hash_before
    assert handle.search(QUERY, 5)["weights"]["dense"] == 2.0  # the open handle follows the commit
    handle.close()
    rebuilt = index(out, rebuild=True)
    assert (rebuilt.dense_weight, search(out, QUERY)["weights"]["dense"]) == (2.0, 2.0)


def test_after_an_edit_it_ranks_as_a_fresh_build_with_the_same_weight(chunks: tuple[Path, Path]) -> None:
    corpus, out = chunks
    index(out, dense_weight=1.7)
    doc = corpus / "getting-started.md"
    doc.write_text(doc.read_text(encoding="utf-8") + "\n\nOverlap between pieces keeps context.\n", encoding="utf-8")
    run_ingest(corpus, out)
    index(out)  # incremental: the weight is the index's own
    fresh = out.parent / "fresh.sqlite"
    index(out, store=str(fresh), dense_weight=1.7)
    for query in (QUERY, "configuration reference", "how long may a chunk be"):
        assert ranked(out, query) == ranked(out, query, store=fresh), query
    assert ranked(out) != ranked(out, dense_weight=0.0)


def test_the_cli_says_which_weight_and_why(chunks: tuple[Path, Path]) -> None:
    _, out = chunks
    cli = [sys.executable, "-m", "pipeline", "index", "--out", str(out)]
    done = subprocess.run([*cli, "--dense-weight", "1.5", "--json"], capture_output=True, text=True, check=True)
    report = json.loads(done.stdout)
    jsonschema.validate(report, json.loads((ROOT / "schemas" / "index.schema.json").read_text()))
    assert (report["dense_weight"], report["dense_weight_reason"]) == (1.5, "--dense-weight")
    table = subprocess.run(cli, capture_output=True, text=True, check=True)
    assert "hybrid dense weight 1.5: the index's own" in " ".join(table.stdout.split())
    bad = subprocess.run([*cli, "--dense-weight", "-1"], capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "--dense-weight" in bad.stderr


def test_lancedb_keeps_the_weight_and_commits_it_alone(chunks: tuple[Path, Path]) -> None:
    pytest.importorskip("lancedb", reason="the lancedb extra: pip install -e '.[lancedb]'")
    _, out = chunks
    store = f"lancedb:{out.parent / 'lance'}"
    index(out, store=store, dense_weight=0.5)
    first = search(out, QUERY, store=store)
    assert first["weights"] == {"bm25": 1.0, "dense": 0.5}
    assert index(out, store=store, dense_weight=2.0).dense_weight == 2.0
    second = search(out, QUERY, store=store)
    assert second["weights"]["dense"] == 2.0 and second["index_hash"] == first["index_hash"]
    assert second["mem_rev"] != first["mem_rev"]
