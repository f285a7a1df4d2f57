"""``chunkyard serve`` and ``open_index``: the index held open for apps and agents (issue 32).

``handle`` (``open_index``) needs only the extra ``index``; ``app``, ``routes``,
``mcp_tools`` and ``metrics`` need the extra ``serve`` (FastAPI, uvicorn, mcp,
prometheus-client) and are imported only by ``chunkyard serve``. ``writer`` runs in the
child process of ``serve --watch``.
"""
