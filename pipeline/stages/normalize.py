"""Stages read and normalize: bytes → canonical text + front matter (docs/spec.md, "Stages")."""

from __future__ import annotations

import math
import os
import re
import tomllib
from pathlib import Path
from typing import Any

import yaml

from pipeline.errors import StageError
from pipeline.models import DEFAULT_MAX_BYTES, SourceDoc

#: Bounds on parsed front matter: values in all (after YAML aliases), and nesting.
_FRONT_MATTER_VALUES = 100_000
_FRONT_MATTER_DEPTH = 64
_C_YAML_MARKS = 2000
#: ``---`` or ``+++`` on line 1 and a ``key:`` / ``key =`` line next, never closed.
_UNCLOSED_FRONT_MATTER = re.compile(r"(?:---\n[ \t]*[\w\"'-]+[ \t]*:|\+\+\+\n[ \t]*[\w\"'.-]+[ \t]*=)")
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_source(path: Path, rel_path: str, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """Read a source file, refusing what is too large to be a document."""
    return read_stamped(path, rel_path, max_bytes)[0]


def read_stamped(path: Path, rel_path: str, max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[bytes, int]:
    """``read_source``, and the file's mtime (ns) as it was when the read began."""
    try:
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            size = st.st_size
            if size <= max_bytes:
                # a buffer the file's size (``read(max_bytes)`` would map the whole limit for
                # every file); the byte more shows a file that grew since: read on, to the limit
                raw = fh.read(size + 1)
                if len(raw) > size:
                    raw += fh.read(max_bytes - size)
                if len(raw) <= max_bytes:
                    return raw, st.st_mtime_ns
                size = os.fstat(fh.fileno()).st_size  # it grew past the limit while read
            raise StageError(
                "read",
                rel_path,
                f"file is {size:,} bytes, over the {max_bytes:,}-byte limit",
                "split the file, or raise the limit with --max-bytes",
            )
    except FileNotFoundError:
        raise StageError("read", rel_path, "file vanished during the run", "run again") from None
    except IsADirectoryError:
        raise StageError("read", rel_path, "is a directory", "rename it or --exclude it") from None
    except PermissionError:
        raise StageError("read", rel_path, "permission denied", "make the file readable") from None
    except OSError as exc:
        raise StageError("read", rel_path, f"cannot read: {exc.strerror}", "check the file") from None


def decode(raw: bytes, rel_path: str) -> str:
    """Strict UTF-8 → canonical text: BOM dropped, CRLF and CR → LF; nothing else changes."""
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise StageError(
            "normalize",
            f"{rel_path}:byte 0",
            "UTF-16 byte order mark",
            "re-save the file as UTF-8",
        )
    nul = raw.find(b"\x00")
    if nul >= 0:
        raise StageError(
            "normalize",
            f"{rel_path}:byte {nul}",
            "NUL byte: this looks like a binary file",
            "remove the file from the corpus or --exclude it",
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise StageError(
            "normalize",
            f"{rel_path}:byte {exc.start} (line {line})",
            f"not valid UTF-8 ({exc.reason})",
            "re-save the file as UTF-8",
        ) from None
    text = text.removeprefix("\ufeff")
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def front_matter_end(text: str) -> tuple[int, str]:
    """Where a ``---`` YAML or ``+++`` TOML block at the very top ends, and its kind.

    Returns ``(0, "")`` when there is none, or when it is never closed.
    """
    for fence, closers, kind in (("---", ("---", "..."), "yaml"), ("+++", ("+++",), "toml")):
        if not text.startswith(fence + "\n"):
            continue
        pos = len(fence) + 1
        while pos < len(text):
            nl = text.find("\n", pos)
            line = text[pos:] if nl < 0 else text[pos:nl]
            if line.rstrip() in closers:
                return (len(text) if nl < 0 else nl + 1), kind
            if nl < 0:
                break
            pos = nl + 1
    return 0, ""


def parse_front_matter(block: str, kind: str) -> dict[str, Any]:
    """Parse the inside of a front matter block; raise ValueError if it is not valid."""
    if kind == "toml":
        return tomllib.loads(block)
    # libyaml recurses in C and overflows the stack (a crash, not an error) on nesting
    # some 20 000 deep; nesting needs one of these marks per level, so a block with
    # fewer is safe for it, and a block with more gets the Python loader (RecursionError).
    marks = sum(map(block.count, "[{-?:\n"))
    loader = _YAML_LOADER if marks <= _C_YAML_MARKS else yaml.SafeLoader
    data = yaml.load(block, Loader=loader)  # a safe loader, in C when it is safe
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise TypeError(f"front matter is a {type(data).__name__}, not a mapping")
    return data


def normalize(raw: bytes, rel_path: str) -> SourceDoc:
    """Bytes → ``SourceDoc``; front matter split off and parsed, kept out of chunks."""
    text = decode(raw, rel_path)
    posix = rel_path.replace(os.sep, "/")
    doc_name = posix.rsplit(".", 1)[0] if "." in posix.rsplit("/", 1)[-1] else posix
    end, kind = front_matter_end(text)
    front: dict[str, Any] | None = None
    warnings: list[str] = []
    if end:
        first_nl = text.index("\n")
        inner = text[first_nl + 1 : end]
        inner = inner[: inner.rstrip("\n").rfind("\n") + 1]  # drop the closing fence line
        try:
            front = _jsonable(parse_front_matter(inner, kind), [_FRONT_MATTER_VALUES])
        except (ValueError, TypeError, RecursionError, yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
            problem = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if isinstance(exc, RecursionError):
                problem = "nested too deep"
            warnings.append(
                f"{posix}:line 1: front matter is not valid {kind.upper()} ({problem}); "
                "chunked without it (hint: fix the front matter syntax)"
            )
    elif _UNCLOSED_FRONT_MATTER.match(text):
        warnings.append(
            f"{posix}:line 1: front matter is never closed; read as Markdown "
            "(hint: close it with a line of --- or +++, or remove its first line)"
        )
    return SourceDoc(posix, doc_name, text, end, front, tuple(warnings))


def _jsonable(value: Any, budget: list[int], depth: int = 0) -> Any:
    """Front matter as plain JSON values (YAML dates and TOML datetimes become strings).

    ``budget`` holds how many more values may be made: YAML aliases can make a small
    block expand exponentially ("billion laughs"), and each chunk record carries a copy.
    """
    budget[0] -= 1
    if budget[0] < 0:
        raise ValueError(f"it expands to more than {_FRONT_MATTER_VALUES:,} values (YAML aliases?)")
    if depth > _FRONT_MATTER_DEPTH:
        raise ValueError(f"it is nested deeper than {_FRONT_MATTER_DEPTH} levels")
    if isinstance(value, dict):
        return {str(k): _jsonable(v, budget, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_jsonable(v, budget, depth + 1) for v in value]
    if isinstance(value, float) and not math.isfinite(value):  # NaN and infinities are not JSON
        return None
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**64:
        return str(value)  # beyond what JSON tools read as an integer
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)
