"""The chunk-folder module: ``ChunkRecord`` agrees with the schema, listing and reading agree with disk."""

from __future__ import annotations

import json
import types
import typing
from pathlib import Path
from typing import Any, Literal, NotRequired, get_args, get_origin, get_type_hints

import orjson
import pytest

from pipeline import chunkfolder
from pipeline.chunkfolder import (
    STATE_DIR,
    ChunkRecord,
    NotAnObjectError,
    is_chunk_file,
    iter_chunk_files,
    read_chunk_file,
    read_chunk_file_or_none,
)

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "schemas" / "chunk.schema.json").read_text())
JSON_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list, "object": dict}


def _is_typeddict(tp: Any) -> bool:
    return isinstance(tp, type) and typing.is_typeddict(tp)


def mismatches(schema: dict[str, Any], tp: Any, where: str) -> list[str]:
    """Where a Python type and a JSON-schema node disagree (empty when they agree)."""
    if get_origin(tp) is NotRequired:
        (tp,) = get_args(tp)
    if "const" in schema:
        return [] if get_origin(tp) is Literal and get_args(tp) == (schema["const"],) else [f"{where}: {tp}"]
    if "enum" in schema:
        ok = get_origin(tp) is Literal and set(get_args(tp)) == set(schema["enum"])
        return [] if ok else [f"{where}: {tp} is not Literal{schema['enum']}"]
    kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    members = get_args(tp) if get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
    wanted = {JSON_TYPES[k] if k != "null" else type(None) for k in kinds}
    have = {get_origin(m) or (dict if _is_typeddict(m) else m) for m in members}
    if wanted != have:
        return [f"{where}: schema says {kinds}, the type says {tp}"]
    (main,) = [m for m in members if m is not type(None)]
    if kinds[0] == "array":
        return mismatches(schema["items"], get_args(main)[0], f"{where}[]")
    if kinds[0] == "object" and "properties" in schema:
        return object_mismatches(schema, main, where)
    return []


def object_mismatches(schema: dict[str, Any], tp: Any, where: str) -> list[str]:
    if not _is_typeddict(tp):
        return [f"{where}: {tp} is not a TypedDict for an object with properties"]
    hints = get_type_hints(tp, include_extras=True)
    props, required = schema["properties"], set(schema.get("required", ()))
    found = [f"{where}.{name}: in the schema, not in {tp.__name__}" for name in props.keys() - hints.keys()]
    found += [f"{where}.{name}: in {tp.__name__}, not in the schema" for name in hints.keys() - props.keys()]
    found += [
        f"{where}.{n}: required by the schema, optional in the type" for n in required - tp.__required_keys__
    ]
    found += [
        f"{where}.{n}: optional in the schema, required by the type" for n in tp.__required_keys__ - required
    ]
    for name in props.keys() & hints.keys():
        found += mismatches(props[name], hints[name], f"{where}.{name}")
    return found


def test_chunk_record_matches_the_schema_both_ways() -> None:
    assert object_mismatches(SCHEMA, ChunkRecord, "ChunkRecord") == []


def test_the_schema_check_can_fail() -> None:
    """A TypedDict missing a field, with an extra one, or with a wrong type is caught."""

    class Wrong(typing.TypedDict):
        id: int
        extra: str

    found = object_mismatches(
        {"properties": {"id": {"type": "string"}, "gone": {"type": "string"}}, "required": ["id"]}, Wrong, "W"
    )
    assert any("gone" in f for f in found)
    assert any("extra" in f for f in found)
    assert any("W.id" in f for f in found)
    assert mismatches({"type": ["string", "null"]}, str, "x") != []
    assert mismatches({"enum": ["a", "b"]}, Literal["a"], "x") != []


def test_every_chunk_file_of_a_real_ingest_reads_as_a_chunk_record(tmp_path: Path) -> None:
    from pipeline.api import ingest

    corpus = Path(__file__).resolve().parents[1] / "corpus"
    out = tmp_path / "out"
    ingest(corpus, out)
    files = list(iter_chunk_files(out))
    assert files, "the sample corpus gave no chunk files"
    assert not any(f.startswith(STATE_DIR) for f in files)
    for rel in files:
        record = read_chunk_file(out / rel)
        assert set(record) == set(SCHEMA["properties"])
        assert rel.endswith(f"__ch{record['chunkNumber']}.json")
        assert record["id"].endswith(f"::ch{record['chunkNumber']}")


def test_listing_skips_the_state_folder_and_sorts_as_paths(tmp_path: Path) -> None:
    for rel in (
        "a.json",
        "a/b.json",
        "b.txt",
        f"{STATE_DIR}/index.json",
        f"x/{STATE_DIR}/y.json",
        "z/c.json",
    ):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"{}")
    listed = list(iter_chunk_files(tmp_path))
    assert listed == ["a/b.json", "a.json", "z/c.json"]
    assert listed == [
        p.relative_to(tmp_path).as_posix()
        for p in sorted(tmp_path.rglob("*.json"))
        if STATE_DIR not in p.relative_to(tmp_path).parts
    ]
    assert [is_chunk_file(r) for r in ("a.json", f"{STATE_DIR}/i.json", "b.txt")] == [True, False, False]


def test_reading_says_what_is_wrong(tmp_path: Path) -> None:
    (tmp_path / "list.json").write_bytes(b"[1]")
    (tmp_path / "bad.json").write_bytes(b"{")
    with pytest.raises(NotAnObjectError):
        read_chunk_file(tmp_path / "list.json")
    with pytest.raises(orjson.JSONDecodeError):
        read_chunk_file(tmp_path / "bad.json")
    with pytest.raises(FileNotFoundError):
        read_chunk_file(tmp_path / "gone.json")
    assert [read_chunk_file_or_none(tmp_path / n) for n in ("list.json", "bad.json", "gone.json")] == [
        None
    ] * 3


def test_the_state_folder_is_named_once() -> None:
    """``.chunkyard`` is spelled only in the chunk-folder module among the Python sources."""
    package = Path(chunkfolder.__file__).parent
    spelled = [
        str(p.relative_to(package))
        for p in package.rglob("*.py")
        if any('".chunkyard"' in line or "'.chunkyard'" in line for line in p.read_text().splitlines())
    ]
    assert spelled == ["chunkfolder.py"]
