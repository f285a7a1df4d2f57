"""``chunkyard serve`` as a subprocess on 127.0.0.1: every route, MCP over stdio and HTTP, hostile requests.

Real components only: the ONNX embedder, the SQLite index, uvicorn, the official ``mcp``
SDK's own client. Search answers are compared with ``chunkyard search --json`` for the
gold questions of the corpus subset (``serve_support``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import pytest
from serve_support import (
    CHUNKYARD,
    Client,
    gold_questions,
    indexed,
    need_serve_stack,
    served,
    without_volatile,
)

need_serve_stack()
from mcp import Client as McpClient
from mcp.client.stdio import StdioServerParameters


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("serve")
    return indexed(root, root / "one")


@pytest.fixture(scope="module")
def server(folders: tuple[Path, Path]) -> Any:
    corpus, chunks = folders
    with served(["--out", str(chunks), "--corpus", str(corpus)], chunks.parent) as client:
        yield client


def cli_search(chunks: Path, query: str, *options: str) -> dict[str, Any]:
    done = subprocess.run(
        [CHUNKYARD, "search", query, "--out", str(chunks), "--json", *options],
        capture_output=True,
        check=True,
        cwd=chunks.parent,
    )
    record: dict[str, Any] = json.loads(done.stdout)
    return record


def first_hit(server: Client, query: str = "allow credentials with wildcard origins") -> dict[str, Any]:
    status, record = server.get(f"/v1/search?q={quote(query)}&k=3")
    assert status == 200, record
    assert record["items"], record
    hit: dict[str, Any] = record["items"][0]
    return hit


# --- the JSON API ---------------------------------------------------------------------------


def test_search_equals_the_cli_for_the_gold_questions(server: Client, folders: tuple[Path, Path]) -> None:
    _, chunks = folders
    questions = [q for q in gold_questions() if q["id"] in ("f01", "f14", "f57", "f93", "f126")]
    assert len(questions) == 5
    for q in questions:
        status, record = server.get(f"/v1/search?q={quote(q['question'])}")
        assert status == 200, record
        assert without_volatile(record) == without_volatile(cli_search(chunks, q["question"])), q["id"]
        assert any(item["file"] == q["source"] for item in record["items"]), q["id"]


def test_search_options_equal_the_cli(server: Client, folders: tuple[Path, Path]) -> None:
    _, chunks = folders
    query = "middleware for allowed origins"
    status, bm25 = server.post("/v1/search", {"query": query, "k": 3, "mode": "bm25", "no_expand": True})
    assert status == 200, bm25
    assert without_volatile(bm25) == without_volatile(
        cli_search(chunks, query, "-k", "3", "--mode", "bm25", "--no-expand")
    )
    assert bm25["ranker"] == "bm25" and bm25["expand_tokens"] == 0 and len(bm25["items"]) == 3
    status, dense = server.get(f"/v1/search?q={quote(query)}&k=2&mode=dense&expand=200")
    assert status == 200 and dense["ranker"] == "dense" and dense["expand_tokens"] == 200
    assert without_volatile(dense) == without_volatile(
        cli_search(chunks, query, "-k", "2", "--mode", "dense", "--expand", "200")
    )


@pytest.mark.parametrize("processes", ["1", "2"])
def test_serve_dense_weight_ranks_as_the_cli_with_it(folders: tuple[Path, Path], processes: str) -> None:
    """``serve --dense-weight W`` (one process, or each of several) fuses hybrid search as
    ``search --dense-weight W`` does, and its records say so."""
    corpus, chunks = folders
    query = "middleware for allowed origins"
    args = ["--out", str(chunks), "--corpus", str(corpus), "--dense-weight", "0.3", "--processes", processes]
    with served(args, chunks.parent) as client:
        status, record = client.get(f"/v1/search?q={quote(query)}&k=4")
    assert status == 200, record
    assert record["weights"] == {"bm25": 1.0, "dense": 0.3}
    assert without_volatile(record) == without_volatile(cli_search(chunks, query, "-k", "4", "--dense-weight", "0.3"))
    assert without_volatile(record) != without_volatile(cli_search(chunks, query, "-k", "4"))


def test_chunk_by_every_id_form_and_resolve(server: Client) -> None:
    hit = first_hit(server)
    status, by_chunk_id = server.get(f"/v1/chunk?id={quote(hit['chunk_id'])}")
    assert status == 200, by_chunk_id
    record = by_chunk_id["record"]
    assert record["chunk_id"] == hit["chunk_id"] and by_chunk_id["redirected_from"] is None
    for other in (record["id"], by_chunk_id["chunk_file"]):
        status, again = server.get(f"/v1/chunk?id={quote(other)}")
        assert status == 200 and again["record"] == record, other
    status, resolved = server.get(f"/v1/resolve?id={quote(hit['chunk_id'])}&context=2")
    assert status == 200, resolved
    assert resolved["snippet_id"] == hit["chunk_id"] and resolved["source_status"] == "current"
    inside = [line["text"] for line in resolved["lines"] if line["inside"]]
    assert "\n".join(inside).strip() == record["originalText"].strip()
    assert len(resolved["lines"]) > len(inside)  # the context lines


def test_check_citations_accepts_a_hit_as_copied(server: Client) -> None:
    hit = first_hit(server)
    status, report = server.post("/v1/check-citations", {"citations": [hit]})
    assert status == 200 and report["ok"] is True and report["code"] == "ok", report
    status, bare = server.post("/v1/check-citations", [hit])
    assert status == 200 and bare["ok"] is True
    status, wrong = server.post("/v1/check-citations", {"citations": [{**hit, "rev": "0000000"}]})
    assert status == 200 and wrong["ok"] is False and wrong["code"] == "rev_mismatch"
    status, other = server.post("/v1/check-citations", {"citations": [{**hit, "index_hash": "sqlite-vec:0"}]})
    assert other["code"] == "mismatch_index_hash"


def test_health_documents_metrics_openapi(server: Client) -> None:
    status, health = server.get("/v1/health")
    assert status == 200 and health["ok"] and health["index"]["chunks"] > 0
    assert health["index"]["index_hash"].startswith("sqlite-vec:")
    status, docs = server.get("/v1/documents")
    assert status == 200 and len(docs) == 6
    assert {d["path"] for d in docs} >= {"docs/en/docs/tutorial/cors.md"}
    first_hit(server)
    status, headers, body = server.raw("GET", "/metrics")
    text = body.decode()
    assert status == 200 and headers["content-type"].startswith("text/plain")
    assert 'chunkyard_requests_total{code="200",route="/v1/search"}' in text
    assert 'chunkyard_request_seconds_bucket{le="0.25",route="/v1/search"}' in text
    assert f"chunkyard_index_chunks {float(health['index']['chunks'])}" in text
    assert "chunkyard_index_bytes" in text
    status, spec = server.get("/openapi.json")
    assert status == 200
    assert {"/v1/search", "/v1/chunk", "/v1/resolve", "/v1/check-citations", "/v1/health"} <= set(
        spec["paths"]
    )


# --- hostile requests -----------------------------------------------------------------------


def refused(answer: tuple[int, Any], status: int, code: str) -> None:
    got_status, body = answer
    assert got_status == status and body["code"] == code and body["ok"] is False, body
    assert "Traceback" not in json.dumps(body)


def test_hostile_requests_get_json_errors_and_the_server_keeps_serving(server: Client) -> None:
    refused(server.get("/v1/chunk?id=" + quote("../../../etc/passwd")), 400, "bad_id")
    refused(server.get("/v1/chunk?id=" + quote("/etc/passwd")), 400, "bad_id")
    refused(server.get("/v1/resolve?id=" + quote("docs/../../secret.json")), 400, "bad_id")
    refused(server.get("/v1/chunk?id=" + quote("nope|r=0|s=1")), 404, "unknown_id")
    refused(server.get("/v1/search?q=" + "a" * 100_000), 400, "query_too_long")
    refused(server.post("/v1/search", {"query": "b" * 100_000}), 400, "query_too_long")
    refused(server.get("/v1/search?q=x&k=0"), 400, "bad_k")
    refused(server.get("/v1/search?q=x&k=100000"), 400, "bad_k")
    refused(server.get("/v1/search?q=x&mode=evil"), 400, "bad_request")
    refused(server.get("/v1/search"), 400, "bad_request")
    refused(server.get("/v1/resolve?id=x&context=-1"), 400, "bad_context")
    status, _, body = server.raw("GET", b"/v1/search?q=%ff%fe")
    refused((status, json.loads(body)), 400, "bad_utf8")
    status, _, body = server.raw(
        "POST", "/v1/search", b'{"query": "\xff\xfe"}', {"Content-Type": "application/json"}
    )
    refused((status, json.loads(body)), 400, "bad_utf8")
    status, _, body = server.raw("POST", "/v1/search", b'{"query": ', {"Content-Type": "application/json"})
    refused((status, json.loads(body)), 400, "bad_request")
    status, _, body = server.raw(
        "POST", "/v1/check-citations", b"[" * 3_000_000, {"Content-Type": "application/json"}
    )
    refused((status, json.loads(body)), 413, "body_too_large")
    refused(server.get("/no/such/route"), 404, "not_found")
    status, _, body = server.raw("DELETE", "/v1/search")
    refused((status, json.loads(body)), 405, "method_not_allowed")
    script = "<script>alert(1)</script>"
    status, headers, body = server.raw("GET", "/v1/search?q=" + quote(script))
    assert status == 200 and headers["content-type"] == "application/json"
    assert json.loads(body)["query"] == script
    status, headers, _ = server.raw("GET", "/docs")  # no HTML route: nothing renders a query as markup
    assert status == 404 and headers["content-type"] == "application/json"
    status, health = server.get("/v1/health")
    assert status == 200 and health["ok"]
    assert first_hit(server)["chunk_id"]


def test_a_token_guards_every_route(folders: tuple[Path, Path]) -> None:
    corpus, chunks = folders
    with served(
        ["--out", str(chunks), "--corpus", str(corpus), "--token", "s3cret"], chunks.parent
    ) as client:
        status, body = client.get("/v1/health")
        assert status == 200 and body["ok"]
        anonymous = Client(client.port)
        for path in ("/v1/health", "/v1/search?q=cors", "/metrics", "/openapi.json"):
            refused(anonymous.get(path), 401, "unauthorized")
        refused(Client(client.port, "wrong").get("/v1/search?q=cors"), 401, "unauthorized")


def test_a_non_loopback_bind_needs_a_token(folders: tuple[Path, Path]) -> None:
    _, chunks = folders
    done = subprocess.run(
        [CHUNKYARD, "serve", "--out", str(chunks), "--host", "0.0.0.0", "--port", "1"],
        capture_output=True,
        check=False,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "CHUNKYARD_SERVE_TOKEN"},
    )
    assert done.returncode == 2
    assert "--token" in done.stderr.decode() and "--insecure" in done.stderr.decode()


# --- MCP ------------------------------------------------------------------------------------


async def drive_mcp(client: McpClient) -> dict[str, Any]:
    """Every tool and resource through the SDK's client; what each answered."""
    async with client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert set(tools) == {"search", "get_chunk", "resolve", "check_citations"}
        assert "snippet_id" in (tools["search"].description or "")
        found = await client.call_tool("search", {"query": "allow credentials with wildcard origins", "k": 3})
        assert not found.is_error, found
        record = found.structured_content
        hit = record["items"][0]
        got = await client.call_tool("get_chunk", {"id": hit["chunk_id"]})
        resolved = await client.call_tool("resolve", {"id": hit["chunk_id"], "context": 1})
        checked = await client.call_tool("check_citations", {"answer": {"citations": [hit]}})
        bad = await client.call_tool("get_chunk", {"id": "../../etc/passwd"})
        templates = (await client.list_resource_templates()).resource_templates
        listing = await client.read_resource("chunkyard://documents")
        docs = json.loads(listing.contents[0].text)
        document = await client.read_resource(docs[0]["uri"])
        return {
            "record": record,
            "hit": hit,
            "get": got.structured_content,
            "resolve": resolved.structured_content,
            "check": checked.structured_content,
            "bad": bad,
            "templates": [t.uri_template for t in templates],
            "docs": docs,
            "document": document.contents[0].text,
        }


