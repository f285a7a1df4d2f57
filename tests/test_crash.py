"""Crash safety (SPEC §5): ``kill -9`` at 30 random moments; one normal run repairs everything.

Two scenarios alternate: a first ingest into an empty folder, and an incremental
ingest after edits, deletions, a rename and additions (so stale files, redirects and
the journal are in play). After each kill, the visible files must be whole; after one
normal run, the output must equal a clean run's: the file set, every chunk file's
stable content, the manifest's documents and the redirect map. And a loader that
replayed the change feed of every run, the killed one included, holds exactly the
output.
"""

from __future__ import annotations

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

from pipeline.run.db import dump_state
from pipeline.run.emit import stable_view
from pipeline.run.feed import read_feed
from pipeline.run.ingest import Options, ingest
from pipeline.run.state import JOURNAL, STATE_DIR

KILLS = 30
SOURCE = Path("/work/shared/corpora/rust-book/src")
N_DOCS = 16


def chunkyard(corpus: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "pipeline", "ingest", str(corpus), "--out", str(out), "-q", "--jobs", "1"]


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


def loader_view(out: Path) -> dict[str, tuple[str, str]]:
    """What a loader that tailed the whole feed holds: id → (chunk_id, hash)."""
    store: dict[str, tuple[str, str]] = {}
    for line in read_feed(out, 0):
        e = line.event
        if e["event"] == "ingest.write":
            store[e["id"]] = (e["chunk_id"], e["hash"])
        elif e["event"] == "ingest.delete":
            store.pop(e["id"], None)
    return store


def assert_whole(out: Path) -> None:
    """Right after a kill: every visible chunk file parses (temp files may lie around)."""
    for path in out.rglob("doc_*.json"):
        orjson.loads(path.read_bytes())


def timed(cmd: list[str]) -> float:
    started = time.monotonic()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.monotonic() - started


def test_sigkill_at_random_moments_then_one_run_repairs(tmp_path: Path) -> None:
    docs_a = source_docs()
    docs_b = edited(docs_a)
    corpus = write_corpus(tmp_path / "corpus_b", docs_b)
    corpus_a = write_corpus(tmp_path / "corpus_a", docs_a)

    # the references: clean runs, never killed
    ref_fresh = tmp_path / "ref_fresh"
    t_fresh = timed(chunkyard(corpus, ref_fresh))
    base_a = tmp_path / "base_a"
    timed(chunkyard(corpus_a, base_a))  # version A, as a loader last saw it
    shutil.rmtree(corpus_a)
    ref_inc = tmp_path / "ref_inc"
    shutil.copytree(base_a, ref_inc)
    t_inc = timed(chunkyard(corpus, ref_inc))
    want = {"fresh": snapshot(ref_fresh), "inc": snapshot(ref_inc)}
    assert want["inc"]["redirects"].get("redirects"), "version B should need redirects"
    assert want["fresh"]["files"] == want["inc"]["files"]

    rng = random.Random(20261123)
    interrupted = 0
    for i in range(KILLS):
        kind = "fresh" if i % 2 == 0 else "inc"
        out = tmp_path / f"out{i}"
        if kind == "inc":
            shutil.copytree(base_a, out)
        window = t_fresh if kind == "fresh" else t_inc
        proc = subprocess.Popen(chunkyard(corpus, out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.0, 0.8 * window))  # within the run even when a later run is faster
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            interrupted += 1
        proc.wait()
        if out.exists():
            assert_whole(out)
        repair = ingest(Options(corpus=corpus, out=out, jobs=1))  # one normal run (in-process: faster)
        assert not repair.failures and repair.exit_code == 0
        got = snapshot(out)
        assert got["files"].keys() == want[kind]["files"].keys(), f"kill {i} ({kind})"
        assert got == want[kind], f"kill {i} ({kind})"
        assert dump_state(out)["inflight"] is None
        assert (
            not any((out / STATE_DIR / JOURNAL).glob("*")) if (out / STATE_DIR / JOURNAL).exists() else True
        )
        truth = {rec["id"]: (rec["chunk_id"], rec["hash"]) for rec in got["files"].values()}
        assert loader_view(out) == truth, f"kill {i} ({kind}): the feed missed something"
        shutil.rmtree(out)
    print(
        f"\ncrash test: {interrupted}/{KILLS} runs killed mid-way (windows {t_fresh:.2f} s / {t_inc:.2f} s), all repaired"
    )
    assert interrupted >= KILLS // 2
