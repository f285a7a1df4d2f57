"""Whether a container's paragraph is still open, by CommonMark's container stack (for lazy lines).

CommonMark (5.1, 5.2) lets a quote or a list item go on with a line that lacks its marks
("lazy continuation") only while the innermost open block is a paragraph. mistletoe takes
any line that starts no other block; ``containers`` asks ``Blocks.paragraph`` instead.

``Blocks`` reads the lines a container holds (its own marks already removed) as
commonmark.js's ``incorporateLine`` reads a document: first the open containers nested in
it (quotes, list items) are matched, then new ones and leaf blocks are opened, then the
line is a lazy paragraph line, or goes to the innermost container. It keeps only what the
question needs: the stack of open containers (a quote, or a list item and the column its
content starts at) and the open leaf (a paragraph, a fence, an HTML block, indented code,
a GFM table as markdown-it reads them), and while a paragraph's lines may be link definitions,
those lines: markdown-it reads definitions as blocks of their own (a destination or title on
the next line, lazy or not, included), which no lazy line goes on with; CommonMark takes them
out of the paragraph only when it closes (``test_link_definitions_take_their_lines_as_markdown_it_reads_them``). A quote goes on at a ``>`` after any indentation, as
``containers._quoted`` has mistletoe read it (markdown-it does too). Tabs count as 4 columns from the container's
content, which is not CommonMark's tab stop inside a container
(``test_a_tab_after_a_container_mark``).

An earlier tracker followed only the last list item it saw: after a staircase of quotes
and list items nested in and out of each other it lost the nesting, and a lazy
``x`` / ``===`` there became a heading (``test_a_lazy_underline_after_a_deep_quote_and_list_staircase``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from mistletoe import block_token

from pipeline.stages.mdpatch.blocks import (
    FENCE_CLOSER,
    STAND_IN,
    cells,
    delimiter_cells,
    ends_table,
    indent,
)

_FENCE_OPENER = re.compile(r"(`{3,})(?!.*`)|(~{3,})")
_ATX = re.compile(r"#{1,6}(?:[ \t]|$)")
_THEMATIC = re.compile(r"(?:(?:\*[ \t]*){3,}|(?:-[ \t]*){3,}|(?:_[ \t]*){3,})$")
_SETEXT = re.compile(r"(?:=+|-+)[ \t]*$")
_LIST_MARK = re.compile(r"(?:([-+*])|([0-9]{1,9})[.)])(?=[ \t]|$)")


#: A paragraph this many lines long is taken for no definitions (a label holds 999 characters).
_RUN_LINES = 64


def _definition_ends(text: str) -> Iterator[int]:
    """Where each of the link definitions ``text`` begins with ends, one after another:
    mistletoe's own reader (``Footnote.match_reference``, as ``install`` patches it), which
    reads these lines again when the container is parsed."""
    pos = 0
    while pos < len(text) and (found := block_token.Footnote.match_reference(text, pos)):  # type: ignore[no-untyped-call]
        pos = found[0]
        yield pos


def _definitions(lines: list[str]) -> int:
    """How many of ``lines`` (a paragraph's, from its first) link definitions take."""
    text = "\n".join(lines) + "\n"
    return text.count("\n", 0, max(_definition_ends(text), default=0))


def _goes_into(lines: list[str], lazy: str) -> bool:
    """Whether the link definition on the last of ``lines`` (each a definition's, from the
    first) goes on into ``lazy``: its destination or title (``[a]:`` / ``/u``), not a
    definition of its own (``[a]: /u`` / ``[b]: /v``), which to markdown-it ends the container."""
    text = "\n".join([*lines, lazy]) + "\n"
    boundary = len(text) - len(lazy) - 1  # where ``lazy`` begins
    start = 0
    for end in _definition_ends(text):
        if end > boundary:
            return start < boundary  # it began before ``lazy`` and ends in it
        start = end
    return False


#: What ends an HTML block of kind 1 (CommonMark 4.6): any of the four end tags.
KIND_1_ENDS = ("</script>", "</pre>", "</style>", "</textarea>")

_UNDERLINE = re.compile(r" {0,3}(?:=+|-+)[ \t]*\n?$")

#: Open leaf blocks (``None``: none open, or one that ended on its own line).
_PARAGRAPH, _INDENTED, _TABLE = "paragraph", "indented", "table"


class _Item:
    """An open list item: the column its content starts at, and whether it holds anything."""

    __slots__ = ("filled", "width")

    def __init__(self, width: int, filled: bool) -> None:
        self.width = width
        self.filled = filled


def _nonspace(line: str, pos: int) -> int:
    while pos < len(line) and line[pos] == " ":
        pos += 1
    return pos


def _html_start(rest: str) -> tuple[int, tuple[str, ...] | None] | None:
    """The kind (1-7) of the HTML block ``rest`` opens, and the strings that end it (kinds 1-5)."""
    html = block_token.HtmlBlock
    saved = html._end_cond  # mistletoe's start() sets it
    try:
        kind = html.start(rest)  # type: ignore[no-untyped-call]
        end = html._end_cond
    finally:
        html._end_cond = saved
    if not kind:
        return None
    if kind == 1:
        return 1, KIND_1_ENDS
    return int(kind), ((end,) if kind <= 5 and end else None)


class Blocks:
    """The open containers and leaf of one container's content, line by line (see the module)."""

    __slots__ = ("_todo", "fence", "html_end", "last", "leaf", "run", "stack")

    def __init__(self) -> None:
        #: lines fed and not read yet, and whether each was lazy: they are read only when ``goes_on``
        #: is asked, which a container does only at a line that may be lazy. A staircase of
        #: nested lists asks no container, and each level would read every line below it.
        self._todo: list[tuple[str, bool]] = []  #: (line, lazy)
        self.stack: list[_Item | None] = []  #: open containers, outermost first: None is a quote
        self.leaf: str | None = None
        self.fence: tuple[str, int] | None = None  #: an open fence: its character and length
        self.html_end: tuple[str, ...] | None = None  #: an open HTML block: what ends it (None: a blank)
        self.last = ""  #: the paragraph's latest line, when it was not lazy (a table header?)
        #: the open paragraph's lines while they may hold link definitions (markdown-it reads
        #: those as blocks of their own, which no lazy line goes on with), else None
        self.run: list[str] | None = None

    def goes_on(self, lazy: str) -> bool:
        """Whether ``lazy``, a line without the container's marks, goes on with it: only a
        paragraph takes a lazy line (CommonMark 5.1), and to markdown-it a paragraph's lines
        that link definitions take are no paragraph, unless a definition takes this line too
        (``> [a]:`` / ``/u``: the destination; ``> [a]: /u`` / ``alpha``: no)."""
        todo, self._todo = self._todo, []
        for line, is_lazy in todo:
            if is_lazy:
                self.last = ""
                self._extend(line)
            else:
                self._read(line)
        if self.leaf != _PARAGRAPH:
            return False
        if self.run is None or _definitions(self.run) < len(self.run):
            return True  # a paragraph (a line no definition takes) takes lazy lines
        return _goes_into(self.run, lazy.rstrip("\n"))

    def lazy_line(self, line: str) -> None:
        """A line that went on with the paragraph without its container's marks."""
        self._todo.append((line, True))

    def feed(self, line: str) -> None:
        """One line of the container's content (its own marks removed)."""
        self._todo.append((line, False))

    def _extend(self, line: str) -> None:
        """The open paragraph takes ``line``: the definitions it may hold, as far as they go."""
        run = self.run
        if run is None:
            return
        run.append(line.rstrip("\n"))
        took = _definitions(run)
        if 0 < took < len(run):  # definitions, then a line none of them took: it begins afresh
            del run[:took]
        if len(run) > _RUN_LINES or run[0].lstrip(" ")[:1] != "[":
            self.run = None

    def _read(self, raw: str) -> None:
        line = raw.rstrip("\n").expandtabs(4)
        pos, matched = 0, 0
        for box in self.stack:  # 1. the open containers this line goes on with
            nxt = _nonspace(line, pos)
            if box is None:
                if line[nxt : nxt + 1] != ">":  # past any indentation, as ``containers._quoted``
                    break
                pos = nxt + 1 + (line[nxt + 1 : nxt + 2] == " ")
            elif nxt >= len(line):  # blank from here on
                if not box.filled:  # an item that began with a blank line ends at the second
                    break
                pos = nxt
            elif nxt - pos >= box.width:
                pos += box.width
            else:
                break
            matched += 1
        all_matched = matched == len(self.stack)
        blank = _nonspace(line, pos) >= len(line)  # nothing left after the matched marks
        if all_matched and self._leaf_goes_on(line, pos, blank):
            return
        header, self.last = self.last, ""
        tip_paragraph = self.leaf == _PARAGRAPH
        definitions = self.run
        if tip_paragraph and not all_matched and definitions is not None and self._defined():
            # to markdown-it, definitions take no lazy line but their own destination or title
            tip_paragraph = _goes_into(definitions, line[pos:])
        in_paragraph = all_matched and tip_paragraph and not blank
        if in_paragraph and header and "|" in header and delimiter_cells(line[pos:]) == cells(header):
            self.leaf = _TABLE  # markdown-it's table: the paragraph's last line was its header
            return
        opened: list[_Item | None] = []
        leaf, fence, html_end = None, None, None
        while True:  # 2. the containers and the leaf this line opens
            nxt = _nonspace(line, pos)
            indented = nxt - pos >= 4
            rest = line[nxt:]
            para = in_paragraph and not opened  # the line would interrupt the paragraph
            tip_para = tip_paragraph and not opened
            if indented:
                if not tip_para and nxt < len(line):
                    leaf = _INDENTED
                break
            if rest[:1] == ">":
                pos = nxt + 1 + (line[nxt + 1 : nxt + 2] == " ")
                opened.append(None)
                continue
            if (
                _ATX.match(rest)
                or _THEMATIC.match(rest)
                or (para and _SETEXT.match(rest) and not self._defined())
            ):
                leaf = "ended"
                break
            if opener := _FENCE_OPENER.match(rest):
                run = opener[1] or opener[2]
                leaf, fence = "fence", (run[0], len(run))
                break
            if rest[:1] == "<" and (html := _html_start(rest)) and (html[0] < 7 or not tip_para):
                leaf, html_end = "html", html[1]
                if html_end is not None and any(e in rest.casefold() for e in html_end):
                    leaf = "ended"
                break
            mark = _LIST_MARK.match(rest)
            if mark and not (para and mark[2] is not None and int(mark[2]) != 1):
                after = nxt + len(mark[0])
                content = _nonspace(line, after)
                empty = content >= len(line)
                if para and empty:  # an empty item does not interrupt a paragraph
                    break
                spaces = content - after
                pad = 1 if empty or spaces >= 5 else spaces
                opened.append(_Item(nxt - pos + len(mark[0]) + pad, filled=not empty))
                pos = after + pad
                continue
            break
        if not opened and leaf is None and not all_matched and tip_paragraph and not blank:
            self._extend(line[pos:])  # 3. a lazy line: the paragraph takes it (no definition then,
            return  # unless one goes on into it), and every container stays open
        del self.stack[matched:]  # 4. the containers it did not go on with end
        if opened or leaf is not None or not all_matched or blank:
            self.leaf = None
        self.stack += opened
        if leaf is None and self.leaf is None and line[pos:].strip(" "):
            leaf = _PARAGRAPH  # text left after the marks: a paragraph begins (maybe definitions)
            self.run = [] if line[pos:].lstrip(" ")[:1] == "[" else None
        if leaf is not None and self.stack and self.stack[-1] is not None:
            self.stack[-1].filled = True
        for box in self.stack[:-1]:
            if box is not None:
                box.filled = True  # it holds the container after it
        if leaf == _PARAGRAPH or (leaf is None and self.leaf == _PARAGRAPH):
            self.leaf = _PARAGRAPH
            self.last = line[pos:]
            self._extend(line[pos:])
        elif leaf is not None:
            self.leaf = None if leaf == "ended" else leaf
            self.fence, self.html_end = fence, html_end
        if self.leaf != _PARAGRAPH:
            self.run = None

    def _defined(self) -> bool:
        """Link definitions take every line of the open paragraph (markdown-it): it is none."""
        return self.run is not None and _definitions(self.run) == len(self.run)

    def _leaf_goes_on(self, line: str, pos: int, blank: bool) -> bool:
        """The open leaf takes this line (every container matched): True when it did."""
        leaf = self.leaf
        if leaf == "fence" and self.fence is not None:
            char, length = self.fence
            closer = FENCE_CLOSER.fullmatch(line[pos:])
            if closer and closer[1][0] == char and len(closer[1]) >= length:
                self.leaf = self.fence = None
            return True
        if leaf == "html":
            if self.html_end is None:
                if blank:
                    self.leaf = None
                return True
            if any(e in line[pos:].casefold() for e in self.html_end):
                self.leaf = self.html_end = None
            return True
        if leaf == _INDENTED:
            if blank or _nonspace(line, pos) - pos >= 4:
                return True
            self.leaf = None
            return False
        if leaf == _TABLE:
            if blank or ends_table(line[pos:]):
                self.leaf = None
                return blank
            return True
        return False


def lazy_text(line: str) -> str:
    """A lazy line as its container will read it again: paragraph text, never a block of its own.

    The line goes on with a paragraph without its container's marks, so it is that paragraph's
    text however the container's lines are read again; mistletoe, parsing them, would read it
    anew. Two ways it did:

    - an underline: the lazy line cannot be the paragraph's setext underline (CommonMark 4.3:
      the underline is no lazy line), but ``===`` among the container's lines is one;
    - indented 4 columns or more: CommonMark decides what the line starts after the last
      container it matched, where that much indentation is indented code, which cannot
      interrupt a paragraph, so the line is text (CommonMark 0.31.2, example 238:
      ``> foo`` / ``    - bar``). Among the container's lines, though, the indentation goes
      on with the list items nested in it, and what is left can start a block: under
      ``> - a``, a fence's opener indented 4 opened a fence in the item, a code block
      CommonMark does not see, and the real one after it was cut in two
      (``test_an_indented_lazy_line_is_text``).

    A stand-in (heading titles drop it) after the underline, or before the indented line's
    first character, keeps the line text."""
    if _UNDERLINE.match(line):
        return line.rstrip("\n") + STAND_IN + line[len(line.rstrip("\n")) :]
    if indent(line) >= 4:
        text = len(line) - len(line.lstrip(" \t"))
        return line[:text] + STAND_IN + line[text:]
    return line
