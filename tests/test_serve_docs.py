"""Every example of docs/serve.md runs: its ``shell`` blocks against a real server, its MCP config.

(``sh`` and ``python`` blocks run in ``tests/test_docs.py`` like every page's.) A ``shell``
block starts its ``chunkyard serve`` line on a free port (in place of 8750), runs each
``curl`` line with the real curl, and checks that the answer is JSON (Prometheus text for
``/metrics``) with the ``code`` its comment names; a line commented ``refused: exit 2``
must exit 2 without serving.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest
from serve_support import CHUNKYARD, ROOT, need_serve_stack, served

need_serve_stack()
from mcp import Client as McpClient
from mcp.client.stdio import StdioServerParameters

PAGE = ROOT / "docs" / "serve.md"
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks(lang: str) -> list[str]:
    return [body for kind, body in _FENCE.findall(PAGE.read_text(encoding="utf-8")) if kind == lang]


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pipeline.api import ingest, update_index

    root = tmp_path_factory.mktemp("serve-docs")
    shutil.copytree(ROOT / "corpus", root / "corpus")
    assert ingest(root / "corpus", root / "chunks").exit_code == 0
    update_index(root / "chunks")
    return root


def test_the_page_has_what_it_promises() -> None:
    shell = blocks("shell")
    assert len(shell) >= 4
    assert all(block.splitlines()[0].startswith("chunkyard serve") for block in shell)
    assert sum(line.startswith("curl ") for block in shell for line in block.splitlines()) >= 12


@pytest.mark.parametrize("number", range(len(blocks("shell"))))
def test_every_shell_block_runs(number: int, sandbox: Path) -> None:
    lines = [line for line in blocks("shell")[number].splitlines() if line.strip()]
    serve, curls = shlex.split(lines[0], comments=True), lines[1:]
    assert serve[:2] == ["chunkyard", "serve"]
    if "refused: exit 2" in lines[0]:
        done = subprocess.run(
            [CHUNKYARD, *serve[1:], "--port", "1"], cwd=sandbox, capture_output=True, check=False, timeout=120
        )
        assert done.returncode == 2 and "--token" in done.stderr.decode()
        assert not curls
        return
    with served(serve[2:], sandbox) as client:
        for line in curls:
            check_curl(line, client.port, sandbox)


def check_curl(line: str, port: int, sandbox: Path) -> None:
    words = shlex.split(line.replace("8750", str(port)), comments=True)
    assert words[0] == "curl"
    done = subprocess.run(words, cwd=sandbox, capture_output=True, check=False, timeout=120)
    assert done.returncode == 0, (line, done.stderr)
    body = done.stdout.decode()
    if "/metrics" in line:
        assert "chunkyard_requests_total" in body and "chunkyard_index_chunks" in body
        return
    answer: Any = json.loads(body)
    wanted = re.search(r"#\s*code: (\w+)", line)
    if wanted:
        assert answer["code"] == wanted.group(1) and answer["ok"] is False, (line, answer)
    elif isinstance(answer, dict):
        assert answer.get("ok", True) is not False, (line, answer)
        if "/v1/search" in line:
            assert answer["items"] and answer["event"] == "retrieve.run"


def test_the_error_example_is_what_the_server_says(sandbox: Path) -> None:
    example = json.loads(blocks("json")[0])
    with served(["--out", "chunks"], sandbox) as client:
        status, answer = client.get("/v1/chunk?id=../../etc/passwd")
    assert status == example["status"] and answer == example


def test_the_desktop_client_config_launches_the_server(sandbox: Path) -> None:
    config = json.loads(blocks("json")[1])["mcpServers"]["chunkyard"]
    assert config["command"] == "chunkyard"
    args = [str(sandbox / "chunks") if a == "/path/to/chunks" else a for a in config["args"]]
    params = StdioServerParameters(command=CHUNKYARD, args=args, cwd=str(sandbox))

    async def tools() -> list[str]:
        async with McpClient(params, read_timeout_seconds=180) as client:
            found = await client.call_tool("search", {"query": "how long may a chunk be", "k": 1})
            assert not found.is_error and found.structured_content["items"]
            return sorted(tool.name for tool in (await client.list_tools()).tools)

    assert anyio.run(tools) == ["check_citations", "get_chunk", "resolve", "search"]
