"""``ingest``: chunk a corpus into an output folder, incrementally (docs/spec.md, Runs).

The entry point of a one-shot run, over ``session.Session`` (one sync, then the lock is
released). ``Options`` and ``Summary`` are re-exported from ``model.py`` for callers.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from pipeline.errors import UsageError
from pipeline.run.model import DocResult, Options, Summary
from pipeline.run.session import Session

__all__ = ["Options", "Session", "Summary", "corpus_relative", "ingest"]


def ingest(
    opts: Options,
    on_start: Callable[[int], None] | None = None,
    on_result: Callable[[DocResult], None] | None = None,
    on_wait: Callable[[str], None] | None = None,
    changed: Iterable[str] | None = None,
) -> Summary:
    """Chunk a corpus into ``opts.out``; incremental unless ``opts.full``.

    ``changed``: only these corpus-relative paths (``ingest --changed``), as a ``watch``
    save syncs them, without the walk: the caller knows what changed. A path that did
    not change costs a stat; one that changed and is not named waits for the next
    whole-corpus run, which finds it as always.
    """
    with Session(opts, on_wait) as session:
        session.one_shot = True
        return session.sync(None if changed is None else list(changed), on_start, on_result)


def corpus_relative(corpus: Path, path: str) -> str:
    """``path`` (as typed: relative to the current folder, or absolute) as a path under ``corpus``.

    The file may be gone (a deletion to record). Raises ``UsageError`` for a path outside it.
    """
    for base, target in (
        (os.path.abspath(corpus), os.path.abspath(path)),
        (os.path.realpath(corpus), os.path.realpath(path)),
    ):
        rel = os.path.relpath(target, base)
        if rel != os.curdir and not rel.startswith(os.pardir + os.sep) and rel != os.pardir:
            return rel.replace(os.sep, "/")
    raise UsageError(
        f"{path}: --changed names a file outside the corpus {corpus} "
        "(hint: name the changed Markdown files under it, relative to the current folder)"
    )
