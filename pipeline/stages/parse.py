"""Stage parse: canonical text → blocks with exact char and line spans (docs/spec.md, "Stages").

mistletoe gives each block token its start line only; the end of a block is
where the next sibling starts, less trailing blank lines (a paragraph or a
heading ends sooner, on its own terms). Text that mistletoe keeps out of the
tree (link reference and footnote definitions) becomes a ``linkdef`` block, so
every non-blank character of the body belongs to exactly one top-level block.
"""

from __future__ import annotations

import html
import re
from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate
from typing import Any

from pipeline.stages.mdpatch.punctuation import import_mistletoe

import_mistletoe()  # first: mistletoe's own import scans every code point (mdpatch/punctuation.py)

from mistletoe import block_token, span_token, span_tokenizer
from mistletoe.block_token import Document

from pipeline.errors import StageError
from pipeline.models import Block, BlockKind, SourceDoc
from pipeline.stages.mdpatch import MAX_DEPTH, install_patches
from pipeline.stages.mdpatch.blocks import STAND_IN, STAND_IN_TRIMMED, stand_in

#: A heading longer than this keeps its markup in its title: mistletoe's inline parser is
#: quadratic on some input (``[x](`` repeated).
_INLINE_TITLE_CHARS = 1000
#: A character that can start inline markup in a heading (else its text is taken as it is).
_INLINE_MARK = re.compile(r"[*_`\[<\\!~&]")

_SETEXT_UNDERLINE = re.compile(r" {0,3}(=+|-+)[ \t]*$")
_IMAGE_ONLY = re.compile(
    r"""(\[)?!\[(?:[^\]\\]|\\.)*\]                # ![alt]
        (?:\((?:[^()\\]|\\.)*\)|\[[^\]]*\])?        # (url "title") or [ref]
        (?(1)\](?:\((?:[^()\\]|\\.)*\)|\[[^\]]*\])|)\s*$  # [![..](..)](link) or [![..](..)][ref]
    """,
    re.VERBOSE | re.DOTALL,
)
#: HTML blocks of CommonMark kinds 1-5 may hold blank lines; the others end at one.
_HTML_KEEPS_BLANKS = re.compile(
    r" {0,3}<(?:script|pre|style|textarea|!--|\?|![A-Za-z]|!\[CDATA\[)", re.IGNORECASE
)
_KIND_BY_TOKEN: dict[str, BlockKind] = {
    "Heading": "heading",
    "SetextHeading": "heading",
    "Paragraph": "paragraph",
    "CodeFence": "code",
    "BlockCode": "code",
    "Table": "table",
    "HtmlBlock": "html",
    "Quote": "quote",
    "List": "list",
    "ListItem": "item",
    "ThematicBreak": "thematic",
}


