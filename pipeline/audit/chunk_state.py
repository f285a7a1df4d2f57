"""A chunk folder as the audit tools read it: its state, redirects, chunk files and sources.

Read-only: nothing here writes to the output folder, so ``validate``, ``resolve``
and ``check-citations`` can run beside an ``ingest`` or a ``watch``. The state database
is read through mappings that ask it per key (``docs``, ``redirects``, ``index``), so an
audit holds no copy of the state, whatever the corpus size. See docs/spec.md, "State and
scale" and "Audit".
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.audit.broken import read_checked
from pipeline.chunkfolder import STATE_DIR, ChunkRecord
from pipeline.errors import PipelineError, UsageError
from pipeline.models import SourceDoc
from pipeline.run.db import StateDB, StateError, db_path
from pipeline.run.state import MANIFEST, STATE_FILE, state_dir
from pipeline.stages.normalize import normalize, read_source


def doc_name_of(rel_path: str) -> str:
    """``<reldir>/<stem>``: the source path without its extension (as ``normalize`` names it)."""
    posix = rel_path.replace(os.sep, "/")
    return posix.rsplit(".", 1)[0] if "." in posix.rsplit("/", 1)[-1] else posix


def uid_of(chunk_id: str) -> str:
    """The ``doc_uid`` part of a ``chunk_id`` (001's ``doc_id``)."""
    return chunk_id.split("|r=", 1)[0]


@dataclass(frozen=True, slots=True)
class Location:
    """Where one chunk lives: its document (manifest key) and its place in it."""

    rel_path: str  #: corpus-relative source path, the manifest key
    index: int  #: chunk number within the document
    file: str  #: chunk file, relative to the output folder


class DocsView(Mapping[str, dict[str, Any]]):
    """``rel`` → the document's entry (as the manifest had it), asked of the state per key."""

    def __init__(self, db: StateDB) -> None:
        self._db = db

    def __getitem__(self, rel: str) -> dict[str, Any]:
        entry = self._db.entry(rel)
        if entry is None:
            raise KeyError(rel)
        return entry

    def __contains__(self, rel: object) -> bool:
        return isinstance(rel, str) and self._db.stamp(rel) is not None

    def __iter__(self) -> Iterator[str]:
        return self._db.iter_rels()

    def __len__(self) -> int:
        return self._db.count_docs()


class RedirectsView(Mapping[str, str]):
    """old ``chunk_id`` → new, asked of the state per key."""

    def __init__(self, db: StateDB) -> None:
        self._db = db

    def __getitem__(self, old: str) -> str:
        new = self._db.redirect(old)
        if new is None:
            raise KeyError(old)
        return new

    def __contains__(self, old: object) -> bool:
        return isinstance(old, str) and self._db.redirect(old) is not None

    def __iter__(self) -> Iterator[str]:
        return (old for old, _ in self._db.iter_redirects())

    def __len__(self) -> int:
        return self._db.count_redirects()


class IndexView(Mapping[str, Location]):
    """``chunk_id``, ``id`` or ``file`` → where the chunk lives (the state's indexes)."""

    def __init__(self, db: StateDB, kind: str) -> None:
        self._db, self._kind = db, kind

    def __getitem__(self, key: str) -> Location:
        found = self._db.locate(self._kind, key)
        if found is None:
            raise KeyError(key)
        return Location(*found)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._db.locate(self._kind, key) is not None

    def __iter__(self) -> Iterator[str]:
        return self._db.iter_column(self._kind)

    def __len__(self) -> int:
        return self._db.count_chunks()


@dataclass(slots=True)
class ChunkStore:
    """One output folder opened for auditing."""

    out: Path
    corpus: Path
    manifest: dict[str, Any]  #: the state's header, and ``docs`` (a ``DocsView``)
    redirects: Mapping[str, str] = field(default_factory=dict)
    db: StateDB | None = None

    @property
    def docs(self) -> Mapping[str, dict[str, Any]]:
        docs: Mapping[str, dict[str, Any]] = self.manifest.get("docs") or {}
        return docs

    def index(self, kind: str) -> Mapping[str, Location]:
        """``chunk_id``, ``id`` or ``file`` → location (queries on the state's indexes)."""
        if self.db is None:
            return {}
        return IndexView(self.db, kind)

    def read_record(self, file: str) -> ChunkRecord:
        """One chunk file, parsed and checked against the chunk schema; ``PipelineError`` when
        it is missing or unreadable, ``BrokenChunkError`` when it is not a record of the schema
        (edited or cut short on disk: a reader names it instead of failing on a field later)."""
        try:
            return read_checked(self.out, file)
        except FileNotFoundError:
            raise PipelineError(
                f"{file}: chunk file is listed in the manifest but missing "
                "(hint: run chunkyard ingest to repair the output)"
            ) from None
        except OSError as exc:
            raise PipelineError(
                f"{file}: cannot read the chunk file ({exc}) (hint: run chunkyard ingest)"
            ) from None

    def source(self, rel_path: str) -> SourceDoc | None:
        """The current source document, normalized; None when it is gone or unreadable."""
        try:
            return normalize(read_source(self.corpus / rel_path, rel_path), rel_path)
        except PipelineError:
            return None


def open_store(out: Path, corpus: Path | None = None, *, need_corpus: bool = False) -> ChunkStore:
    """Open ``out`` for auditing; ``UsageError`` (exit 2) when it is not a chunk folder.

    The corpus is ``corpus`` when given, else the one the state records, else ``corpus/``.
    """
    if not out.is_dir():
        raise UsageError(f"{out}: no such chunk folder (hint: pass the folder given to ingest as --out)")
    path = db_path(state_dir(out))
    if not path.is_file():
        old = " (an older chunkyard's manifest.json: run chunkyard ingest once to migrate it)"
        raise UsageError(
            f"{out}: no manifest: no state at {STATE_DIR}/{STATE_FILE}"
            + (old if (state_dir(out) / MANIFEST).is_file() else "")
            + f" (hint: run chunkyard ingest CORPUS --out {out})"
        )
    try:
        db = StateDB.reader(path)
        header = db.header()
    except (StateError, Exception) as exc:  # noqa: BLE001 - sqlite3.Error: not a state database
        raise UsageError(f"{path}: cannot read the state ({exc}) (hint: run chunkyard ingest)") from None
    manifest = {**header, "docs": DocsView(db)}
    if corpus is None:
        recorded = manifest.get("corpus")
        corpus = Path(recorded) if isinstance(recorded, str) and recorded else Path("corpus")
    if need_corpus and not corpus.is_dir():
        raise UsageError(f"{corpus}: corpus folder not found (hint: pass the corpus with --corpus)")
    return ChunkStore(out, corpus, manifest, RedirectsView(db), db)
