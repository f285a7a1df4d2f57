"""Bounds on mistletoe's block parser for hostile input (used by the parse stage).

Two of mistletoe's block-level paths are worse than linear, and a corpus can
hold the input that hits them:

- **Nesting.** Every container level (a ``>`` quote, a list item) re-reads all
  the lines below it and then parses them again one level down: a "staircase" of
  quotes costs lines x depth, a 10 000-level one runs into Python's recursion
  limit after minutes, and a staircase of indented lists copies the text once
  per level (gigabytes). The parse stage never descends past ``parse.MAX_DEPTH``
  anyway, so below ``max_depth`` levels we stop parsing: the container keeps
  its lines (its extent is decided by its parent) and has no children, so it
  becomes one leaf block. Deep documents are chunked, in time linear in their
  size, instead of failing.
- **Link reference definitions.** ``Footnote.read`` joins a whole run of
  definitions into one string and slices it from the current offset, several
  times per definition: quadratic in the run (80 000 definitions take 11 s). The
  replacement below hands each definition a window of at least ``WINDOW``
  characters of whole lines; a definition that does not match in its window is
  decided on everything left, so a run ends exactly where mistletoe ends it.
  The one difference: a title that runs over more than ``WINDOW`` characters of
  lines is cut short there (the definition keeps its destination, the rest is a
  paragraph), as in a renderer with a length limit.
"""

from __future__ import annotations

import threading
from typing import Any

from mistletoe import block_token, block_tokenizer
from mistletoe import token as md_token

#: Characters of look-ahead a link reference definition gets (see the module docstring).
WINDOW = 8192

_state = threading.local()
_installed: dict[str, Any] = {}


def install(max_depth: int) -> None:
    """Patch mistletoe (idempotent): nesting deeper than ``max_depth`` is not parsed."""
    _installed["max_depth"] = max_depth
    if "tokenize_block" in _installed:
        return
    original = block_tokenizer.tokenize_block
    _installed["tokenize_block"] = original

    def tokenize_block(iterable: Any, token_types: Any, start_line: int = 1) -> Any:
        depth = getattr(_state, "depth", 0)
        if depth > _installed["max_depth"]:
            return block_tokenizer.ParseBuffer()  # type: ignore[no-untyped-call]
        _state.depth = depth + 1
        try:
            return original(iterable, token_types, start_line)  # type: ignore[no-untyped-call]
        finally:
            _state.depth = depth

    block_tokenizer.tokenize_block = tokenize_block
    block_token.Footnote.read = classmethod(_read_definitions)  # type: ignore[method-assign,assignment]


def _read_definitions(cls: Any, lines: Any) -> Any:
    """``Footnote.read`` in linear time: same result, a bounded window per definition."""
    buffer: list[str] = []
    nxt = lines.peek()
    while nxt is not None and nxt.strip() != "":
        buffer.append(next(lines))
        nxt = lines.peek()
    matches: list[Any] = []
    total = len(buffer)
    first = 0  # first line not yet consumed
    text, upto, offset = "", 0, 0  # the window: buffer[first_of_window:upto] joined
    while True:
        if len(text) - offset < WINDOW and upto < total:
            upto, size = first, 0
            while upto < total and size < 2 * WINDOW:
                size += len(buffer[upto])
                upto += 1
            text, offset = "".join(buffer[first:upto]), 0
        if offset >= len(text) - 1:  # mistletoe's own loop condition
            break
        info = cls.match_reference(text, offset)
        if info is None and upto < total:  # perhaps the window was short: decide on all that is left
            text, upto, offset = "".join(buffer[first:]), total, 0
            info = cls.match_reference(text, offset)
        if info is None:
            lines._index -= text.count("\n", offset)  # give back what did not match
            break
        end, match = info
        matches.append(match)
        first += text.count("\n", offset, end)
        offset = end
    cls.append_footnotes(matches, md_token._root_node)
    return matches or None
