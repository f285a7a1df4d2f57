"""chunkyard view without a browser: the data in the page, its escaping, its CSP, the terminal view."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from rich.console import Console

from pipeline.audit.chunk_state import open_store
from pipeline.view import collect, render_eval, render_search, report_bytes
from pipeline.view.page import json_block
from pipeline.view.results import metric_series
from pipeline.view.terminal import BANDS, OVERLAP, banded, printable

ROOT = Path(__file__).resolve().parents[1]

HOSTILE = (
    "# Evil <b>title</b> \"quoted' &amp;\n\n"
    "<script>window.__pwned = 1</script>\n\n"
    "</script><script>window.__pwned = 2</script><!--\n\n"
    "Text with </textarea><img src=x onerror=\"window.__pwned=3\"> and \"quotes' `ticks`.\n\n"
    "<svg onload=window.__pwned=4></svg>\n\n"
    "## عربي RTL \u202e override \u2066isolate\n\n"
    "Controls: \x01\x07\x1b[31mred\x1b[0m \x7f \u0085 and zero width \u200b joiner.\n\n"
    "```html\n<iframe src=\"https://example.com\"></iframe>\n```\n"
)


def chunkyard(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args], check=False, cwd=cwd, capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample corpus plus a hostile document and one that fails, ingested."""
    base = tmp_path_factory.mktemp("view")
    corpus = base / "corpus"
    subprocess.run(["cp", "-r", str(ROOT / "corpus"), str(corpus)], check=True)
    (corpus / "evil.md").write_text(HOSTILE, encoding="utf-8")
    (corpus / "broken.md").write_bytes(b"# Broken\n\n\xff\xfe not utf-8\n")
    run = chunkyard("ingest", str(corpus), "--out", str(base / "chunks"), "--quiet")
    assert run.returncode == 1, run.stderr  # broken.md fails, the rest is chunked
    return base


def data_blocks(page: bytes) -> dict[str, object]:
    found = re.findall(rb'<script type="application/json" id="([^"]+)">(.*?)</script>', page, re.DOTALL)
    return {name.decode(): json.loads(body) for name, body in found}


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[str] = []
        self.styles: list[str] = []
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in = tag if tag in ("script", "style") else None

    def handle_data(self, data: str) -> None:
        if self._in == "script" and self.tags[-1][1].get("type") is None:
            self.scripts.append(data)
        elif self._in == "style":
            self.styles.append(data)

    def handle_endtag(self, tag: str) -> None:
        self._in = None


