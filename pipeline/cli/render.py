"""Rich output of the audit tools ``validate``, ``resolve`` and ``check-citations`` (docs/spec.md, "Audit")."""

from __future__ import annotations

import contextlib
from collections import defaultdict
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from pipeline.audit.answer import CODES as CITATION_CODES
from pipeline.audit.answer import CitationReport
from pipeline.audit.resolve import Resolved
from pipeline.audit.validate import CODES as VALIDATE_CODES
from pipeline.audit.validate import Problem, Report

EXAMPLES_PER_CODE = 3


def _where(p: Problem) -> str:
    place = p.file or p.source or "(output)"
    return f"{place} · {p.field}" if p.field else place


def render_validate(report: Report, out: Console, *, quiet: bool = False) -> None:
    """A table of codes and counts, the fix for each, then the first examples of each code."""
    summary = (
        f"{report.files:,} chunk files of {report.documents:,} documents"
        f"{' (re-chunked)' if report.reingest else ''} in {report.seconds:.1f} s"
    )
    if not report.problems:
        if not quiet:
            out.print(Text.assemble(("✓ ok", "bold green"), f": {summary}, every check passed"))
        return
    by_code: dict[str, list[Problem]] = defaultdict(list)
    for p in report.problems:
        by_code[p.code].append(p)
    if quiet:
        for code, found in by_code.items():
            first = found[0]
            out.print(
                f"{code} ×{len(found)}: {_where(first)}: {first.message}", highlight=False, markup=False
            )
        return
    table = Table(title="chunkyard validate", title_justify="left", show_lines=False)
    table.add_column("code", style="bold red", no_wrap=True)
    table.add_column("count", justify="right")
    table.add_column("what it means")
    table.add_column("next step")
    for code, found in by_code.items():
        meaning, fix = VALIDATE_CODES[code]
        style = "bold yellow" if found[0].severity == "warning" else "bold red"
        table.add_row(Text(code, style=style), f"{len(found):,}", meaning, fix)
    out.print(table)
    for code, found in by_code.items():
        out.print(Text(f"{code}:", style="bold"))
        for p in found[:EXAMPLES_PER_CODE]:
            out.print(Text.assemble("  ", (_where(p), "cyan"), ": ", p.message), soft_wrap=False)
        if len(found) > EXAMPLES_PER_CODE:
            out.print(
                Text(f"  … and {len(found) - EXAMPLES_PER_CODE:,} more (--json lists them all)", style="dim")
            )
    verdict = (
        Text("✗ " + report.code, style="bold red") if not report.ok else Text("✓ ok", style="bold green")
    )
    errors, warnings = len(report.errors), len(report.problems) - len(report.errors)
    out.print(Text.assemble(verdict, f": {errors:,} errors, {warnings:,} warnings; {summary}"))


def render_resolved(found: Resolved, out: Console, err: Console, *, context: int = 3) -> None:
    """Where the chunk is, then its lines numbered with ``context`` lines either side, the chunk marked."""
    rec = found.record
    first, last = found.line_span
    if found.redirected_from:
        err.print(
            Text(
                f"note: {found.redirected_from} was redirected to {rec['chunk_id']} (the redirect map)",
                "yellow",
            )
        )
    notes = {
        "moved": "the source changed since ingest; the chunk's text now sits at other offsets (run chunkyard ingest)",
        "changed": "the source changed since ingest and no longer holds this text; showing the chunk's own text",
        "missing": f"the source {found.source_path} is gone; showing the chunk's own text",
    }
    if found.source_status in notes:
        err.print(Text(f"warning: {notes[found.source_status]}", "yellow"))
    title = rec["sectionTitle"] or "(before the first heading)"
    shown = found.source_path
    with contextlib.suppress(ValueError, OSError):
        shown = shown.resolve().relative_to(Path.cwd())
    out.print(Text.assemble((rec["id"], "bold"), "  ", (rec["chunk_id"], "cyan")))
    out.print(
        Text.assemble(
            (f"{shown}:{first}-{last}", "bold green"),
            f"  section {rec['section_id']} “{title}” · {rec['block_type']} · "
            f"{rec['tokenStats']['tokens']} tokens · rev {rec['rev']} · chars "
            f"{rec['charOffsets']['charStart']}-{rec['charOffsets']['charEnd']}",
        )
    )
    rows = found.rows(context)
    width = len(str(rows[-1].number)) if rows else 1
    for row in rows:
        marked = row.inside
        line = Text(f"{row.number:>{width}} ", style="bold" if marked else "dim")
        line.append("▌ " if marked else "│ ", style="green" if marked else "dim")
        body = Text(row.text, style="" if marked else "dim")
        if row.mark_end > row.mark_start:
            body.stylize("on grey23", row.mark_start, row.mark_end)
        line.append_text(body)
        out.print(line, soft_wrap=True)


def render_citations(report: CitationReport, out: Console, *, quiet: bool = False) -> None:
    """``ok``, or every finding with its field and fix."""
    summary = f"{report.citations} citation(s) in {report.segments} segment(s) of {report.answer}"
    if report.ok:
        if not quiet:
            out.print(Text.assemble(("✓ ok", "bold green"), f": {summary} check out against the chunk store"))
        return
    if quiet:
        for p in report.problems:
            out.print(
                f"{p.code}: {p.where} · {p.field}: {p.message}", highlight=False, markup=False, soft_wrap=True
            )
        return
    table = Table(title="chunkyard check-citations", title_justify="left")
    table.add_column("citation", style="cyan", no_wrap=True)
    table.add_column("code", style="bold red", no_wrap=True)
    table.add_column("field")
    table.add_column("problem")
    for p in report.problems:
        table.add_row(p.where, p.code, p.field, p.message)
    out.print(table)
    for code in dict.fromkeys(p.code for p in report.problems):
        out.print(
            Text.assemble((f"{code}", "bold"), f": {CITATION_CODES[code][0]} → {CITATION_CODES[code][1]}")
        )
    out.print(
        Text.assemble((f"✗ {report.code}", "bold red"), f": {len(report.problems)} problem(s); {summary}")
    )
