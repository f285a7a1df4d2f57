"""``ingest --executor ray`` on a real two-node Ray cluster, on loopback only (issue 19).

Each cluster (a head and one more node, one CPU each) lives in a network and PID
namespace of its own (``ray_support.LoopbackCluster``); the tests skip, and say
why, where ``unshare`` is not permitted. What they prove:

- the output is the local pool's, byte for byte (volatile fields aside), over three
  real corpora; a second run does nothing; an edited document is the only one re-chunked;
- a node killed mid-run (its raylet SIGKILLed while it runs a task, after the first
  results are in): the run finishes, the output is a clean run's, every document once;
- a bad, a slow and a memory-hungry document are reported exactly as the local pool
  reports them (exit 1, named), and the run ends: nothing is retried forever;
- Ctrl-C stops the run, and the next run converges to a clean run's output;
- a node that does not see the output is refused before any document goes out;
- without Ray installed, ``--executor ray`` says how to install it; a local run never imports it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import chunk_files
from ray_support import BIN, FENCES, LoopbackCluster, running_cluster, skip_without_namespaces
from test_docs import ROOT, blocks

from pipeline.run.db import db_path, dump_state
from pipeline.run.feed import FeedGapError, read_feed
from pipeline.run.ingest import Options, ingest

# ray and the namespaces are required parts: each test goes through skip_without_namespaces
# (conftest.require), which skips without them, or fails under CI.
pytestmark = [pytest.mark.corpora, pytest.mark.slow, pytest.mark.timeout(900)]  # clusters start slowly under load

#: Manifest fields that must not depend on the executor: all but the run's own stamps.
VOLATILE_FEED = ("ts", "trace_id")


@pytest.fixture(scope="module")
def cluster() -> Iterator[LoopbackCluster]:
    with running_cluster() as c:
        yield c


# -- what two outputs must share ------------------------------------------------------------


def manifest_docs(root: Path) -> dict[str, Any]:
    """Every document's state row (what manifest.json held), from the state database."""
    docs: dict[str, Any] = dump_state(root)["docs"]
    return docs


def feed_lines(root: Path) -> list[dict[str, Any]]:
    """The change feed in order (its ``seq`` included), volatile fields aside; [] before any."""
    if not db_path(root / ".chunkyard").exists():
        return []
    try:
        lines = [line.event for line in read_feed(root, 0)]
    except (FeedGapError, sqlite3.Error):  # no feed yet (the run is still creating its tables)
        return []
    return [{k: v for k, v in e.items() if k not in VOLATILE_FEED} for e in lines]


def assert_same_output(want: Path, got: Path) -> None:
    """Chunk files byte for byte (volatile values blanked), manifest entries, the feed in order."""
    files_want, files_got = chunk_files(want), chunk_files(got)
    assert files_want.keys() == files_got.keys()
    differ = [name for name in files_want if files_want[name] != files_got[name]]
    assert not differ, f"{len(differ)} files differ, e.g. {differ[:3]}"
    assert manifest_docs(want) == manifest_docs(got)  # every field: mtimes, ids, hashes, tokens
    assert feed_lines(want) == feed_lines(got)


def local_ingest(corpus: Path, out: Path, **kw: Any) -> dict[str, Any]:
    return ingest(Options(corpus=corpus, out=out, jobs=2, **kw)).as_dict()


def ray_ingest(
    cluster: LoopbackCluster, corpus: Path, out: Path, *args: str
) -> tuple[int, dict[str, Any], str]:
    proc = cluster.run(cluster.chunkyard("ingest", str(corpus), "--out", str(out), "--json", *args))
    try:
        summary = json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"no JSON summary (exit {proc.returncode}): {proc.stdout[-1000:]}\n{proc.stderr[-3000:]}")
    return proc.returncode, summary, proc.stderr


def copy_corpus(src: Path, dst: Path, limit: int | None = None) -> Path:
    """A copy to edit; ``limit``: the first so many documents only (in path order)."""
    if limit is None:
        shutil.copytree(src, dst)
        return dst
    docs = sorted(p for p in src.rglob("*.md"))[:limit]
    for path in docs:
        target = dst / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    return dst


