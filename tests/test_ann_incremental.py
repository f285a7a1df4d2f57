"""Vectors added to an existing HNSW graph are found as well as those of a fresh build (issue 31).

A graph of clustered near duplicates (the shape of the 1M bench haystack: each real chunk
copied many times with a little noise), then distinct vectors added later, as a user's new
documents reach an existing index: first into the graph's journal (scored exactly), then,
past ``JOURNAL_MAX_KEYS``, inserted into the graph by a compaction. Inserted at a fresh
build's breadth, many of them end up with no edge that leads to them and search misses
them; the compaction's wider breadth finds them as a fresh build would. Real usearch,
through ``ann.HnswIndex``; seeded data, a few seconds.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import usearch  # noqa: F401  (the extra 'scale': a required part, so missing fails, not skips)

from pipeline.index import ann
from pipeline.index.vector_store import TIE_MARGIN

DIM = 64
CLUSTERS, COPIES = 30, 1000  #: near-duplicate clusters as wide as the haystack's
GROUPS, PER_GROUP = 20, 20  #: the vectors added later: documents of related chunks
K = 10


def _unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def _data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    centers = _unit(rng.standard_normal((CLUSTERS, DIM)))
    copies = _unit(
        np.repeat(centers, COPIES, axis=0)
        + 0.05 / np.sqrt(DIM) * rng.standard_normal((CLUSTERS * COPIES, DIM))
    )
    topics = _unit(rng.standard_normal((GROUPS, DIM)))
    late = _unit(
        np.repeat(topics, PER_GROUP, axis=0)
        + 0.8 / np.sqrt(DIM) * rng.standard_normal((GROUPS * PER_GROUP, DIM))
    )
    asked = late[::4]  # five a document
    questions = _unit(asked + 0.4 / np.sqrt(DIM) * rng.standard_normal(asked.shape))
    copy_keys = np.arange(1, len(copies) + 1, dtype=np.uint64)
    late_keys = np.arange(len(copies) + 1, len(copies) + len(late) + 1, dtype=np.uint64)
    return copy_keys, copies, late_keys, late, questions


COPY_KEYS, COPY_VECTORS, LATE_KEYS, LATE_VECTORS, QUESTIONS = _data()
EVERY_KEY = np.concatenate([COPY_KEYS, LATE_KEYS])
EVERY_VECTOR = np.vstack([COPY_VECTORS, LATE_VECTORS])
EXACT = [set(EVERY_KEY[np.argsort(-(EVERY_VECTOR @ q), kind="stable")[:K]].tolist()) for q in QUESTIONS]


@pytest.fixture(scope="module")
def copies_graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the fresh graph (and vectors file) of the copies alone."""
    folder = tmp_path_factory.mktemp("copies-graph")
    ann.HnswIndex(folder / "index.sqlite", DIM).rebuild(COPY_KEYS, COPY_VECTORS, "g0")
    return folder


def _added_late(copies_graph: Path, into: Path) -> tuple[ann.HnswIndex, ann.HnswIndex]:
    """The copies' graph copied to ``into``, the late vectors applied to it as a run does:
    the writer that applied them, and a reader opened after (a searcher's)."""
    shutil.copytree(copies_graph, into)
    writer = ann.HnswIndex(into / "index.sqlite", DIM)
    writer.apply([], (LATE_KEYS, LATE_VECTORS), "g1")
    return writer, ann.HnswIndex(into / "index.sqlite", DIM)


def _recall(graph: ann.HnswIndex) -> float:
    """Recall@10 of the questions against exact search, ranked as a searcher ranks: the
    graph's ``k + TIE_MARGIN`` candidates scored again with their exact vectors."""
    row_of = {int(key): row for row, key in enumerate(EVERY_KEY)}
    hits = 0
    for question, exact in zip(QUESTIONS, EXACT, strict=True):
        found = graph.search(question, K + TIE_MARGIN)
        scores = EVERY_VECTOR[[row_of[key] for key in found]] @ question
        hits += len({found[i] for i in np.argsort(-scores, kind="stable")[:K]} & exact)
    return hits / (K * len(QUESTIONS))


def test_vectors_compacted_into_an_existing_graph_keep_a_fresh_builds_recall(
    copies_graph: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ann, "JOURNAL_MAX_KEYS", len(LATE_KEYS) - 1)  # this run compacts
    _, graph = _added_late(copies_graph, tmp_path / "policy")
    assert graph.state()["journal_keys"] == 0 and graph.state()["count"] == len(EVERY_KEY)
    assert _recall(graph) >= 0.95

    # the premise: inserted at a fresh build's breadth, the same vectors are lost
    monkeypatch.setattr(ann, "EXPANSION_ADD_EXISTING", ann.EXPANSION_ADD)
    writer, narrow = _added_late(copies_graph, tmp_path / "narrow")
    assert narrow.state()["journal_keys"] == 0
    lost = _recall(narrow)
    assert lost < 0.9
    # and the writer, searched after its compaction, sees the graph it saved (not the journal it folded in)
    assert _recall(writer) == lost


def test_vectors_in_the_journal_are_scored_exactly(copies_graph: Path, tmp_path: Path) -> None:
    _, graph = _added_late(copies_graph, tmp_path / "journal")
    assert graph.state()["journal_keys"] == len(LATE_KEYS)  # not yet in the graph
    assert _recall(graph) == 1.0
