"""The change feed as a reader sees it: re-exported from ``pipeline.run.changes``.

The reader lives in the ``run`` layer so that the index (a layer below the adapters) can
follow the feed through the same code; this module keeps the adapters' import path.
"""

from __future__ import annotations

from pipeline.run.changes import Change, ChangeKind, Cursor, CursorLostError, feed_path, read_changes

__all__ = ["Change", "ChangeKind", "Cursor", "CursorLostError", "feed_path", "read_changes"]
