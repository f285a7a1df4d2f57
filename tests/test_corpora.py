"""Integration over ../shared/corpora: every real-world corpus ingests cleanly and passes the
independent contract checker (``../shared/tools/check_chunks.py``, markdown-it-py based).

All corpora are ingested once per session (``--jobs 2``); while one ingests, the checker
runs on the previous one in a second process. Skipped when the corpora are absent;
``pytest -m 'not corpora'`` leaves them out.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import pytest
from conftest import CORPORA, load_checker, need_checker, need_corpora, require, schema_errors

from pipeline.models import Policy
from pipeline.run.ingest import Options, Summary, ingest

pytestmark = [pytest.mark.corpora, pytest.mark.slow]

NAMES = sorted(p.name for p in CORPORA.iterdir() if p.is_dir()) if CORPORA.is_dir() else []
#: python-jsonschema is slow (~3 ms a record): it checks every Nth file; the pipeline itself
#: checks every record with jsonschema-rs before writing it.
SCHEMA_SAMPLE = 40


@dataclass
class Run:
    summary: Summary | None
    out: Path
    fails: dict[str, list[str]]
    counts: dict[str, int]
    totals: dict[str, int]
    schema_fails: list[str]
    error: str = ""


def check_output(
    corpus: Path, out: Path
) -> tuple[dict[str, list[str]], dict[str, int], dict[str, int], list[str]]:
    """The checker over one output folder, plus a sample through python-jsonschema.

    Runs in a worker process, where markdown-it's inline pass is switched off: the checker
    reads block tokens only (headings, fences, tables), which that pass never changes, and
    it halves the checker's time.
    """
    checker = load_checker()
    if not hasattr(checker, "FullMarkdownIt"):
        checker.FullMarkdownIt = checker.MarkdownIt
        checker.MarkdownIt = lambda *a, **k: checker.FullMarkdownIt(*a, **k).disable("inline")
    report = checker.Report()
    totals = checker.check(corpus, out, None, report)
    schema_fails = []
    for i, path in enumerate(sorted(out.rglob("doc_*.json"))):
        if i % SCHEMA_SAMPLE == 0:
            errors = schema_errors(json.loads(path.read_bytes()))
            if errors:
                schema_fails.append(f"{path.relative_to(out)}: {errors[0]}")
    return dict(report.fails), dict(report.counts), totals, schema_fails


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    corpora_dir = need_corpora()
    need_checker()
    base = tmp_path_factory.mktemp("corpora")
    done: dict[str, Run] = {}
    pending: dict[str, tuple[Summary, Path, Future[Any]]] = {}
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("fork")) as pool:
        for name in NAMES:
            out = base / name
            try:
                summary = ingest(Options(corpus=corpora_dir / name, out=out, policy=Policy(), jobs=2))
            except Exception as exc:  # noqa: BLE001 # reported by the test for this corpus
                done[name] = Run(None, out, {}, {}, {}, [], error=f"{type(exc).__name__}: {exc}")
                continue
            pending[name] = (summary, out, pool.submit(check_output, corpora_dir / name, out))
        for name, (summary, out, future) in pending.items():
            done[name] = Run(summary, out, *future.result())
    return done


def records(run: Run, rel_dir: str, stem: str) -> list[dict[str, Any]]:
    """The chunk records of one document, in order (no glob: stems like ``[[`` are literal)."""
    name = re.compile(rf"^doc_{re.escape(stem)}__ch(\d+)\.json$")
    found = {}
    for path in (run.out / rel_dir).iterdir():
        m = name.match(path.name)
        if m:
            found[int(m[1])] = json.loads(path.read_bytes())
    return [found[n] for n in sorted(found)]


@pytest.mark.parametrize("name", NAMES)
def test_corpus_ingests_and_passes_the_checker(name: str, runs: dict[str, Run], corpora_dir: Path) -> None:
    run = runs[name]
    assert not run.error
    assert run.summary is not None
    assert run.summary.failures == []
    assert run.summary.exit_code == 0
    sources = [p for p in (corpora_dir / name).rglob("*") if p.suffix.lower() in (".md", ".markdown")]
    assert run.summary.documents == len(sources)
    assert run.totals["files"] == run.summary.chunks > 0
    assert run.totals["docs"] == len(sources)
    violations = {check: fails[:3] for check, fails in run.fails.items() if fails}
    assert violations == {}
    for check in ("offsets.slice", "lines.span", "section.boundary", "coverage", "id.unique", "atomic.code"):
        assert run.counts.get(check, 0) > 0 or check == "atomic.code", f"{check} never ran"
    assert run.schema_fails == []


def only(name: str, runs: dict[str, Run]) -> Run:
    if name not in runs:
        require("corpora", f"corpus {name} absent from {CORPORA}")
    return runs[name]


def test_bom_before_front_matter(runs: dict[str, Run], corpora_dir: Path) -> None:
    run = only("powershell-docs", runs)
    recs = records(run, "reference/5.1/Microsoft.PowerShell.Utility", "Write-Host")
    assert recs
    src = (
        corpora_dir / "powershell-docs/reference/5.1/Microsoft.PowerShell.Utility/Write-Host.md"
    ).read_bytes()
    assert src.startswith(b"\xef\xbb\xbf---")
    text = src.decode("utf-8-sig").replace("\r\n", "\n")
    assert recs[0]["charOffsets"]["charStart"] >= text.index("\n---", 3) + 4
    assert recs[0]["metadata"]["frontMatter"]["title"] == "Write-Host"
    assert recs[0]["fileTitle"] == "Write-Host"


def test_crlf_files_have_no_carriage_returns(runs: dict[str, Run]) -> None:
    run = only("powershell-docs", runs)
    recs = records(run, "reference/5.1/Microsoft.PowerShell.Security", "Set-Acl")
    assert recs
    assert all("\r" not in r["originalText"] and "\r" not in r["embedText"] for r in recs)


def test_1898_line_code_block_is_one_chunk(runs: dict[str, Run]) -> None:
    run = only("eips", runs)
    recs = records(run, "EIPS", "eip-7643")
    big = [r for r in recs if r["lineSpan"]["lineEnd"] - r["lineSpan"]["lineStart"] > 1800]
    assert len(big) == 1
    assert big[0]["block_type"] == "code"
    assert big[0]["tokenStats"]["tokens"] > big[0]["metadata"]["chunkingOptions"]["target_tokens"]


def test_every_h2_of_the_release_notes_opens_a_chunk(runs: dict[str, Run], corpora_dir: Path) -> None:
    run = only("fastapi-en", runs)
    recs = records(run, "docs/en/docs", "release-notes")
    text = (corpora_dir / "fastapi-en/docs/en/docs/release-notes.md").read_text(encoding="utf-8")
    checker = load_checker()
    h2 = [start for start, level in checker.Outline(text).headings if level == 2]
    assert len(h2) >= 298
    starts = {r["charOffsets"]["charStart"] for r in recs}
    assert set(h2) <= starts


def test_tldr_punctuation_names(runs: dict[str, Run]) -> None:
    run = only("tldr-common", runs)
    for stem in ("!", "[[", "]]", "%", "((", ","):
        recs = records(run, "pages/common", stem)
        assert recs, stem
        assert recs[0]["id"] == f"doc:pages/common/{stem}::ch0"
        assert recs[0]["metadata"]["sourceFile"] == f"pages/common/{stem}.md"


def test_huge_tables_split_between_rows(runs: dict[str, Run], corpora_dir: Path) -> None:
    run = only("public-apis", runs)
    recs = records(run, ".", "README")
    text = (corpora_dir / "public-apis/README.md").read_text(encoding="utf-8")
    tables = [r for r in recs if r["block_type"] == "table"]
    assert tables
    for r in tables:
        s, e = r["charOffsets"]["charStart"], r["charOffsets"]["charEnd"]
        assert s == 0 or text[s - 1] == "\n", "a table piece starts at a row"
        assert not text[e:].split("\n", 1)[0].strip(), "a table piece ends at a row (trailing blanks aside)"
