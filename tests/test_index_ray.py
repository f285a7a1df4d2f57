"""``index --executor ray`` on a real two-node Ray cluster, on loopback only (issue 30).

The cluster (a head and one more node, one CPU each) lives in a network and PID namespace
of its own (``ray_support.LoopbackCluster``); the tests skip, and say why, where
``unshare`` is not permitted (CI runs as root: there they run). The corpus is the first
chapters of rust-book (a few hundred chunks: the ONNX model on these 2 cores is the cost).
What they prove:

- the index the actors embed is the local one: the same chunk ids, vectors within cosine
  1e-6, the same ``index_hash``, the same ``search --json`` records for every rust-book gold
  question; both nodes embedded texts;
- a node killed mid-index (its raylet and workers SIGKILLed while it embeds): the index
  completes, the same again, its lost batches re-sent, each chunk written once;
- a batch the embedder refuses (an OpenAI-compatible server that refuses long inputs) is
  reported with its chunk ids and the reason, exit 2, not retried; the index is unchanged;
- Ctrl-C stops the run with the old index searchable; the next run completes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import need_corpora
from kill_support import wait_thawed
from ray_support import BIN, LoopbackCluster, running_cluster, skip_without_namespaces

from pipeline.index.query import Searcher
from pipeline.index.sync import index
from pipeline.run.ingest import Options, ingest

pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[ray]')")
pytest.importorskip("sqlite_vec", reason="the index extra is not installed (pip install -e '.[index]')")

#: A two-node cluster embedding ~100 chunks twice over: minutes on a loaded machine, past the
#: suite's per-test limit (a guard against hangs, not a speed goal).
pytestmark = [pytest.mark.corpora, pytest.mark.slow, pytest.mark.timeout(900)]

GOLD = Path(__file__).resolve().parents[1] / "bench" / "gold" / "rust-book.jsonl"
#: rust-book's first two chapters (~100 chunks): enough batches to kill a node between two of them.
CHAPTERS = ("ch01", "ch02")


@pytest.fixture(scope="module")
def cluster() -> Iterator[LoopbackCluster]:
    with running_cluster() as c:
        yield c


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with ``corpus`` (rust-book's first chapters), ``chunks`` and ``local`` (chunks
    indexed in this process): each test copies ``chunks`` and indexes the copy on Ray."""
    root = tmp_path_factory.mktemp("ray-index")
    src = need_corpora() / "rust-book" / "src"  # module-scoped: corpora_dir is per test
    corpus = root / "corpus" / "src"
    corpus.mkdir(parents=True)
    for path in sorted(src.glob("*.md")):
        if path.name.startswith(CHAPTERS):
            shutil.copy2(path, corpus / path.name)
    ingest(Options(corpus=root / "corpus", out=root / "chunks", jobs=1))
    shutil.copytree(root / "chunks", root / "local")
    report = index(root / "local")
    assert report.embedded == report.chunks > 90
    return root


def copy_chunks(indexed: Path, dest: Path) -> Path:
    shutil.copytree(indexed / "chunks", dest)
    return dest


def ray_index(cluster: LoopbackCluster, out: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    proc = cluster.run(cluster.chunkyard("index", "--out", str(out), "--json", *args))
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"no JSON report (exit {proc.returncode}): {proc.stdout[-1000:]}\n{proc.stderr[-3000:]}")
    return proc.returncode, report, proc.stderr


# -- what two indexes must share ------------------------------------------------------------


def vectors(out: Path) -> dict[str, list[float]]:
    """chunk id → its vector, read from the SQLite store's vec0 table."""
    import apsw
    import numpy as np
    import sqlite_vec

    conn = apsw.Connection(str(out / ".chunkyard" / "index.sqlite"))
    conn.enable_load_extension(True)
    conn.load_extension(sqlite_vec.loadable_path())
    try:
        rows = conn.execute("SELECT chunk_id, embedding FROM vectors").fetchall()
    finally:
        conn.close()
    return {cid: np.frombuffer(blob, dtype=np.float32).tolist() for cid, blob in rows}


def gold_records(out: Path) -> list[dict[str, Any]]:
    """``search --json``'s record for every rust-book gold question (one searcher, in order)."""
    questions = [json.loads(line)["question"] for line in GOLD.read_text().splitlines() if line.strip()]
    with Searcher(out, None, None) as searcher:
        return [_stable(searcher.record(q, 10, "hybrid")) for q in questions]


#: What differs between two runs of one query: its time stamp and its trace id.
VOLATILE = ("ts", "trace_id")


def _stable(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in VOLATILE}


