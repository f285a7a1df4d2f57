"""Stage emit: chunk records → files, schema-checked, atomic, only what changed (SPEC §1, §5)."""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema
import orjson

from .errors import SchemaError

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schemas" / "chunk.schema.json"
_PACKAGED_SCHEMA = Path(__file__).resolve().parent / "chunk.schema.json"


@lru_cache(maxsize=1)
def validator() -> jsonschema.protocols.Validator:
    """The chunk schema, compiled once per process."""
    path = SCHEMA_PATH if SCHEMA_PATH.exists() else _PACKAGED_SCHEMA
    schema = json.loads(path.read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def check_record(record: dict[str, Any], where: str) -> None:
    """Raise ``SchemaError`` naming the file and the first failing field."""
    error = jsonschema.exceptions.best_match(validator().iter_errors(record))
    if error is not None:
        field = "/".join(map(str, error.absolute_path)) or "(record)"
        raise SchemaError(
            f"{where}: field {field}: {error.message} (hint: this is a chunkyard bug; please report it)"
        )


def dumps(record: dict[str, Any]) -> bytes:
    return orjson.dumps(record, option=orjson.OPT_INDENT_2) + b"\n"


def stable_view(record: dict[str, Any]) -> dict[str, Any]:
    """The record without its volatile fields (``processedAt``, ``processingTimeMs``)."""
    meta = dict(record.get("metadata") or {})
    meta.pop("processedAt", None)
    pipe = dict(meta.get("pipeline") or {})
    pipe.pop("processingTimeMs", None)
    meta["pipeline"] = pipe
    return {**record, "metadata": meta}


def unchanged(path: Path, record: dict[str, Any]) -> bool:
    """True when the file on disk already says the same, volatile fields aside."""
    try:
        old = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return False
    return isinstance(old, dict) and stable_view(old) == stable_view(record)


def write_atomic(path: Path, data: bytes) -> None:
    """Write to a temp file beside ``path`` and rename it over: readers see old or new, whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
