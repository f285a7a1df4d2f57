"""Retrieval evaluation: gold sets, metrics, the metrics pack, exports.

The contract: docs/spec.md, "Index, search and evaluation".


- ``gold``: load a gold file and resolve each answer to ``[start, end)`` in its source.
- ``metrics``: the hit rule and recall@k, MRR@10, nDCG@10, recall in a token budget, citations.
- ``pack``: 004's metrics pack (``schemas/metrics.schema.json``).
- ``export``: BEIR folders, TREC run and qrels files.
- ``chunks``: chunk lists (chunkyard's chunk files or any chunker's) for retrievers to index.

Nothing here imports an embedder or a vector store: a retriever hands in ranked items.
"""
