"""The ``watch`` command's terminal side: a rich line or a JSON line per event, and signals.

The contract: docs/spec.md, "Watch".
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import asdict
from types import FrameType
from typing import Any

import orjson
from rich.console import Console
from rich.markup import escape

from pipeline.errors import PipelineError
from pipeline.run.ingest import Options
from pipeline.run.watch import DEFAULT_DEBOUNCE, SyncReport, Watcher


class Printer:
    """Renders ``SyncReport``s: rich lines for people, JSON lines (``--json``) for scripts."""

    def __init__(self, opts: Options, *, out: Console, err: Console, quiet: bool, json_out: bool) -> None:
        self.opts = opts
        self.out = out
        self.err = err
        self.quiet = quiet
        self.json_out = json_out

    def json(self, kind: str, **fields: Any) -> None:
        sys.stdout.write(orjson.dumps({"event": kind, **fields}).decode() + "\n")
        sys.stdout.flush()

    def line(self, text: str) -> None:
        if not self.quiet and not self.json_out:
            self.out.print(f"[dim]{time.strftime('%H:%M:%S')}[/] {text}", highlight=False, soft_wrap=True)

    def error(self, text: str) -> None:
        if self.json_out:
            self.json("error", message=text)
        else:
            self.err.print(f"[dim]{time.strftime('%H:%M:%S')}[/] [red]{escape(text)}[/]", soft_wrap=True)

    def warning(self, text: str) -> None:
        """Said once, whatever ``--quiet`` says: watch works, but not as asked (the inotify limit)."""
        if self.json_out:
            self.json("warning", message=text)
        else:
            self.err.print(f"[dim]{time.strftime('%H:%M:%S')}[/] [yellow]{escape(text)}[/]", soft_wrap=True)

    def waiting(self, holder: str) -> None:
        if not self.quiet and not self.json_out:
            self.err.print(
                f"[yellow]waiting[/] for the lock on {escape(str(self.opts.out))}: held by {holder}"
            )

    def sync(self, report: SyncReport) -> None:
        if report.error is not None:
            self.error(report.error)
            return
        s = report.summary
        if report.initial:
            written = s.added + s.changed
            if self.json_out:
                self.json(
                    "ready",
                    corpus=str(self.opts.corpus),
                    out=str(self.opts.out),
                    run_id=s.run_id,
                    documents=s.documents,
                    chunks=s.chunks,
                    written=written,
                    unchanged=s.unchanged,
                    removed=s.removed,
                    failed=len(s.failures),
                    failures=s.failures,
                    ms=round(report.ms, 1),
                )
            else:
                self.line(
                    f"[bold]watching[/] {escape(str(self.opts.corpus))} → {escape(str(self.opts.out))}: "
                    f"{s.documents:,} documents, {s.chunks:,} chunks; first sync wrote {written:,}, "
                    f"removed {s.removed:,} in {report.ms / 1000:.2f} s. Ctrl-C to stop."
                )
                for failure in s.failures:
                    self.error(f"failed: {failure}")
            return
        told = {d.error for d in report.docs}
        for failure in s.failures:  # not of one document: state writes, id collisions
            if failure not in told:
                self.error(f"failed: {failure}")
        for warning in s.warnings:
            if self.json_out:
                self.json("warning", message=warning, run_id=s.run_id)
            elif not self.quiet:
                self.err.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False, soft_wrap=True)
        by_path = {d.path: d for d in report.docs}
        renamed = {d.renamed_from for d in report.docs if d.renamed_from and d.status == "chunked"}
        for d in report.docs:
            ms = round(report.latency_ms or report.ms, 1)  # the catch-up sync has no event to time from
            if self.json_out:
                fields = {k: v for k, v in asdict(d).items() if v is not None and k != "status"}
                self.json(d.status, **fields, latency_ms=ms, run_id=s.run_id)
                continue
            if d.status == "failed":
                self.error(
                    f"{d.error}" + (f"; its {d.unchanged} chunk files are kept" if d.unchanged else "")
                )
            elif d.status == "removed" and d.path in renamed:
                continue
            elif d.status == "removed":
                self.line(f"[bold]{escape(d.path)}[/] removed ({d.removed} chunk files) [dim]{ms:.0f} ms[/]")
            else:
                source = by_path.get(d.renamed_from or "")
                removed = d.removed + (source.removed if source is not None else 0)
                name = (
                    escape(d.path)
                    if d.renamed_from is None
                    else f"{escape(d.renamed_from)} → {escape(d.path)}"
                )
                self.line(
                    f"[bold]{name}[/] {d.written} written · {d.unchanged} unchanged · {removed} removed"
                    f" [dim]{ms:.0f} ms[/]"
                )

    def stopped(self, watcher: Watcher) -> None:
        if watcher.fatal is not None:
            self.error(watcher.fatal)
        if self.json_out:
            self.json("stopped", failing=sorted(watcher.failing))
            return
        for _, why in sorted(watcher.failing.items()):
            self.err.print(f"[red]failing:[/] {escape(why)}", highlight=False, soft_wrap=True)
        n = len(watcher.failing)
        self.line("stopped" + (f"; {n} document{'s' if n > 1 else ''} failing" if n else ""))


def serve(
    opts: Options,
    *,
    out: Console,
    err: Console,
    debounce: float = DEFAULT_DEBOUNCE,
    polling: bool = False,
    quiet: bool = False,
    json_out: bool = False,
    index: bool = False,
    store: str | None = None,
) -> int:
    """Watch until SIGINT or SIGTERM; the exit code: 0, or 1 if documents are failing at the end.

    The first signal stops cleanly (the sync under way finishes, pending saves are flushed,
    the lock is released); a second one exits at once, which atomic writes make safe.
    With ``index``, each sync is followed by ``chunkyard index`` (docs/index.md).
    """
    printer = Printer(opts, out=out, err=err, quiet=quiet, json_out=json_out)
    on_sync: Any = printer.sync
    if index:
        on_sync = _indexing(printer.sync, opts, store, out=out, err=err, quiet=quiet, json_out=json_out)
    watcher = Watcher(
        opts,
        debounce=debounce,
        polling=polling,
        on_sync=on_sync,
        on_wait=printer.waiting,
        on_warning=printer.warning,
    )
    watcher.start()  # may wait for the lock; Ctrl-C there is a plain KeyboardInterrupt
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            os._exit(128 + signum)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.wait(0.2) and watcher.fatal is None and not watcher.done.is_set():
            pass
        watcher.stop()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    printer.stopped(watcher)
    return 1 if watcher.fatal is not None or watcher.failing else 0


def _indexing(
    then: Any, opts: Options, store: str | None, *, out: Console, err: Console, quiet: bool, json_out: bool
) -> Any:
    """``on_sync`` that reports the sync, then applies the change feed to the index."""
    from pipeline.index.sync import index, index_embedder

    embedder: list[Any] = []  #: made on the first run, kept: the model loads once

    def on_sync(report: Any) -> None:
        then(report)
        try:
            if not embedder:
                embedder.append(index_embedder(opts.out, store))
            done = index(opts.out, store, embedder[0])
        except PipelineError as exc:  # the index is as it was; the next save tries again
            err.print(f"[red]index:[/] {exc}", highlight=False, markup=True)
            return
        if json_out:
            line = {"event": "index", **done.as_dict()}
            out.file.write(orjson.dumps(line).decode() + "\n")
            out.file.flush()
        elif not quiet and (done.added or done.updated or done.moved or done.deleted):
            out.print(
                f"indexed: +{done.added} ~{done.updated} moved {done.moved} -{done.deleted} "
                f"(embedded {done.embedded}) in {done.seconds:.2f} s",
                highlight=False,
            )

    return on_sync
