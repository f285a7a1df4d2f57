"""``chunkyard serve --processes N``: several server processes on one port, answering as one.

Real components only: ``chunkyard serve`` as a subprocess on 127.0.0.1 (uvicorn's supervisor
spawning real server processes), the real ONNX model and SQLite index, a plain HTTP client.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import time
from pathlib import Path
from urllib.parse import quote

from serve_support import CHUNKYARD, gold_questions, indexed, need_serve_stack, served, without_volatile

need_serve_stack()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_two_processes_answer_as_one_server_and_stop_together(tmp_path: Path) -> None:
    """Both processes answer (health names the process), every answer equals ``chunkyard
    search --json``'s whichever process gave it, ``/metrics`` counts the requests of both, and
    a SIGTERM to the parent stops every process."""
    corpus, chunks = indexed(tmp_path, tmp_path / "two")
    questions = [row["question"] for row in gold_questions()][:3]
    with served(["--out", str(chunks), "--corpus", str(corpus), "--processes", "2"], tmp_path) as server:
        seen: set[int] = set()
        deadline = time.monotonic() + 120
        while len(seen) < 2 and time.monotonic() < deadline:  # a fresh connection each: any process may take it
            status, health = server.get("/v1/health")
            assert status == 200 and health["ok"] and health["index"]["exists"], health
            seen.add(int(health["process"]))
        assert len(seen) == 2, seen
        assert server.proc is not None and server.proc.pid not in seen  # the parent only supervises

        searches = 0
        for question in questions:
            cli = subprocess.run(
                [CHUNKYARD, "search", question, "--out", str(chunks), "-k", "5", "--json"],
                capture_output=True,
                check=True,
            )
            expected = without_volatile(json.loads(cli.stdout))
            for _ in range(4):
                status, record = server.get(f"/v1/search?q={quote(question)}&k=5")
                searches += 1
                assert status == 200 and without_volatile(record) == expected, question
        _, _, metrics = server.raw("GET", "/metrics")
        text = metrics.decode()
        assert f'chunkyard_requests_total{{code="200",route="/v1/search"}} {searches}.0' in text, text[-2000:]
        assert "chunkyard_index_chunks" in text
    assert server.proc is not None and server.proc.returncode is not None
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in seen) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in seen), seen


def test_processes_with_stdio_is_refused(tmp_path: Path) -> None:
    """``--processes`` > 1 with ``--mcp stdio`` (one process's standard streams): exit 2, and why."""
    done = subprocess.run(
        [CHUNKYARD, "serve", "--out", str(tmp_path), "--processes", "2", "--mcp", "stdio"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done
    assert "--processes 2 with --mcp stdio" in done.stderr, done.stderr


def test_processes_with_watch_find_a_save_in_every_process(tmp_path: Path) -> None:
    """``--processes 2 --watch``: the supervisor runs the one writer; a saved document is found
    by both processes, and each one's ``/v1/health`` reports the writer's runs."""
    corpus, chunks = indexed(tmp_path.parent, tmp_path / "pw")
    word = "quixoticzebra"
    args = ["--out", str(chunks), "--watch", str(corpus), "--processes", "2"]
    with served(args, tmp_path) as server:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            status, health = server.get("/v1/health")
            if status == 200 and health["writer"] and health["writer"]["syncs"] >= 1:
                break
            time.sleep(0.2)
        assert health["writer"]["alive"] and health["writer"]["syncs"] >= 1, health
        (corpus / "docs" / "zebra.md").write_text(f"# Zebra\n\nThe {word} relay signs each request.\n")
        # the processes that found the save, and those that report the run that indexed it: the
        # writer commits the index before it reports the run, so a process may find the save a
        # moment before its health says so; both must come, in every process
        found: set[int] = set()
        reported: set[int] = set()
        deadline = time.monotonic() + 180
        while (len(found) < 2 or len(reported) < 2) and time.monotonic() < deadline:
            # one connection: the process that says who it is answers the search too
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
            try:
                conn.request("GET", f"/v1/search?q={word}&mode=bm25&k=3")
                record = json.loads(conn.getresponse().read())
                conn.request("GET", "/v1/health")
                health = json.loads(conn.getresponse().read())
            finally:
                conn.close()
            process = int(health["process"])
            if any(item["file"] == "docs/zebra.md" for item in record["items"]):
                found.add(process)
            if health["writer"]["syncs"] >= 2:
                reported.add(process)
            time.sleep(0.05)
        assert len(found) == 2, found
        assert len(reported) == 2, (reported, health)


def test_the_shared_listener_gives_connections_without_nagles_delay() -> None:
    """The socket the processes share says TCP, so asyncio sets ``TCP_NODELAY`` on each
    connection it accepts (uvicorn's own ``bind_socket`` does not: every answer on a kept-alive
    connection after the first then waited about 40 ms for the client's delayed ACK)."""
    import asyncio
    import socket

    import uvicorn

    from pipeline.serve.processes import tcp_listener

    async def nodelay_of_an_accepted_connection(listener: socket.socket) -> int:
        accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def on_connect(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            sock = writer.get_extra_info("socket")
            accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(on_connect, sock=listener)
        try:
            _, writer = await asyncio.open_connection(*listener.getsockname()[:2])
            value = await asyncio.wait_for(accepted, 10)
            writer.close()
            return value
        finally:
            server.close()
            await server.wait_closed()

    bare = uvicorn.Config("pipeline.serve.processes:process_app", host="127.0.0.1", port=0).bind_socket()
    assert bare.proto == 0  # the premise: without tcp_listener, Nagle stays on
    assert asyncio.run(nodelay_of_an_accepted_connection(bare)) == 0
    listener = tcp_listener(
        uvicorn.Config("pipeline.serve.processes:process_app", host="127.0.0.1", port=0).bind_socket()
    )
    assert listener.proto == socket.IPPROTO_TCP and listener.get_inheritable()
    assert asyncio.run(nodelay_of_an_accepted_connection(listener)) != 0
