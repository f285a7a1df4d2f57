"""``index --rebuild``: build a fresh index beside the old one, then swap it in.

The old index stays searchable until the swap. A SQLite file is swapped in one atomic
rename (readers see the old index or the new one); a LanceDB folder cannot be, so the old
one is moved aside first and removed last.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pipeline.index.vector_store import open_at

R = TypeVar("R")


def rebuild_beside(kind: str, path: Path, build: Callable[[Path], R]) -> R:
    """``build(fresh)`` a new store of ``kind`` at a path beside ``path``, then put it at ``path``."""
    fresh = path.with_name(path.name + ".rebuild")
    remove_store(fresh)
    result = build(fresh)
    if fresh.is_dir():  # LanceDB: a folder cannot be swapped in one step; the old one goes last
        old = path.with_name(path.name + ".old")
        remove_store(old)
        if path.exists():
            os.replace(path, old)
        os.replace(fresh, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        if path.exists():  # the old file's WAL emptied into it first: its WAL never meets the new file
            db = open_at(kind, path)
            try:
                getattr(db, "checkpoint", lambda: None)()
            finally:
                db.close()
        os.replace(fresh, path)  # one atomic step: readers see the old index or the new one
        for suffix in ("-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)
    return result


def remove_store(path: Path) -> None:
    """Remove a store at ``path`` (a folder, or a file with its WAL and shared memory)."""
    if path.is_dir():
        shutil.rmtree(path)
    for p in (path, Path(str(path) + "-wal"), Path(str(path) + "-shm")):
        if p.is_file():
            p.unlink()
