"""`chunkyard validate`: a clean ingest passes; each planted corruption is named by its code."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from blake3 import blake3
from typer.testing import CliRunner

from pipeline.audit.problems import STATE_DB_FILE, STATE_REDIRECTS
from pipeline.audit.validate import CODES, Report, validate
from pipeline.cli.app import app
from pipeline.errors import UsageError
from pipeline.run.db import StateDB, db_path, dump_state
from pipeline.run.ingest import Options, ingest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "corpora"
#: Real documents with the hard cases: odd names, CRLF, a BOM, CJK, front matter.
EXTRA = (
    "tldr-common/pages/common/!.md",
    "tldr-common/pages/common/[[.md",
    "powershell-docs/reference/5.1/Microsoft.PowerShell.Security/Get-Acl.md",
    "powershell-docs/reference/5.1/Microsoft.PowerShell.Utility/Write-Host.md",
    "fastapi-zh-ja/docs/zh/docs/index.md",
    "eips/EIPS/eip-20.md",
)
DEEP = "guides/deep-dive.md"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """One real ingest per module: the repo's corpus plus a few shared documents."""
    base = tmp_path_factory.mktemp("pristine")
    corpus, out = base / "corpus", base / "chunks"
    shutil.copytree(ROOT / "corpus", corpus, copy_function=shutil.copyfile)
    for rel in EXTRA:
        if (SHARED / rel).is_file():
            (corpus / "shared" / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(SHARED / rel, corpus / "shared" / rel)
    summary = ingest(Options(corpus=corpus, out=out, jobs=1))
    assert not summary.failures
    return corpus, out


@pytest.fixture
def store(pristine: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    """A private copy of the corpus and its chunks, to corrupt."""
    corpus, out = tmp_path / "corpus", tmp_path / "chunks"
    shutil.copytree(pristine[0], corpus, copy_function=shutil.copyfile)
    shutil.copytree(pristine[1], out, copy_function=shutil.copyfile)
    return corpus, out


def manifest(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = dump_state(out)
    return data


def save_manifest(out: Path, data: dict[str, Any]) -> None:
    """Write the (tampered) documents' entries back into the state, as a bug or a hand edit could."""
    db = StateDB(db_path(out / ".chunkyard"))
    with db.transaction():
        for rel, entry in data["docs"].items():
            db.put_doc(rel, entry, int(data.get("generation", 1)))
    db.close()


def load(out: Path, f: str) -> dict[str, Any]:
    data: dict[str, Any] = orjson.loads((out / f).read_bytes())
    return data


def save(out: Path, f: str, rec: dict[str, Any]) -> None:
    (out / f).write_bytes(orjson.dumps(rec, option=orjson.OPT_INDENT_2))


def files_of(out: Path, rel: str = DEEP) -> list[str]:
    files: list[str] = manifest(out)["docs"][rel]["files"]
    return files


def run(store: tuple[Path, Path], **kw: Any) -> Report:
    corpus, out = store
    return validate(out, corpus, jobs=1, **kw)


def found(report: Report, code: str, file: str | None = None) -> bool:
    return any(p.code == code and (file is None or p.file == file) for p in report.problems)


# --- clean output --------------------------------------------------------------------------


def test_clean_output_passes(store: tuple[Path, Path]) -> None:
    report = run(store)
    assert report.ok, report.counts()
    assert report.problems == []
    assert report.code == "ok"
    assert report.files == sum(len(e["files"]) for e in manifest(store[1])["docs"].values())


def test_clean_output_is_stable_under_reingest(store: tuple[Path, Path]) -> None:
    report = run(store, reingest=True)
    assert report.ok, [p.as_dict() for p in report.problems[:5]]


def test_the_process_pool_runs_and_agrees_with_one_process(tmp_path: Path) -> None:
    """validate maps its documents over a pool from 64 documents on: 70 here, a few corrupted.

    The pool is seen at work, not assumed: while outcomes stream in, worker processes are alive
    with ``jobs=2`` and none with ``jobs=1``.
    """
    import multiprocessing

    corpus, out = tmp_path / "corpus", tmp_path / "chunks"
    for i in range(70):
        (corpus / f"d{i // 10}").mkdir(parents=True, exist_ok=True)
        (corpus / f"d{i // 10}" / f"doc{i}.md").write_text(
            f"# Doc {i}\n\nText {i}. More.\n\n## Part\n\nBody {i}.\n", encoding="utf-8"
        )
    assert not ingest(Options(corpus=corpus, out=out, jobs=1, doc_timeout=0, doc_memory_mb=0)).failures
    for i in (3, 41, 69):
        f = f"d{i // 10}/doc_doc{i}__ch1.json"
        rec = load(out, f)
        rec["originalText"] = rec["originalText"].replace("Body", "B0dy")
        save(out, f, rec)
    (corpus / "d5" / "doc55.md").unlink()
    reports, alive = {}, {}
    for jobs in (1, 2):
        seen: list[int] = []
        reports[jobs] = validate(
            out, corpus, jobs=jobs, on_doc=lambda seen=seen: seen.append(len(multiprocessing.active_children()))
        )
        alive[jobs] = max(seen)
        assert len(seen) == 70
    assert alive[1] == 0 and alive[2] >= 1, alive
    assert sorted(map(repr, reports[1].problems)) == sorted(map(repr, reports[2].problems))
    assert set(reports[2].counts()) == {"text_mismatch", "hash_mismatch", "source_missing"}, reports[
        2
    ].counts()
    assert {p.source for p in reports[2].problems} == {
        "d0/doc3.md",
        "d4/doc41.md",
        "d6/doc69.md",
        "d5/doc55.md",
    }


def test_manifest_corpus_is_the_default(pristine: tuple[Path, Path]) -> None:
    assert validate(pristine[1]).ok


def test_every_code_has_meaning_and_fix() -> None:
    for code, (meaning, fix) in CODES.items():
        assert code == code.lower() and meaning and fix


# --- planted corruptions: each is named with its code, file and field -------------------------


def _edit(f_index: int, change: Callable[[dict[str, Any]], None]) -> Callable[[Path, Path], str]:
    def plant(corpus: Path, out: Path) -> str:
        f = files_of(out)[f_index]
        rec = load(out, f)
        change(rec)
        save(out, f, rec)
        return f

    return plant


def _swap_offsets(rec: dict[str, Any]) -> None:
    o = rec["charOffsets"]
    o["charStart"], o["charEnd"] = o["charEnd"], o["charStart"]


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(rec: dict[str, Any]) -> None:
        *head, last = path.split(".")
        for key in head:
            rec = rec[key]
        rec[last] = value

    return change


def _edit_text(rec: dict[str, Any]) -> None:
    rec["originalText"] = rec["originalText"].replace("e", "E", 1)


def _delete_file(corpus: Path, out: Path) -> str:
    f = files_of(out)[2]
    (out / f).unlink()
    return f


def _stray_file(corpus: Path, out: Path) -> str:
    f = "guides/doc_deep-dive__ch999.json"
    shutil.copyfile(out / files_of(out)[0], out / f)
    return f


def _bad_json(corpus: Path, out: Path) -> str:
    f = files_of(out)[1]
    (out / f).write_text('{"id": ', encoding="utf-8")
    return f


def _duplicate_chunk_id(corpus: Path, out: Path) -> str:
    f0, f1 = files_of(out)[0], files_of(out)[1]
    rec = load(out, f1)
    rec["chunk_id"] = load(out, f0)["chunk_id"]
    save(out, f1, rec)
    return f1


def _duplicate_across_docs(corpus: Path, out: Path) -> str:
    """Two documents claim the same id: a chunk file moved into another document's slot."""
    other = files_of(out, "getting-started.md")[0]
    f = files_of(out)[0]
    rec = load(out, f)
    rec["id"] = load(out, other)["id"]
    save(out, f, rec)
    return f


def _edit_source(corpus: Path, out: Path) -> str:
    path = corpus / DEEP
    text = path.read_text(encoding="utf-8")
    cut = len(text) // 3
    path.write_text(
        text[:cut] + " An inserted sentence moves every later offset. " + text[cut:], encoding="utf-8"
    )
    return ""


def _delete_source(corpus: Path, out: Path) -> str:
    (corpus / DEEP).unlink()
    return ""


def _manifest_hash(corpus: Path, out: Path) -> str:
    data = manifest(out)
    data["docs"][DEEP]["hashes"][4] = "blake3:" + "0" * 64
    save_manifest(out, data)
    return files_of(out)[4]


def _uncovered(corpus: Path, out: Path) -> str:
    """Trim the last character off a document's last chunk, keeping the file self-consistent."""
    f = files_of(out)[-1]
    rec = load(out, f)
    rec["originalText"] = rec["originalText"][:-1]
    rec["charOffsets"]["charEnd"] -= 1
    rec["charOffsets"]["totalChars"] -= 1
    rec["blocks"][-1]["charEnd"] = min(rec["blocks"][-1]["charEnd"], rec["charOffsets"]["charEnd"])
    rec["hash"] = "blake3:" + blake3(rec["originalText"].encode()).hexdigest()
    save(out, f, rec)
    data = manifest(out)
    data["docs"][DEEP]["hashes"][-1] = rec["hash"]
    save_manifest(out, data)
    return ""


def _bad_order(corpus: Path, out: Path) -> str:
    """Swap the chunk_ids of two chunks of one section, in the files and the manifest alike."""
    data = manifest(out)
    entry = data["docs"][DEEP]
    recs = [load(out, f) for f in entry["files"]]
    i = next(k for k in range(len(recs) - 1) if recs[k]["section_id"] == recs[k + 1]["section_id"])
    a, b = recs[i]["chunk_id"], recs[i + 1]["chunk_id"]
    for k, cid in ((i, b), (i + 1, a)):
        recs[k]["chunk_id"] = cid
        entry["chunk_ids"][k] = cid
        save(out, entry["files"][k], recs[k])
    save_manifest(out, data)
    return str(entry["files"][i])


def _redirect(table: dict[str, str]) -> Callable[[Path, Path], str]:
    def plant(corpus: Path, out: Path) -> str:
        db = StateDB(db_path(out / ".chunkyard"))
        with db.transaction():
            for old, new in table.items():
                db.set_redirect(old, new)
        db.close()
        return STATE_REDIRECTS

    return plant


def _redirect_chain(corpus: Path, out: Path) -> str:
    """a → b → a live chunk: a chain (not collapsed), but nothing dangles."""
    live = manifest(out)["docs"][DEEP]["chunk_ids"][0]
    table = {
        "a|r=00000000|s=1|p=000|b=000": "b|r=00000000|s=1|p=000|b=000",
        "b|r=00000000|s=1|p=000|b=000": live,
    }
    return _redirect(table)(corpus, out)


def _temp_file(corpus: Path, out: Path) -> str:
    f = "guides/.doc_deep-dive__ch0.json.4242.tmp"
    (out / f).write_text("{", encoding="utf-8")
    return f


def _mixed_policy(corpus: Path, out: Path) -> str:
    data = manifest(out)
    data["docs"][DEEP]["policy_hash"] = "0123456789abcdef"
    save_manifest(out, data)
    return STATE_DB_FILE


CORRUPTIONS: dict[str, tuple[Callable[[Path, Path], str], tuple[str, ...]]] = {
    "edit originalText": (_edit(3, _edit_text), ("text_mismatch", "hash_mismatch")),
    "swap offsets": (_edit(3, _swap_offsets), ("bad_offsets",)),
    "wrong totalChars": (_edit(3, _set("charOffsets.totalChars", 1)), ("bad_offsets",)),
    "offsets past the end": (_edit(3, _set("charOffsets.charEnd", 10**7)), ("bad_offsets",)),
    "wrong lineSpan": (_edit(3, _set("lineSpan.lineEnd", 1)), ("bad_line_span",)),
    "block outside the chunk": (
        _edit(3, _set("blocks", [{"block_id": "x", "type": "paragraph", "charStart": 0, "charEnd": 1}])),
        ("bad_blocks",),
    ),
    "delete a chunk file": (_delete_file, ("missing_file",)),
    "stray chunk file": (_stray_file, ("stale_file", "duplicate_id", "duplicate_chunk_id")),
    "leftover temp file": (_temp_file, ("stale_file",)),
    "duplicate chunk_id": (_duplicate_chunk_id, ("duplicate_chunk_id",)),
    "duplicate id": (_duplicate_across_docs, ("duplicate_id", "broken_chain")),
    "broken prevId": (_edit(3, _set("prevId", "doc:guides/deep-dive::ch0")), ("broken_chain",)),
    "broken nextId": (_edit(3, _set("nextId", None)), ("broken_chain",)),
    "chunkNumber gap": (_edit(3, _set("chunkNumber", 7)), ("broken_chain",)),
    "edit the source": (_edit_source, ("source_changed", "rev_mismatch", "text_mismatch")),
    "delete the source": (_delete_source, ("source_missing",)),
    "wrong hash": (_edit(3, _set("hash", "blake3:" + "a" * 64)), ("hash_mismatch",)),
    "wrong rev": (_edit(3, _set("rev", "00000000")), ("rev_mismatch",)),
    "break the schema": (_edit(3, _set("contentType", "page")), ("schema_invalid",)),
    "drop a required field": (_edit(3, lambda r: r.pop("anchor")), ("schema_invalid",)),
    "not JSON": (_bad_json, ("bad_json",)),
    "manifest disagrees": (_manifest_hash, ("manifest_mismatch",)),
    "section_id vs chunk_id": (_edit(3, _set("section_id", "9")), ("bad_chunk_id",)),
    "wrong sourceFile": (_edit(3, _set("metadata.sourceFile", "elsewhere.md")), ("manifest_mismatch",)),
    "text lost": (_uncovered, ("uncovered_text",)),
    "bad order": (_bad_order, ("bad_order",)),
    "mixed policy": (_mixed_policy, ("mixed_policy",)),
    "dangling redirect": (
        _redirect({"gone|r=00000000|s=1|p=000|b=000": "nowhere|r=0|s=1|p=000|b=000"}),
        ("dangling_redirect",),
    ),
    "redirect chain": (_redirect_chain, ("redirect_chain",)),
}


#: Codes a corruption may raise besides its own, each for a stated reason; any other is noise.
ALSO: dict[str, tuple[str, ...]] = {
    # the file's chunk_id is another chunk's: the manifest disagrees, and its s= is not the file's section
    "duplicate chunk_id": ("manifest_mismatch", "bad_chunk_id"),
    "duplicate id": ("manifest_mismatch",),  # the file's id is not the one the manifest lists
    "mixed policy": ("manifest_mismatch",),  # each file's policyHash now disagrees with its entry
    "swap offsets": ("uncovered_text",),  # a chunk with start > end covers nothing
    "wrong hash": ("manifest_mismatch",),  # the manifest keeps the true hash
}


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_corruption_is_named(store: tuple[Path, Path], name: str) -> None:
    plant, expected = CORRUPTIONS[name]
    f = plant(*store)
    report = run(store)
    assert not report.ok
    for code in expected:
        assert code in CODES
        assert found(report, code), f"{name}: expected {code}, got {report.counts()}"
    unrelated = set(report.counts()) - set(expected) - set(ALSO.get(name, ()))
    assert not unrelated, f"{name}: unrelated codes {sorted(unrelated)} in {report.counts()}"
    if f:
        assert any(p.file == f for p in report.problems), f"{name}: no problem names {f}"
    for p in report.problems:
        assert p.field and p.message and p.fix


def test_swapped_offsets_name_file_and_field(store: tuple[Path, Path]) -> None:
    f = _edit(3, _swap_offsets)(*store)
    problem = next(p for p in run(store).problems if p.code == "bad_offsets" and p.field == "charOffsets")
    assert problem.file == f and problem.source == DEEP
    assert "chunkyard ingest --full" in problem.fix


def test_edited_source_points_at_ingest(store: tuple[Path, Path]) -> None:
    _edit_source(*store)
    report = run(store)
    changed = next(p for p in report.problems if p.code == "source_changed")
    assert changed.source == DEEP and changed.fix == "run `chunkyard ingest`"
    assert {p.source for p in report.problems} == {DEEP}


def test_unstable_id_needs_reingest(store: tuple[Path, Path]) -> None:
    """A chunk_id rewritten consistently everywhere passes the static checks; re-chunking catches it."""
    _corpus, out = store
    data = manifest(out)
    entry = data["docs"][DEEP]
    for k, f in enumerate(entry["files"]):
        rec = load(out, f)
        rec["chunk_id"] = rec["chunk_id"].replace("|p=000|", "|p=001|")
        entry["chunk_ids"][k] = rec["chunk_id"]
        save(out, f, rec)
    save_manifest(out, data)
    assert run(store).ok
    report = run(store, reingest=True)
    assert found(report, "unstable_id")


def test_stale_content_needs_reingest(store: tuple[Path, Path]) -> None:
    _corpus, out = store
    f = files_of(out)[5]
    rec = load(out, f)
    rec["anchor"] = "not the first salient sentence"
    save(out, f, rec)
    assert run(store).ok
    report = run(store, reingest=True)
    assert [(p.code, p.file, p.field) for p in report.problems] == [("stale_content", f, "anchor")]


def test_new_source_is_only_a_warning(store: tuple[Path, Path]) -> None:
    corpus, _out = store
    (corpus / "late.md").write_text("# Late\n\nNever ingested.\n", encoding="utf-8")
    report = run(store)
    assert report.ok and report.code == "ok"
    assert [(p.code, p.source, p.severity) for p in report.problems] == [
        ("not_ingested", "late.md", "warning")
    ]


def test_no_folder_or_no_manifest_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such chunk folder"):
        validate(tmp_path / "nothing")
    with pytest.raises(UsageError, match="no manifest"):
        validate(tmp_path)


# --- the command line ----------------------------------------------------------------------

runner = CliRunner()


def test_cli_clean_exits_zero(store: tuple[Path, Path]) -> None:
    corpus, out = store
    result = runner.invoke(app, ["validate", "--out", str(out), "--corpus", str(corpus)])
    assert result.exit_code == 0, result.output
    assert "ok" in result.output


def test_cli_json_names_codes_and_exits_one(store: tuple[Path, Path]) -> None:
    corpus, out = store
    f = _delete_file(corpus, out)
    _edit(3, _swap_offsets)(corpus, out)
    result = runner.invoke(app, ["validate", "--out", str(out), "--corpus", str(corpus), "--json", "-j", "1"])
    assert result.exit_code == 1
    doc = orjson.loads(result.stdout)
    assert doc["ok"] is False and doc["code"] in doc["counts"]
    assert {"missing_file", "bad_offsets"} <= set(doc["counts"])
    missing = next(p for p in doc["problems"] if p["code"] == "missing_file")
    assert missing["file"] == f and missing["fix"] and missing["severity"] == "error"


def test_cli_rich_report_has_table_and_examples(store: tuple[Path, Path]) -> None:
    corpus, out = store
    _edit(3, _edit_text)(corpus, out)
    result = runner.invoke(app, ["validate", "--out", str(out), "--corpus", str(corpus)])
    assert result.exit_code == 1
    assert "text_mismatch" in result.output and "hash_mismatch" in result.output
    assert "doc_deep-dive__ch3.json" in result.output


def test_cli_usage_errors_exit_two(tmp_path: Path, store: tuple[Path, Path]) -> None:
    result = runner.invoke(app, ["validate", "--out", str(tmp_path / "missing")])
    assert result.exit_code == 2
    result = runner.invoke(app, ["validate", "--out", str(store[1]), "--corpus", str(tmp_path / "nope")])
    assert result.exit_code == 2


def test_cli_help() -> None:
    result = runner.invoke(app, ["validate", "--help"])
    assert result.exit_code == 0
    assert "--reingest" in result.output and "--corpus" in result.output