# -- the same output ------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "limit", "edit"), [
    ("tldr-common", 300, "pages/common/avo.md"),
    ("fastapi-en", None, "docs/en/docs/tutorial/first-steps.md"),
    ("rust-book", None, "src/ch04-01-what-is-ownership.md"),
])  # fmt: skip
def test_ray_writes_what_the_local_pool_writes(
    cluster: LoopbackCluster, corpora_dir: Path, tmp_path: Path, name: str, limit: int | None, edit: str
) -> None:
    corpus = copy_corpus(corpora_dir / name, tmp_path / name, limit)
    assert (corpus / edit).is_file()
    local, remote = tmp_path / "local", tmp_path / "ray"
    want = local_ingest(corpus, local)
    code, got, stderr = ray_ingest(cluster, corpus, remote)
    assert code == 0, (got["failures"], stderr[-3000:])
    assert got["documents"] == got["processed"] == want["documents"] > 0
    assert got["chunks"] == want["chunks"] and got["written"] == want["written"] == want["chunks"]
    assert_same_output(local, remote)

    feed_before = feed_lines(remote)
    code, again, _ = ray_ingest(cluster, corpus, remote)
    assert code == 0 and again["processed"] == 0 and again["skipped"] == again["documents"]
    assert again["written"] == again["removed"] == 0
    assert feed_lines(remote) == feed_before  # a no-op says nothing

    doc = corpus / edit
    doc.write_text(doc.read_text(encoding="utf-8") + "\nA paragraph added by the test.\n", encoding="utf-8")
    code, edited, _ = ray_ingest(cluster, corpus, remote)
    assert code == 0 and edited["processed"] == 1 and edited["skipped"] == edited["documents"] - 1
    new_lines = feed_lines(remote)[len(feed_before) :]
    assert new_lines and {e["source"] for e in new_lines} == {edit}
    local_ingest(corpus, local)
    assert_same_output(local, remote)


# -- faults ---------------------------------------------------------------------------------


def wait_for(condition: Any, proc: subprocess.Popen[str], what: str) -> None:
    """Until ``condition()`` holds (polled): the run must still be going when it does."""
    while not condition():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the run ended before {what}: exit {proc.returncode}\n{out[-500:]}\n{err[-3000:]}")
        time.sleep(0.01)


def test_a_node_killed_mid_run_changes_nothing(corpora_dir: Path, tmp_path: Path) -> None:
    skip_without_namespaces()
    corpus = copy_corpus(corpora_dir / "tldr-common", tmp_path / "corpus")  # 2,000 documents: a few seconds
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    want = local_ingest(corpus, clean)
    c = LoopbackCluster()
    try:
        raylet = c.raylet_pid(1)
        args = ["ingest", str(corpus), "--out", str(killed), "--json", "--batch", "50"]
        run = c.start(c.chunkyard(*args))
        # the moment: the first batch is folded in (the feed has lines) and the node runs a task
        wait_for(lambda: bool(feed_lines(killed)), run, "the first results came in")
        wait_for(lambda: c.freeze_mid_task(raylet), run, "the second node was caught inside a task")
        c.kill_node(raylet)
        lines_at_kill = len(feed_lines(killed))
        out, err = run.communicate(timeout=300)
        retried = "Attempting to resubmit task" in c.driver_log()
    finally:
        c.close()
    assert run.returncode == 0, err[-3000:]
    assert retried, "Ray retried no task: the node's work was done before it died"
    got = json.loads(out)  # Ray's news of the dead node went to stderr: stdout is the JSON alone
    assert lines_at_kill < want["chunks"]  # it was killed mid-run
    assert got["documents"] == got["processed"] == want["documents"]  # every document once
    assert got["failed"] == 0 and got["written"] == want["written"]
    assert_same_output(clean, killed)
    writes = [e["file"] for e in feed_lines(killed) if e["event"] == "ingest.write"]
    assert len(writes) == len(set(writes)) == want["chunks"]  # one feed line per chunk file


SLOW = "".join("  " * i + "- x\n" for i in range(3_000))  # a staircase of lists: minutes of work
GOOD = "# Good\n\nA fine document.\n"


