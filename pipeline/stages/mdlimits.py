"""Bounds and fixes for mistletoe's block parser on hostile input (used by the parse stage).

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

And fixes where mistletoe parts from CommonMark / GFM, found by fuzzing against
markdown-it (``tests/fuzz_regressions/``):

- it closes a code fence at any line that starts with the fence and has no space in
  it, so ```` ```python ```` or ```` ```~ ```` ended a block; CommonMark (4.5) closes it
  only with a run of the same character, at least as long, then nothing but blanks;
- it takes ``a|b`` over ``---`` for a table; GFM wants as many header cells as
  delimiter cells, else no table (there, a setext heading);
- it ends a table at the first line without a ``|``; GFM ends it only at a blank
  line or the start of another block (a quote, fence, thematic break, list, ATX
  heading or HTML block), so ``Title`` then ``===`` right under a table are two rows;
- it lets a list item or a quote go on with any line that starts no other block
  ("lazy continuation"); CommonMark allows that only while a *paragraph* is open in
  it, so after a fence, a heading or an empty item the line ends the container (and
  ``alpha`` / ``===`` after it is a heading). ``mdlazy.Blocks`` follows the container's
  nested quotes and list items as CommonMark does, and says whether a paragraph is open.
  And a line without ``>`` that starts a list ends a quote whatever the list's number
  (``0.``) or content: the rule that only ``1.`` or a non-empty item may interrupt a
  paragraph holds inside the paragraph's own container only (commonmark.js, markdown-it).
  Nor does a lazy line end the container as a table header when the delimiter row under
  it does not go on with the container (``_interrupts``: GFM reads no table there);
- it ends an HTML block opened by ``<script>``, ``<pre>``, ``<style>`` or ``<textarea>``
  only at its own closing tag; CommonMark (4.6, kind 1) ends it at a line with any of
  the four, so a ``<script>`` block closed by ``</pre>`` swallowed the rest;
- its patterns use Python's Unicode ``\\s`` and ``\\d`` where CommonMark means ASCII:
  ``#``+NBSP opened a heading, ``١. x`` and ``. x`` opened ordered lists, and a line
  indented by spaces then a Unicode blank (U+2028) did not continue a list item; and
  an HTML block or a link definition opened, or a quote went on, after a form feed or an NBSP.
  (A line of nothing but Unicode blanks, blank to mistletoe and text to CommonMark, is
  shown to mistletoe with a stand-in: see ``parse._visible_blanks``.)

The table rules follow markdown-it-py's ``rules_block/table.py`` (the reference the
contract checker uses), down to its cap on cells filled in for short rows.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

from pipeline.stages.punctuation import import_mistletoe

import_mistletoe()  # before mistletoe's own import: see punctuation.py

from mistletoe import block_token, block_tokenizer
from mistletoe.core_tokens import shift_whitespace

from pipeline.stages.mdblocks import LIST_MARKER, read_definitions, read_fence, read_table
from pipeline.stages.mdlazy import KIND_1_ENDS, Blocks, lazy_text

_state = threading.local()
_installed: dict[str, Any] = {}


def install(max_depth: int) -> None:
    """Patch mistletoe (idempotent): nesting deeper than ``max_depth`` is not parsed."""
    _installed["max_depth"] = max_depth
    if _installed.get("patched"):
        return
    _installed["patched"] = True

    def tokenize_block(iterable: Any, token_types: Any, start_line: int = 1) -> Any:
        depth = getattr(_state, "depth", 0)
        if depth > _installed["max_depth"]:
            return block_tokenizer.ParseBuffer()  # type: ignore[no-untyped-call]
        _state.depth = depth + 1
        try:
            return _tokenize_block(iterable, token_types, start_line)
        finally:
            _state.depth = depth

    block_tokenizer.tokenize_block = tokenize_block
    block_token.Footnote.read = classmethod(read_definitions)  # type: ignore[method-assign,assignment]
    reference = block_token.Footnote.match_reference.__func__  # type: ignore[attr-defined]
    block_token.Footnote.match_reference = classmethod(_blanks_by_commonmark(reference))  # type: ignore[method-assign,assignment]
    block_token.CodeFence.read = classmethod(read_fence)  # type: ignore[method-assign,assignment]
    block_token.Table.read = classmethod(read_table)  # type: ignore[method-assign,assignment]
    block_token.ListItem.read = classmethod(_read_item)  # type: ignore[method-assign,assignment]
    block_token.HtmlBlock.read = classmethod(_read_html)  # type: ignore[method-assign,assignment]
    block_token.Quote.read = classmethod(_read_quote)  # type: ignore[method-assign,assignment]
    block_token.Paragraph.read = classmethod(_read_paragraph)  # type: ignore[method-assign,assignment]
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


def _read_html(cls: Any, lines: Any) -> Any:
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


def _read_item(cls: Any, lines: Any, prev_marker: Any = None) -> Any:
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


def _read_quote(cls: Any, lines: Any) -> Any:
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


_BREAKERS: dict[tuple[Any, ...], list[Any]] = {}
#: Block tokens whose ``start`` never accepts a line that begins with a letter and holds no
#: ``|`` (they need blanks, a mark, ``<``, ``[`` or a pipe first); the parse stage adds its own.
NO_LETTER_START: set[Any] = {
    block_token.HtmlBlock,
    block_token.BlockCode,
    block_token.Heading,
    block_token.Quote,
    block_token.CodeFence,
    block_token.ThematicBreak,
    block_token.List,
    block_token.Table,
    block_token.Footnote,
}
_PLAIN_FIRST: dict[tuple[Any, ...], bool] = {}


def _tokenize_block(iterable: Any, token_types: Any, start_line: int = 1) -> Any:
    """mistletoe's ``tokenize_block``, with a fast path (speed only, same tokens).

    A line that starts with a letter and holds no ``|`` opens a paragraph whenever all
    the other token types are in ``NO_LETTER_START``, and an empty line opens nothing:
    no ``start`` check is needed for either.
    """
    key = tuple(token_types)
    paragraph = block_token.Paragraph
    plain_first = _PLAIN_FIRST.get(key)
    if plain_first is None:
        plain_first = _PLAIN_FIRST[key] = paragraph in key and all(
            t is paragraph or t in NO_LETTER_START for t in key
        )
    lines = block_tokenizer.FileWrapper(iterable, start_line=start_line)  # type: ignore[no-untyped-call]
    parse_buffer = block_tokenizer.ParseBuffer()  # type: ignore[no-untyped-call]
    src = lines.lines  # ``peek`` and ``next`` by index: the wrapper's list and position
    while (at := lines._index + 1) < len(src):
        line = src[at]
        if plain_first and line == "\n":  # an empty line starts nothing either
            lines._index = at
            parse_buffer.loose = True
        elif plain_first and line[:1].isalpha() and "|" not in line:
            result = paragraph.read(lines)  # type: ignore[no-untyped-call]
            parse_buffer.append((paragraph, result, start_line + at))
        else:
            for token_type in token_types:
                if token_type.start(line):
                    line_number = start_line + lines._index + 1
                    result = token_type.read(lines)
                    if result is not None:
                        parse_buffer.append((token_type, result, line_number))
                        break
            else:  # unmatched newlines
                lines._index = at
                parse_buffer.loose = True
    return parse_buffer


def _read_paragraph(cls: Any, lines: Any) -> Any:
    """mistletoe's ``Paragraph.read``, with a fast path for plain lines (speed only).

    A line whose first non-blank character is a letter, with no ``|`` in it, starts
    nothing that may interrupt a paragraph: every such rule (ATX heading, fence, quote,
    list, HTML block, table, thematic break, setext underline) needs a mark there, or a
    pipe. Those lines, most of a paragraph, skip the seven checks.
    """
    line_buffer = [next(lines)]
    key = tuple(block_token._token_types)
    breaking_tokens = _BREAKERS.get(key)
    if breaking_tokens is None:
        breaking_tokens = _BREAKERS[key] = [
            t for t in key if hasattr(t, "check_interrupts_paragraph") and t is not block_token.ThematicBreak
        ]
    src = lines.lines  # the file wrapper's own list: a run of plain lines is taken by index
    while True:
        first = at = lines._index + 1
        while at < len(src) and "|" not in (line := src[at]) and line.lstrip()[:1].isalpha():
            at += 1
        if at > first:
            line_buffer += src[first:at]
            lines._index = at - 1
        next_line = lines.peek()
        if next_line is None or next_line.strip() == "":
            break
        if any(token_type.check_interrupts_paragraph(lines) for token_type in breaking_tokens):
            break
        if cls.parse_setext and cls.is_setext_heading(next_line):
            line_buffer.append(next(lines))
            return block_token.SetextHeading(line_buffer)  # type: ignore[no-untyped-call]
        if block_token.ThematicBreak.check_interrupts_paragraph(lines):  # type: ignore[no-untyped-call]
            break
        line_buffer.append(next(lines))
    return line_buffer