def check_mcp_answers(seen: dict[str, Any], corpus: Path) -> None:
    hit = seen["hit"]
    assert seen["record"]["event"] == "retrieve.run" and hit["file"] == "docs/en/docs/tutorial/cors.md"
    assert seen["get"]["record"]["chunk_id"] == hit["chunk_id"]
    assert seen["resolve"]["snippet_id"] == hit["chunk_id"] and seen["resolve"]["lines"]
    assert seen["check"]["ok"] is True and seen["check"]["code"] == "ok"
    assert seen["bad"].is_error and "bad_id" in seen["bad"].content[0].text
    assert "chunkyard://doc/{+path}" in seen["templates"]
    assert len(seen["docs"]) == 6
    assert seen["document"] == (corpus / seen["docs"][0]["path"]).read_text(encoding="utf-8")


def test_mcp_over_streamable_http(server: Client, folders: tuple[Path, Path]) -> None:
    corpus, _ = folders
    seen = anyio.run(drive_mcp, McpClient(f"http://127.0.0.1:{server.port}/mcp", read_timeout_seconds=120))
    check_mcp_answers(seen, corpus)
    status, health = server.get("/v1/health")  # the JSON API still answers beside it
    assert status == 200 and health["ok"]


def test_mcp_over_stdio(folders: tuple[Path, Path]) -> None:
    corpus, chunks = folders
    params = StdioServerParameters(
        command=CHUNKYARD, args=["serve", "--out", str(chunks), "--corpus", str(corpus), "--mcp", "stdio"]
    )
    seen = anyio.run(drive_mcp, McpClient(params, read_timeout_seconds=180))
    check_mcp_answers(seen, corpus)