def test_bad_documents_are_reported_as_the_local_pool_reports_them(
    cluster: LoopbackCluster, tmp_path: Path
) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.md").write_text(GOOD)
    (corpus / "bad.md").write_bytes(b"# Bad\n\ncaf\xe9 au lait\n")  # Latin-1, not UTF-8
    (corpus / "slow.md").write_text(SLOW)
    (corpus / "z.md").write_text(GOOD.replace("fine", "second"))
    local, remote = tmp_path / "local", tmp_path / "ray"
    want = local_ingest(corpus, local, doc_timeout=2.0)
    started = time.monotonic()
    code, got, stderr = ray_ingest(cluster, corpus, remote, "--doc-timeout", "2")
    assert time.monotonic() - started < 120  # reported, not retried: a retry would take minutes
    assert code == 1, stderr[-3000:]
    assert want["failed"] == 2 and got["failures"] == want["failures"]  # the same words, in order
    assert got["failures"][0].startswith("bad.md") and "UTF-8" in got["failures"][0]
    assert got["failures"][1].startswith("slow.md") and "took longer than 2 s" in got["failures"][1]
    assert_same_output(local, remote)

    hungry = tmp_path / "hungry"
    hungry.mkdir()
    (hungry / "hog.md").write_text(SLOW)
    (hungry / "z.md").write_text(GOOD)
    want = local_ingest(hungry, tmp_path / "local-hog", doc_timeout=60.0, doc_memory_mb=48)
    code, got, _ = ray_ingest(
        cluster, hungry, tmp_path / "ray-hog", "--doc-timeout", "60", "--doc-memory", "48"
    )
    assert code == 1 and got["failures"] == want["failures"]
    assert len(got["failures"]) == 1 and "needs more than 48 MiB" in got["failures"][0]
    assert_same_output(tmp_path / "local-hog", tmp_path / "ray-hog")


def test_ctrl_c_stops_the_run_and_the_next_run_converges(
    cluster: LoopbackCluster, corpora_dir: Path, tmp_path: Path
) -> None:
    corpus = copy_corpus(corpora_dir / "tldr-common", tmp_path / "corpus", 300)
    clean, out = tmp_path / "clean", tmp_path / "out"
    local_ingest(corpus, clean)
    run = cluster.start(cluster.chunkyard("ingest", str(corpus), "--out", str(out), "--json", "--batch", "5"))
    wait_for(lambda: bool(feed_lines(out)), run, "the first results came in")
    # the driver is pid 2+ in the namespace; the host sees it as nsenter's child
    driver = int(Path(f"/proc/{run.pid}/task/{run.pid}/children").read_text().split()[0])
    os.kill(driver, signal.SIGINT)
    run.communicate(timeout=120)
    assert run.returncode != 0, "the run was not stopped"
    assert len(feed_lines(out)) < len(feed_lines(clean))  # stopped before its end
    code, got, stderr = ray_ingest(cluster, corpus, out)
    assert code == 0, stderr[-3000:]
    assert got["processed"] > 0  # what the stopped run had not recorded is done now
    assert chunk_files(clean) == chunk_files(out)
    assert manifest_docs(clean) == manifest_docs(out)


def test_a_node_without_the_shared_file_system_is_refused(tmp_path: Path) -> None:
    skip_without_namespaces()
    shared = tmp_path / "shared"
    (shared / "corpus").mkdir(parents=True)
    (shared / "corpus" / "a.md").write_text(GOOD)
    c = LoopbackCluster(hide=shared)
    try:
        proc = c.run(c.chunkyard("ingest", str(shared / "corpus"), "--out", str(shared / "out")))
    finally:
        c.close()
    assert proc.returncode == 2, proc.stderr[-3000:]
    said = " ".join(proc.stderr.split())
    assert "the output is not visible" in said and "same path" in said, said
    assert not list((shared / "out").rglob("doc_*.json"))  # refused before any document went out
    assert not [p for p in (shared / "out" / ".chunkyard").iterdir() if p.name.startswith("probe-")]


