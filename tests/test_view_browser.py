"""chunkyard view in a real browser: Debian's headless Chromium over the DevTools protocol.

Each report is opened from ``file://``; the test reads every chunk band back out of the
DOM (all pages of every document), compares it with the chunk files, checks that the page
logged no error (a CSP violation would be one) and that no document's script ran, and
saves screenshots under ``tests/artifacts/`` (ignored by git). ``make test`` installs
Chromium where it can (``make browser``); elsewhere these tests skip, saying why.
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cdp import Browser, chromium_binary
from conftest import require
from make_hostile_corpus import CONTENT, make_hostile_corpus

from pipeline.audit.chunk_state import ChunkStore, open_store
from pipeline.view import render_eval, render_search

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
ARTIFACTS = ROOT / "tests" / "artifacts"
BINARY = chromium_binary()

pytestmark = pytest.mark.slow


def need_chromium() -> None:
    """Chromium is a required part (``conftest.require``): without it these tests skip, or fail under CI."""
    why = "no Chromium: `make browser` installs Debian's chromium (as root: apt-get install -y chromium)"
    require("chromium", None if BINARY else why)


@pytest.fixture(autouse=True)
def _needs_chromium() -> None:
    need_chromium()  # per test, so that each one is counted; the browser fixture asks first

MARKER_DOC = (
    "# Marker <script>window.__pwned = 'title'</script>\n\n"
    "<script>window.__pwned = 'block'</script>\n\n"
    "</script><script>window.__pwned = 'closed'</script><!--\n\n"
    "A paragraph </textarea></title></style><img src=x onerror=\"window.__pwned='img'\"> \"'><svg onload="
    "window.__pwned='svg'>\n\n"
    "<iframe srcdoc=\"<script>parent.__pwned='frame'</script>\"></iframe>\n\n"
    "<a href=\"javascript:window.__pwned='link'\">click</a> &lt;entity&gt; &amp;\n\n"
    "## שלום עולם \u202e override \u202c مرحبا\n\n"
    "Controls \x01\x08\x1b[2J\x7f\u0085 end.\n"
)

# Every page of one document, drawn in turn: [from, to, [[start, end, chunks, text], ...]] per page.
COLLECT = """(function (di) {
  var pages = chunkyardView.pages(di), out = [];
  for (var p = 0; p + 1 < pages.length; p++) {
    chunkyardView.show(di, p);
    var box = document.querySelector('.doctext'), segs = [];
    box.querySelectorAll('.seg').forEach(function (s) {
      segs.push([+s.getAttribute('data-s'), +s.getAttribute('data-e'), s.getAttribute('data-c') || '', s.textContent]);
    });
    out.push([+box.getAttribute('data-from'), +box.getAttribute('data-to'), segs, box.children.length]);
  }
  return JSON.stringify(out);
})(%d)"""


def chunkyard(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )


def build(corpus: Path, out: Path, html: Path, exit_code: int = 0) -> ChunkStore:
    """Ingest (``exit_code``: 1 where the corpus holds a broken file on purpose), then the report."""
    run = chunkyard("ingest", str(corpus), "--out", str(out), "--quiet", "--doc-timeout", "300")
    assert run.returncode == exit_code, run.stderr
    view = chunkyard("view", "--out", str(out), "--html", str(html), "--quiet")
    assert view.returncode == 0, view.stderr
    return open_store(out)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    need_chromium()
    assert BINARY is not None
    b = Browser(BINARY, tmp_path_factory.mktemp("chromium-profile"))
    yield b
    b.close()


@pytest.fixture(scope="module")
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


def open_page(browser: Browser, html: Path, fragment: str = "") -> None:
    browser.events.clear()
    browser.open(html.resolve().as_uri() + fragment)


def check_bands(browser: Browser, store: ChunkStore) -> int:
    """Every chunk of every document drawn exactly over its [charStart, charEnd); returns the chunk count."""
    table = browser.evaluate(
        "JSON.stringify(JSON.parse(document.getElementById('cy-meta').textContent).overview.table)"
    )
    names = [row[0] for row in json.loads(table)]
    assert names == sorted(store.docs)
    checked = 0
    for di, rel in enumerate(names):
        source = store.source(rel)
        assert source is not None, rel
        text = source.text
        pages = json.loads(browser.evaluate(COLLECT % di))
        assert pages[0][0] == 0 and pages[-1][1] == len(text), rel
        covered: dict[int, list[tuple[int, int]]] = {}
        at = 0
        for start, end, segs, n_children in pages:
            assert start == at and n_children == len(segs), rel
            for s, e, cs, shown in segs:
                assert s == at and e > s and shown == text[s:e], (rel, s, e)
                at = e
                for c in cs.split(",") if cs else ():
                    covered.setdefault(int(c), []).append((s, e))
            assert at == end, rel
        files = store.docs[rel]["files"]
        assert sorted(covered) == list(range(len(files))), rel
        for n, file in enumerate(files):
            rec = store.read_record(file)
            spans = covered[n]
            assert all(a[1] == b[0] for a, b in itertools.pairwise(spans)), (rel, n)
            band = (spans[0][0], spans[-1][1])
            off = rec["charOffsets"]
            assert band == (off["charStart"], off["charEnd"]), (rel, file)
            assert "".join(text[s:e] for s, e in spans) == rec["originalText"]
            checked += 1
    return checked


def assert_clean(browser: Browser) -> None:
    assert browser.problems() == []
    assert browser.evaluate("typeof window.__pwned") == "undefined"
    assert (
        browser.evaluate(
            "document.querySelectorAll('iframe, img, textarea, .doctext script, .doctext a').length"
        )
        == 0
    )


def wait_for(browser: Browser, expression: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not browser.evaluate(expression):
        assert time.monotonic() < deadline, f"never true: {expression}"
        time.sleep(0.02)


def pin_first_band(browser: Browser, chunk: int = 0) -> None:
    browser.evaluate(
        f"(function(){{var s=document.querySelector('.seg[data-c=\"{chunk}\"]')||document.querySelector('.seg[data-c]');"
        "s.scrollIntoView({block:'center'});s.dispatchEvent(new MouseEvent('mouseover',{bubbles:true}));"
        "s.dispatchEvent(new MouseEvent('click',{bubbles:true}));})()"
    )


def doc_index(store: ChunkStore, rel: str) -> int:
    return sorted(store.docs).index(rel)


def test_sample_corpus(browser: Browser, artifacts: Path, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    shutil.copytree(ROOT / "corpus", corpus)
    (corpus / "marker.md").write_text(MARKER_DOC, encoding="utf-8")
    (corpus / "broken.md").write_bytes(b"# Broken\n\n\xff not UTF-8\n")
    html = tmp_path / "report.html"
    store = build(corpus, tmp_path / "chunks", html, exit_code=1)
    open_page(browser, html)
    assert browser.evaluate("document.querySelectorAll('.card').length") == 6
    assert "broken.md" in browser.evaluate("document.body.innerText")
    browser.screenshot(artifacts / "view-overview.png")
    assert check_bands(browser, store) == sum(len(e["files"]) for e in store.docs.values())
    assert_clean(browser)
    open_page(browser, html, f"#doc={doc_index(store, 'getting-started.md')}")
    pin_first_band(browser, 3)
    assert browser.evaluate("document.querySelectorAll('.seg.pin').length") > 0
    info = browser.evaluate("document.querySelector('aside.info').innerText")
    rec = store.read_record(store.docs["getting-started.md"]["files"][3])
    assert rec["chunk_id"] in info and str(rec["tokenStats"]["tokens"]) in info
    browser.screenshot(artifacts / "view-document.png")
    open_page(browser, html, f"#doc={doc_index(store, 'marker.md')}")
    pin_first_band(browser)
    browser.screenshot(artifacts / "view-hostile-marker.png")
    assert_clean(browser)


@pytest.fixture
def hostile_dir() -> Iterator[Path]:
    """A temp folder removed with ``rm -rf``: the hostile corpus nests folders deeper than
    ``shutil.rmtree`` (pytest's cleanup) can recurse."""
    path = Path(tempfile.mkdtemp(prefix="chunkyard-view-hostile-"))
    yield path
    subprocess.run(["chmod", "-R", "u+rwx", str(path)], capture_output=True, check=False)
    subprocess.run(["rm", "-rf", str(path)], capture_output=True, check=False)


def test_hostile_corpus(browser: Browser, artifacts: Path, hostile_dir: Path) -> None:
    tmp_path = hostile_dir
    corpus = tmp_path / "corpus"
    make_hostile_corpus(corpus, small=True)
    (corpus / "line_10mb.md").write_bytes(CONTENT["line_10mb.md"]())
    (corpus / "marker.md").write_text(MARKER_DOC * 50, encoding="utf-8")
    html = tmp_path / "report.html"
    store = build(corpus, tmp_path / "chunks", html, exit_code=1)
    open_page(browser, html)
    browser.screenshot(artifacts / "view-hostile-overview.png")
    assert check_bands(browser, store) > 0
    assert_clean(browser)
    # the outline of a long document jumps to a heading on a later page
    di = doc_index(store, "headings_2k.md")
    open_page(browser, html, f"#doc={di}")
    assert browser.evaluate("document.querySelectorAll('nav.outline a').length") == 2000
    last = browser.evaluate(
        "(function(){var a=document.querySelectorAll('nav.outline a'); a[a.length-1].click();"
        "return a[a.length-1].getAttribute('href');})()"
    )
    at = int(last.rsplit("at=", 1)[1])
    source = store.source("headings_2k.md")
    assert source is not None and source.text[at:].split("\n", 1)[0].endswith("# Heading 1999")
    wait_for(browser, "+document.querySelector('.doctext').getAttribute('data-from') > 0")
    assert browser.evaluate("+document.querySelector('.seg.target-flash').getAttribute('data-s')") == at
    assert_clean(browser)
    for rel, name in (("unicode_odd.md", "rtl"), ("controls.md", "controls"), ("line_10mb.md", "line-10mb")):
        open_page(browser, html, f"#doc={doc_index(store, rel)}")
        browser.screenshot(artifacts / f"view-hostile-{name}.png")
        assert_clean(browser)


def test_shared_corpus(browser: Browser, artifacts: Path, tmp_path: Path) -> None:
    corpus = SHARED / "corpora" / "rust-book"
    if not corpus.is_dir():
        require("corpora", f"{corpus} is absent")
    html = tmp_path / "report.html"
    store = build(corpus, tmp_path / "chunks", html)
    open_page(browser, html)
    browser.screenshot(artifacts / "view-rust-book-overview.png")
    assert check_bands(browser, store) == sum(len(e["files"]) for e in store.docs.values())
    assert_clean(browser)


SOURCE = (
    "# Keys 🔑 <script>window.__pwned='search'</script> 𝔘\n\n"
    "Hardware keys are required for all admin roles.\n\n## Rotation\n\nRotate keys yearly.\n"
)


def payload(start: int, end: int, rank: int, **extra: Any) -> dict[str, Any]:
    return {
        "doc_id": "handbook", "section_id": "1", "snippet_id": f"handbook|r=1|s=1|p=000|b=00{rank}",
        "source_url": "handbook.md", "offsets": {"start": start, "end": end, "unit": "char"}, "tokens": 12,
        "index_hash": "sqlite-vec:2f7d", "embed_model": "all-MiniLM-L6-v2:mean",
        "analyzer": "verbatim+context-prefix", "rev": "3b91f2a", "score_raw": 0.84, "score_norm": 0.78,
        "k_pos": rank, "k_final": rank, **extra,
    }  # fmt: skip


def test_search_page(browser: Browser, artifacts: Path, tmp_path: Path) -> None:
    hits = [
        (SOURCE.index("Hardware"), SOURCE.index("\n\n## Rotation")),
        (SOURCE.index("Rotate"), len(SOURCE) - 1),
    ]
    record = {
        "schema_version": "1.0.0", "event": "retrieve.run", "ts": "2026-11-25T07:00:00Z", "trace_id": "t1",
        "q_id": "q1", "query": "admin keys </title><script>window.__pwned='q'</script>", "ranker": "hybrid",
        "k": 2, "items": [payload(s, e, n, text=SOURCE[s:e]) for n, (s, e) in enumerate(hits, 1)],
    }  # fmt: skip
    html = tmp_path / "search.html"
    html.write_bytes(render_search(record, sources={"handbook.md": SOURCE}, context_chars=60))
    open_page(browser, html)
    got = json.loads(
        browser.evaluate(
            "JSON.stringify([...document.querySelectorAll('.hitcard')].map(c => { var b = c.querySelector('.doctext'),"
            " o = +b.getAttribute('data-offset'), h = [...b.querySelectorAll('.seg.hit')];"
            " return [o + +h[0].getAttribute('data-s'), o + +h[h.length-1].getAttribute('data-e'),"
            " h.map(x => x.textContent).join('')]; }))"
        )
    )
    assert got == [[s, e, SOURCE[s:e]] for s, e in hits]
    browser.evaluate("document.querySelectorAll('.hitcard details').forEach(d => d.open = true)")
    browser.screenshot(artifacts / "view-search.png")
    assert_clean(browser)


def test_eval_page(browser: Browser, artifacts: Path, tmp_path: Path) -> None:
    start = SOURCE.index("Hardware")
    q = {"question": "Which keys <b>?</b>", "source": "handbook.md", "start": start, "end": start + 20}
    per_query = [
        {**q, "id": "q1", "mode": "dense", "items": [payload(0, 6, 1), payload(start, start + 30, 2)]},
        {**q, "id": "q1", "mode": "hybrid", "items": [payload(start, start + 30, 1)]},
        {**q, "id": "q2", "mode": "dense", "items": [payload(0, 6, 1)]},
    ]
    pack = {
        "$schema": "https://wfgy.dev/schemas/metrics-1.0.json", "dataset": "goldset_v1",
        "chunkers": {
            "md-heading-v1": {"recall@10": 0.91, "MRR@10": 0.62, "nDCG@10": 0.7},
            "langchain": {"recall@10": 0.8, "MRR@10": 0.5, "nDCG@10": 0.58},
        },
    }  # fmt: skip
    html = tmp_path / "eval.html"
    html.write_bytes(render_eval(pack, per_query))
    open_page(browser, html)
    bars = json.loads(
        browser.evaluate(
            "JSON.stringify([...document.querySelectorAll('svg rect.bar')].map(r => "
            "[r.closest('section').querySelector('h3').textContent, r.getAttribute('data-series'), +r.getAttribute('data-value')]))"
        )
    )
    want = [
        [m, run, v]
        for m in ("recall@10", "MRR@10", "nDCG@10")
        for run, vals in pack["chunkers"].items()
        for v in [vals[m]]
    ]  # type: ignore[attr-defined]
    assert bars == want
    verdicts = browser.evaluate(
        "[...document.querySelectorAll('.q')].map(q => q.getAttribute('data-qid') + ':' + "
        "[...q.querySelectorAll('.run')].map(r => r.getAttribute('data-run') + '=' + r.querySelector('.ok, .miss').textContent)"
        ".join(',')).join('|')"
    )
    assert verdicts == "q1:dense=hit at rank 2,hybrid=hit at rank 1|q2:dense=miss"
    assert "2 questions · 2 run(s)" in browser.evaluate("document.querySelector('header').textContent")
    browser.screenshot(artifacts / "view-eval.png")
    browser.evaluate("document.getElementById('misses').click()")
    assert browser.evaluate("document.querySelectorAll('.q').length") == 1
    assert_clean(browser)


def test_eval_page_of_chunkyards_pack(browser: Browser, artifacts: Path, tmp_path: Path) -> None:
    from types import SimpleNamespace

    from pipeline.view.results import eval_rows

    start = SOURCE.index("Hardware")
    gold = [
        SimpleNamespace(id="q1", question="Which keys?", source="handbook.md", start=start, end=start + 8, text="Hardware"),
        SimpleNamespace(id="q2", question="How often to rotate?", source="handbook.md", start=SOURCE.index("yearly"),
                        end=SOURCE.index("yearly") + 6, text="yearly"),
    ]  # fmt: skip
    item = {"file": "handbook.md", "source": "bm25", "chunk_id": "handbook|r=1|s=1|p=000|b=000",
            "offsets": {"start": start, "end": start + 47, "unit": "char"}, "score": 0.9}  # fmt: skip
    runs = {"hybrid": {"q1": [item], "q2": [item]}, "bm25": {"q1": [payload(0, 6, 1), item], "q2": []}}
    metrics = {"recall@1": 0.5, "recall@5": 0.5, "recall@10": 0.5, "MRR@10": 0.5, "nDCG@10": 0.5}
    pack = {
        "dataset": "corpus-gold", "mode": "hybrid", "questions": 2, **metrics,
        "hit_rule": {"coverage": 0.5, "strict_coverage": 1.0, "unit": "char"},
        "modes": {"hybrid": {"questions": 2, "metrics": metrics, "strict": metrics},
                  "bm25": {"questions": 2, "metrics": {**metrics, "MRR@10": 0.25}, "strict": metrics}},
        "per_query": [{"mode": "hybrid", "id": "q1", "retrieved": 1, "first_hit": 1, "first_full_hit": 1,
                       "citation": True, "metrics": metrics}],
    }  # fmt: skip
    html = tmp_path / "eval.html"
    html.write_bytes(render_eval(pack, eval_rows(gold, runs)))
    open_page(browser, html)
    assert browser.evaluate("document.querySelectorAll('svg rect.bar').length") == 2 * 5
    verdicts = browser.evaluate(
        "[...document.querySelectorAll('.q')].map(q => q.getAttribute('data-qid') + ':' + "
        "[...q.querySelectorAll('.run')].map(r => r.getAttribute('data-run') + '=' + r.querySelector('.ok, .miss').textContent)"
        ".join(',')).join('|')"
    )
    assert verdicts == "q1:hybrid=hit at rank 1,bm25=hit at rank 2|q2:hybrid=miss,bm25=miss"
    assert "citation verified" in browser.evaluate("document.querySelector('.run').textContent")
    browser.screenshot(artifacts / "view-eval-pack.png")
    assert_clean(browser)
