"""mistletoe's block tokenizer and paragraph reader, with fast paths for plain lines (speed only).

Same tokens as mistletoe's own: a line that starts with a letter and holds no ``|`` starts
nothing but a paragraph (or goes on with one), so most lines skip every ``start`` check.
Installed by ``install_patches``.
"""

from __future__ import annotations

from typing import Any

from mistletoe import block_token, block_tokenizer

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


def tokenize_block(iterable: Any, token_types: Any, start_line: int = 1) -> Any:
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


def read_paragraph(cls: Any, lines: Any) -> Any:
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
