"""LlamaIndex: chunk-folder reader, Markdown node parser and a feed-driven vector store sync.

Needs the ``llamaindex`` extra (``pip install 'chunkyard[llamaindex]'``: ``llama-index-core``).
Importing this module imports it; ``import pipeline`` never does.

Every node is a ``TextNode`` with ``id_`` = ``chunk_id``, ``text`` = ``originalText`` (the
verbatim source slice, so ``source[start_char_idx:end_char_idx] == text``), flat citation
metadata, and PREVIOUS / NEXT (neighbour chunks' ``chunk_id``) and SOURCE / PARENT
relationships. What LlamaIndex embeds (``get_content(MetadataMode.EMBED)``) is exactly
chunkyard's ``embedText``: the context line rides in the ``context`` metadata key, the
only key shown to the embedding model and the LLM.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.node_parser import NodeParser
from llama_index.core.schema import BaseNode, Document, NodeRelationship, RelatedNodeInfo, TextNode

from pipeline.adapters.folder import open_chunks
from pipeline.adapters.records import chunk_records, embed_prefix, flat_metadata
from pipeline.adapters.sync import StoreSyncReport, sync
from pipeline.errors import UsageError
from pipeline.models import Policy

__all__ = ("ChunkyardNodeParser", "ChunkyardReader", "StoreSyncReport", "sync_vector_store", "to_node")

#: The metadata key that carries ``embedText``'s context line.
CONTEXT_KEY = "context"


def to_node(
    record: Mapping[str, Any], neighbours: Mapping[str, str] | None = None, source_id: str = ""
) -> TextNode:
    """One chunk record as a ``TextNode``.

    Args:
        record: a chunk record.
        neighbours: ``id`` (``doc:…::chN``) → ``chunk_id`` for the chunks of its document;
            PREVIOUS / NEXT are set for the neighbours found there.
        source_id: the SOURCE node (the LlamaIndex ``Document`` it came from); default
            chunkyard's ``parentId`` (``doc:<docName>``), which is also the PARENT.
    """
    metadata = flat_metadata(record)
    prefix = embed_prefix(record)
    context = prefix.rstrip()
    template = "{content}"
    if context:
        metadata = {CONTEXT_KEY: context, **metadata}
        template = "{metadata_str}" + prefix[len(context) :] + "{content}"
    others = [k for k in metadata if k != CONTEXT_KEY]
    offsets = record["charOffsets"]
    parent = RelatedNodeInfo(node_id=record["parentId"])
    relations: dict[NodeRelationship, Any] = {
        NodeRelationship.SOURCE: RelatedNodeInfo(node_id=source_id) if source_id else parent,
        NodeRelationship.PARENT: parent,
    }
    for key, rel in (
        (record["prevId"], NodeRelationship.PREVIOUS),
        (record["nextId"], NodeRelationship.NEXT),
    ):
        if key and neighbours and key in neighbours:
            relations[rel] = RelatedNodeInfo(node_id=neighbours[key])
    return TextNode(
        id_=record["chunk_id"],
        text=record["originalText"],
        metadata=metadata,
        start_char_idx=offsets["charStart"],
        end_char_idx=offsets["charEnd"],
        relationships=relations,
        excluded_embed_metadata_keys=others,
        excluded_llm_metadata_keys=others,
        metadata_template="{value}",
        text_template=template,
    )


def _nodes(records: Sequence[Mapping[str, Any]], source_id: str = "") -> list[TextNode]:
    """A whole document's records as nodes, linked to each other."""
    neighbours = {r["id"]: r["chunk_id"] for r in records}
    return [to_node(r, neighbours, source_id) for r in records]


class ChunkyardReader:
    """The chunks of a chunk folder (``chunkyard ingest``'s ``--out``) as ``TextNode``s.

    Nodes, not ``Document``s: they are chunks already, ready for ``VectorStoreIndex(nodes)``
    (a ``Document`` would be split again).

    Args:
        out: the chunk folder.

    Example:
        >>> nodes = ChunkyardReader("chunks").load_nodes()   # doctest: +SKIP
    """

    def __init__(self, out: Path | str) -> None:
        self.out = Path(out)

    def lazy_load_nodes(self, sources: Iterable[str] | None = None) -> Iterator[TextNode]:
        """One node per chunk, document by document, in reading order.

        Args:
            sources: only these documents (corpus-relative paths); all when ``None``.
        """
        folder = open_chunks(self.out)
        for source in sources if sources is not None else folder.sources:
            yield from _nodes(list(folder.records(source)))

    def load_nodes(self, sources: Iterable[str] | None = None) -> list[TextNode]:
        """``lazy_load_nodes``, as a list."""
        return list(self.lazy_load_nodes(sources))