def sha(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def test_json_block_escapes_every_angle_bracket() -> None:
    value = {"t": "</script><!-- <script> \u2028 \x00 é"}
    raw = json_block(value)
    assert b"<" not in raw
    assert json.loads(raw) == value


def test_report_holds_exact_chunk_offsets_and_only_its_own_markup(store_dir: Path) -> None:
    store = open_store(store_dir / "chunks")
    report = collect(store)
    page = report_bytes(report)
    blocks = data_blocks(page)
    meta = blocks.pop("cy-meta")
    assert isinstance(meta, dict)
    table = meta["overview"]["table"]
    assert [r[0] for r in table] == sorted(store.docs)
    for n, rel in enumerate(sorted(store.docs)):
        doc = blocks[f"cy-doc-{n}"]
        assert isinstance(doc, dict)
        files = store.docs[rel]["files"]
        assert [c[12] for c in doc["chunks"]] == files
        source = store.source(rel)
        assert source is not None and doc["text"] == source.text
        for row, file in zip(doc["chunks"], files, strict=True):
            rec = store.read_record(file)
            off = rec["charOffsets"]
            assert (row[0], row[1], row[2]) == (off["charStart"], off["charEnd"], rec["tokenStats"]["tokens"])
            assert row[4] == rec["chunk_id"] and row[3] == rec["id"]
            assert doc["text"][row[0] : row[1]] == rec["originalText"]
    # the hostile document's markup is data, never markup of the page
    parser = Tags()
    parser.feed(page.decode())
    names = [t for t, _ in parser.tags]
    assert names.count("script") == len(store.docs) + 2  # cy-meta, one per document, our script
    assert not {"img", "svg", "iframe", "textarea", "b"} & set(names)
    assert len(parser.scripts) == 1 and len(parser.styles) == 1
    csp = next(a["content"] for t, a in parser.tags if t == "meta" and a.get("http-equiv"))
    assert csp is not None
    assert f"script-src {sha(parser.scripts[0])};" in csp
    assert f"style-src {sha(parser.styles[0])};" in csp
    assert "default-src 'none'" in csp and "unsafe-inline" not in csp


def test_overview_counts_failures_and_stale_documents(store_dir: Path, tmp_path: Path) -> None:
    store = open_store(store_dir / "chunks")
    report = collect(store)
    o = report.overview
    total = sum(len(e["files"]) for e in store.docs.values())
    assert o["chunks"] == total == sum(o["histogram"]["counts"])
    h = o["histogram"]
    assert sum(h["counts"][h["target_bin"] :]) == o["over_budget_total"] > 0
    assert h["edges"][h["target_bin"]] == o["policy"]["target_tokens"]
    assert [r[0] for r in o["largest"]] == sorted((r[0] for r in o["largest"]), reverse=True)
    assert o["largest"][0][0] >= o["smallest"][-1][0]
    assert all(r[0] > o["policy"]["target_tokens"] for r in o["over_budget"])
    assert [f[0] for f in o["failures"]] == ["broken.md"]
    assert "not valid UTF-8" in o["failures"][0][1]
    assert not any(d.stale for d in report.docs)
    # a source edited after the ingest: its chunks no longer match, and the report says so
    corpus = tmp_path / "corpus"
    subprocess.run(["cp", "-r", str(store.corpus), str(corpus)], check=True)
    intro = corpus / "getting-started.md"
    intro.write_text("# Moved\n\n" + intro.read_text(encoding="utf-8"), encoding="utf-8")
    moved = collect(open_store(store_dir / "chunks", corpus), ["getting-started.md"])
    assert moved.docs[0].stale == len(moved.docs[0].chunks) > 0


def test_terminal_bands_alternate_and_controls_are_shown_as_symbols(store_dir: Path) -> None:
    store = open_store(store_dir / "chunks")
    doc = collect(store, ["evil.md"]).docs[0]
    assert "\x1b" in doc.text and "\x1b" not in printable(doc.text)
    assert len(printable(doc.text)) == len(doc.text)
    text = banded(doc)
    assert "\x1b" not in text.plain and "\x07" not in text.plain
    styled = {(s.start, s.end): str(s.style) for s in text.spans}
    for n, ch in enumerate(doc.chunks):
        assert styled[(ch[0], ch[1])] == BANDS[n % 2]
    console = Console(record=True, width=100, color_system=None)
    from pipeline.view.terminal import print_document

    print_document(doc, console)
    shown = console.export_text()
    assert "window.__pwned = 1" in shown and "\x1b" not in shown


def test_histogram_bins_end_at_the_target() -> None:
    from pipeline.view.collect import histogram

    h = histogram([0, 1, 51, 52, 511, 512, 513, 1024, 1025, 90_000], 512)
    assert h["target_bin"] == 10 and h["edges"][10] == 512 and len(h["counts"]) == 21
    assert h["counts"][0] == 3 and h["counts"][1] == 1  # 0, 1, 51 | 52 (51.2 is the edge)
    assert h["counts"][9] == 2 and h["counts"][10] == 1  # 511, 512 at or under the target | 513
    assert h["counts"][19] == 1 and h["counts"][20] == 2  # 1024 | 1025 and 90 000


def test_terminal_marks_overlaps() -> None:
    from pipeline.view.collect import DocView

    doc = DocView("x.md", "aaaa bbbb cccc", [[0, 9, 1] + [""] * 6 + [[]] + [0, 0, ""], [5, 14, 1] + [""] * 6 + [[]] + [0, 0, ""]])
    spans = {(s.start, s.end): str(s.style) for s in banded(doc).spans}
    assert spans[(5, 9)] == OVERLAP


def test_cli_view(store_dir: Path) -> None:
    out = str(store_dir / "chunks")
    html = store_dir / "r.html"
    run = chunkyard("view", "--out", out, "--html", str(html), "--json")
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert summary["html"] == str(html) and summary["bytes"] == html.stat().st_size
    assert summary["failed"] == 1 and summary["documents"] == len(open_store(store_dir / "chunks").docs)
    one = chunkyard("view", "--out", out, "--html", str(html), "guides/deep-dive.md", "--quiet")
    assert one.returncode == 0 and data_blocks(html.read_bytes())["cy-meta"]["overview"]["documents"] == 1  # type: ignore[index]
    term = chunkyard("view", "--out", out, "evil.md")
    assert term.returncode == 0, term.stderr
    assert "window.__pwned = 1" in term.stdout and "\x1b[31m" not in term.stdout
    assert chunkyard("view", "--out", out).returncode == 2
    missing = chunkyard("view", "--out", out, "nope.md")
    assert missing.returncode == 2 and "not a document" in missing.stderr
    assert chunkyard("view", "--out", str(store_dir / "nothing"), "--html", str(html)).returncode == 2


# --- search and eval pages from the documented shapes (004 record, 001 payload, 004 metrics pack)

SOURCE = "# Keys\n\nHardware keys are required for all admin roles.\n\n## Rotation\n\nRotate keys yearly.\n"


def payload(start: int, end: int, rank: int, **extra: object) -> dict[str, object]:
    return {
        "doc_id": "handbook",
        "section_id": "1",
        "snippet_id": f"handbook|r=1|s=1|p=000|b=00{rank}",
        "source_url": "handbook.md",
        "offsets": {"start": start, "end": end, "unit": "char"},
        "tokens": 12,
        "index_hash": "sqlite-vec:2f7d",
        "embed_model": "all-MiniLM-L6-v2:mean",
        "analyzer": "verbatim+context-prefix",
        "rev": "3b91f2a",
        "score_raw": 0.84,
        "score_norm": 0.78,
        "k_pos": rank,
        "k_final": rank,
        **extra,
    }


def test_render_search_highlights_each_hit_in_its_source() -> None:
    start = SOURCE.index("Hardware")
    end = SOURCE.index("\n\n## Rotation")
    record = {
        "schema_version": "1.0.0",
        "event": "retrieve.run",
        "q_id": "q1",
        "query": "which keys <script>?",
        "ranker": "hybrid",
        "k": 2,
        "items": [
            payload(start, end, 1, text=SOURCE[start:end]),
            payload(0, 6, 2, text="# Old"),
            payload(500, 600, 3),
        ],
    }
    page = render_search(record, sources={"handbook.md": SOURCE}, context_chars=5)
    assert b"<script>?" not in page
    meta = data_blocks(page)["cy-meta"]
    assert isinstance(meta, dict) and meta["kind"] == "search"
    first, second, third = meta["contexts"]
    assert first["hit_start"] == start and first["hit_end"] == end and first["offset"] == start - 5
    assert first["text"] == SOURCE[start - 5 : end + 5] and "note" not in first
    assert "changed" in second["note"]
    assert "outside the source" in third["note"]
    assert meta["record"]["items"][0]["snippet_id"] == record["items"][0]["snippet_id"]  # type: ignore[index]


def test_metric_series_flat_and_nested() -> None:
    flat = {"$schema": "https://wfgy.dev/schemas/metrics-1.0.json", "dataset": "gold", "recall@50": 0.91}
    assert metric_series(flat) == {"all": {"recall@50": 0.91}}
    nested = {"dataset": "gold", "modes": {"dense": {"MRR@10": 0.5}, "hybrid": {"MRR@10": 0.7, "n": 3}}}
    assert metric_series(nested) == {"dense": {"MRR@10": 0.5}, "hybrid": {"MRR@10": 0.7}}
    per_chunker = {"md-heading-v1": {"recall@10": 0.8}, "langchain": {"recall@10": 0.6}, "flag": True}
    assert metric_series(per_chunker) == {"md-heading-v1": {"recall@10": 0.8}, "langchain": {"recall@10": 0.6}}
    packs = {"md-heading-v1": PACK, "langchain": {**PACK, "modes": {"bm25": PACK["modes"]["bm25"]}}}
    assert list(metric_series(packs)) == ["md-heading-v1 · hybrid", "md-heading-v1 · bm25", "langchain · bm25"]


METRICS = {"recall@1": 0.5, "recall@5": 1.0, "recall@10": 1.0, "MRR@10": 0.75, "nDCG@10": 0.8155, "recall@1000tok": 1.0}

#: chunkyard's own pack (issue 17, schemas/metrics.schema.json), two questions, two modes
PACK: dict = {
    "$schema": "https://chunkyard.dev/schemas/metrics.schema.json", "schema_version": "1.0.0",
    "event": "eval.run", "ts": "2026-11-25T07:00:00Z", "trace_id": "0b8f7a52-0c43-4d0e-9d7e-3f8f1b3c2a10",
    "agent_id": "system", "mem_rev": None, "mem_hash": "sha256:" + "0" * 64, "dataset": "corpus-gold",
    "questions": 2, "hit_rule": {"coverage": 0.5, "strict_coverage": 1.0, "unit": "char"},
    "budgets": {"tokens": [1000, 2000], "tokenizer": "cl100k_base"}, "index": None, "mode": "hybrid",
    **METRICS,
    "modes": {
        "hybrid": {"questions": 2, "metrics": METRICS, "strict": {**METRICS, "recall@1": 0.0}},
        "bm25": {"questions": 2, "metrics": {**METRICS, "MRR@10": 0.5}, "strict": METRICS},
    },
    "per_query": [
        {"mode": "hybrid", "id": "q1", "retrieved": 10, "first_hit": 1, "first_full_hit": 2, "citation": True, "metrics": METRICS},
        {"mode": "hybrid", "id": "q2", "retrieved": 10, "first_hit": 2, "first_full_hit": None, "citation": False, "metrics": METRICS},
        {"mode": "bm25", "id": "q1", "retrieved": 10, "first_hit": None, "first_full_hit": None, "citation": None, "metrics": METRICS},
    ],
}  # fmt: skip


def test_render_eval_reads_chunkyards_metrics_pack() -> None:
    meta = data_blocks(render_eval(PACK))["cy-meta"]
    assert isinstance(meta, dict)
    ev = meta["eval"]
    assert ev["series"] == {"hybrid": METRICS, "bm25": {**METRICS, "MRR@10": 0.5}}
    assert ev["metrics"] == list(METRICS)
    rows = [(q["mode"], q["id"], q["first_hit"], q["citation"]) for q in ev["queries"]]
    assert rows == [("hybrid", "q1", 1, True), ("hybrid", "q2", 2, False), ("bm25", "q1", None, None)]


def test_eval_rows_from_gold_and_runs() -> None:
    from types import SimpleNamespace

    from pipeline.view.results import eval_rows

    start = SOURCE.index("Hardware")
    gold = [SimpleNamespace(id="q1", question="Which keys?", source="handbook.md", start=start, end=start + 8, text="Hardware")]
    search_item = {"file": "handbook.md", "source": "bm25", "source_url": "https://example.org/hb",
                   "chunk_id": "handbook|r=1|s=1|p=000|b=000", "charStart": start, "charEnd": start + 40}  # fmt: skip
    runs = {"bm25": {"q1": [payload(0, 6, 1), search_item]}, "hybrid": {}}
    rows = eval_rows(gold, runs)
    assert [(r["mode"], len(r["items"]), r["quote"]) for r in rows] == [("bm25", 2, "Hardware"), ("hybrid", 0, "Hardware")]
    no_rows = {k: v for k, v in PACK.items() if k != "per_query"}
    meta = data_blocks(render_eval(no_rows, rows))["cy-meta"]
    q = meta["eval"]["queries"]  # type: ignore[index]
    assert [it["hit"] for it in q[0]["items"]] == [False, True]  # the path is `file`, not source/source_url
    assert q[0]["items"][1]["path"] == "handbook.md" and q[0]["items"][1]["start"] == start
    assert [r["first_hit"] for r in q] == [2, None]
    # the pack's rows fill in what the entries lack: ranks of the whole answer, the citation check
    filled = data_blocks(render_eval(PACK, rows))["cy-meta"]["eval"]["queries"]  # type: ignore[index]
    assert filled[1]["first_full_hit"] == 2 and filled[1]["citation"] is True


def test_render_eval_marks_hits_by_the_gold_rule() -> None:
    start = SOURCE.index("Hardware")
    q = {"id": "q1", "question": "Which keys?", "source": "handbook.md", "start": start, "end": start + 20}
    per_query = [
        {**q, "mode": "dense", "items": [payload(0, 6, 1), payload(start, start + 15, 2)]},
        {**q, "mode": "hybrid", "items": [payload(start - 2, start + 30, 1)]},
        {**q, "mode": "bm25", "items": [payload(start, start + 5, 1, hit=False)]},
    ]
    pack = {"dataset": "gold", "modes": {"dense": {"MRR@10": 0.5}, "hybrid": {"MRR@10": 1.0}}}
    meta = data_blocks(render_eval(pack, per_query))["cy-meta"]
    assert isinstance(meta, dict)
    qs = meta["eval"]["queries"]
    assert [q["first_hit"] for q in qs] == [2, 1, None]
    assert [it["hit"] for it in qs[0]["items"]] == [False, True]
    assert meta["eval"]["metrics"] == ["MRR@10"] and set(meta["eval"]["series"]) == {"dense", "hybrid"}
