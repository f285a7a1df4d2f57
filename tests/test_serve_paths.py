"""``chunkyard serve``'s less travelled paths: an unexpected failure (500 ``internal``), a LanceDB
index, and the query embedder that serve's workers share.

Real components only: a served subprocess on 127.0.0.1, the real ONNX model, a real LanceDB
store; the failure comes from a real request on a chunk file broken on disk, not a mock.
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


def test_an_unexpected_failure_is_a_json_500_and_the_server_keeps_serving(tmp_path: Path) -> None:
    """A chunk file edited by hand into valid JSON of the wrong shape makes ``resolve`` fail in
    a way no error class foresees: the client gets 500 ``internal`` as JSON, without the
    traceback (that goes to the server's log), and every other request is answered as before."""
    corpus, chunks = indexed(tmp_path, tmp_path / "broken")
    with served(["--out", str(chunks), "--corpus", str(corpus)], tmp_path) as server:
        status, record = server.get(
            "/v1/search?q=" + quote("allow credentials with wildcard origins") + "&k=1"
        )
        assert status == 200 and record["items"], record
        victim = record["items"][0]["chunk_file"]
        good = json.loads((chunks / victim).read_text(encoding="utf-8"))
        broken = {**good, "charOffsets": "not an object"}
        (chunks / victim).write_text(json.dumps(broken), encoding="utf-8")

        status, headers, body = server.raw("GET", "/v1/resolve?id=" + quote(victim))
        assert status == 500, body
        assert headers["content-type"] == "application/json"
        answer = json.loads(body)
        assert answer == {
            "ok": False,
            "code": "internal",
            "error": "internal error (details in the server's log)",
            "status": 500,
        }
        assert b"Traceback" not in body and b"charOffsets" not in body
        assert server.proc is not None
        log = stderr_of(server.proc)
        assert "TypeError" in log  # the details are in the server's log

        status, health = server.get("/v1/health")
        assert status == 200 and health["ok"]
        (chunks / victim).write_text(json.dumps(good), encoding="utf-8")  # mended: answered again
        status, resolved = server.get("/v1/resolve?id=" + quote(victim))
        assert status == 200 and resolved["snippet_id"] == good["chunk_id"], resolved
        status, again = server.get(
            "/v1/search?q=" + quote("allow credentials with wildcard origins") + "&k=1"
        )
        assert status == 200 and again["items"][0]["chunk_id"] == record["items"][0]["chunk_id"]
        _, _, metrics = server.raw("GET", "/metrics")
        assert 'chunkyard_requests_total{code="500",route="/v1/resolve"} 1.0' in metrics.decode()


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
