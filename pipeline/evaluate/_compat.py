"""The two pipeline functions evaluation reuses, found in either source layout.

The canonical text (strict UTF-8, BOM dropped, CRLF/CR → LF: SPEC §1) and ``rev`` (001's
revision lock) must be computed exactly as the chunker computes them, so they are imported,
never re-implemented. The stages moved from ``pipeline/*.py`` to ``pipeline/stages/`` (issue 13).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, cast


def _find(name: str, attr: str) -> object:
    for mod in (f"pipeline.stages.{name}", f"pipeline.{name}"):
        try:
            return getattr(importlib.import_module(mod), attr)
        except ModuleNotFoundError:
            continue
    raise ImportError(f"pipeline.stages.{name}.{attr} not found in either layout")  # pragma: no cover


decode = cast(Callable[[bytes, str], str], _find("normalize", "decode"))
text_rev = cast(Callable[[str], str], _find("mint", "text_rev"))


def token_counter(name: str = "cl100k_base") -> Callable[[str], int]:
    """An exact token counter (the chunker's own), built on first use."""
    counter_cls = cast(Callable[[str], Any], _find("tokens", "Counter"))
    return cast(Callable[[str], int], counter_cls(name).count)
