"""A document whose front matter sets ``doc_id``, moved to another path: the same document.

Its chunk ids come from the ``doc_id``, not the path, so after a move the new path mints the
ids the old path held. The run that sees the move must treat them as moved (the old path is
gone in the same sync), not as two documents minting the same ids: no "chunk ids collide"
failure when the new path sorts first, no widened ``r=`` when it sorts last, and an output
equal to a fresh ingest of the moved corpus. Through the CLI, on a temp folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import chunk_files
from typer.testing import CliRunner

from pipeline.cli.app import app

runner = CliRunner()

GUIDE = "---\ndoc_id: guide\n---\n# Guide\n\nSome text about things.\n\n## Part\n\nMore text here.\n"
OTHER = "# Other\n\nHello there.\n"


def ingest(corpus: Path, out: Path) -> tuple[int, dict[str, Any]]:
    result = runner.invoke(app, ["ingest", str(corpus), "--out", str(out), "--json", "-j", "1"])
    return result.exit_code, json.loads(result.stdout)


def chunk_ids(out: Path) -> dict[str, str]:
    """Chunk file name → the ``chunk_id`` it holds."""
    return {p.name: json.loads(p.read_bytes())["chunk_id"] for p in sorted(out.rglob("doc_*.json"))}


def feed(out: Path) -> list[dict[str, Any]]:
    import sqlite3

    conn = sqlite3.connect(out / ".chunkyard" / "state.sqlite")
    try:
        return [json.loads(line) for (line,) in conn.execute("SELECT line FROM feed ORDER BY seq")]
    finally:
        conn.close()


@pytest.mark.parametrize(("before", "after"), [("zeta.md", "alpha.md"), ("beta.md", "zz.md")])
def test_a_doc_id_moved_keeps_its_ids_without_a_collision(tmp_path: Path, before: str, after: str) -> None:
    corpus, out = tmp_path / "c", tmp_path / "o"
    corpus.mkdir()
    (corpus / before).write_text(GUIDE, encoding="utf-8")
    (corpus / "other.md").write_text(OTHER, encoding="utf-8")
    code, first = ingest(corpus, out)
    assert code == 0 and first["failures"] == [], first
    ids_before = {cid for name, cid in chunk_ids(out).items() if name.startswith(f"doc_{Path(before).stem}__")}
    assert len(ids_before) == 2 and all(cid.startswith("guide|r=") for cid in ids_before)
    seen = len(feed(out))

    (corpus / before).rename(corpus / after)
    code, moved = ingest(corpus, out)
    assert code == 0, moved
    assert (moved["failures"], moved["warnings"]) == ([], []), "the move read as two documents with one doc_id"
    ids_after = {cid for name, cid in chunk_ids(out).items() if name.startswith(f"doc_{Path(after).stem}__")}
    assert ids_after == ids_before, "the moved document's ids changed (r= widened?)"
    assert not [n for n in chunk_ids(out) if n.startswith(f"doc_{Path(before).stem}__")]
    lines = feed(out)[seen:]
    assert {e["chunk_id"] for e in lines if e["event"] == "ingest.write"} == ids_before
    assert {e["source"] for e in lines if e["event"] == "ingest.delete"} == {before}
    assert not [e for e in lines if e["event"] == "ingest.redirect"], "the ids did not change: nothing to redirect"

    code, again = ingest(corpus, out)
    assert (code, again["written"], again["failures"], again["warnings"]) == (0, 0, [], [])
    fresh = tmp_path / "fresh"
    assert ingest(corpus, fresh)[0] == 0
    assert chunk_files(out) == chunk_files(fresh), "the moved output differs from a fresh ingest"


def test_a_copy_that_keeps_its_doc_id_still_collides(tmp_path: Path) -> None:
    """The fix ignores only documents gone in the same sync: a copy beside the original widens."""
    corpus, out = tmp_path / "c", tmp_path / "o"
    corpus.mkdir()
    (corpus / "zeta.md").write_text(GUIDE, encoding="utf-8")
    assert ingest(corpus, out)[0] == 0
    (corpus / "alpha.md").write_text(GUIDE, encoding="utf-8")
    code, copied = ingest(corpus, out)
    assert code == 0, copied
    assert copied["warnings"] == ["zeta.md: mint: doc_uid|r collides with alpha.md; r= widened to 12 hex"]
