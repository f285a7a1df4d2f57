#!/usr/bin/env python3
"""How big the report of a large corpus is, and how fast it opens in headless Chromium.

    python bench/view_open.py [--corpus ../shared/corpora] [--runs 3]

Ingests the corpus (every one of ``../shared/corpora`` by default: ~4,900 documents,
~42k chunks) into ``bench/results/scratch/view/``, writes ``chunkyard view --html``,
then opens the page from ``file://`` in Debian's headless Chromium (fresh profile each
run) and times: navigation → the overview drawn (the page's ``data-ready``), and the
largest document's first page drawn. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from cdp import Browser, chromium_binary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--corpus", type=Path, default=ROOT.parent / "shared" / "corpora")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    binary = chromium_binary()
    if binary is None:
        sys.exit("no chromium: run `make browser` (as root)")
    scratch = ROOT / "bench" / "results" / "scratch" / "view"
    scratch.mkdir(parents=True, exist_ok=True)
    out, html = scratch / "chunks", scratch / "report.html"
    cli = [sys.executable, "-m", "pipeline"]
    subprocess.run([*cli, "ingest", str(args.corpus), "--out", str(out), "--quiet"], cwd=ROOT, check=False)
    started = time.perf_counter()
    view = subprocess.run(
        [*cli, "view", "--out", str(out), "--html", str(html), "--json"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    write_s = time.perf_counter() - started
    summary = json.loads(view.stdout)
    overview, largest = [], []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as profile:
            b = Browser(binary, Path(profile))
            try:
                overview.append(b.open(html.as_uri()))
                problems = b.problems()
                di = b.evaluate(
                    "(function(){var t=JSON.parse(document.getElementById('cy-meta').textContent).overview.table,"
                    "m=0;t.forEach(function(r,i){if(r[1]>t[m][1])m=i;});return m;})()"
                )
                t0 = time.monotonic()
                b.evaluate(f"chunkyardView.show({di}, 0)")
                largest.append(time.monotonic() - t0)
            finally:
                b.close()
    print(
        json.dumps(
            {
                "corpus": str(args.corpus),
                "documents": summary["documents"],
                "chunks": summary["chunks"],
                "report_mb": round(summary["bytes"] / 1e6, 1),
                "write_s": round(write_s, 2),
                "open_overview_s": [round(x, 2) for x in overview],
                "open_overview_median_s": round(statistics.median(overview), 2),
                "largest_doc_first_page_s": round(statistics.median(largest), 2),
                "console_problems": problems,
            }
        )
    )


if __name__ == "__main__":
    main()
