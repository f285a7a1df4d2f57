"""``chunkyard serve --watch``: a save is found while clients query; a SIGKILL mid-save converges.

Each answer comes from one committed index: for one ``index_hash``, a query either always
finds the saved document or never does, and the hash moves exactly when the content does.
How fast a save is found is measured in ``bench/serve_load.py --watch``, not here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any
from urllib.parse import quote

from index_support import chunk_state, run_ingest, store_state
from serve_support import (
    CHUNKYARD,
    Client,
    free_port,
    indexed,
    need_serve_stack,
    served,
    start,
    wait_until,
)

need_serve_stack()

WORD = "zanzibarquux"
NEW_DOC = f"# Field notes\n\nThe {WORD} gateway forwards CORS preflight requests.\n"


def writer(client: Client) -> dict[str, Any]:
    status, health = client.get("/v1/health")
    assert status == 200, health
    state: dict[str, Any] = health["writer"]
    return state


def finds(record: dict[str, Any]) -> bool:
    return any(item["file"] == "docs/new.md" for item in record["items"])


def test_a_saved_document_is_found_while_clients_query(tmp_path: Path) -> None:
    corpus, chunks = indexed(tmp_path.parent, tmp_path / "w")
    with served(["--out", str(chunks), "--watch", str(corpus)], tmp_path) as client:
        wait_until(lambda: writer(client)["syncs"] >= 1, 180)
        _, before = client.get("/v1/health")
        seen: dict[tuple[str, str], set[bool]] = defaultdict(set)  # (index_hash, mode) -> found or not
        failures: list[Any] = []
        halt = threading.Event()

        def query(mode: str) -> None:
            while not halt.is_set():
                status, record = client.get(f"/v1/search?q={quote(WORD + ' gateway')}&mode={mode}&k=5")
                if status != 200:
                    failures.append(record)
                    continue
                seen[record["index_hash"], mode].add(finds(record))

        threads = [threading.Thread(target=query, args=(m,)) for m in ("bm25", "hybrid", "bm25", "dense")]
        for t in threads:
            t.start()
        try:
            time.sleep(0.5)
            (corpus / "docs" / "new.md").write_text(NEW_DOC, encoding="utf-8")
            wait_until(lambda: any(True in found for (_, mode), found in seen.items() if mode == "bm25"), 120)
            time.sleep(0.5)
        finally:
            halt.set()
            for t in threads:
                t.join()
        assert not failures, failures[:3]
        old = before["index"]["index_hash"]
        assert seen[old, "bm25"] == seen[old, "hybrid"] == {False}  # the old index never had it
        new = sorted({h for h, _ in seen} - {old})
        assert len(new) == 1  # one commit: the document, its chunks, vectors and BM25 terms together
        # the new index always has it: no answer saw half of the commit
        assert seen[new[0], "bm25"] == seen[new[0], "hybrid"] == {True}
        _, after = client.get("/v1/health")
        assert after["index"]["index_hash"] == new[0]
        assert after["index"]["generation"] == before["index"]["generation"] + 1

        # a save that changes nothing: the writer syncs, the index stays as it is
        syncs = writer(client)["syncs"]
        (corpus / "docs" / "new.md").write_text(NEW_DOC, encoding="utf-8")
        wait_until(lambda: writer(client)["syncs"] > syncs, 60)
        _, same = client.get("/v1/health")
        assert same["index"]["index_hash"] == new[0]
        assert same["index"]["generation"] == after["index"]["generation"]


def test_sigkill_of_serve_watch_mid_save_converges(tmp_path: Path) -> None:
    corpus, chunks = indexed(tmp_path.parent, tmp_path / "k")
    args = ["--out", str(chunks), "--watch", str(corpus)]
    port = free_port()
    proc = start(args, tmp_path, port)
    client = Client(port)
    try:
        wait_until(lambda: _ready(client), 180, proc)
        target = corpus / "docs/en/docs/tutorial/cors.md"
        text = target.read_text(encoding="utf-8")
        target.write_text(text + f"\n## Gateways\n\nThe {WORD} gateway.\n", encoding="utf-8")
        (corpus / "docs" / "new.md").write_text(NEW_DOC, encoding="utf-8")
        time.sleep(0.15)  # the writer has seen the saves and is syncing them
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # serve and its writer, mid-sync
        proc.wait()
    with served(args, tmp_path) as again:
        wait_until(lambda: writer(again)["syncs"] >= 1, 180)
        status, record = again.get(f"/v1/search?q={WORD}&mode=bm25&k=5")
        assert status == 200 and {"docs/new.md", "docs/en/docs/tutorial/cors.md"} <= {
            item["file"] for item in record["items"]
        }
    # the chunks equal a clean run's, the index equals the chunks, and they validate
    clean = tmp_path / "clean"
    assert run_ingest(corpus, clean).exit_code == 0
    ours = chunk_state(chunks)
    assert {cid: h for cid, (_, h, _) in ours.items()} == {
        cid: h for cid, (_, h, _) in chunk_state(clean).items()
    }
    assert store_state(chunks) == ours
    done = subprocess.run(
        [CHUNKYARD, "validate", "--out", str(chunks), "--corpus", str(corpus), "-q"],
        capture_output=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout.decode()[-2000:]


def _ready(client: Client) -> bool:
    try:
        return writer(client)["syncs"] >= 1
    except OSError:
        return False


def test_queries_through_open_index_go_on_during_a_full_rebuild(tmp_path: Path) -> None:
    """``index --rebuild`` builds a new file and swaps it in: every query answers, from the old
    index or the new one (same content, so the same ``index_hash`` and the same hits)."""
    from pipeline import open_index
    from pipeline.index.sync import index

    _, chunks = indexed(tmp_path.parent, tmp_path / "r")
    store = chunks / ".chunkyard" / "index.sqlite"
    with open_index(chunks, workers=3) as handle:
        first = handle.search("CORS preflight max age", k=3)
        inode = store.stat().st_ino
        answers: list[dict[str, Any]] = []
        failures: list[BaseException] = []
        done = threading.Event()

        def ask() -> None:
            while not done.is_set():
                try:
                    answers.append(handle.search("CORS preflight max age", k=3))
                except BaseException as exc:  # noqa: BLE001 - any failure is the finding
                    failures.append(exc)

        threads = [threading.Thread(target=ask) for _ in range(3)]
        for t in threads:
            t.start()
        try:
            index(chunks, rebuild=True)
            time.sleep(0.3)
        finally:
            done.set()
            for t in threads:
                t.join()
        assert store.stat().st_ino != inode  # a new file was swapped in
        assert not failures, failures[:3]
        assert answers
        hits = [[item["chunk_id"] for item in first["items"]]]
        for record in answers:
            assert record["index_hash"] == first["index_hash"]
            assert [item["chunk_id"] for item in record["items"]] == hits[0]
        after = handle.search("CORS preflight max age", k=3)
        assert [item["chunk_id"] for item in after["items"]] == hits[0]
        assert handle.status()["index_hash"] == first["index_hash"]


def test_serve_watch_builds_chunks_and_index_from_nothing(tmp_path: Path) -> None:
    """A new chunk folder: health answers at once, search says ``no_index`` (503) until the
    writer's first sync is indexed, then answers from it."""
    from serve_support import copy_subset, need_corpus

    need_corpus()
    corpus = copy_subset(tmp_path / "corpus")
    chunks = tmp_path / "chunks"
    with served(["--out", str(chunks), "--watch", str(corpus)], tmp_path) as client:
        status, health = client.get("/v1/health")
        assert status == 200 and health["ok"]
        early = client.get("/v1/search?q=cors")
        assert early[0] == 200 or (early[0] == 503 and early[1]["code"] == "no_index"), early
        wait_until(lambda: writer(client)["syncs"] >= 1, 300)
        status, record = client.get("/v1/search?q=" + quote("CORS preflight max age") + "&k=3")
        assert status == 200 and record["items"], record
        assert record["index_hash"] == writer(client)["index_hash"]
        status, health = client.get("/v1/health")
        assert health["index"]["exists"] and health["index"]["chunks"] == len(chunk_state(chunks)) > 0
