"""A worker never imports in the middle of a run (issue 13, defect 3).

A run loads all a document needs (``run.worker.prepare``) before any worker forks. Were a
worker to import later, a venv replaced under a long ``watch`` or a process whose
privileges dropped (a clone in a folder only its owner can enter, read as ``nobody``)
would fail its documents with ``ModuleNotFoundError``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: After ``prepare``, every import anywhere (the parent or a forked worker) raises.
SCRIPT = """
import importlib.abc, sys
from pathlib import Path
from pipeline.models import Policy
from pipeline.run.ingest import Options, ingest
from pipeline.run.worker import prepare

prepare(Policy())

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        raise ImportError(f"imported mid-run: {name}")

sys.meta_path.insert(0, Refuse())
corpus, out, jobs, timeout = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
summary = ingest(Options(corpus=corpus, out=out, jobs=jobs, doc_timeout=timeout, doc_memory_mb=int(timeout)))
print(summary.failures, summary.processed)
"""


@pytest.mark.parametrize(("jobs", "guarded"), [(1, True), (2, True), (2, False)])
def test_after_prepare_no_document_imports_anything(tmp_path: Path, jobs: int, guarded: bool) -> None:
    timeout = "30" if guarded else "0"
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(ROOT / "corpus"), str(tmp_path / "out"), str(jobs), timeout],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    failures, _, docs = proc.stdout.strip().partition(" ")
    assert failures == "[]", proc.stdout
    assert int(docs) >= 5
    assert len(list((tmp_path / "out").rglob("*.json"))) > 20


def test_the_unreadable_folder_test_passes_alone() -> None:
    """It drops privileges to ``nobody``; alone, nothing earlier has imported what it needs."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            "tests/test_hostile.py",
            "-k",
            "unreadable_folder",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "1 passed" in proc.stdout
