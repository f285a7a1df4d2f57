"""See the chunks: static HTML reports of chunk boundaries, search hits and evaluations (issue 20).

- ``write_report(store, path)``: the corpus overview and every document with its chunks as bands;
- ``render_search(record, …)``: a 004 retrieval record, hits shown inside their source;
- ``render_eval(metrics_pack, per_query, …)``: metrics per run as charts, hits and misses per question;
- ``print_document(…)`` (``terminal``): one document in the terminal, chunks in alternating colors.

Every page is one self-contained file (``page.py``): no network, document text only ever as text.
"""

from pipeline.view.collect import Report, collect
from pipeline.view.report import report_bytes, write_report
from pipeline.view.results import render_eval, render_search

__all__ = ["Report", "collect", "render_eval", "render_search", "report_bytes", "write_report"]
