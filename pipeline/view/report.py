"""The chunk report: one HTML file over a chunk folder (``chunkyard view --html``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.audit.chunk_state import ChunkStore
from pipeline.view.collect import Report, collect
from pipeline.view.page import page_bytes, write_page


def report_bytes(report: Report, *, title: str = "chunkyard report", out: str = "") -> bytes:
    """The page for a collected report: the overview in ``cy-meta``, one data block per document."""
    meta: dict[str, Any] = {"kind": "report", "title": title, "out": out, "overview": report.overview}
    return page_bytes(title, meta, ((n, doc.as_json()) for n, doc in enumerate(report.docs)))


def write_report(store: ChunkStore, html: Path, docs: list[str] | None = None) -> Report:
    """Collect ``store`` (or only the manifest keys in ``docs``) and write the page to ``html``."""
    report = collect(store, docs)
    write_page(html, report_bytes(report, title=f"chunkyard: {store.out}", out=str(store.out)))
    return report
