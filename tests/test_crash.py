"""Crash safety (SPEC §5): ``kill -9`` at moments chosen from observed progress; one run repairs.

A clean run is traced first (``pipeline/run/checkpoint.py``, ``CHUNKYARD_CRASH_TRACE``): how
many times it reaches each phase — a chunk file named, a document's files half renamed, a
block of the change feed appended, the state commit. Then runs are killed at points spread
over each phase (``CHUNKYARD_CRASH_AT="phase:n"``: the process SIGKILLs itself there), in two
scenarios: a first ingest into an empty folder, and an incremental ingest after edits,
deletions, a rename and additions (stale files, redirects and the journal in play). Every
kill is asserted to have landed (exit -9), and the distribution over phases is printed.

After each kill, the visible files must be whole; after one normal run, the output must
equal a clean run's: the file set, every chunk file's stable content, the manifest's
documents and the redirect map. And a loader that replayed the change feed of every run,
the killed one included, holds exactly the output.
"""

from __future__ import annotations

import collections
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import CORPORA
from kill_support import loader_view

from pipeline.run.db import dump_state
from pipeline.run.emit import stable_view
from pipeline.run.ingest import Options, ingest
from pipeline.run.state import JOURNAL, STATE_DIR

SOURCE = CORPORA / "rust-book" / "src"
N_DOCS = 16
#: Kills per phase and scenario, spread evenly over the times a clean run reaches the phase.
KILLS_PER_PHASE = {"chunk-file": 4, "between-renames": 2, "feed-append": 2, "state-commit": 3}


def chunkyard(corpus: Path, out: Path) -> list[str]:
    """One process does it all (no worker pool): each phase is counted in the process that dies."""
    return [sys.executable, "-m", "pipeline", "ingest", str(corpus), "--out", str(out), "-q",
            "--jobs", "1", "--doc-timeout", "0", "--doc-memory", "0"]  # fmt: skip


def generated(n: int) -> dict[str, str]:
    """A stand-in corpus for machines without the shared corpora."""
    rng = random.Random(7)
    words = [f"word{i}" for i in range(40)]
    docs = {}
    for i in range(n):
        parts = [f"# Document {i}\n"]
        for s in range(rng.randint(3, 7)):
            parts.append(f"## Part {s}\n")
            for _ in range(rng.randint(2, 6)):
                parts.append(" ".join(rng.choice(words) for _ in range(rng.randint(30, 120))) + ".\n")
            parts.append("```\ncode block " + str(s) + "\n```\n")
        docs[f"doc{i:02d}.md"] = "\n".join(parts)
    return docs