class ChunkyardNodeParser(NodeParser):
    """Parse Markdown ``Document``s into chunk nodes with chunkyard's rules (md-heading-v1), in memory.

    A document is chunked under the path in its metadata (``file_path`` relative to
    ``root``, else ``file_name``), else its ``id_`` + ``.md``: that path names the ids.
    Offsets are exact in the document's text (as chunkyard normalizes it: LF, no BOM).

    Attributes:
        policy: the chunking policy (default ``Policy()``).
        root: the folder document paths are taken relative to (``SimpleDirectoryReader``'s).
    """

    policy: Policy = Policy()
    root: str = ""

    @classmethod
    def class_name(cls) -> str:
        return "ChunkyardNodeParser"

    def _path(self, node: BaseNode) -> str:
        meta = node.metadata
        path = str(meta.get("file_path") or "")
        if path and self.root:
            try:
                return Path(path).resolve().relative_to(Path(self.root).resolve()).as_posix()
            except ValueError:
                pass
        name = str(meta.get("file_name") or "")
        return name or (Path(path).name if path else f"{node.node_id}.md")

    def _parse_nodes(
        self, nodes: Sequence[BaseNode], show_progress: bool = False, **kwargs: Any
    ) -> list[BaseNode]:
        out: list[BaseNode] = []
        for node in nodes:
            text = node.get_content()
            records = chunk_records(text, self._path(node), self.policy)
            for chunk in _nodes(records, node.node_id):
                if self.include_metadata:
                    chunk.metadata = {**node.metadata, **chunk.metadata}
                    chunk.excluded_embed_metadata_keys = [k for k in chunk.metadata if k != CONTEXT_KEY]
                    chunk.excluded_llm_metadata_keys = list(chunk.excluded_embed_metadata_keys)
                out.append(chunk)
        return out

    def _postprocess_parsed_nodes(
        self, nodes: list[BaseNode], parent_doc_map: dict[str, Document]
    ) -> list[BaseNode]:
        return nodes  # the offsets and links are exact already: no search by text


class _StoreTarget:
    """A LlamaIndex vector store (we embed) or a ``VectorStoreIndex`` (it embeds) for the sync."""

    def __init__(self, out: Path, target: Any, embed_model: BaseEmbedding | None) -> None:
        self.out = out
        self.target = target
        self.is_index = hasattr(target, "insert_nodes") and hasattr(target, "vector_store")
        model = embed_model or (getattr(target, "_embed_model", None) if self.is_index else None)
        if model is None:
            raise UsageError(
                f"sync_vector_store: {type(target).__name__} has no embedding model "
                "(hint: pass embed_model=..., or a VectorStoreIndex built with one)"
            )
        self.embed_model: BaseEmbedding = model

    def upsert(self, records: Sequence[Mapping[str, Any]], replacing: Sequence[str]) -> None:
        """Embed first (a failing model touches nothing), then replace the old nodes."""
        nodes = [to_node(r, self._neighbours(r)) for r in records]
        vectors = self.embed_model.get_text_embedding_batch([r["embedText"] for r in records])
        for node, vector in zip(nodes, vectors, strict=True):
            node.embedding = vector
        if replacing:
            self.delete(replacing)  # add() appends rather than replaces in many stores
        if self.is_index:  # it keeps its docstore in step; nodes with a vector are not embedded again
            self.target.insert_nodes(nodes)
        else:
            self.target.add(nodes)

    def delete(self, chunk_ids: Sequence[str]) -> None:
        """Remove the ids the store holds; ids it lacks are no error (a retry after a failure)."""
        if not self.is_index:
            self.target.delete_nodes(list(chunk_ids))
            return
        index = self.target  # VectorStoreIndex.delete_nodes raises on an id its docstore lacks
        index.vector_store.delete_nodes(list(chunk_ids))
        if not index.vector_store.stores_text or getattr(index, "_store_nodes_override", False):
            struct = index.index_struct
            for cid in chunk_ids:
                if cid in struct.nodes_dict:
                    struct.delete(cid)
                index.docstore.delete_document(cid, raise_error=False)
            index.storage_context.index_store.add_index_struct(struct)

    def _neighbours(self, record: Mapping[str, Any]) -> dict[str, str]:
        """``id`` → ``chunk_id`` of the chunk's neighbours, read from their files."""
        found: dict[str, str] = {}
        folder = record["metadata"]["sourceFile"].rpartition("/")[0]
        for key in (record["prevId"], record["nextId"]):
            if not key:
                continue
            name, _, n = key.rpartition("::ch")
            stem = name.removeprefix("doc:").rpartition("/")[2]
            file = f"{folder}/doc_{stem}__ch{n}.json" if folder else f"doc_{stem}__ch{n}.json"
            try:
                found[key] = str(orjson.loads((self.out / file).read_bytes())["chunk_id"])
            except (OSError, orjson.JSONDecodeError, KeyError, TypeError):
                continue
        return found


def sync_vector_store(
    out: Path | str,
    target: Any,
    cursor_path: Path | str,
    *,
    embed_model: BaseEmbedding | None = None,
    full: bool = False,
    batch_size: int = 512,
) -> StoreSyncReport:
    """Apply a chunk folder's change feed to a LlamaIndex vector store, from where it left off.

    Keyed by ``chunk_id``; a chunk is embedded only when its embedded text is new to the
    store. The cursor and what the store holds are kept in ``cursor_path`` (JSON),
    written atomically after the store calls succeeded: if one fails, the next call
    starts again from the same place. Position fields of a chunk whose text did not
    change stay as they were when it was embedded (see ``langchain.sync_vectorstore``).

    Args:
        out: the chunk folder (``ingest``'s ``--out``).
        target: a ``VectorStoreIndex`` (its docstore is kept in step too) or any vector
            store with ``add(nodes)`` / ``delete_nodes(node_ids)``.
        cursor_path: a JSON file of this store's own (created on the first call).
        embed_model: embeds ``embedText`` (default: a ``VectorStoreIndex``'s own model;
            required for a bare vector store).
        full: read the whole feed again and delete what the store holds that the chunk
            folder no longer has (automatic when the feed no longer reaches the cursor).
        batch_size: nodes per store call (a ``VectorStoreIndex`` serializes its whole
            index struct once per call: larger batches, fewer of those).

    Returns:
        The counts: added, replaced, unchanged, deleted, ``embedded``; and the cursor.
    """
    out = Path(out)
    return sync(out, _StoreTarget(out, target, embed_model), cursor_path, full=full, batch_size=batch_size)
