"""Container readers for mistletoe (list items, quotes) and its HTML block, as CommonMark reads them.

mistletoe lets a list item or a quote go on with any line that starts no other block; these
``read`` methods let a lazy line go on only while a paragraph may be open (``lazy.Blocks``),
and end a kind 1 HTML block at any of its four end tags. Installed by ``install_patches``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mistletoe import block_token, block_tokenizer

from pipeline.stages.mdpatch.blocks import LIST_MARKER
from pipeline.stages.mdpatch.lazy import KIND_1_ENDS, Blocks, lazy_text


def read_html(cls: Any, lines: Any) -> Any:
    """``HtmlBlock.read``: a kind 1 block (``<script>``, ``<pre>``…) ends at any of the four end tags."""
    end = cls._end_cond
    ends = KIND_1_ENDS if end in KIND_1_ENDS else (end,) if end is not None else None
    line_buffer = []
    for line in lines:
        line_buffer.append(line)
        if ends is not None:
            folded = line.casefold()
            if any(tag in folded for tag in ends):
                break
        elif line.strip() == "":
            line_buffer.pop()
            lines.backstep()
            break
    return line_buffer


def read_item(cls: Any, lines: Any, prev_marker: Any = None) -> Any:
    """mistletoe 1.x's ``ListItem.read``; a lazy line only goes on while a paragraph may be open."""
    next_marker = None
    line_buffer: list[str] = []
    lazy = Blocks()
    line = next(lines)
    start_line = lines.line_number()
    next_line = lines.peek()
    indentation, prepend, leader, content = prev_marker if prev_marker else cls.parse_marker(line)
    if not content.strip(" \t\n"):  # CommonMark's blank: an NBSP is text
        prepend = indentation + len(leader) + 1
        blanks = 1
        while next_line is not None and next_line.strip() == "":
            blanks += 1
            next(lines)
            next_line = lines.peek()
        if blanks > 1:
            parse_buffer = block_tokenizer.ParseBuffer()  # type: ignore[no-untyped-call]
            parse_buffer.loose = True
            next_marker = cls.parse_marker(next_line) if next_line is not None else None
            return (parse_buffer, indentation, prepend, leader, start_line), next_marker
    else:
        line_buffer.append(content)
        lazy.feed(content)
    breaking_tokens = [
        t
        for t in block_token._token_types
        if hasattr(t, "check_interrupts_paragraph") and t is not block_token.List
    ]
    newline_count = 0
    while True:
        if next_line is None:
            if newline_count:
                lines.backstep()
                del line_buffer[-newline_count:]
            break
        continuation = cls.parse_continuation(next_line, prepend)
        if not continuation:
            if _interrupts(
                breaking_tokens, lines, lazy, lambda row: bool(cls.parse_continuation(row, prepend))
            ):
                if newline_count:
                    lines.backstep()
                    del line_buffer[-newline_count:]
                break
            marker_info = cls.parse_marker(next_line)
            if marker_info is not None:
                next_marker = marker_info
                break
            if newline_count:
                lines.backstep()
                del line_buffer[-newline_count:]
                break
            if not lazy.goes_on(next_line):  # CommonMark: only a paragraph goes on lazily
                break
            line_buffer.append(lazy_text(next_line))
            lazy.lazy_line(next_line)
            next(lines)
            next_line = lines.peek()
            newline_count = 0
            continue
        line_buffer.append(continuation)
        lazy.feed(continuation)
        newline_count = newline_count + 1 if continuation == "\n" else 0
        next(lines)
        next_line = lines.peek()
    parse_buffer = block_tokenizer.tokenize_block(
        line_buffer, block_token._token_types, start_line=start_line
    )  # type: ignore[no-untyped-call]
    return (parse_buffer, indentation, prepend, leader, start_line), next_marker


def read_quote(cls: Any, lines: Any) -> Any:
    """mistletoe 1.x's ``Quote.read``; a lazy line only goes on while a paragraph may be open."""
    line = cls.convert_leading_tabs(next(lines).lstrip()).split(">", 1)[1]
    if len(line) > 0 and line[0] == " ":
        line = line[1:]
    line_buffer = [line]
    lazy = Blocks()
    lazy.feed(line)
    start_line = lines.line_number()
    next_line = lines.peek()
    breaking_tokens = [
        t
        for t in block_token._token_types
        if hasattr(t, "check_interrupts_paragraph") and t is not block_token.Quote
    ]
    while (
        next_line is not None
        and next_line.strip() != ""
        and not _interrupts(breaking_tokens, lines, lazy, _quoted)
    ):
        if _quoted(next_line):
            stripped = cls.convert_leading_tabs(next_line.lstrip(" \t"))
            prepend = 2 if stripped[1:2] == " " else 1
            stripped = stripped[prepend:]
            line_buffer.append(stripped)
            lazy.feed(stripped)
        elif not lazy.goes_on(next_line) or LIST_MARKER.match(next_line):
            break  # a list may start here, whatever its number or content: the quote's line failed
        else:
            line_buffer.append(lazy_text(next_line))
            lazy.lazy_line(next_line)
        next(lines)
        next_line = lines.peek()
    # mistletoe turns setext headings off here, lest a lazy ``===`` underline the paragraph;
    # ``lazy_text`` keeps lazy lines from being underlines, so ``> a`` / ``> ===`` is a heading
    return block_tokenizer.tokenize_block(line_buffer, block_token._token_types, start_line=start_line)  # type: ignore[no-untyped-call]


def _quoted(row: str) -> bool:
    """A line that goes on with a quote by its mark: spaces and tabs, then ``>``.

    mistletoe's own ``read`` skipped any blanks (``lstrip()``), so an NBSP line of a lazy
    paragraph went on as a quote line (CommonMark and markdown-it: NBSP is text). Four spaces
    or more before the ``>`` still go on, as in mistletoe and markdown-it (the contract
    checker's parser); CommonMark (cmark-gfm, commonmark.js) reads no quote mark there
    (``>   > ```\n>     > a``: an empty fence, then indented code), a known disagreement
    left on the checker's side.
    """
    return row.lstrip(" \t")[:1] == ">"


def _interrupts(breaking_tokens: list[Any], lines: Any, lazy: Blocks, goes_on: Callable[[str], bool]) -> bool:
    """Whether the next line, which may end the container, starts a block that interrupts it.

    A table is no such block when its header row would be a lazy line of the container's
    paragraph and its delimiter row does not go on with the container either: GFM
    (cmark-gfm) opens a table only on a delimiter row whose open block is a paragraph, and
    that delimiter row ends the container (CommonMark 5.1: only paragraph text is lazy),
    so the header stays paragraph text (markdown-it agrees: its delimiter row must be
    indented into the container). ``1. a`` / ``\\|`` / ``---``: a list, then a thematic break.
    """
    for token_type in breaking_tokens:
        if not token_type.check_interrupts_paragraph(lines):
            continue
        if token_type is block_token.Table:
            src, at = lines.lines, lines._index + 1  # the header row; the delimiter row after it
            if goes_on(src[at]):  # the header row goes on with the container: a table there is inside it
                continue
            if (
                not goes_on(src[at])
                and at + 1 < len(src)
                and not goes_on(src[at + 1])
                and lazy.goes_on(src[at])
            ):
                continue
        return True
    return False
