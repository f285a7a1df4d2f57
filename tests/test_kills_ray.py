"""SIGKILL of the Ray parent: ``ingest --executor ray`` killed from outside while the cluster works.

With ``--executor ray`` the parent (the Ray driver) hands batches of documents to tasks on
the cluster, and stays the only writer of the state and the change feed; the tasks write
each document's chunk files. Here a real two-node cluster (``ray_support.LoopbackCluster``:
loopback only, a PID namespace of its own) runs ``chunkyard ingest --executor ray`` over the
kill tests' corpus, and the parent is frozen at a moment drawn from the seed, found mid-way
(neither the empty output nor a clean run's), and SIGKILLed there (``kill_support``). After
each kill:

- the cluster's tasks of the dead run end by themselves (Ray ends a dead driver's workers):
  none is left running a chunkyard batch, so nothing writes behind the next run;
- every visible chunk file is whole; one more run converges to a clean Ray run's output,
  byte for byte, with the same state; a loader replaying the feed holds exactly the output
  (``test_kills.converge``);
- the cluster lives on: the next attempt runs on it.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kill_support import SEED, Tally, good_files, kills, output_view, report, state_view, stop_in_flight
from ray_support import LoopbackCluster, running_cluster
from test_crash import edited, generated, write_corpus
from test_kills import adapt, attempts, classify, converge, source_docs

#: Kills of the Ray parent (part of the suite's 200 outside SIGKILLs; CHUNKYARD_KILLS scales them).
RAY_PARENT_KILLS = 5
#: Generated documents added to the kill tests' corpus: one task each, so that the cluster
#: holds work in flight for a while once the parent has connected.
MORE_DOCS = 40

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LoopbackCluster]:
    with running_cluster() as c:
        yield c


def ray_ingest_cmd(cluster: LoopbackCluster, corpus: Path, out: Path) -> list[str]:
    """One document per task (``--batch 1``): many tasks in flight on the two nodes at once."""
    return cluster.command(cluster.chunkyard("ingest", str(corpus), "--out", str(out), "-q", "--batch", "1"))


def dispatching(out: Path) -> bool:
    """The tasks have begun to write (the parent has connected to the cluster and sent work)."""
    return any(out.rglob("doc_*.json"))


def timed_run(cluster: LoopbackCluster, corpus: Path, out: Path) -> float:
    """A clean run; the seconds from its first chunk file to its state's commit (the window
    kills aim at; what follows, the parent leaving the cluster, is no longer in flight)."""
    proc = subprocess.Popen(
        ray_ingest_cmd(cluster, corpus, out),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=cluster.env(),
    )
    first = last = None
    while proc.poll() is None:
        if first is None and dispatching(out):
            first = time.monotonic()
        if first is not None and last is None and (state_view(out) or {}).get("inflight", 1) is None:
            last = time.monotonic()
        time.sleep(0.01)
    assert proc.returncode == 0 and proc.stderr is not None, proc.stderr.read()[-3000:] if proc.stderr else ""
    proc.stderr.close()
    end = last or time.monotonic()
    return end - (first or end)


def tasks_gone(cluster: LoopbackCluster, timeout: float = 60.0) -> None:
    """No worker of either node runs a chunkyard batch any more (the dead run's tasks ended)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not any(cluster.busy_workers(cluster.raylet_pid(node)) for node in (0, 1)):
            return
        time.sleep(0.05)
    raise AssertionError(f"a task of the killed run still runs {timeout} s after its parent died")


def test_ray_parent_killed_while_the_cluster_works(cluster: LoopbackCluster, tmp_path: Path) -> None:
    docs = source_docs()
    docs.update({f"more/{name}": text for name, text in generated(MORE_DOCS).items()})
    corpus = write_corpus(tmp_path / "corpus", edited(docs))
    clean = tmp_path / "clean"
    window = max(timed_run(cluster, corpus, clean), 0.5)
    want = output_view(clean)
    known_good = good_files(clean)
    tally = Tally("ingest --executor ray (the parent, a two-node cluster)")
    for i in attempts(tally, kills(RAY_PARENT_KILLS)):
        rng = random.Random(f"{SEED}:ray-parent:{i}")
        out = tmp_path / f"out{i}"
        proc = subprocess.Popen(
            ray_ingest_cmd(cluster, corpus, out),
            start_new_session=True,  # the group: nsenter and the parent (the cluster's processes are not in it)
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=cluster.env(),
        )
        landed = stop_in_flight(
            proc, rng, lambda out=out: classify(out, ({}, None), want),
            group=True, first=window, step=window / 10, tally=tally,
            started=lambda out=out: dispatching(out),
        )  # fmt: skip
        tasks_gone(cluster)
        window = adapt(window, landed)
        if landed:
            tally.landed += 1
            converge(out, corpus, want, known_good, f"ray parent kill {i} (seed {SEED})")
        shutil.rmtree(out)
    report(tally)
    assert tally.landed == kills(RAY_PARENT_KILLS)
