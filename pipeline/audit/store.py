"""The chunk store as the audit tools read it: manifest, redirects, chunk files, sources (SPEC §5, §8).

Read-only: nothing here writes to the output folder, so ``validate``, ``resolve``
and ``check-citations`` can run beside an ``ingest`` or a ``watch``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from pipeline.errors import PipelineError, UsageError
from pipeline.models import SourceDoc
from pipeline.run.state import MANIFEST, MANIFEST_FORMAT, STATE_DIR, load_redirects
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


@dataclass(slots=True)
class ChunkStore:
    """One output folder opened for auditing."""

    out: Path
    corpus: Path
    manifest: dict[str, Any]
    redirects: dict[str, str] = field(default_factory=dict)
    _index: dict[str, dict[str, Location]] | None = None

    @property
    def docs(self) -> dict[str, dict[str, Any]]:
        docs: dict[str, dict[str, Any]] = self.manifest.get("docs") or {}
        return docs

    def index(self, kind: str) -> dict[str, Location]:
        """``chunk_id``, ``id`` or ``file`` → location, built from the manifest on first use."""
        if self._index is None:
            by: dict[str, dict[str, Location]] = {"chunk_id": {}, "id": {}, "file": {}}
            for rel, entry in self.docs.items():
                files = entry.get("files") or []
                for i, f in enumerate(files):
                    loc = Location(rel, i, f)
                    by["file"][f] = loc
                    for kind_, key in (("chunk_id", "chunk_ids"), ("id", "ids")):
                        values = entry.get(key) or []
                        if i < len(values):
                            by[kind_].setdefault(values[i], loc)
            self._index = by
        return self._index[kind]

    def read_record(self, file: str) -> dict[str, Any]:
        """One chunk file, parsed; ``PipelineError`` when it is missing or not a JSON object."""
        path = self.out / file
        try:
            record = orjson.loads(path.read_bytes())
        except FileNotFoundError:
            raise PipelineError(
                f"{file}: chunk file is listed in the manifest but missing "
                "(hint: run chunkyard ingest to repair the output)"
            ) from None
        except (OSError, orjson.JSONDecodeError) as exc:
            raise PipelineError(
                f"{file}: cannot read the chunk file ({exc}) (hint: run chunkyard ingest)"
            ) from None
        if not isinstance(record, dict):
            raise PipelineError(f"{file}: not a JSON object (hint: run chunkyard ingest --full)")
        return record

    def source(self, rel_path: str) -> SourceDoc | None:
        """The current source document, normalized; None when it is gone or unreadable."""
        try:
            return normalize(read_source(self.corpus / rel_path, rel_path), rel_path)
        except PipelineError:
            return None


def open_store(out: Path, corpus: Path | None = None, *, need_corpus: bool = False) -> ChunkStore:
    """Open ``out`` for auditing; ``UsageError`` (exit 2) when it is not a chunk folder.

    The corpus is ``corpus`` when given, else the one the manifest records, else ``corpus/``.
    """
    if not out.is_dir():
        raise UsageError(f"{out}: no such chunk folder (hint: pass the folder given to ingest as --out)")
    path = out / STATE_DIR / MANIFEST
    if not path.is_file():
        raise UsageError(
            f"{out}: no manifest at {STATE_DIR}/{MANIFEST} (hint: run chunkyard ingest CORPUS --out {out})"
        )
    try:
        manifest = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise UsageError(f"{path}: cannot read the manifest ({exc}) (hint: run chunkyard ingest)") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT:
        raise UsageError(
            f"{path}: not a format-{MANIFEST_FORMAT} manifest (hint: re-run chunkyard ingest --full)"
        )
    if corpus is None:
        recorded = manifest.get("corpus")
        corpus = Path(recorded) if isinstance(recorded, str) and recorded else Path("corpus")
    if need_corpus and not corpus.is_dir():
        raise UsageError(f"{corpus}: corpus folder not found (hint: pass the corpus with --corpus)")
    return ChunkStore(out, corpus, manifest, load_redirects(out))
