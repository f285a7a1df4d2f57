"""An independent outline of a Markdown document (markdown-it-py, not chunkyard's mistletoe).

``../shared/tools/check_chunks.py`` has the reference ``Outline``; where ../shared is absent,
the property tests take this one, built on the same parser (markdown-it-py is a dev
dependency), so they still hold chunkyard's headings to a parser that is not its own.
"""

from __future__ import annotations

from bisect import bisect_right

from markdown_it import MarkdownIt

_CLOSERS = (("---", ("---", "...")), ("+++", ("+++",)))


def front_matter_end(text: str) -> int:
    """Where front matter (``---`` YAML or ``+++`` TOML on the very first line) ends, else 0."""
    for fence, closers in _CLOSERS:
        if not text.startswith(fence + "\n"):
            continue
        pos = len(fence) + 1
        while pos <= len(text):
            nl = text.find("\n", pos)
            line = text[pos:] if nl < 0 else text[pos:nl]
            if line.rstrip() in closers:
                return len(text) if nl < 0 else nl + 1
            if nl < 0:
                break
            pos = nl + 1
    return 0


class Outline:
    """Document-level headings ``(offset, level)``, fences and tables ``(kind, start, end)``."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.fm_end = front_matter_end(text)
        body = "\n" * text[: self.fm_end].count("\n") + text[self.fm_end :]  # lines keep their numbers
        self.line_starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]
        self.headings: list[tuple[int, int]] = []
        self.atomic: list[tuple[str, int, int]] = []
        for tok in MarkdownIt("commonmark").enable("table").parse(body):
            if not tok.map:
                continue
            if tok.type == "heading_open" and tok.level == 0:
                self.headings.append((self._start(tok.map[0]), int(tok.tag[1])))
            elif tok.type in ("fence", "table_open"):
                kind = "code" if tok.type == "fence" else "table"
                self.atomic.append((kind, self._start(tok.map[0]), self._end(tok.map[1])))

    def _start(self, line: int) -> int:
        return self.line_starts[min(line, len(self.line_starts) - 1)]

    def _end(self, line_excl: int) -> int:
        """End of line ``line_excl - 1`` without its newline, trailing blanks dropped."""
        end = self.line_starts[line_excl] - 1 if line_excl < len(self.line_starts) else len(self.text)
        while end > 0 and self.text[end - 1] in " \t\n":
            end -= 1
        return end

    def line_of(self, offset: int) -> int:
        return bisect_right(self.line_starts, offset)

    def depths_at(self, offset: int) -> list[int]:
        """Heading levels above ``offset``, outermost first."""
        stack: list[int] = []
        for start, level in self.headings:
            if start > offset:
                break
            while stack and stack[-1] >= level:
                stack.pop()
            stack.append(level)
        return stack