def assert_same_index(want: Path, got: Path, want_report: dict[str, Any], got_report: dict[str, Any]) -> None:
    import numpy as np

    assert got_report["index_hash"] == want_report["index_hash"]
    assert got_report["chunks"] == want_report["chunks"]
    a, b = vectors(want), vectors(got)
    assert a.keys() == b.keys() and len(a) == want_report["chunks"]
    worst = min(float(np.dot(a[cid], b[cid])) for cid in a)  # unit vectors: cosine = dot
    assert worst >= 1 - 1e-6, f"a vector differs: cosine {worst}"
    assert gold_records(want) == gold_records(got)


def local_report(indexed: Path) -> dict[str, Any]:
    """The local index's figures, as ``index --json`` gives them (a no-op run reads them)."""
    return index(indexed / "local").as_dict()


# -- the same index -------------------------------------------------------------------------


def test_ray_actors_build_the_local_index(cluster: LoopbackCluster, indexed: Path, tmp_path: Path) -> None:
    out = copy_chunks(indexed, tmp_path / "chunks")
    code, got, stderr = ray_index(cluster, out, "--batch-size", "16")
    assert code == 0, stderr[-3000:]
    want = local_report(indexed)
    assert got["embedded"] == got["chunks"] == want["chunks"]
    where = got["embedded_on"]
    assert where["executor"] == "ray" and where["resent"] == 0
    assert sum(where["texts_by_node"].values()) == got["embedded"]
    assert len(where["texts_by_node"]) == 2, where  # both nodes embedded
    assert set(where["device_by_node"].values()) == {"cpu"}
    assert_same_index(indexed / "local", out, want, got)
    code, again, _ = ray_index(cluster, out)
    assert code == 0 and again["embedded"] == 0 and again["embedded_on"] == {}  # nothing to do: no Ray


def test_by_default_one_actor_takes_a_whole_node(indexed: Path, tmp_path: Path) -> None:
    """A node of two CPUs gets one actor of two CPUs, not two of one (one model load; its
    embedder runs a single-thread session per CPU), and the index is the local one."""
    from ray_support import FENCES, HEAD_PORT

    skip_without_namespaces()
    out = copy_chunks(indexed, tmp_path / "chunks")
    c = LoopbackCluster(nodes=0)  # the namespace only: a head of two CPUs started here
    try:
        fences = FENCES.replace("--num-cpus=1", "--num-cpus=2").split()
        started = c.run(
            [str(BIN / "ray"), "start", "--head", f"--port={HEAD_PORT}", *fences,
             "--include-dashboard=false", f"--temp-dir={c.temp}/head"]
        )  # fmt: skip
        assert started.returncode == 0, started.stderr[-2000:]
        code, got, stderr = ray_index(c, out, "--batch-size", "16")
    finally:
        c.close()
    assert code == 0, stderr[-3000:]
    where = got["embedded_on"]
    assert where["actors"] == 1 and len(where["texts_by_node"]) == 1, where
    assert got["embedded"] == got["chunks"] and where["batches"] > 1
    assert_same_index(indexed / "local", out, local_report(indexed), got)


# -- faults ---------------------------------------------------------------------------------


def cached(out: Path) -> int:
    """Vectors in the store's embedding cache (committed batch by batch as they come back)."""
    path = out / ".chunkyard" / "index.sqlite"
    if not path.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as conn:
            return int(conn.execute("SELECT count(*) FROM embed_cache").fetchone()[0])
    except sqlite3.Error:  # the run is still creating its tables
        return 0


def wait_for(condition: Any, proc: subprocess.Popen[str], what: str) -> None:
    while not condition():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the run ended before {what}: exit {proc.returncode}\n{out[-500:]}\n{err[-3000:]}")
        time.sleep(0.02)


def committed_rows(out: Path) -> int:
    """Chunk rows the index holds (0 when there is no index yet)."""
    path = out / ".chunkyard" / "index.sqlite"
    if not path.exists():
        return 0
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as conn:
        return int(conn.execute("SELECT count(*) FROM chunks").fetchone()[0])


def stop(proc: subprocess.Popen[str]) -> None:
    """End a process started in the namespace: nsenter's child first (killing nsenter leaves it)."""
    with contextlib.suppress(OSError, IndexError, ValueError):
        child = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])
        os.kill(child, signal.SIGKILL)
    proc.kill()
    proc.communicate(timeout=60)


def embedding_workers(cluster: LoopbackCluster, raylet: int) -> list[int]:
    """That raylet's worker processes holding an embedding actor (Ray retitles them ``ray::EmbedActor``)."""
    from ray_support import _cmdline, _pids, _ppid

    return [p for p in _pids() if _ppid(p) == raylet and "ray::EmbedActor" in " ".join(_cmdline(p))]