def source_docs() -> dict[str, str]:
    if SOURCE.is_dir():
        paths = sorted(SOURCE.glob("ch*.md"))[:: max(1, len(list(SOURCE.glob("ch*.md"))) // N_DOCS)][:N_DOCS]
        if len(paths) >= 10:
            return {p.name: p.read_text(encoding="utf-8") for p in paths}
    return generated(N_DOCS)


def edited(docs: dict[str, str]) -> dict[str, str]:
    """Version B: paragraphs edited, headings added, a section deleted, deletions, a rename, additions."""
    names = sorted(docs)
    b = dict(docs)
    for name in names[0:4]:  # a paragraph edited
        text = b[name]
        i = text.find(" the ", len(text) // 2)
        b[name] = text[:i] + " the very " + text[i + 5 :] if i > 0 else text + "\nOne more paragraph.\n"
    for name in names[4:6]:  # a heading added: every id of the document moves (redirects)
        text = b[name]
        i = text.find("\n## ", text.find("\n## ") + 1)
        extra = "\n## A heading added before the crash\n\nWith a few words under it.\n"
        b[name] = text[:i] + extra + text[i:] if i > 0 else text + extra
    text = b[names[6]]  # a section deleted: the document shrinks
    first = text.find("\n## ")
    second = text.find("\n## ", first + 1)
    if 0 < first < second:
        b[names[6]] = text[:first] + text[second:]
    del b[names[7]], b[names[8]]  # deleted
    b["renamed-" + names[9]] = b.pop(names[9])  # renamed
    b["added-one.md"] = "# Added\n\nA new document.\n\n## More\n\nWith two sections.\n"
    b["sub/added-two.md"] = docs[names[10]].replace("# ", "# Copy of ", 1)
    return b


def write_corpus(root: Path, docs: dict[str, str]) -> Path:
    shutil.rmtree(root, ignore_errors=True)
    for name, text in docs.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    past = time.time_ns() - 60 * 10**9
    for path in root.rglob("*.md"):
        os.utime(path, ns=(past, past))
    return root


def snapshot(out: Path) -> dict[str, Any]:
    """Everything a clean run determines: files, their stable content, manifest docs, redirects."""
    files = {}
    for path in sorted(out.rglob("*")):
        rel = path.relative_to(out).as_posix()
        if path.is_dir() or rel.startswith(STATE_DIR + "/"):
            continue
        assert path.name.startswith("doc_") and path.suffix == ".json", f"stray file {rel}"
        files[rel] = stable_view(orjson.loads(path.read_bytes()))  # whole: it parses
    state = dump_state(out)
    return {"files": files, "docs": state["docs"], "redirects": {"redirects": state["redirects"]}}


def assert_whole(out: Path) -> None:
    """Right after a kill: every visible chunk file parses (temp files may lie around)."""
    for path in out.rglob("doc_*.json"):
        orjson.loads(path.read_bytes())


def traced(cmd: list[str], trace: Path) -> collections.Counter[str]:
    """Run ``cmd`` to the end and count the phases it reached."""
    subprocess.run(
        cmd, check=True, capture_output=True, env={**os.environ, "CHUNKYARD_CRASH_TRACE": str(trace)}
    )
    return collections.Counter(trace.read_text().split())


def kill_points(reached: collections.Counter[str]) -> list[tuple[str, int]]:
    """``(phase, n)`` spread over each phase: the n-th time a clean run reaches it."""
    points = []
    for phase, kills in KILLS_PER_PHASE.items():
        total = reached[phase]
        assert total >= kills, f"a clean run reaches {phase} {total} times; the test needs {kills}"
        points += sorted({(phase, 1 + (total - 1) * k // max(kills - 1, 1)) for k in range(kills)})
    return points


@pytest.mark.slow
def test_sigkill_in_every_phase_then_one_run_repairs(tmp_path: Path) -> None:
    docs_a = source_docs()
    docs_b = edited(docs_a)
    corpus = write_corpus(tmp_path / "corpus_b", docs_b)
    corpus_a = write_corpus(tmp_path / "corpus_a", docs_a)

    # the references: clean runs, never killed, traced
    ref_fresh = tmp_path / "ref_fresh"
    reached = {"fresh": traced(chunkyard(corpus, ref_fresh), tmp_path / "trace_fresh")}
    base_a = tmp_path / "base_a"
    subprocess.run(
        chunkyard(corpus_a, base_a), check=True, capture_output=True
    )  # version A, as a loader saw it
    shutil.rmtree(corpus_a)
    ref_inc = tmp_path / "ref_inc"
    shutil.copytree(base_a, ref_inc)
    reached["inc"] = traced(chunkyard(corpus, ref_inc), tmp_path / "trace_inc")
    want = {"fresh": snapshot(ref_fresh), "inc": snapshot(ref_inc)}
    assert want["inc"]["redirects"].get("redirects"), "version B should need redirects"
    assert want["fresh"]["files"] == want["inc"]["files"]

    hits: collections.Counter[tuple[str, str]] = collections.Counter()
    for kind in ("fresh", "inc"):
        for i, (phase, nth) in enumerate(kill_points(reached[kind])):
            out = tmp_path / f"out_{kind}{i}"
            if kind == "inc":
                shutil.copytree(base_a, out)
            env = {**os.environ, "CHUNKYARD_CRASH_AT": f"{phase}:{nth}"}
            proc = subprocess.run(chunkyard(corpus, out), env=env, capture_output=True, check=False)
            assert proc.returncode == -signal.SIGKILL, (
                f"{kind} {phase}:{nth} did not die there: {proc.stderr[-500:]!r}"
            )
            hits[(kind, phase)] += 1
            assert_whole(out)
            repair = ingest(Options(corpus=corpus, out=out, jobs=1))  # one normal run (in-process: faster)
            assert not repair.failures and repair.exit_code == 0
            got = snapshot(out)
            where = f"killed at {phase}:{nth} ({kind})"
            assert got["files"].keys() == want[kind]["files"].keys(), where
            assert got == want[kind], where
            assert dump_state(out)["inflight"] is None
            assert (
                not any((out / STATE_DIR / JOURNAL).glob("*"))
                if (out / STATE_DIR / JOURNAL).exists()
                else True
            )
            truth = {rec["id"]: (rec["chunk_id"], rec["hash"]) for rec in got["files"].values()}
            assert loader_view(out) == truth, f"{where}: the feed missed something"
            shutil.rmtree(out)
    table = ", ".join(f"{kind} {phase} {n}" for (kind, phase), n in sorted(hits.items()))
    print(f"\ncrash test: {sum(hits.values())} kills, all landed and repaired: {table}")
    print(f"phases a clean run reaches: fresh {dict(reached['fresh'])}, inc {dict(reached['inc'])}")
    for kind in ("fresh", "inc"):
        for phase, kills in KILLS_PER_PHASE.items():
            assert (
                hits[(kind, phase)]
                == len({p for p in kill_points(reached[kind]) if p[0] == phase})
                >= min(kills, 1)
            )
