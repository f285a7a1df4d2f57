"""Hand chunkyard's chunks to other frameworks: LangChain, LlamaIndex (optional extras).

``langchain.py`` and ``llamaindex.py`` import their framework when imported, so nothing
here is imported by ``import pipeline`` or the CLI; ``records``, ``changes`` and
``sync`` are framework-free and shared by both.
"""
