"""What the command line promises and nothing tested before (issue 14): every ``--json`` output
against its JSON Schema in ``schemas/``, the usage-error JSON, and the options one by one —
``--exclude`` and ``.git``, ``--lang``, ``--tokenizer o200k_base``, ``--no-context-prefix``,
``-j 0``, an argument and ``--corpus`` at once, the unguarded path, and ``r=`` widening."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, stable
from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.run.db import dump_state
from pipeline.stages.tokens import get_encoding

SCHEMAS = ROOT / "schemas"
runner = CliRunner()


@cache
def validator(name: str) -> Any:
    """python-jsonschema over ``schemas/<name>.schema.json`` (its ``$ref``s resolved in ``schemas/``)."""
    import jsonschema
    from referencing import Registry, Resource

    resources = []
    for path in SCHEMAS.glob("*.schema.json"):
        schema = json.loads(path.read_text(encoding="utf-8"))
        resources.append((path.name, Resource.from_contents(schema)))
        resources.append((schema["$id"], Resource.from_contents(schema)))
    schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, registry=Registry().with_resources(resources), format_checker=cls.FORMAT_CHECKER)


def conforms(name: str, doc: Any) -> None:
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator(name).iter_errors(doc)]
    assert not errors, f"{name}: {errors[:5]}"


def invoke(*args: str) -> Any:
    return runner.invoke(app, list(args), env={"COLUMNS": "250"})


def corpus_at(root: Path, docs: dict[str, str]) -> Path:
    for rel, text in docs.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    return root


DOCS = {
    "a.md": "# Alpha\n\nFirst paragraph. Second sentence.\n\n## Sub\n\nMore text here.\n",
    "drafts/b.md": "# Draft\n\nNot ready.\n",
    "drafts/keep/c.md": "# Kept?\n\nUnder drafts too.\n",
    ".git/d.md": "# Git internals\n\nNever a document.\n",
    "e.md": "---\nlang: de\n---\n# Deutsch\n\nEin Satz.\n",
}


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return corpus_at(tmp_path / "corpus", DOCS)


def sources(out: Path) -> set[str]:
    return set(dump_state(out)["docs"])


def records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_bytes()) for p in sorted(out.rglob("doc_*.json"))]


# -- every --json output has a schema ------------------------------------------------------


def test_every_schema_is_valid_2020_12() -> None:
    for path in SCHEMAS.glob("*.schema.json"):
        validator(path.name.removesuffix(".schema.json"))


def test_the_ingest_summary_keys(corpus: Path, tmp_path: Path) -> None:
    result = invoke("ingest", str(corpus), "--out", str(tmp_path / "o"), "--json", "-j", "1")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    conforms("ingest-summary", summary)
    assert summary["documents"] == 4 and summary["failed"] == 0 and summary["failures"] == []
    assert summary["chunks"] == summary["added"] == summary["written"] == len(records(tmp_path / "o"))
    # a failure is counted and listed
    (corpus / "bad.md").write_bytes(b"# Bad\n\n\xff\n")
    result = invoke("ingest", str(corpus), "--out", str(tmp_path / "o"), "--json", "-j", "1")
    assert result.exit_code == 1
    summary = json.loads(result.stdout)
    conforms("ingest-summary", summary)
    assert summary["failed"] == 1 and summary["failures"][0].startswith("bad.md:")


@pytest.mark.parametrize(
    "command",
    [
        ["ingest", "{tmp}/no-corpus", "--out", "{tmp}/o"],
        ["watch", "{tmp}/no-corpus", "--out", "{tmp}/o"],
        ["validate", "--out", "{tmp}/no-chunks"],
        ["resolve", "x|r=00000000|s=1|p=000|b=000", "--out", "{tmp}/no-chunks"],
        ["check-citations", "{tmp}/answer.json", "--out", "{tmp}/no-chunks"],
    ],
    ids=lambda c: c[0],
)
def test_the_usage_error_json(command: list[str], tmp_path: Path) -> None:
    """Exit 2, and on stdout one JSON object that says so (``schemas/usage-error.schema.json``)."""
    (tmp_path / "answer.json").write_text('{"answer": "x", "citations": []}')
    result = invoke(*[c.format(tmp=tmp_path) for c in command], "--json")
    assert result.exit_code == 2, result.output
    doc = json.loads(result.stdout)
    conforms("usage-error", doc)
    assert "no-" in doc["error"]


def test_validate_resolve_and_check_citations_json(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    assert invoke("ingest", str(corpus), "--out", str(out), "-q", "-j", "1").exit_code == 0
    result = invoke("validate", "--out", str(out), "--json", "-j", "1")
    assert result.exit_code == 0
    conforms("validate-report", json.loads(result.stdout))
    (out / records(out)[0]["metadata"]["sourceFile"].replace(".md", "")).with_suffix(
        ".md"
    )  # (a path, unused)
    rec = records(out)[0]
    result = invoke("resolve", rec["chunk_id"], "--out", str(out), "--json")
    assert result.exit_code == 0
    payload = json.loads(result.stdout)
    conforms("resolve", payload)
    result = invoke("resolve", "nothing|r=00000000|s=1|p=000|b=000", "--out", str(out), "--json")
    assert result.exit_code == 1
    conforms("resolve", json.loads(result.stdout))
    answer = tmp_path / "answer.json"
    answer.write_text(json.dumps({"answer": "x", "citations": [payload]}))
    result = invoke("check-citations", str(answer), "--out", str(out), "--json")
    assert result.exit_code == 0
    conforms("citations-report", json.loads(result.stdout))
    answer.write_text(json.dumps({"answer": "x", "citations": [{**payload, "rev": "00000000"}]}))
    result = invoke("check-citations", str(answer), "--out", str(out), "--json")
    assert result.exit_code == 1
    conforms("citations-report", json.loads(result.stdout))


# -- the options, one by one ----------------------------------------------------------------


def test_exclude_and_git_folders_are_skipped(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    assert invoke("ingest", str(corpus), "--out", str(out), "-q", "-j", "1").exit_code == 0
    assert sources(out) == {"a.md", "drafts/b.md", "drafts/keep/c.md", "e.md"}  # never .git/
    result = invoke("ingest", str(corpus), "--out", str(out), "-q", "-j", "1", "--exclude", "drafts/*")
    assert result.exit_code == 0, result.output
    assert sources(out) == {"a.md", "e.md"}  # a glob over the path: drafts/keep/c.md too
    assert not list((out / "drafts").rglob("*.json")) if (out / "drafts").exists() else True
    result = invoke(
        "ingest", str(corpus), "--out", str(out), "-q", "-j", "1", "--exclude", "a.md", "--exclude", "e.md"
    )
    assert sources(out) == {"drafts/b.md", "drafts/keep/c.md"}


def test_lang_is_the_default_front_matter_overrides(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    assert invoke("ingest", str(corpus), "--out", str(out), "-q", "-j", "1", "--lang", "fr").exit_code == 0
    langs = {r["metadata"]["sourceFile"]: r["metadata"]["lang"] for r in records(out)}
    assert langs["a.md"] == "fr" and langs["e.md"] == "de"
    assert {r["metadata"]["chunkingOptions"]["lang"] for r in records(out)} == {"fr"}


def test_tokenizer_o200k_counts_with_o200k(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    result = invoke("ingest", str(corpus), "--out", str(out), "-q", "-j", "1", "--tokenizer", "o200k_base")
    assert result.exit_code == 0, result.output
    o200k = get_encoding("o200k_base").encode_ordinary
    for r in records(out):
        assert r["tokenStats"]["tokenizer"] == "o200k_base"
        assert r["tokenStats"]["tokens"] == len(o200k(r["embedText"]))
    assert invoke("ingest", str(corpus), "--out", str(out), "--tokenizer", "gpt2").exit_code == 2


def test_no_context_prefix_embeds_the_text_alone(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "o"
    assert (
        invoke("ingest", str(corpus), "--out", str(out), "-q", "-j", "1", "--no-context-prefix").exit_code
        == 0
    )
    recs = records(out)
    assert recs and all(r["embedText"] == r["originalText"] for r in recs)
    assert {r["metadata"]["chunkingOptions"]["context_prefix"] for r in recs} == {False}


def test_jobs_0_is_one_per_core_and_changes_nothing(corpus: Path, tmp_path: Path) -> None:
    one, every = tmp_path / "one", tmp_path / "every"
    assert invoke("ingest", str(corpus), "--out", str(one), "-q", "-j", "1").exit_code == 0
    assert invoke("ingest", str(corpus), "--out", str(every), "-q", "-j", "0").exit_code == 0
    assert [stable(r) for r in records(one)] == [stable(r) for r in records(every)]


def test_an_argument_and_corpus_at_once_is_a_usage_error(corpus: Path, tmp_path: Path) -> None:
    for command in ("ingest", "watch"):
        result = invoke(command, str(corpus), "--corpus", str(tmp_path), "--out", str(tmp_path / "o"))
        assert result.exit_code == 2, result.output
        assert "not both" in result.output
    assert not (tmp_path / "o").exists()


def test_the_unguarded_path_gives_the_same_files(corpus: Path, tmp_path: Path) -> None:
    """``--doc-timeout 0 --doc-memory 0``: no guard pool, plain workers; the same output."""
    guarded, bare = tmp_path / "guarded", tmp_path / "bare"
    (corpus / "bad.md").write_bytes(b"# Bad\n\n\xff\n")
    cmd = [sys.executable, "-m", "pipeline", "ingest", str(corpus), "--json", "-j", "2"]
    a = subprocess.run([*cmd, "--out", str(guarded)], capture_output=True, text=True, check=False)
    b = subprocess.run([*cmd, "--out", str(bare), "--doc-timeout", "0", "--doc-memory", "0"],
                       capture_output=True, text=True, check=False)  # fmt: skip
    assert a.returncode == b.returncode == 1, b.stderr
    assert json.loads(a.stdout)["failures"] == json.loads(b.stdout)["failures"]
    assert [stable(r) for r in records(guarded)] == [stable(r) for r in records(bare)]


def test_a_doc_uid_collision_widens_r_to_12_hex_and_warns(tmp_path: Path) -> None:
    """Two documents with one ``doc_id`` and one outline: ``doc_uid|r`` collides, so the later
    one's ``r=`` is widened to 12 hex (000), with a warning; a third collision cannot widen."""
    same = "---\ndoc_id: shared\n---\n# Same outline\n\n{text}\n"
    corpus = corpus_at(tmp_path / "c", {"x.md": same.format(text="One."), "y.md": same.format(text="Two.")})
    out = tmp_path / "o"
    result = invoke("ingest", str(corpus), "--out", str(out), "--json", "-j", "1")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert [w for w in summary["warnings"] if "r= widened to 12 hex" in w] == [
        "y.md: mint: doc_uid|r collides with x.md; r= widened to 12 hex"
    ]
    ids = {r["metadata"]["sourceFile"]: r["chunk_id"] for r in records(out)}
    assert ids["x.md"].split("|")[1].startswith("r=") and len(ids["x.md"].split("|")[1]) == 2 + 8
    assert len(ids["y.md"].split("|")[1]) == 2 + 12
    assert ids["x.md"].split("|")[1][2:] == ids["y.md"].split("|")[1][2:10]  # the same rev, widened
    # incremental: nothing moves on a second run
    again = json.loads(invoke("ingest", str(corpus), "--out", str(out), "--json", "-j", "1").stdout)
    assert (again["written"], again["warnings"]) == (0, [])
    assert validate_ok(out)


def validate_ok(out: Path) -> bool:
    from pipeline.audit.validate import validate

    report = validate(out, jobs=1)
    return report.ok and not [p for p in report.problems if p.severity == "error"]
