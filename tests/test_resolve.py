"""`chunkyard resolve`: every address form → the exact source span, with context; redirects followed."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from pipeline.audit.chunk_state import open_store
from pipeline.audit.resolve import UnknownIdError, find, resolve
from pipeline.cli.app import app
from pipeline.run.db import StateDB, db_path, dump_state
from pipeline.run.ingest import Options, ingest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "corpora"
EXTRA = ("tldr-common/pages/common/[[.md", "fastapi-zh-ja/docs/zh/docs/index.md")
DEEP = "guides/deep-dive.md"
runner = CliRunner()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("resolve")
    corpus, out = base / "corpus", base / "chunks"
    shutil.copytree(ROOT / "corpus", corpus, copy_function=shutil.copyfile)
    for rel in EXTRA:
        if (SHARED / rel).is_file():
            (corpus / "shared" / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(SHARED / rel, corpus / "shared" / rel)
    assert not ingest(Options(corpus=corpus, out=out, jobs=1)).failures
    return corpus, out


@pytest.fixture
def copy(pristine: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    corpus, out = tmp_path / "corpus", tmp_path / "chunks"
    shutil.copytree(pristine[0], corpus, copy_function=shutil.copyfile)
    shutil.copytree(pristine[1], out, copy_function=shutil.copyfile)
    return corpus, out


def entry(out: Path, rel: str = DEEP) -> dict[str, Any]:
    data: dict[str, Any] = dump_state(out)["docs"][rel]
    return data


def plant_redirects(out: Path, table: dict[str, str]) -> None:
    """Write redirect rows straight into the state (as a hand edit or a bug could)."""
    db = StateDB(db_path(out / ".chunkyard"))
    with db.transaction():
        for old, new in table.items():
            db.set_redirect(old, new)
    db.close()


def invoke(*args: str) -> Any:
    return runner.invoke(app, ["resolve", *args], env={"COLUMNS": "250"})


def test_every_address_form_finds_the_same_chunk(pristine: tuple[Path, Path]) -> None:
    corpus, out = pristine
    e = entry(out)
    store = open_store(out, corpus)
    want = e["files"][4]
    forms = [
        e["chunk_ids"][4],
        e["ids"][4],
        want,
        want.rsplit("/", 1)[-1],
        want.rsplit("/", 1)[-1].removesuffix(".json"),
        str(out / want),
        f"  {e['chunk_ids'][4]}  ",
    ]
    for form in forms:
        loc, redirected = find(store, form)
        assert (loc.file, redirected) == (want, None), form


def test_text_is_the_source_slice(pristine: tuple[Path, Path]) -> None:
    corpus, out = pristine
    e = entry(out)
    found = resolve(open_store(out, corpus), e["chunk_ids"][6])
    assert found.source_status == "current"
    text = (corpus / DEEP).read_text(encoding="utf-8")
    assert text[found.start : found.end] == found.record["originalText"]
    first, last = found.line_span
    rows = found.rows(context=2)
    assert rows[0].number == max(1, first - 2) and rows[-1].number == last + 2
    inside = [r for r in rows if r.inside]
    assert (inside[0].number, inside[-1].number) == (first, last)
    assert "\n".join(r.text[r.mark_start : r.mark_end] for r in inside) == found.record["originalText"]


def test_crlf_bom_and_cjk_sources_resolve(pristine: tuple[Path, Path]) -> None:
    corpus, out = pristine
    store = open_store(out, corpus)
    for rel in [
        r for r in store.docs if r.startswith("shared/") or r in ("windows-notes.md", "i18n/多言語ガイド.md")
    ]:
        for cid in entry(out, rel)["chunk_ids"]:
            found = resolve(store, cid)
            assert found.source_status == "current", (rel, cid)
            assert (
                found.text is not None and found.text[found.start : found.end] == found.record["originalText"]
            )


def test_redirect_from_a_real_reingest(copy: tuple[Path, Path]) -> None:
    """A heading added above a section moves its chunk_id; the old id still resolves, and says so."""
    corpus, out = copy
    old = entry(out)["chunk_ids"][1]
    path = corpus / DEEP
    text = path.read_text(encoding="utf-8")
    cut = text.index("\n## ") + 1
    path.write_text(text[:cut] + "## A new first section\n\nInserted.\n\n" + text[cut:], encoding="utf-8")
    assert not ingest(Options(corpus=corpus, out=out, jobs=1)).failures
    store = open_store(out, corpus)
    assert old in store.redirects, "the moved section's old id has no redirect"
    assert old not in store.index("chunk_id")
    found = resolve(store, old)
    assert found.redirected_from == old
    assert found.record["chunk_id"] == store.redirects[old]
    result = invoke(old, "--out", str(out), "--corpus", str(corpus), "--json")
    assert result.exit_code == 0, result.output
    payload = orjson.loads(result.stdout)
    assert payload["redirected_from"] == old and payload["snippet_id"] == store.redirects[old]


def test_planted_redirect_and_dangling_redirect(copy: tuple[Path, Path]) -> None:
    corpus, out = copy
    live = entry(out)["chunk_ids"][2]
    table = {"gone|r=00000000|s=1|p=000|b=000": live, "lost|r=00000000|s=1|p=000|b=000": "nowhere|r=1|s=1"}
    plant_redirects(out, table)
    store = open_store(out, corpus)
    assert resolve(store, "gone|r=00000000|s=1|p=000|b=000").record["chunk_id"] == live
    with pytest.raises(UnknownIdError, match="no chunk has"):
        resolve(store, "lost|r=00000000|s=1|p=000|b=000")
    result = invoke("gone|r=00000000|s=1|p=000|b=000", "--out", str(out), "--corpus", str(corpus))
    assert result.exit_code == 0
    assert "redirected" in result.output


def test_source_edited_after_ingest(copy: tuple[Path, Path]) -> None:
    corpus, out = copy
    e = entry(out)
    path = corpus / DEEP
    path.write_text(
        "Preface added after the ingest.\n\n" + path.read_text(encoding="utf-8"), encoding="utf-8"
    )
    store = open_store(out, corpus)
    moved = resolve(store, e["chunk_ids"][5])
    assert moved.source_status == "moved"
    assert moved.text is not None and moved.text[moved.start : moved.end] == moved.record["originalText"]
    assert moved.line_span[0] == moved.record["lineSpan"]["lineStart"] + 2
    path.unlink()
    gone = resolve(store, e["chunk_ids"][5])
    assert gone.source_status == "missing"
    assert [r.text for r in gone.rows()] == gone.record["originalText"].split("\n")


def test_cli_rich_output_numbers_the_lines(pristine: tuple[Path, Path]) -> None:
    corpus, out = pristine
    e = entry(out)
    rec = orjson.loads((out / e["files"][3]).read_bytes())
    result = invoke(e["ids"][3], "--out", str(out), "--corpus", str(corpus), "--context", "1")
    assert result.exit_code == 0, result.output
    first, last = rec["lineSpan"]["lineStart"], rec["lineSpan"]["lineEnd"]
    assert f"deep-dive.md:{first}-{last}" in result.output
    assert rec["chunk_id"] in result.output
    numbered = [
        line.split()[0] for line in result.output.splitlines() if line[:1].isdigit() or line[:1] == " "
    ]
    assert str(first - 1) in numbered and str(last + 1) in numbered


def test_cli_json_is_the_001_payload(pristine: tuple[Path, Path]) -> None:
    corpus, out = pristine
    e = entry(out)
    result = invoke(e["files"][2], "--out", str(out), "--corpus", str(corpus), "--json")
    assert result.exit_code == 0, result.output
    p = orjson.loads(result.stdout)
    rec = orjson.loads((out / e["files"][2]).read_bytes())
    assert p["snippet_id"] == rec["chunk_id"] and p["doc_id"] == rec["chunk_id"].split("|r=")[0]
    assert p["section_id"] == rec["section_id"] and p["source_url"] == rec["source_url"]
    assert p["offsets"] == {
        "start": rec["charOffsets"]["charStart"],
        "end": rec["charOffsets"]["charEnd"],
        "unit": "char",
    }
    assert p["tokens"] == rec["tokenStats"]["tokens"] and p["rev"] == rec["rev"]
    assert p["analyzer"] == rec["metadata"]["analyzer"]
    assert p["text"] == rec["originalText"] and p["file"] == e["files"][2]
    assert p["lineSpan"] == rec["lineSpan"] and p["redirected_from"] is None


def test_cli_unknown_id_suggests_the_nearest(pristine: tuple[Path, Path]) -> None:
    corpus, out = pristine
    e = entry(out)
    stale = e["chunk_ids"][3].replace("|r=", "|r=f", 1)[: len(e["chunk_ids"][3])]
    stale = stale.split("|r=")[0] + "|r=00000000|" + e["chunk_ids"][3].split("|", 2)[2]
    result = invoke(stale, "--out", str(out), "--corpus", str(corpus))
    assert result.exit_code == 1
    assert "no chunk has this id" in result.output
    assert e["chunk_ids"][3] in result.output  # same section and block, live revision: first suggestion
    result = invoke("doc:guides/deep-dive::ch999", "--out", str(out), "--json")
    assert result.exit_code == 1
    doc = orjson.loads(result.stdout)
    assert doc["code"] == "unknown_id" and doc["suggestions"]
    assert f"ch{len(e['files']) - 1}" in doc["error"]


def test_cli_usage_errors(tmp_path: Path) -> None:
    assert invoke("x", "--out", str(tmp_path / "none")).exit_code == 2
    assert invoke("x", "--out", str(tmp_path)).exit_code == 2
    result = runner.invoke(app, ["resolve", "--help"])
    assert result.exit_code == 0 and "--context" in result.output
