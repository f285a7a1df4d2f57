"""SIGKILL ``chunkyard index`` at observed moments, 20 times: each next run converges (store == chunks).

Moments, observed in the store itself (never a sleep): the run holds the lock; it has
committed some embeddings to the cache; it has committed many; its final commit is done
(the process may be gone by then). Between kills the corpus changes: paragraphs appended,
or a full re-chunk under another token budget (every text new the first time).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from index_support import chunk_state, copy_sample, run_ingest, store_state, vector_ids

KILLS = 20
BUDGETS = (512, 256, 384)


def _peek(store: Path) -> tuple[int, str]:
    """(embeddings cached, generation) as a reader sees them now; (−1, "") when not readable yet."""
    import apsw

    if not store.exists():
        return -1, ""
    try:
        conn = apsw.Connection(str(store), flags=apsw.SQLITE_OPEN_READONLY)
        try:
            cached = next(iter(conn.execute("SELECT count(*) FROM embed_cache")))[0]
            gen = dict(conn.execute("SELECT key, value FROM meta")).get("generation", "")
            return int(cached), str(gen)
        finally:
            conn.close()
    except apsw.Error:
        return -1, ""


def _holds_lock(lock: Path, pid: int) -> bool:
    try:
        return lock.read_text().strip() == f"pid {pid}"
    except OSError:
        return False


def _kill_at(proc: subprocess.Popen[bytes], store: Path, moment: int, deadline: float) -> bool:
    """Wait for the moment, SIGKILL; True when the process was still alive to be killed."""
    lock = store.with_name(store.name + ".lock")
    base_cached, base_gen = _peek(store)
    while time.monotonic() < deadline and proc.poll() is None:
        if moment == 0:
            hit = _holds_lock(lock, proc.pid)
        else:
            cached, gen = _peek(store)
            hit = (
                (moment == 1 and cached > max(base_cached, 0))
                or (moment == 2 and cached >= max(base_cached, 0) + 12)
                or (moment == 3 and gen != base_gen and gen != "")
            )
        if hit:
            break
        time.sleep(0.002)
    alive = proc.poll() is None
    if alive:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return alive


@pytest.mark.slow
def test_twenty_sigkills_each_followed_by_one_index_converge(tmp_path: Path) -> None:
    corpus, out = copy_sample(tmp_path / "corpus"), tmp_path / "chunks"
    run_ingest(corpus, out)
    store = out / ".chunkyard" / "index.sqlite"
    env = {**os.environ, "CHUNKYARD_INDEX_BATCH": "4"}
    cmd = [sys.executable, "-m", "pipeline", "index", "--out", str(out), "--quiet"]
    docs = sorted(corpus.rglob("*.md"))
    killed_alive = 0
    for round_no in range(KILLS):
        if round_no % 3 == 0:
            run_ingest(corpus, out, full=True, policy=_policy(BUDGETS[(round_no // 3) % len(BUDGETS)]))
        else:
            for doc in docs[round_no % len(docs) :][:3]:
                with doc.open("a", encoding="utf-8") as fh:
                    fh.write(f"\n\nParagraph {round_no} appended to see the index follow it.\n")
            run_ingest(corpus, out, policy=_policy(BUDGETS[(round_no // 3) % len(BUDGETS)]))
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        killed_alive += _kill_at(proc, store, round_no % 4, time.monotonic() + 120)
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        state = chunk_state(out)
        assert store_state(out) == state, f"round {round_no}"
        assert vector_ids(out) == set(state), f"round {round_no}"
    assert killed_alive >= KILLS // 2, f"only {killed_alive} of {KILLS} kills found the run alive"


def _policy(target: int) -> object:
    from pipeline.models import Policy

    return Policy(target, 32, "cl100k_base", True, "en")
