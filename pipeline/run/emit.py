"""Stage emit: chunk records → files, schema-checked, atomic, only what changed (docs/spec.md, The stages; Runs)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import xxhash

from pipeline.errors import SchemaError
from pipeline.run.checkpoint import reached

if TYPE_CHECKING:  # jsonschema is slow to import: only a run that writes needs it
    import jsonschema

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "schemas" / "chunk.schema.json"
_PACKAGED_SCHEMA = Path(__file__).resolve().parents[1] / "chunk.schema.json"  #: where the wheel puts it


def load_schema() -> dict[str, Any]:
    path = SCHEMA_PATH if SCHEMA_PATH.exists() else _PACKAGED_SCHEMA
    schema: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return schema


@lru_cache(maxsize=1)
def validator() -> jsonschema.protocols.Validator:
    """The chunk schema for the reference validator (python-jsonschema), compiled once."""
    import jsonschema

    schema = load_schema()
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


@lru_cache(maxsize=1)
def fast_validator() -> Any:
    """The same schema compiled by jsonschema-rs: much faster, used on the write path.

    Its verdicts are checked against python-jsonschema's in the tests.
    """
    import jsonschema_rs

    return jsonschema_rs.validator_for(load_schema(), validate_formats=True)


def check_record(record: dict[str, Any], where: str) -> None:
    """Raise ``SchemaError`` naming the file and the first failing field.

    Only jsonschema-rs runs here (``prepare`` loads it before the first document), so a
    worker never imports mid-run; python-jsonschema is the reference the tests hold it to.
    """
    fast = fast_validator()
    if fast.is_valid(record):
        return
    error = next(iter(fast.iter_errors(record)), None)
    if error is None:  # not valid, yet no error to show: trust nothing, and say so
        raise SchemaError(f"{where}: the schema check failed without naming a field (hint: report it)")
    field = "/".join(map(str, error.instance_path)) or "(record)"
    raise SchemaError(
        f"{where}: field {field}: {error.message} (hint: this is a chunkyard bug; please report it)"
    )


def dumps(record: dict[str, Any]) -> bytes:
    return orjson.dumps(record, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)


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
    if not os.access(path, os.F_OK):  # a new file (the common case): no exception to raise
        return False
    try:
        old = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return False
    return isinstance(old, dict) and stable_view(old) == stable_view(record)


def stable_digest(record: dict[str, Any]) -> str:
    """xxh3 of the record's stable view: equal digests, equal files (volatile fields aside)."""
    view = orjson.dumps(stable_view(record), option=orjson.OPT_SORT_KEYS)
    return xxhash.xxh3_64_hexdigest(view)


def _make_dirs(folder: Path) -> None:
    """``mkdir -p`` without recursion (``Path.mkdir(parents=True)`` recurses once per level)."""
    missing: list[Path] = []
    while not folder.is_dir():
        missing.append(folder)
        if folder.parent == folder:
            break
        folder = folder.parent
    for path in reversed(missing):
        path.mkdir(exist_ok=True)


_CREATE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
_UNNAMED_FLAGS = getattr(os, "O_TMPFILE", 0) | os.O_WRONLY | getattr(os, "O_CLOEXEC", 0)
_FOLDER = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)


def _open_folder(folder: str) -> int:
    """A descriptor of ``folder``, made first if need be: files in it are then named alone."""
    try:
        return os.open(folder, _FOLDER)
    except FileNotFoundError:
        _make_dirs(Path(folder))
        return os.open(folder, _FOLDER)


def _write_temp(folder: int, name: str, data: bytes) -> str:
    """``data`` in a hidden temp file beside ``name``; nothing left behind if that fails.

    Plain file descriptors, and names relative to the folder's descriptor: this runs
    once per chunk file, and the kernel resolves only the last part of each path.
    """
    tmp = f".{name}.{os.getpid()}.tmp"
    fd = os.open(tmp, _CREATE, 0o644, dir_fd=folder)
    try:
        _write_fd(fd, data)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=folder)
        raise
    os.close(fd)
    return tmp


