"""``install_patches``: the one call that puts the parser patches into mistletoe (idempotent).

Called where a worker is prepared (``run.worker.prepare``) and where the parse stage
starts (``parse.parse``); importing this package changes nothing in mistletoe. The package
docstring (``pipeline/stages/mdpatch/__init__.py``) lists what is patched and why.
"""

from __future__ import annotations

import re
import threading
from typing import Any

from pipeline.stages.mdpatch.punctuation import import_mistletoe

import_mistletoe()  # before mistletoe's own import (the package's other modules come after it)

from mistletoe import block_token, block_tokenizer
from mistletoe.core_tokens import shift_whitespace

from pipeline.stages.mdpatch import fastpath
from pipeline.stages.mdpatch.blocks import read_definitions, read_fence, read_table
from pipeline.stages.mdpatch.containers import read_html, read_item, read_quote

#: Beyond this depth the parse stage keeps a container as one leaf instead of descending into
#: it; two levels further down mistletoe does not even parse (hostile nesting).
MAX_DEPTH = 48

_state = threading.local()
_lock = threading.Lock()
_installed: list[bool] = []


class HtmlBlock(block_token.HtmlBlock):
    """mistletoe's HTML block, asked first for every line: it now turns most away at once.

    Each of its seven start rules needs a ``<`` first (after the indent), so a line
    without one is no HTML block; the others get mistletoe's own checks.
    """

    @classmethod
    def start(cls, line: str) -> Any:
        if line.lstrip()[:1] != "<":
            return False
        return super().start(line)  # type: ignore[no-untyped-call]


def _depth_limited(iterable: Any, token_types: Any, start_line: int = 1) -> Any:
    """``tokenize_block`` that parses nothing below ``MAX_DEPTH + 2`` levels of containers."""
    depth = getattr(_state, "depth", 0)
    if depth > MAX_DEPTH + 2:
        return block_tokenizer.ParseBuffer()  # type: ignore[no-untyped-call]
    _state.depth = depth + 1
    try:
        return fastpath.tokenize_block(iterable, token_types, start_line)
    finally:
        _state.depth = depth


def install_patches() -> None:
    """Put the patches into mistletoe, once per process (later calls return at once)."""
    if _installed:
        return
    with _lock:
        if not _installed:
            _install()
            _installed.append(True)


def _install() -> None:
    block_tokenizer.tokenize_block = _depth_limited
    block_token.Footnote.read = classmethod(read_definitions)  # type: ignore[method-assign,assignment]
    reference = block_token.Footnote.match_reference.__func__  # type: ignore[attr-defined]
    block_token.Footnote.match_reference = classmethod(_blanks_by_commonmark(reference))  # type: ignore[method-assign,assignment]
    block_token.CodeFence.read = classmethod(read_fence)  # type: ignore[method-assign,assignment]
    block_token.Table.read = classmethod(read_table)  # type: ignore[method-assign,assignment]
    block_token.ListItem.read = classmethod(read_item)  # type: ignore[method-assign,assignment]
    block_token.HtmlBlock.read = classmethod(read_html)  # type: ignore[method-assign,assignment]
    block_token.Quote.read = classmethod(read_quote)  # type: ignore[method-assign,assignment]
    block_token.Paragraph.read = classmethod(fastpath.read_paragraph)  # type: ignore[method-assign,assignment]
    block_token.List.check_interrupts_paragraph = classmethod(_list_interrupts)  # type: ignore[method-assign,assignment]
    block_token.HtmlBlock.start = classmethod(_declaration(block_token.HtmlBlock.start.__func__))  # type: ignore[method-assign,assignment,attr-defined]
    for token in (block_token.HtmlBlock, block_token.Footnote):  # indented by spaces and tabs only
        token.start = classmethod(_indented_by_blanks(token.start.__func__))  # type: ignore[method-assign,assignment,attr-defined]
    # the same patterns, blanks and digits as CommonMark counts them (ASCII)
    block_token.Heading.pattern = re.compile(r" {0,3}(#{1,6})(?:\n|[ \t]+?(.*?)(\n|[ \t]+?#+[ \t]*?$))")
    block_token.ThematicBreak.pattern = re.compile(r" {0,3}(?:([-_*])[ \t]*?)(?:\1[ \t]*?){2,}$")
    block_token.List.pattern = re.compile(r" {0,3}(?:[0-9]{1,9}[.)]|[+\-*])(?:[ \t]*$|[ \t]+)")
    block_token.ListItem.pattern = re.compile(r"( {0,3})([0-9]{1,9}[.)]|[+\-*])($|[ \t]+)")
    block_token.ListItem.continuation_pattern = re.compile(r"([ \t]*)([^ \t\n].*\n|\n)")
    block_token.add_token(HtmlBlock)  # type: ignore[no-untyped-call] # HTML blocks are atomic (docs/spec.md, "Splitting")
    fastpath.NO_LETTER_START.add(HtmlBlock)  # it needs a ``<`` first, as mistletoe's


