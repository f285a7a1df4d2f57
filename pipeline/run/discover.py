"""Discovery: which files of a corpus folder are documents (docs/spec.md, Runs)."""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable, Iterator
from operator import itemgetter
from pathlib import Path
from typing import NamedTuple

from pipeline.chunkfolder import STATE_DIR

SUFFIXES = (".md", ".markdown")
SKIP_DIRS = frozenset({".git", STATE_DIR})


class Found(NamedTuple):
    """A document found under the corpus root (a tuple: a walk makes one per document)."""

    path: str  #: absolute path (through symlinks as found)
    rel_path: str  #: corpus-relative POSIX path
    #: its size and mtime from the walk's own ``stat`` (-1: not taken, or it failed)
    size: int = -1
    mtime_ns: int = -1


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
    stat: bool = False,
    on_folder: Callable[[str, list[Listed]], bool] | None = None,
) -> tuple[list[Found], list[str]]:
    """Every document under ``root``, sorted by relative path, and the folders it could not read.

    Symlinks to files are followed; symlinked folders are followed once, never
    into a loop; ``.git`` folders and the output folder are skipped. A name that is
    not valid UTF-8 is reported and skipped (no output could name it). The walk
    keeps its own stack, so no folder depth can exhaust Python's.

    Args:
        unreadable: if given, the relative paths of folders that could not be listed
            are appended to it (their documents are unknown, not deleted).
        stat: take each document's size and mtime on the way (``Found.size``,
            ``Found.mtime_ns``): the one ``stat`` per document a no-change run needs,
            from the folder entry, so no second pass builds every path again.
        on_folder: called once per listed folder with its prefix (``a/b/``, ``""`` at the
            root) and the documents directly in it as ``(name, size, mtime_ns)`` (in no
            order), as the walk lists it, so a caller can act on a folder before the walk
            ends; those it returns False for are left out of the result (the caller has
            dealt with them as a whole: no ``Found`` is made for them).
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

    def walk(folder: str, rel: str, key: tuple[int, int] | None) -> None:
        if key is None:
            try:
                st = os.stat(folder)
            except OSError:
                return
            key = (st.st_dev, st.st_ino)
        if key in seen_dirs:
            return  # a symlink loop, or a folder reached twice
        seen_dirs.add(key)
        fd = -1
        try:  # listed by descriptor: each entry's stat is then an fstatat, no path to resolve
            fd = os.open(folder, _DIR_FLAGS)
            with os.scandir(fd) as listing:
                entries = list(listing)  # in no order: the documents are sorted once, at the end
        except OSError as exc:
            if fd >= 0:
                os.close(fd)
            problems.append(
                f"{rel or '.'}/: read: cannot list folder ({exc.strerror}) (hint: make it readable)"
            )
            if unreadable is not None:
                unreadable.append(rel)
            return
        base = folder.rstrip("/")  # the root may be "/"
        try:
            prefix = f"{rel}/" if rel else ""
            listed: list[Listed] = []  # plain tuples: a folder dealt with as a whole costs no Found
            subfolders: list[tuple[str, str, tuple[int, int] | None]] = []
            bad_names: list[str] = []
            for entry in entries:
                name = entry.name
                try:
                    is_dir = entry.is_dir()  # follows symlinks; the type comes with the listing
                    if not is_dir and not (name.endswith(".md") and len(name) > 3) and not is_document(name):
                        continue  # neither a folder nor a document: nothing to say about it
                    is_file = not is_dir and entry.is_file()
                except OSError:
                    continue
                rel_path = prefix + name
                if not (name.isascii() or _utf8(name)):
                    if (is_dir and name not in SKIP_DIRS) or is_file:
                        shown = os.fsencode(rel_path).decode("utf-8", "backslashreplace")
                        bad_names.append(
                            f"{shown}: read: the name is not valid UTF-8, skipped (hint: rename it to UTF-8)"
                        )
                    continue
                if is_dir:
                    if name in SKIP_DIRS or (exclude and excluded(rel_path, exclude)):
                        continue
                    try:
                        sub = entry.stat()
                    except OSError:
                        continue
                    sub_key = (sub.st_dev, sub.st_ino)
                    if sub_key == out_key:
                        continue
                    subfolders.append((f"{base}/{name}", rel_path, sub_key))
                elif is_file and not (exclude and excluded(rel_path, exclude)):
                    try:
                        got = entry.stat() if stat else None
                    except OSError:  # the run reads it, and says why it cannot
                        got = None
                    if on_folder is not None:
                        listed.append((name, -1, -1) if got is None else (name, got.st_size, got.st_mtime_ns))
                    elif got is None:
                        found.append(Found(f"{base}/{name}", rel_path))
                    else:
                        found.append(Found(f"{base}/{name}", rel_path, got.st_size, got.st_mtime_ns))
            problems.extend(sorted(bad_names))
        finally:
            os.close(fd)
        if on_folder is not None and on_folder(prefix, listed):
            found.extend(Found(f"{base}/{name}", prefix + name, size, mtime) for name, size, mtime in listed)
        # depth first, in name order, as a recursion would: of two ways into one folder
        # (symlinks), the first by name is the one its documents are found under
        subfolders.sort(key=_REL, reverse=True)
        stack.extend(subfolders)

    stack: list[tuple[str, str, tuple[int, int] | None]] = [(str(root), "", None)]
    while stack:
        walk(*stack.pop())
    found.sort(key=_rel)
    return found, problems


#: A document as a folder's listing gives it to ``on_folder``: (name, size, mtime_ns).
Listed = tuple[str, int, int]

_REL = itemgetter(1)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)


def _rel(found: Found) -> str:
    return found.rel_path


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
