"""LangChain: a document loader, a Markdown text splitter and a feed-driven vector store sync.

Needs the ``langchain`` extra (``pip install 'chunkyard[langchain]'``: ``langchain-core``
and ``langchain-text-splitters``). Importing this module imports them; ``import pipeline``
never does.

- ``ChunkyardLoader(out)``: one ``Document`` per chunk of a chunk folder
  (``page_content`` = ``embedText``, ``id`` = ``chunk_id``, flat citation metadata).
- ``ChunkyardTextSplitter(policy)``: chunkyard's md-heading-v1 rules on text in memory.
- ``sync_vectorstore(out, store, cursor_path)``: applies the change feed to any
  ``VectorStore`` through ``add_documents(ids=…)`` / ``delete(ids=…)``, embedding only
  chunks whose embedded text changed, and remembers its cursor.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from langchain_core.document_loaders import BaseLoader
from langchain_core.documents import Document
from langchain_core.vectorstores import VectorStore
from langchain_text_splitters import TextSplitter

from pipeline.adapters.folder import open_chunks
from pipeline.adapters.records import chunk_records, flat_metadata
from pipeline.adapters.sync import StoreSyncReport, sync
from pipeline.errors import PipelineError
from pipeline.models import Policy

__all__ = ("ChunkyardLoader", "ChunkyardTextSplitter", "StoreSyncReport", "sync_vectorstore", "to_document")

Content = Literal["embed", "original"]


def to_document(record: Mapping[str, Any], content: Content = "embed") -> Document:
    """One chunk record as a LangChain ``Document``.

    Args:
        record: a chunk record (a chunk file's JSON, or one from ``chunk_text``).
        content: ``embed`` puts ``embedText`` (what chunkyard means to be embedded: the
            context line, then the text) in ``page_content``; ``original`` the verbatim
            source slice ``originalText``.
    """
    text = record["embedText"] if content == "embed" else record["originalText"]
    return Document(page_content=text, metadata=flat_metadata(record), id=record["chunk_id"])


class ChunkyardLoader(BaseLoader):
    """Load the chunks of a chunk folder (``chunkyard ingest``'s ``--out``) as Documents.

    Args:
        out: the chunk folder.
        sources: only these documents (corpus-relative paths); all when ``None``.
        content: ``embed`` (default) or ``original``, see ``to_document``.

    Example:
        >>> docs = ChunkyardLoader("chunks").load()   # doctest: +SKIP
    """

    def __init__(
        self, out: Path | str, sources: Iterable[str] | None = None, content: Content = "embed"
    ) -> None:
        self.out = Path(out)
        self.sources = list(sources) if sources is not None else None
        self.content: Content = content

    def lazy_load(self) -> Iterator[Document]:
        """One ``Document`` per chunk, document by document, in reading order."""
        folder = open_chunks(self.out)
        for source in self.sources if self.sources is not None else folder.sources:
            for record in folder.records(source):
                yield to_document(record, self.content)


class ChunkyardTextSplitter(TextSplitter):
    """Split Markdown with chunkyard's rules (md-heading-v1), in memory.

    Headings start chunks, code blocks and tables are never cut, budgets are counted in
    real tokens on the embedded text. ``chunk_size`` / ``chunk_overlap`` are the policy's
    ``target_tokens`` / ``overlap_tokens``.

    Args:
        policy: the chunking policy (default ``Policy()``: 256 tokens, 64 overlap, cl100k).
        content: ``embed`` (default: the context line, then the text) or ``original``.
        path: the path a text is named by when its metadata has no ``source``.
        **kwargs: passed to ``TextSplitter`` (``length_function`` and the like are unused).

    ``create_documents`` / ``split_documents`` add chunkyard's metadata (see
    ``to_document``) and ``start_index``: the exact offset of ``originalText`` in the
    text (code points; the text as chunkyard normalizes it: LF line ends, no BOM).
    """

    def __init__(
        self, policy: Policy | None = None, *, content: Content = "embed", path: str = "doc.md", **kwargs: Any
    ) -> None:
        self.policy = policy or Policy()
        self.content: Content = content
        self.path = path
        kwargs.setdefault("chunk_size", self.policy.target_tokens)
        kwargs.setdefault("chunk_overlap", min(self.policy.overlap_tokens, self.policy.target_tokens))
        kwargs.setdefault("strip_whitespace", False)
        super().__init__(**kwargs)

    def split_text(self, text: str) -> list[str]:
        """The chunks' texts (``embedText``, or ``originalText`` with ``content="original"``)."""
        key = "embedText" if self.content == "embed" else "originalText"
        return [r[key] for r in chunk_records(text, self.path, self.policy)]

    def create_documents(
        self, texts: list[str], metadatas: list[dict[Any, Any]] | None = None
    ) -> list[Document]:
        """One ``Document`` per chunk of each text, with chunkyard's metadata and ``start_index``.

        A text whose metadata has a ``source`` is chunked under that path (it names the ids).
        """
        metas = metadatas or [{}] * len(texts)
        documents: list[Document] = []
        for text, meta in zip(texts, metas, strict=True):
            path = str(meta.get("source") or self.path)
            for record in chunk_records(text, path, self.policy):
                doc = to_document(record, self.content)
                doc.metadata = {**meta, **doc.metadata, "start_index": record["charOffsets"]["charStart"]}
                documents.append(doc)
        return documents


class _VectorStoreTarget:
    """A LangChain ``VectorStore`` as the sync drives it."""

    def __init__(self, store: VectorStore, content: Content) -> None:
        self.store = store
        self.content: Content = content

    def upsert(self, records: Sequence[Mapping[str, Any]], replacing: Sequence[str]) -> None:
        docs = [to_document(r, self.content) for r in records]
        self.store.add_documents(docs, ids=[r["chunk_id"] for r in records])

    def delete(self, chunk_ids: Sequence[str]) -> None:
        if self.store.delete(ids=list(chunk_ids)) is False:
            raise PipelineError(
                f"{type(self.store).__name__}.delete refused {len(chunk_ids)} ids "
                "(hint: the store must support delete(ids=...); the cursor was not moved)"
            )


def sync_vectorstore(
    out: Path | str,
    vectorstore: VectorStore,
    cursor_path: Path | str,
    *,
    content: Content = "embed",
    full: bool = False,
    batch_size: int = 128,
) -> StoreSyncReport:
    """Apply a chunk folder's change feed to any LangChain ``VectorStore``, from where it left off.

    Keyed by ``chunk_id`` (``add_documents(ids=…)``, ``delete(ids=…)``); a chunk is embedded
    only when its embedded text is new to the store. The cursor and what the store
    holds are kept in ``cursor_path`` (JSON), written atomically after the store calls
    succeeded: if one fails, the next call starts again from the same place.

    The store must replace a document added again under the same id (InMemoryVectorStore,
    Chroma, PGVector, Qdrant … do). A chunk whose text is unchanged but whose position
    moved is not re-embedded, so its position fields in the store (``char_start``,
    ``line_start``, ``rev``, ``chunk_number`` …) are those of when it was embedded: for the
    current ones, look its ``chunk_id`` up with ``open_chunks(out).get(chunk_id)``.

    Args:
        out: the chunk folder (``ingest``'s ``--out``).
        vectorstore: the store (with its embedding model).
        cursor_path: a JSON file of this store's own (created on the first call).
        content: what to embed: ``embed`` (default, ``embedText``) or ``original``.
        full: read the whole feed again and delete what the store holds that the chunk
            folder no longer has (automatic when the feed no longer reaches the cursor).
        batch_size: documents per store call.

    Returns:
        The counts: added, replaced, unchanged, deleted, ``embedded``; and the cursor.
    """
    return sync(out, _VectorStoreTarget(vectorstore, content), cursor_path, full=full, batch_size=batch_size)
