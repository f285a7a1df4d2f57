"""Discovery: which files of a corpus folder are documents (SPEC §5)."""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SUFFIXES = (".md", ".markdown")
SKIP_DIRS = frozenset({".git", ".chunkyard"})


@dataclass(frozen=True, slots=True)
class Found:
    """A document found under the corpus root."""

    path: str  #: absolute path (through symlinks as found)
    rel_path: str  #: corpus-relative POSIX path


def is_document(name: str) -> bool:
    """``*.md`` / ``*.markdown``, any case; ``.md`` alone is a hidden file, not a document."""
    stem, dot, suffix = name.rpartition(".")
    return bool(dot) and bool(stem) and f".{suffix.lower()}" in SUFFIXES


def excluded(rel_path: str, patterns: tuple[str, ...]) -> bool:
    """``--exclude`` globs match the relative path or any of its folders."""
    if not patterns:
        return False
    parts = rel_path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(fnmatch.fnmatchcase(p, pat) for pat in patterns for p in (*prefixes, parts[-1]))


def discover(
    root: Path,
    out: Path | None = None,
    exclude: tuple[str, ...] = (),
    *,
    unreadable: list[str] | None = None,
) -> tuple[list[Found], list[str]]:
    """Every document under ``root``, sorted by relative path, and the folders it could not read.

    Symlinks to files are followed; symlinked folders are followed once, never
    into a loop; ``.git`` folders and the output folder are skipped. A name that is
    not valid UTF-8 is reported and skipped (no output could name it). The walk
    keeps its own stack, so no folder depth can exhaust Python's.

    Args:
        unreadable: if given, the relative paths of folders that could not be listed
            are appended to it (their documents are unknown, not deleted).
    """
    problems: list[str] = []
    root = root.resolve()
    try:  # the output folder is known by its (device, inode); resolving each folder's path
        out_st = os.stat(out) if out is not None else None  # would cost depth² lstat calls
    except OSError:
        out_st = None
    out_key = (out_st.st_dev, out_st.st_ino) if out_st is not None else None
    seen_dirs: set[tuple[int, int]] = set()
    found: list[Found] = []

    def walk(folder: Path, rel: str) -> None:
        try:
            st = folder.stat()
        except OSError:
            return
        key = (st.st_dev, st.st_ino)
        if key in seen_dirs:
            return  # a symlink loop, or a folder reached twice
        seen_dirs.add(key)
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            problems.append(
                f"{rel or '.'}/: read: cannot list folder ({exc.strerror}) (hint: make it readable)"
            )
            if unreadable is not None:
                unreadable.append(rel)
            return
        subfolders: list[tuple[Path, str]] = []
        for entry in entries:
            rel_path = f"{rel}/{entry.name}" if rel else entry.name
            try:
                is_dir = entry.is_dir(follow_symlinks=True)
                is_file = entry.is_file(follow_symlinks=True)
            except OSError:
                continue
            if not _utf8(entry.name):
                if (is_dir and entry.name not in SKIP_DIRS) or (is_file and is_document(entry.name)):
                    shown = os.fsencode(rel_path).decode("utf-8", "backslashreplace")
                    problems.append(
                        f"{shown}: read: the name is not valid UTF-8, skipped (hint: rename it to UTF-8)"
                    )
                continue
            if is_dir:
                if entry.name in SKIP_DIRS or excluded(rel_path, exclude):
                    continue
                sub = Path(entry.path)
                if out_key is not None and _key(sub) == out_key:
                    continue
                subfolders.append((sub, rel_path))
            elif is_file and is_document(entry.name) and not excluded(rel_path, exclude):
                found.append(Found(entry.path, rel_path))
        stack.extend(reversed(subfolders))  # depth first, in name order, as a recursion would

    stack: list[tuple[Path, str]] = [(root, "")]
    while stack:
        walk(*stack.pop())
    found.sort(key=lambda f: f.rel_path)
    return found, problems


def walk(top: str | os.PathLike[str]) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk(top)`` without recursion: top-down, in the same order, pruned by editing the
    folder list, symlinked folders listed but not entered. Python 3.11's ``os.walk`` recurses
    once per level, so a deep enough tree raises ``RecursionError``.
    """
    stack = [os.fspath(top)]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        dirs: list[str] = []
        files: list[str] = []
        links: set[str] = set()
        for entry in entries:
            try:
                is_dir = entry.is_dir()
                if is_dir and entry.is_symlink():
                    links.add(entry.name)
            except OSError:
                is_dir = False
            (dirs if is_dir else files).append(entry.name)
        yield folder, dirs, files
        stack.extend(os.path.join(folder, d) for d in reversed(dirs) if d not in links)


def _key(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _utf8(name: str) -> bool:
    """False for a name with bytes that are not UTF-8 (``os`` hands them over as surrogates)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def find_one(
    root: Path, rel_path: str, out: Path | None = None, exclude: tuple[str, ...] = ()
) -> Found | None:
    """The document at ``rel_path`` under ``root``, or None if it is not (or no longer) one."""
    parts = rel_path.split("/")
    if not is_document(parts[-1]) or excluded(rel_path, exclude) or SKIP_DIRS.intersection(parts[:-1]):
        return None
    if not _utf8(rel_path):
        return None  # discover reports it
    path = root / rel_path
    if out is not None:
        try:
            if path.resolve().is_relative_to(out.resolve()):
                return None
        except OSError:
            return None
    return Found(str(path), rel_path) if path.is_file() else None