def test_an_address_nothing_answers_on_is_a_setup_error(cluster: LoopbackCluster, tmp_path: Path) -> None:
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.md").write_text(GOOD)
    args = [
        "ingest",
        str(tmp_path / "c"),
        "--out",
        str(tmp_path / "o"),
        "--executor",
        "ray",
        "--address",
        "127.0.0.1:1",
    ]
    proc = cluster.run([str(BIN / "chunkyard"), *args], timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "nothing answers at 127.0.0.1:1" in " ".join(proc.stderr.split())


# -- the docs' commands ----------------------------------------------------------------------


def test_the_docs_commands_for_a_ray_cluster_run(corpora_dir: Path, tmp_path: Path) -> None:
    """docs/operations.md's Ray block, line by line, in a namespace of its own (test_docs skips it)."""
    skip_without_namespaces()
    page = ROOT / "docs" / "operations.md"
    (block,) = [b for b in blocks(page, "sh") if "ray start --head" in b]
    lines = [line for line in block.splitlines() if line.strip() and "pip install" not in line]
    assert [line.split()[:2] for line in lines] == [["ray", "start"]] * 2 + [["chunkyard", "ingest"]] * 2
    sandbox = tmp_path / "sandbox"
    shutil.copytree(ROOT / "corpus", sandbox / "corpus")
    c = LoopbackCluster(nodes=0)
    try:
        runs = []
        for i, line in enumerate(lines):
            if line.startswith("ray start"):  # the test's fences: one CPU, a capped store, its own temp dir
                line = f"{line.split('#')[0]} {FENCES} --temp-dir={c.temp}/docs{i}"
            runs.append(
                c.run(["bash", "-c", line], cwd=sandbox, HEAD="127.0.0.1", PATH=f"{BIN}:{os.environ['PATH']}")
            )
            assert runs[-1].returncode == 0, f"{line}\n{runs[-1].stdout[-1000:]}{runs[-1].stderr[-3000:]}"
    finally:
        c.close()
    again = json.loads(runs[-1].stdout)
    assert again["processed"] == 0 and again["skipped"] == again["documents"] > 0
    local_ingest(sandbox / "corpus", tmp_path / "local")
    assert_same_output(tmp_path / "local", sandbox / "chunks")


# -- without Ray ------------------------------------------------------------------------------

BLOCK_RAY = "import sys; sys.modules['ray'] = None; from pipeline.cli.app import run; sys.argv[0] = 'chunkyard'; run()"


def test_without_ray_the_error_says_how_to_install_it(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.md").write_text(GOOD)
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            BLOCK_RAY,
            "ingest",
            str(corpus),
            "--out",
            str(tmp_path / "o"),
            "--executor",
            "ray",
        ],
        check=False,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "300", "NO_COLOR": "1"},
    )
    assert proc.returncode == 2
    assert "pip install 'chunkyard[ray]'" in " ".join(proc.stderr.split())
    assert not list((tmp_path / "o").rglob("*.json"))


def test_a_local_run_never_imports_ray(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.md").write_text(GOOD)
    code = (
        "import sys; from pathlib import Path; from pipeline.run.ingest import Options, ingest; "
        f"s = ingest(Options(corpus=Path({str(corpus)!r}), out=Path({str(tmp_path / 'o')!r}), jobs=2)); "
        "assert s.exit_code == 0 and s.processed == 1; print('ray' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "False"


@pytest.mark.parametrize("args", [["--address", "127.0.0.1:1"], ["--batch", "4"], ["--executor", "dask"]])
def test_ray_options_need_the_ray_executor(tmp_path: Path, args: list[str]) -> None:
    from typer.testing import CliRunner

    from pipeline.cli.app import app

    (tmp_path / "c").mkdir()
    result = CliRunner().invoke(app, ["ingest", str(tmp_path / "c"), "--out", str(tmp_path / "o"), *args])
    assert result.exit_code == 2, result.output


def test_batches_spread_the_documents_over_the_cpus() -> None:
    from pipeline.run.ray_executor import MAX_BATCH, batch_size

    assert batch_size(800, 2) == 50  # about eight tasks per CPU
    assert batch_size(2000, 2) == batch_size(10_000_000, 80) == MAX_BATCH  # a retry after a node loss redoes little
    assert batch_size(5, 80) == 1
    assert batch_size(2000, 2, batch=7) == 7  # --batch wins