def _write_fd(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write to a temp file beside ``path`` and rename it over: readers see old or new, whole."""
    write_all_atomic([(path, data)])


def _split(path: str | os.PathLike[str], folders: dict[str, int]) -> tuple[int, str]:
    """``path`` as (descriptor of its folder, opened once per call of the caller, name)."""
    full = os.fspath(path)
    where, _, name = full.rpartition("/")
    where = where or ("/" if full.startswith("/") else ".")
    folder = folders.get(where)
    if folder is None:
        folder = folders[where] = _open_folder(where)
    return folder, name


def write_all_atomic(
    items: Sequence[tuple[str | os.PathLike[str], bytes]], new: bool = False, chunks: bool = False
) -> None:
    """Write every file to a temp file first, then rename them all into place.

    If any temp file cannot be written (a full disk, an I/O error), the others are
    removed and no target is touched: a document is replaced whole or not at all.
    ``new`` says no target exists yet (a fresh output folder): see ``_write_all_new``.
    ``chunks``: these are chunk files (the crash test's points, ``checkpoint.py``).
    """
    global _unnamed_usable
    folders: dict[str, int] = {}
    try:
        if new and _unnamed_usable and len(items) <= _UNNAMED_AT_ONCE:
            try:
                _write_all_new(items, folders, chunks)
                return
            except _NoUnnamedError:
                _unnamed_usable = False
        temps: list[tuple[int, str, str]] = []  # (folder, temp name, name)
        try:
            for path, data in items:
                folder, name = _split(path, folders)
                temps.append((folder, _write_temp(folder, name, data), name))
        except BaseException:
            _unlink_all(temps)
            raise
        for i, (folder, tmp, name) in enumerate(temps):
            try:
                os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
            except BaseException:
                _unlink_all(temps[i:])
                raise
            if chunks:
                _named(i, len(temps))
    finally:
        for folder in folders.values():
            os.close(folder)


def _named(i: int, total: int) -> None:
    """Crash points (``checkpoint.py``): a chunk file got its name; more of its document to come."""
    reached("chunk-file")
    if i + 1 < total:
        reached("between-renames")


class _NoUnnamedError(Exception):
    """Unnamed files failed before they ever worked in this process: use named temp files."""


#: Linux makes unnamed files (and links them by their /proc name); cleared when a
#: file system refuses them (then this process uses named temp files).
_unnamed_usable = bool(getattr(os, "O_TMPFILE", 0)) and os.path.isdir("/proc/self/fd")
_unnamed_proven = False  #: a document went that way in this process: later failures are real
#: Each unnamed file is an open descriptor until it is linked; a document with more
#: chunk files than this takes the named temp files (descriptors are limited).
_UNNAMED_AT_ONCE = 256


def _write_all_new(
    items: Sequence[tuple[str | os.PathLike[str], bytes]], folders: dict[str, int], chunks: bool = False
) -> None:
    """Write files whose targets do not exist: each is made unnamed, then linked into place.

    On Linux ``O_TMPFILE`` makes a file with no name in its folder; ``linkat`` gives
    it one. That is one change to the folder per file, where a named temp file
    costs three (create it, and a rename that removes one name and adds another)
    and two workers writing side by side wait on each other for each. It is as
    safe: nothing has a name until every file is written, and an unnamed file
    vanishes with the process that made it, so a crash leaves no temp file. A
    target that exists after all (``EEXIST``) is replaced through a named temp
    file. If anything fails, the files this call named are removed again; and until
    one document has gone this way, a failure means the way itself may not work here
    (a file system without ``O_TMPFILE``, a /proc that is not procfs): the caller is
    told to use named temp files, for this document and the rest of the process.
    """
    global _unnamed_proven
    made: list[tuple[int, int, str]] = []  # (folder, descriptor, name)
    named: list[tuple[int, str]] = []
    try:
        for path, data in items:
            folder, name = _split(path, folders)
            fd = os.open(".", _UNNAMED_FLAGS, 0o644, dir_fd=folder)
            made.append((folder, fd, name))
            _write_fd(fd, data)
        for i, (folder, fd, name) in enumerate(made):
            try:
                os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=folder, follow_symlinks=True)
            except FileExistsError:
                _link_over(fd, folder, name)
                if chunks:
                    _named(i, len(made))
                continue  # it had a name before this call: not one to take back
            named.append((folder, name))
            if chunks:
                _named(i, len(made))
    except BaseException as exc:
        for folder, name in named:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=folder)
        if isinstance(exc, OSError) and not _unnamed_proven:
            raise _NoUnnamedError from exc
        raise
    finally:
        for _, fd, _ in made:
            os.close(fd)
    _unnamed_proven = _unnamed_proven or bool(made)  # an empty document proves nothing


def _link_over(fd: int, folder: int, name: str) -> None:
    """Give the unnamed file ``fd`` the name ``name``, replacing the file there."""
    tmp = f".{name}.{os.getpid()}.tmp"
    os.link(f"/proc/self/fd/{fd}", tmp, dst_dir_fd=folder, follow_symlinks=True)
    try:
        os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=folder)
        raise


def _unlink_all(temps: Iterable[tuple[int, str, str]]) -> None:
    for folder, tmp, _ in temps:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=folder)


#: Schema errors ``schema_errors`` gives for one record (validate lists them per file).
SCHEMA_ERRORS_SHOWN = 5


def schema_errors(rec: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(field path, message) of the first schema errors, from the reference validator."""
    errors = sorted(validator().iter_errors(rec), key=lambda e: list(map(str, e.absolute_path)))
    if not errors:  # the two validators disagree: say so rather than pass the file
        yield "(record)", "jsonschema-rs rejects the record but python-jsonschema accepts it"
    for error in errors[:SCHEMA_ERRORS_SHOWN]:
        yield ".".join(map(str, error.absolute_path)) or "(record)", error.message[:300]
