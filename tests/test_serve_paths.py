"""``chunkyard serve``'s less travelled paths: chunk files broken on disk under a running
server, a LanceDB index, and the query embedder that serve's workers share.

Real components only: a served subprocess on 127.0.0.1, the real ONNX model, a real LanceDB
store; the failures come from real requests on chunk files broken on disk, not mocks.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pytest
from serve_support import (
    CHUNKYARD,
    gold_questions,
    indexed,
    need_serve_stack,
    served,
    stderr_of,
    without_volatile,
)

need_serve_stack()


def test_a_broken_chunk_file_is_answered_around_and_named_and_the_server_keeps_serving(
    tmp_path: Path,
) -> None:
    """Two chunk files broken on disk under a running server: the hit's own, edited by hand into
    valid JSON of the wrong shape, and a neighbour of its passage, cut short. A search that
    meets them still answers (200): the hit comes back as the plain chunk the index holds, the
    broken neighbour stays out of the passage, and a warning names each file and the fix. A
    request about a broken chunk itself (resolve, get) is 500 ``broken_chunk`` naming its file
    and the fix, never a traceback; a citation of it is checked as ``unreadable_chunk``; the
    server's log says the same; once mended, every answer is the one from before."""
    corpus, chunks = indexed(tmp_path, tmp_path / "broken")
    question = "/v1/search?q=" + quote("allow credentials with wildcard origins") + "&k=3"
    with served(["--out", str(chunks), "--corpus", str(corpus)], tmp_path) as server:
        status, before = server.get(question)
        assert status == 200 and before["items"] and not before["warnings"], before
        hit = before["items"][0]
        assert len(hit["chunk_ids"]) > 1, hit  # a passage: the hit and ranked neighbours
        victim = hit["chunk_file"]
        status, neighbour = server.get("/v1/chunk?id=" + quote(hit["chunk_ids"][1]))
        assert status == 200, neighbour
        cut = neighbour["chunk_file"]
        good = {rel: (chunks / rel).read_bytes() for rel in (victim, cut)}
        shape = {**json.loads(good[victim]), "charOffsets": "not an object"}
        (chunks / victim).write_text(json.dumps(shape), encoding="utf-8")
        (chunks / cut).write_bytes(good[cut][: len(good[cut]) // 2])

        status, during = server.get(question)
        assert status == 200, during
        first = during["items"][0]
        assert first["chunk_id"] == hit["chunk_id"] and first["chunk_ids"] == [hit["chunk_id"]], first
        cut_id = neighbour["record"]["chunk_id"]  # in no passage; a hit of its own stays a plain chunk
        assert all(cut_id not in item["chunk_ids"][1:] for item in during["items"]), during["items"]
        assert all(item["chunk_ids"] == [cut_id] for item in during["items"] if item["chunk_id"] == cut_id)
        for rel, why in ((victim, "charOffsets"), (cut, "not JSON")):
            said = [w for w in during["warnings"] if w.startswith(f"{rel}: broken chunk file")]
            assert len(said) == 1 and why in said[0], during["warnings"]
            assert f"chunkyard validate --out {chunks}" in said[0] and "--full" in said[0], said

        for route, rel in (("/v1/resolve", victim), ("/v1/chunk", cut)):
            status, headers, body = server.raw("GET", f"{route}?id=" + quote(rel))
            assert status == 500 and headers["content-type"] == "application/json", body
            answer = json.loads(body)
            assert (answer["ok"], answer["code"], answer["file"]) == (False, "broken_chunk", rel), answer
            assert answer["error"].startswith(f"{rel}: broken chunk file") and "--full" in answer["error"]
            assert b"Traceback" not in body
        # an answer citing the broken chunk: checked, with one clear problem for that citation
        status, report = server.post("/v1/check-citations", {"citations": [hit]})
        assert status == 200 and report["ok"] is False, report
        problems = [p for p in report["problems"] if victim in json.dumps(p)]
        assert problems and problems[0]["code"] == "unreadable_chunk", report
        status, health = server.get("/v1/health")
        assert status == 200 and health["ok"]
        assert server.proc is not None
        log = stderr_of(server.proc)
        for rel in (victim, cut):
            assert f"{rel}: broken chunk file" in log and "chunkyard ingest CORPUS" in log, log[-3000:]
        assert "Traceback" not in log, log[-3000:]

        for rel, data in good.items():  # mended: answered as before
            (chunks / rel).write_bytes(data)
        status, resolved = server.get("/v1/resolve?id=" + quote(victim))
        assert status == 200 and resolved["snippet_id"] == hit["chunk_id"], resolved
        status, after = server.get(question)
        assert status == 200 and after["items"] == before["items"] and not after["warnings"], after
        _, _, metrics = server.raw("GET", "/metrics")
        assert 'chunkyard_requests_total{code="500",route="/v1/resolve"} 1.0' in metrics.decode()
        assert 'chunkyard_requests_total{code="500",route="/v1/search"}' not in metrics.decode()


def need_lancedb() -> None:
    try:
        import lancedb  # noqa: F401
    except ImportError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"lancedb is missing ({exc}): make install installs the extra 'lancedb'")
        pytest.skip(f"lancedb is not installed ({exc})")


def test_serve_over_a_lancedb_index_answers_as_the_cli(tmp_path: Path) -> None:
    """``index --store lancedb:PATH`` then ``serve --store lancedb:PATH``: every gold question's
    record equals ``chunkyard search --store ... --json``, and health names the LanceDB index."""
    need_lancedb()
    corpus, chunks = indexed(tmp_path, tmp_path / "lance")
    store = f"lancedb:{tmp_path / 'lance' / 'index.lance'}"
    subprocess.run([CHUNKYARD, "index", "--out", str(chunks), "--store", store, "-q"], check=True)
    questions = [row["question"] for row in gold_questions()][:4]  # each a CLI run: the model loaded anew
    with served(["--out", str(chunks), "--corpus", str(corpus), "--store", store], tmp_path) as server:
        status, health = server.get("/v1/health")
        assert status == 200 and health["index"]["kind"] == "lancedb", health
        assert health["index"]["index_hash"].startswith("lancedb:")
        for question in questions:
            status, record = server.get(f"/v1/search?q={quote(question)}&k=5")
            assert status == 200, record
            assert record["store"] == "lancedb" and record["items"], record
            cli = subprocess.run(
                [CHUNKYARD, "search", question, "--out", str(chunks), "--store", store, "-k", "5", "--json"],
                capture_output=True,
                check=True,
            )
            assert without_volatile(record) == without_volatile(json.loads(cli.stdout)), question
        hit = record["items"][0]
        status, chunk = server.get("/v1/chunk?id=" + quote(hit["chunk_id"]))
        assert status == 200 and chunk["record"]["chunk_id"] == hit["chunk_id"]


def test_the_query_embedder_gives_the_models_vectors_and_keeps_recent_ones() -> None:
    """Vectors equal the ONNX model's bit for bit, cached or not, in the order asked; the
    least recently used query leaves the cache first."""
    from pipeline.index.embedders import make_embedder
    from pipeline.serve.query_embedder import query_embedder

    model = make_embedder("default")
    queries = ["how do I enable CORS", "nested body models", "run the dev server"]
    expected = model.embed(queries)
    embedder = query_embedder("default", workers=2, cache_size=2)
    assert (embedder.name, embedder.dim) == (model.name, model.dim)
    first = embedder.embed_query(queries)
    assert np.array_equal(first, expected)
    assert (embedder.hits, embedder.misses) == (0, 3)
    # the cache holds the last two: asked again (with a repeat), they come from it
    again = embedder.embed_query([queries[2], queries[1], queries[2]])
    assert np.array_equal(again, expected[[2, 1, 2]])
    assert (embedder.hits, embedder.misses) == (3, 3)
    # the first one was pushed out: embedded again, the same numbers
    assert np.array_equal(embedder.embed_query([queries[0]]), expected[[0]])
    assert (embedder.hits, embedder.misses) == (3, 4)
    off = query_embedder("default", workers=1, cache_size=0)
    off.embed_query(queries[:1])
    off.embed_query(queries[:1])
    assert (off.hits, off.misses) == (0, 2)


def test_open_index_rejects_a_negative_query_cache(tmp_path: Path) -> None:
    from pipeline.errors import UsageError
    from pipeline.serve.handle import open_index

    with pytest.raises(UsageError, match="query_cache must be 0"):
        open_index(tmp_path, query_cache=-1)