def _blanks_by_commonmark(match_reference: Any) -> Any:
    """``Footnote.match_reference`` where the blanks around a definition's destination are
    spaces and tabs (CommonMark 4.7), as markdown-it reads them: mistletoe's set also held a
    vertical tab and a form feed, so ``[a]:`` then a VT and ``/u`` was a definition."""

    def wrapped(cls: Any, string: str, offset: int) -> Any:
        found = match_reference(cls, string, offset)
        if found is None:
            return None
        label_end = cls.match_link_label(string, offset)[1]
        dest_start = shift_whitespace(string, label_end + 1)  # type: ignore[no-untyped-call]
        dest_end = cls.match_link_dest(string, dest_start)[1]
        for gap in (
            string[label_end + 1 : dest_start],
            string[dest_end : shift_whitespace(string, dest_end)],  # type: ignore[no-untyped-call]
        ):
            if gap.split("\n", 1)[0].strip(" \t"):
                return None
        return found

    return wrapped


def _list_interrupts(cls: Any, lines: Any) -> bool:
    """``List.check_interrupts_paragraph``: an item interrupts a paragraph when it is not empty
    and its number, if any, is 1; empty by CommonMark's blanks (spaces and tabs), where mistletoe's
    ``str.strip()`` also took ``1. `` then an NBSP or U+2028 for an empty item."""
    marker = block_token.ListItem.parse_marker(lines.peek())  # type: ignore[no-untyped-call]
    if marker is None or not marker[3].strip(" \t\n"):
        return False
    leader = marker[2]
    return not leader[0].isdigit() or leader in ("1.", "1)")


def _declaration(start: Any) -> Any:
    """``HtmlBlock.start`` with CommonMark 0.31's kind 4: ``<!`` then an ASCII letter, of either
    case (markdown-it agrees: ``<!doctype html>``); mistletoe asks for an uppercase letter,
    Unicode's included (``<!É`` is text)."""

    def wrapped(cls: Any, line: str) -> Any:
        kind = start(cls, line)
        stripped = line.lstrip()
        if stripped[:2] != "<!" or stripped[:4] == "<!--" or kind not in (False, None, 4):
            return kind
        letter = stripped[2:3]
        if not (letter.isascii() and letter.isalpha()):
            return False if kind == 4 else kind
        if len(line) - len(stripped) >= 4:
            return kind
        cls._end_cond = ">"
        return 4

    return wrapped


def _indented_by_blanks(start: Any) -> Any:
    """A ``start`` that sees a block only after spaces and tabs: mistletoe's ``lstrip()`` also
    skips a form feed or an NBSP, where CommonMark sees text (an HTML block, a definition)."""

    def wrapped(cls: Any, line: str) -> Any:
        lead = line[: len(line) - len(line.lstrip())]
        return False if lead.strip(" \t") else start(cls, line)

    return wrapped