class Lines:
    """Line ↔ char offset arithmetic over one canonical text (lines are 1-based)."""

    __slots__ = ("_blank", "count", "starts", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self._blank: list[bool] | None = None
        lengths = map(len, text.split("\n"))  # a line starts one past the previous one's end
        self.starts = list(accumulate(map((1).__add__, lengths), initial=0))[:-1]
        self.count = len(self.starts)

    def start(self, line: int) -> int:
        """Char offset where ``line`` begins."""
        return self.starts[line - 1]

    def end(self, line: int) -> int:
        """Char offset just past the last character of ``line`` (before its newline)."""
        return self.starts[line] - 1 if line < self.count else len(self.text)

    def line_of(self, offset: int) -> int:
        """The line holding char ``offset``."""
        return bisect_right(self.starts, offset)

    def is_blank(self, line: int) -> bool:
        return self.blanks[line - 1]

    @property
    def blanks(self) -> list[bool]:
        """Whether each line is blank (index 0 is line 1), computed on first use."""
        blank = self._blank
        if blank is None:  # one pass over the text, the first time it is asked
            blank = self._blank = [not s.strip() for s in self.text.split("\n")]
        return blank

    def literal_blank(self, line: int) -> bool:
        """Blank as CommonMark counts it (4.9): spaces and tabs only. A fence holds a line of
        NBSP or U+2028 as text (its last line, when it is never closed); ``blanks`` does not."""
        return not self.text[self.start(line) : self.end(line)].strip(" \t")


def parse(doc: SourceDoc, lines: Lines | None = None) -> tuple[Block, ...]:
    """Top-level blocks of the body (front matter excluded), in document order.

    ``lines``: the ``Lines`` of ``doc.text``, when the caller has them (mint needs them too).
    """
    if lines is None:
        lines = Lines(doc.text)
    body = doc.text[doc.body_start :]
    if not body.strip():
        return ()
    first_line = lines.line_of(doc.body_start) if doc.body_start < len(doc.text) else lines.count
    try:
        tree = _mistletoe(body)
    except RecursionError:
        raise StageError(
            "parse",
            doc.rel_path,
            "nesting too deep for the Markdown parser",
            "flatten the deeply nested quotes or lists",
        ) from None
    offset = first_line - 1
    return _siblings(list(tree.children or ()), first_line, lines.count, offset, lines, 0)


def _mistletoe(body: str) -> Document:
    """Block-level parse only: inline tokens are not needed to find blocks."""
    install_patches()  # once per process; a no-op after the first call
    parts = body.split("\n")
    if _ODD_BLANK.search(body):  # rare: only then look at each line
        parts = [_visible_blanks(p) for p in parts]
    src = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        src.append(parts[-1])
    saved = span_token.tokenize_inner, block_token.Paragraph.__init__, block_token.Table.__init__
    span_token.tokenize_inner = _raw_inner
    # Paragraphs and tables are leaves here, placed by their lines: their inline content
    # (and a table's rows and cells) would be built only to be thrown away.
    block_token.Paragraph.__init__ = block_token.Table.__init__ = _leaf  # type: ignore[method-assign]
    try:
        return Document(src)
    finally:
        span_token.tokenize_inner, block_token.Paragraph.__init__, block_token.Table.__init__ = saved  # type: ignore[method-assign]


#: A blank other than space and tab (NBSP, U+3000, VT, FF, U+2028 ...): Python's ``str.strip``
#: drops it, CommonMark's blank line (4.9 / 2.1) holds only spaces and tabs.
_ODD_BLANK = re.compile(r"[^\S \t\n\r]")


def _visible_blanks(line: str) -> str:
    """A line of nothing but blanks, some not space or tab, with those shown as a non-blank.

    mistletoe tests ``line.strip() == ""`` for a blank line; CommonMark takes such a line
    for text (a paragraph line, a setext heading's content). The stand-in keeps the line's
    length, so every offset holds; it is only ever seen by mistletoe (titles drop it).
    """
    if line.strip() or not _ODD_BLANK.search(line):
        return line
    return _ODD_BLANK.sub(lambda blank: stand_in(blank[0]), line)


def _leaf(self: Any, _lines: Any) -> None:
    """A block token's ``__init__`` that keeps nothing (see ``_mistletoe``)."""


def _raw_inner(content: str) -> list[Any]:
    """``tokenize_inner`` with ``RawText`` the only span token: what heading titles start from."""
    if not content:
        return []
    saved = html._charref  # type: ignore[attr-defined]
    html._charref = span_tokenizer._markdown_charref  # type: ignore[attr-defined] # as mistletoe does
    try:
        return [span_token.RawText(html.unescape(content))]  # type: ignore[no-untyped-call]
    finally:
        html._charref = saved  # type: ignore[attr-defined]


def _siblings(
    tokens: Sequence[Any], first: int, last: int, offset: int, lines: Lines, depth: int
) -> tuple[Block, ...]:
    """Blocks for sibling tokens that share the region of lines ``[first, last]``."""
    starts = [t.line_number + offset for t in tokens]
    out: list[Block] = []
    cursor = first
    for i, tok in enumerate(tokens):
        begin = max(starts[i], cursor)
        limit = (starts[i + 1] - 1) if i + 1 < len(tokens) else last
        if begin > cursor:
            out.extend(_gap(cursor, begin - 1, lines))
        name = type(tok).__name__
        end = _own_end(name, begin, limit, lines)
        block = _block(tok, name, begin, end, offset, lines, depth)
        if block is not None:
            out.append(block)
        cursor = max(end, begin) + 1
        if cursor <= limit:
            out.extend(_gap(cursor, limit, lines))
        cursor = max(cursor, limit + 1)
    if cursor <= last:
        out.extend(_gap(cursor, last, lines))
    return tuple(out)


#: Blocks that end at their last line that is not blank as CommonMark counts it (spaces and
#: tabs): a line of NBSP can be a fence's text, and the last line of the container around it.
_LITERAL_ENDS = frozenset({"CodeFence", "List", "ListItem", "Quote"})


def _own_end(name: str, begin: int, limit: int, lines: Lines) -> int:
    """Last line of a block (a token of class ``name``) that starts on ``begin`` and may run
    up to ``limit``."""
    if name == "Heading":
        return begin
    if name == "SetextHeading":
        for ln in range(begin + 1, limit + 1):
            if _SETEXT_UNDERLINE.match(lines.text, lines.start(ln), lines.end(ln)):
                return ln
        return limit
    if name in ("Paragraph", "Table") or (
        name == "HtmlBlock" and not _HTML_KEEPS_BLANKS.match(lines.text, lines.start(begin), lines.end(begin))
    ):
        try:  # the line before the first blank line after ``begin`` (blanks[i] is line i + 1)
            return lines.blanks.index(True, begin, limit)
        except ValueError:
            return limit
    if name in _LITERAL_ENDS:  # a fence's lines are text, Unicode blanks too, and so a container's
        while limit > begin and lines.literal_blank(limit):
            limit -= 1
        return limit
    blanks = lines.blanks  # blanks[i]: line i + 1
    while limit > begin and blanks[limit - 1]:
        limit -= 1
    return limit


def _gap(first: int, last: int, lines: Lines) -> list[Block]:
    """Non-blank lines the parser kept out of its tree: one ``linkdef`` block."""
    blanks = lines.blanks  # blanks[i]: line i + 1
    while first <= last and blanks[first - 1]:
        first += 1
    while last >= first and blanks[last - 1]:
        last -= 1
    if first > last:
        return []
    return [_make("linkdef", first, last, lines)]


def _make(
    kind: BlockKind,
    first: int,
    last: int,
    lines: Lines,
    children: tuple[Block, ...] = (),
    level: int = 0,
    title: str = "",
) -> Block:
    start = lines.start(first)
    end = lines.end(last)
    text = lines.text
    while end > start and text[end - 1] in " \t":
        end -= 1
    # a block starts at its first non-blank line's start, so leading indent is kept
    return Block(kind, start, end, first, last, children, level, title)


def _block(tok: Any, name: str, first: int, last: int, offset: int, lines: Lines, depth: int) -> Block | None:
    kind = _KIND_BY_TOKEN.get(name)
    if kind is None:
        return None
    blanks = lines.blanks  # blanks[i]: line i + 1
    while last > first and blanks[last - 1] and (name not in _LITERAL_ENDS or lines.literal_blank(last)):
        last -= 1
    while first < last and blanks[first - 1]:  # mistletoe may open indented code on a blank line
        first += 1
    if blanks[first - 1]:  # whitespace-only lines (4+ spaces, a tab) mistletoe calls indented code
        return None
    if kind == "heading":
        return _make(kind, first, last, lines, level=tok.level, title=heading_title(tok))
    if kind == "paragraph":
        raw = lines.text[lines.start(first) : lines.end(last)].strip()
        if raw.startswith("$$") and raw.endswith("$$") and len(raw) > 4:
            kind = "formula"
        elif raw.startswith(("!", "[![")) and _IMAGE_ONLY.match(raw):
            kind = "image"
        return _make(kind, first, last, lines)
    if kind in ("list", "item", "quote") and depth < MAX_DEPTH and tok.children:
        kids = _siblings(tok.children, first, last, offset, lines, depth + 1)
        return _make(kind, first, last, lines, children=kids)
    return _make(kind, first, last, lines)


def heading_title(tok: Any) -> str:
    """Heading text without Markdown syntax: inline markup parsed, then its text kept."""
    raw = (
        "".join([getattr(c, "content", "") for c in (tok.children or ())])
        .replace(STAND_IN, " ")
        .replace(STAND_IN_TRIMMED, " ")
    )
    if len(raw) <= _INLINE_TITLE_CHARS and _INLINE_MARK.search(raw):
        saved = list(span_token._token_types)
        span_token.add_token(span_token.HtmlSpan)  # type: ignore[no-untyped-call] # so _plain drops tags
        try:
            inline = span_token.tokenize_inner(raw)  # type: ignore[no-untyped-call]
        finally:
            span_token._token_types[:] = saved
        return " ".join(_plain(inline).split())
    return " ".join(raw.split())


def _plain(tokens: Sequence[Any]) -> str:
    out: list[str] = []
    for tok in tokens:
        name = type(tok).__name__
        if name == "HtmlSpan":
            continue
        if name == "LineBreak":
            out.append(" ")
        elif getattr(tok, "children", None):
            out.append(_plain(tok.children))
        else:
            out.append(getattr(tok, "content", ""))
    return "".join(out)