def test_a_node_killed_mid_index_changes_nothing(indexed: Path, tmp_path: Path) -> None:
    skip_without_namespaces()
    out = copy_chunks(indexed, tmp_path / "chunks")
    want = local_report(indexed)
    c = LoopbackCluster()
    try:
        raylet = c.raylet_pid(1)
        run = c.start(c.chunkyard("index", "--out", str(out), "--json", "--batch-size", "8"))
        # the moment: several batches are back (both actors answered), the second node's actor is up
        wait_for(lambda: cached(out) >= 32, run, "the first batches came back")
        wait_for(lambda: bool(embedding_workers(c, raylet)), run, "the second node held an actor")
        at_kill = cached(out)
        c.kill_node(raylet)
        stdout, stderr = run.communicate(timeout=600)
    finally:
        c.close()
    assert run.returncode == 0, stderr[-3000:]
    got = json.loads(stdout)
    assert at_kill < want["chunks"]  # it was killed mid-index
    where = got["embedded_on"]
    assert len(where["texts_by_node"]) == 2, where  # the killed node had embedded batches
    assert where["resent"] >= 1, where  # its batch in flight went to the other actor
    assert got["embedded"] == sum(where["texts_by_node"].values()) == want["chunks"]  # each text once
    assert_same_index(indexed / "local", out, want, got)


def test_a_batch_the_embedder_refuses_is_reported_not_retried(
    cluster: LoopbackCluster, indexed: Path, tmp_path: Path
) -> None:
    out = copy_chunks(indexed, tmp_path / "chunks")
    server = cluster.start(
        [str(BIN / "python"), "-m", "pipeline.index.serve_embeddings", "--port", "0", "--max-input-tokens", "60"]
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert line.startswith("serving "), line + (server.stderr.read() if server.stderr else "")
        url = line.split(" on ", 1)[1].strip()
        started = time.monotonic()
        code, got, stderr = ray_index(cluster, out, "--embedder", f"openai:all-MiniLM-L6-v2@{url}")
        took = time.monotonic() - started
    finally:
        stop(server)
    assert code == 2, stderr[-3000:]
    assert got["ok"] is False and "refused a batch" in got["error"]
    assert "maximum context length is 60 tokens" in got["error"]
    from pipeline.stages.wordpiece import count_wordpieces

    records = [json.loads(p.read_bytes()) for p in out.rglob("*.json") if ".chunkyard" not in p.parts]
    long_ids = [rec["chunk_id"] for rec in records if count_wordpieces(rec["embedText"]) > 60]
    assert long_ids and any(cid in got["error"] for cid in long_ids)  # the chunk ids are named
    assert took < 240  # not retried forever
    assert committed_rows(out) == 0  # nothing committed


def test_ctrl_c_keeps_the_old_index_searchable(
    cluster: LoopbackCluster, indexed: Path, tmp_path: Path, corpora_dir: Path
) -> None:
    root = tmp_path / "edited"
    shutil.copytree(indexed / "corpus", root / "corpus")
    shutil.copytree(indexed / "local", root / "chunks")
    before = index(root / "chunks").index_hash
    for path in sorted((corpora_dir / "rust-book" / "src").glob("ch04-*.md")):
        shutil.copy2(path, root / "corpus" / "src" / path.name)  # another chapter: new chunks to embed
    before_files = len(list((root / "chunks").rglob("doc_*.json")))
    ingest(Options(corpus=root / "corpus", out=root / "chunks", jobs=1))
    out = root / "chunks"
    start = cached(out)
    new_chunks = len(list(out.rglob("doc_*.json"))) - before_files  # ch04's: each a text to embed
    assert new_chunks > 8  # more than two batches of four
    run = cluster.start(cluster.chunkyard("index", "--out", str(out), "--json", "--batch-size", "4"))
    wait_for(lambda: cached(out) > start, run, "the first batch came back")
    driver = int(Path(f"/proc/{run.pid}/task/{run.pid}/children").read_text().split()[0])
    # Ctrl-C lands while batches are still out: the driver is frozen the moment the first one
    # is seen back (a fast machine could embed the rest before a plain SIGINT is handled), and
    # the SIGINT, pending while it is stopped, is the first thing it meets when it goes on
    os.kill(driver, signal.SIGSTOP)
    assert cached(out) < start + new_chunks, "every new text was embedded before the stop"
    os.kill(driver, signal.SIGINT)
    os.kill(driver, signal.SIGCONT)
    wait_thawed(run, False, 120)  # nsenter stopped itself when it saw its child stop
    run.communicate(timeout=10)
    assert run.returncode != 0, "the run was not stopped"
    with Searcher(out, None, None) as searcher:  # the old index, whole
        record = searcher.record("how do I install rust", 5, "hybrid")
    assert record["index_hash"] == before and record["items"]
    code, got, stderr = ray_index(cluster, out)
    assert code == 0, stderr[-3000:]
    assert got["index_hash"] != before and got["cache_hits"] > 0  # the stopped run's vectors were kept
