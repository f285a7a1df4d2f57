"""Leaf-block readers for mistletoe, as CommonMark / GFM read them (installed by ``install_patches``).

- Tables follow markdown-it-py's ``rules_block/table.py`` (the reference the contract checker
  uses): as many header cells as delimiter cells, the table ends only at a blank line or the
  start of another block, and its cap on cells filled in for short rows.
- A code fence closes only with a run of the same character, at least as long, then nothing
  but blanks (CommonMark 4.5).
- Link reference definitions are read in windows of ``WINDOW`` characters, not by re-slicing
  the whole run per definition (quadratic in mistletoe); see the package docstring.
"""

from __future__ import annotations

import re
from typing import Any

from mistletoe import block_token
from mistletoe import token as md_token

#: Characters of look-ahead a link reference definition gets (see the module docstring).
WINDOW = 8192
#: A closing code fence: up to 3 spaces, a run of ` or ~, blanks (CommonMark 4.5).
FENCE_CLOSER = re.compile(r" {0,3}(`{3,}|~{3,})[ \t]*\n?")
_PIPE = re.compile(r"(?<!\\)\|")  # a cell separator: a pipe not escaped by a backslash
_ALIGN = re.compile(r":?-+:?")
LIST_MARKER = re.compile(r" {0,3}(?:[0-9]{1,9}[.)]|[-+*])(?:[ \t]|\n|$)")
#: What markdown-it trims from a table line: ASCII and Unicode blanks (``common/utils.py``).
_TRIM = (
    "\t\n\x0b\x0c\r \xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"
)
#: What mistletoe sees for a blank other than space or tab, on a line of nothing but blanks
#: (``parse._visible_blanks``; CommonMark takes such a line for text): Unicode noncharacters,
#: never text of a document. ``STAND_IN_TRIMMED`` stands for one markdown-it trims from a
#: table line (that line still ends a table), ``STAND_IN`` for any other.
STAND_IN, STAND_IN_TRIMMED = "\ufdd0", "\ufdd1"
_MAX_AUTOCOMPLETED_CELLS = 0x10000  # markdown-it's cap on cells filled in for short rows


def indent(line: str) -> int:
    return len(line.expandtabs(4)) - len(line.expandtabs(4).lstrip(" "))


def cells(row: str) -> int:
    """Cells in a table row as GFM counts them: outer pipes dropped, ``\\|`` kept in a cell."""
    cells = _PIPE.split(row.strip(_TRIM))
    if cells and cells[0] == "":
        cells.pop(0)
    if cells and cells[-1] == "":
        cells.pop()
    return len(cells)


def delimiter_cells(row: str) -> int | None:
    """Cells of a delimiter row (``| :-- | --: |``), or None if the line is not one."""
    line = row.rstrip("\n").lstrip(" \t")
    if len(line) < 2 or indent(row) >= 4:
        return None
    first, second = line[0], line[1]
    if first not in "|-:" or second not in "|-: \t" or (first == "-" and second in " \t"):
        return None
    if line.strip("|-: \t"):
        return None
    columns = line.split("|")
    count = 0
    for i, column in enumerate(columns):
        cell = column.strip(_TRIM)
        if not cell:
            if 0 < i < len(columns) - 1:
                return None
            continue
        if not _ALIGN.fullmatch(cell):
            return None
        count += 1
    return count


def ends_table(line: str) -> bool:
    """A line that starts a block a table gives way to (markdown-it: blockquote's terminators)."""
    if not line.strip(_TRIM + STAND_IN_TRIMMED) or indent(line) >= 4:
        return True
    if LIST_MARKER.match(line):
        return True
    for token in block_token._token_types:
        name = token.__name__
        if name in ("Quote", "CodeFence", "ThematicBreak", "Heading") and token.start(line):
            return True
        if name == "HtmlBlock" and token.start(line) not in (False, None, 7):  # type 7 does not interrupt
            return True
    return False


def read_table(cls: Any, lines: Any, check_only: bool = False) -> Any:
    """``Table.read`` with GFM's rules for where a table starts and where it ends."""
    anchor = lines.get_pos()
    header = next(lines)
    start_line = lines.line_number()
    delimiter = next(lines, None)
    count = delimiter_cells(delimiter) if delimiter is not None else None
    if count is None or indent(header) >= 4 or "|" not in header or cells(header) != count:
        lines.set_pos(anchor)
        return None
    if check_only:
        lines.set_pos(anchor)
        return True
    line_buffer = [header, delimiter]
    filled = 0
    while (row := lines.peek()) is not None and not ends_table(row):
        filled += count - cells(row)
        if filled > _MAX_AUTOCOMPLETED_CELLS:
            break
        line_buffer.append(next(lines))
    return line_buffer, start_line


def read_fence(cls: Any, lines: Any) -> Any:
    """``CodeFence.read`` that closes the fence only where CommonMark does."""
    next(lines)
    info = cls._open_info
    indentation, leader = info[0], info[1]
    mark = leader[0]
    line_buffer: list[str] = []
    # the lines by index (the file wrapper's own list) rather than one ``next`` each;
    # ``_index`` ends where the loop over the wrapper would leave it: on the closer, or last
    src = lines.lines
    at = lines._index
    for at in range(lines._index + 1, len(src)):  # ``at`` outlives the loop on purpose
        line = src[at]
        stripped = line.lstrip(" ")
        if stripped[:1] == mark:  # a closer starts with the fence's mark (after 0-3 spaces)
            closer = FENCE_CLOSER.fullmatch(line)
            if closer and closer[1][0] == mark and len(closer[1]) >= len(leader):
                break
        diff = len(line) - len(stripped)
        if diff > indentation:
            stripped = " " * (diff - indentation) + stripped
        line_buffer.append(stripped)
    lines._index = at
    return line_buffer, info


def read_definitions(cls: Any, lines: Any) -> Any:
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


def stand_in(blank: str) -> str:
    """The stand-in mistletoe sees for ``blank`` (see ``STAND_IN``)."""
    return STAND_IN_TRIMMED if blank in _TRIM else STAND_IN