def test_the_web_stack_loads_only_for_serve() -> None:
    code = (
        "import sys, pipeline.cli.app, pipeline.serve.handle; from pipeline import open_index; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('fastapi', 'starlette', 'uvicorn', 'mcp', 'prometheus_client', 'pydantic')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
    helped = subprocess.run([CHUNKYARD, "serve", "--help"], capture_output=True, text=True, check=True)
    assert "--watch" in helped.stdout and "--token" in helped.stdout and "--mcp" in helped.stdout


@pytest.mark.parametrize(
    "address",
    [
        "../x.json",
        "a/../../b",
        "/etc/passwd",
        "C:\\\\Windows",
        "..\\\\..\\\\boot.ini",
        "x\x00y",
        "a\nb",
        "z" * 2000,
        " ",
    ],
)
def test_addresses_that_could_leave_the_folder_are_refused(address: str) -> None:
    from pipeline.serve.handle import BadIdError, check_address

    with pytest.raises(BadIdError):
        check_address(address)


def test_ids_pass_as_they_are() -> None:
    from pipeline.serve.handle import check_address

    for ok in (
        "guide|r=abc|s=1.2|p=000|b=000",
        "doc:guides/setup::ch3",
        "guides/doc_setup__ch3.json",
        "a..b.md",
    ):
        assert check_address(f" {ok} ") == ok


def test_only_loopback_binds_go_without_a_token() -> None:
    from pipeline.cli.serve import check_bind, is_loopback
    from pipeline.errors import UsageError

    assert all(is_loopback(h) for h in ("127.0.0.1", "127.8.0.1", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "192.168.1.4", "example.com", "10.0.0.1"))
    check_bind("0.0.0.0", "s3cret", False)
    check_bind("0.0.0.0", None, True)
    with pytest.raises(UsageError, match="--token"):
        check_bind("0.0.0.0", None, False)
