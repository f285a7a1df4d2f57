"""Search hits merged into passages: ranked neighbours read from the source as one citation span.

``Passages`` belongs to one ``Searcher``: it keeps each source's canonical text and the chunk
records it read (each read again when its file changes) and the chunks' token counter, and
merges ranked items with ``pipeline.index.expand``. A hit whose source no longer holds its text at its
offsets (edited since ingest, or gone) stays a chunk, with a warning: a passage is read
from the source. So does a hit whose chunk file is broken on disk (cut short, edited into
another shape: ``pipeline.audit.broken``), and a broken neighbour is a wall: the query is
answered, with a warning naming the file and the fix, and the file is logged once.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

from pipeline.audit.broken import BrokenChunkError, read_checked, repair_hint
from pipeline.errors import PipelineError
from pipeline.index.expand import ChunkFiles, ChunkSpan, expand

#: A passage grows only into neighbours ranked this high in the pool (hits ranked lower
#: stay chunks; the choice is measured in docs/benchmarks.md).
MERGE_DEPTH = 30
#: Chunk records kept across queries (the folder's hot ones); past it the memory starts over.
CHUNK_RECORDS_KEPT = 20_000
#: Token counts of passage texts kept across queries (a hot passage is measured once; its
#: text is the key, so an edited source never gets an old count); past it the memory starts over.
PASSAGE_COUNTS_KEPT = 4_096

log = logging.getLogger("chunkyard.search")

#: A chunk file read: its record, or ``None`` and (when it is there but broken) what is wrong.
Read = tuple[dict[str, Any] | None, str | None]


class Passages:
    """Passage merging for the chunk folder ``out`` (its corpus: ``corpus``, else the manifest's).

    Args:
        scope: ``document`` (a passage may run across headings) or ``section``.
    """

    def __init__(self, out: Path, corpus: Path | None, scope: str) -> None:
        self.out = out
        self.scope = scope
        self._corpus = corpus
        self._store: Any = False  # the chunk folder's store, opened on the first passage
        self._texts: dict[str, tuple[tuple[int, int] | None, str | None]] = {}
        self._counter: Callable[[str], int] | None = None
        self._passage_counts: dict[str, int] = {}
        self._records: dict[Path, tuple[tuple[int, int, int], Read]] = {}

    def _chunk_store(self) -> Any:
        """The chunk folder's store (``pipeline.audit.chunk_state``), opened once; ``None`` when it cannot be."""
        if self._store is False:
            from pipeline.audit.chunk_state import open_store

            try:
                self._store = open_store(self.out, self._corpus)
            except PipelineError:
                self._store = None
        return self._store

    def _source_text(self, rel: str) -> str | None:
        """The current canonical text of the source ``rel`` (``None`` when it cannot be read).

        Kept across queries while the file's (mtime, size) stay the same: a long-lived
        searcher (eval, a bench) normalizes each source once, and never merges from a copy
        older than the file."""
        store = self._chunk_store()
        if store is None:
            return None
        try:
            st = (store.corpus / rel).stat()
            stamp: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = None
        kept = self._texts.get(rel)
        if kept is None or kept[0] != stamp or stamp is None:
            doc = store.source(rel) if stamp is not None else None
            kept = (stamp, doc.text if doc is not None else None)
            self._texts[rel] = kept
        return kept[1]

    def read_record(self, path: Path) -> dict[str, Any] | None:
        """A chunk file's record (``None`` when gone or broken), through the same memory as the
        merge (for the BM25 windows)."""
        return self._chunk_record(path)[0]

    def _chunk_record(self, path: Path) -> Read:
        """A chunk file's record, kept across queries while the file's (inode, mtime, size)
        stay the same: chunk files are replaced whole (a new inode), never edited in place.
        A broken file gives ``(None, what is wrong)``, logged the first time it is met."""
        try:
            st = os.stat(path)
        except OSError:
            return None, None
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        kept = self._records.get(path)
        if kept is not None and kept[0] == stamp:
            return kept[1]
        read: Read
        try:
            read = (cast(dict[str, Any], read_checked(self.out, path.relative_to(self.out).as_posix())), None)
        except OSError:
            read = (None, None)
        except BrokenChunkError as exc:
            read = (None, exc.reason)
            log.warning("chunkyard search: %s", exc)
        if len(self._records) >= CHUNK_RECORDS_KEPT:
            self._records.clear()
        self._records[path] = (stamp, read)
        return read

    def merge(
        self,
        items: list[dict[str, Any]],
        budget: int,
        warnings: list[str],
        ids: Mapping[str, str],
        limit: int | None = None,
        prompt: int | None = None,
    ) -> list[dict[str, Any]]:
        """``items`` (best first) merged into passages (``pipeline.index.expand``, ranked neighbours
        only, within ``passage_scope``); the first ``limit`` passages only, when given; with
        ``prompt``, passages that share a prompt of that many tokens (``expand.shared_budget``).

        A hit whose source no longer holds its text at its offsets (edited since ingest, or
        gone) is kept as a chunk, with a warning: a passage is read from the source.
        """
        broken: dict[Path, str] = {}  # the broken chunk files this merge met, and why

        def read(path: Path) -> dict[str, Any] | None:
            record, problem = self._chunk_record(path)
            if problem is not None:
                broken[path] = problem
            return record

        # ids: a ranked neighbour's chunk id without its file
        files = ChunkFiles(self.out, ids, read)
        # each source is looked at once per merge (one stat, one version of its text), not at
        # every hit and every size the passages try
        sources: dict[str, str | None] = {}

        def source_text(rel: str) -> str | None:
            if rel not in sources:
                sources[rel] = self._source_text(rel)
            return sources[rel]

        stale: set[str] = set()
        for item in items:
            files.remember(item["chunk_id"], item["chunk_file"])
            text = source_text(item["file"])
            start, end = item["offsets"]["start"], item["offsets"]["end"]
            if text is None or text[start:end] != item["text"]:
                stale.add(item["file"])
        for rel in sorted(stale):
            warnings.append(
                f"{rel}: the source changed since it was chunked; its hits are not merged "
                f"(hint: chunkyard ingest, then chunkyard index --out {self.out})"
            )

        def lookup(chunk_id: str) -> ChunkSpan | None:
            span = files(chunk_id)
            return None if span is None or span.source in stale else span

        def text_of(source: str, start: int, end: int) -> str:
            return (source_text(source) or "")[start:end]

        merged = expand(
            items,
            lookup,
            budget,
            text_of=text_of,
            ranked_only=True,
            count=self._count_passage,
            scope=self.scope,
            depth=MERGE_DEPTH,
            limit=limit,
            prompt=prompt,
        )
        for item in merged:
            item.setdefault("chunk_ids", [item["chunk_id"]])
        for path, problem in sorted(broken.items()):
            warnings.append(
                f"{path.relative_to(self.out).as_posix()}: broken chunk file ({problem}); its chunk "
                f"is not merged into a passage (hint: {repair_hint(self.out)})"
            )
        return merged

    def _count_passage(self, text: str) -> int:
        """Tokens of a passage's text, remembered (the tokenizer keeps only short texts' counts)."""
        tokens = self._passage_counts.get(text)
        if tokens is None:
            tokens = self._count(text)
            if len(self._passage_counts) >= PASSAGE_COUNTS_KEPT:
                self._passage_counts.clear()
            self._passage_counts[text] = tokens
        return tokens

    @property
    def _count(self) -> Callable[[str], int]:
        """The chunks' token counter (the policy's tokenizer, cl100k by default), made once."""
        if self._counter is None:
            from pipeline.stages.tokens import Counter

            store = self._chunk_store()
            policy = (store.manifest.get("policy") or {}) if store is not None else {}
            self._counter = Counter(str(policy.get("tokenizer") or "cl100k_base")).count
        return self._counter
