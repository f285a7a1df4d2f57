"""Named points of a run where the crash test kills it (docs/spec.md, Runs: a run killed anywhere is repaired).

``reached(phase)`` does nothing unless the environment asks (one dict lookup otherwise):

- ``CHUNKYARD_CRASH_AT="phase:n"``: the n-th time this process reaches ``phase``, it
  SIGKILLs itself, as ``kill -9`` would, mid-write;
- ``CHUNKYARD_CRASH_TRACE=path``: every phase reached is appended to ``path``, one name
  a line, so a test can see how far a clean run gets and choose where to kill.

The phases: ``chunk-file`` (a chunk file got its name), ``between-renames`` (a document's
files are half in place), ``feed-append`` (a block of change-feed lines was written),
``state-commit`` (the feed is durable, the state not yet written). Counts are per process.
"""

from __future__ import annotations

import os
import signal

_AT = os.environ.get("CHUNKYARD_CRASH_AT", "")
_TRACE = os.environ.get("CHUNKYARD_CRASH_TRACE", "")
_PHASE, _, _NTH = _AT.partition(":")
_seen: dict[str, int] = {}


def reached(phase: str) -> None:
    """Mark ``phase``: trace it, or die here if this is the moment asked for (tests only)."""
    if not _AT and not _TRACE:
        return
    if _TRACE:
        with open(_TRACE, "a", encoding="utf-8") as fh:
            fh.write(phase + "\n")
    if phase == _PHASE:
        _seen[phase] = _seen.get(phase, 0) + 1
        if _seen[phase] == int(_NTH or 1):
            os.kill(os.getpid(), signal.SIGKILL)
