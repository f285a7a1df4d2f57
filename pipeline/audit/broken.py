"""A chunk file that is there but cannot be used: not JSON, not an object, or not of the chunk schema.

``chunkyard validate`` lists every such file (codes ``bad_json`` and ``schema_invalid``) and
``chunkyard ingest --full`` rewrites them; a plain ``ingest`` does not, since their sources
did not change. A long-lived reader (``chunkyard serve``, a searcher) meets them one at a
time, and must keep answering: ``read_checked`` turns one into a ``BrokenChunkError`` that
names the file, what is wrong with it and that fix, where reading it as a record would fail
somewhere deeper (a ``KeyError`` in a passage, a ``TypeError`` in ``resolve``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import orjson

from pipeline.chunkfolder import ChunkRecord
from pipeline.errors import PipelineError


class BrokenChunkError(PipelineError):
    """A chunk file that cannot be used as a record; ``file`` (relative to the chunk folder)
    and ``reason`` say which and why, the message says how to mend it."""

    code = "broken_chunk"

    def __init__(self, file: str, reason: str, out: Path) -> None:
        super().__init__(f"{file}: broken chunk file: {reason} (hint: {repair_hint(out)})")
        self.file = file
        self.reason = reason


def repair_hint(out: Path) -> str:
    """How to find and rewrite the broken chunk files of the chunk folder ``out``."""
    return (
        f"`chunkyard validate --out {out}` lists the broken chunk files; "
        f"`chunkyard ingest CORPUS --out {out} --full` rewrites them from their sources"
    )


def record_problem(record: Any) -> str | None:
    """What makes a parsed chunk file unusable (its first field off the chunk schema), or ``None``."""
    if not isinstance(record, dict):
        return f"not a JSON object but {type(record).__name__}"
    from pipeline.run.emit import fast_validator, schema_errors

    if fast_validator().is_valid(record):
        return None
    field, message = next(schema_errors(record))  # validate's own wording of the first error
    return f"field {field}: {message[:200]}"


def read_checked(out: Path, file: str) -> ChunkRecord:
    """The chunk file ``out/file``, parsed and checked against the chunk schema.

    Raises:
        OSError: it cannot be read (``FileNotFoundError`` when it is gone).
        BrokenChunkError: it is not JSON, not an object, or not of the schema.
    """
    data = (out / file).read_bytes()
    try:
        record = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise BrokenChunkError(file, f"not JSON ({exc})", out) from None
    problem = record_problem(record)
    if problem is not None:
        raise BrokenChunkError(file, problem, out)
    return cast(ChunkRecord, record)


__all__ = ("BrokenChunkError", "read_checked", "record_problem", "repair_hint")
