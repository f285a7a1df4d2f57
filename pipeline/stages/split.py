"""Stage split: sections + policy → chunk drafts, by the md-heading-v1 rules (docs/spec.md, "Splitting").

In priority order: a heading starts a chunk and no chunk spans two sections;
code, HTML and math blocks are never split; a table stays whole under twice the
target; small blocks are packed up to the target; a list or quote over the
target splits between items, a paragraph at sentence ends (then word ends) with
overlap; an image paragraph is a chunk of its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

from pipeline.models import ATOMIC_KINDS, Block, BlockKind, ChunkType, Draft, Piece, Policy, Section
from pipeline.stages.tokens import Counter

#: How piece kinds show in ``block_type``.
_OUTPUT_KIND: dict[str, ChunkType] = {
    "thematic": "paragraph",
    "linkdef": "paragraph",
    "item": "list",
    "paragraph": "paragraph",
    "list": "list",
    "quote": "quote",
    "code": "code",
    "table": "table",
    "html": "html",
    "formula": "formula",
    "image": "image",
    "heading": "heading",
}
#: Split points, coarse to fine: sentence ends or line ends, then spaces, then anywhere.
_SENTENCE_END = re.compile(r"(?<=[.!?;:])[\"')\]]*\s+|(?<=[。！？；])\s*|\n\s*")
_SPACE = re.compile(r"\s+")
#: No token of cl100k_base or o200k_base is longer than this many bytes (nor chars).
_LONGEST_TOKEN = 128
#: A context prefix may take at most this share of the target.
_PREFIX_SHARE = 4


class Splitter:
    """md-heading-v1 for one document: holds the text, policy and token counter."""

    def __init__(self, text: str, title: str, policy: Policy, counter: Counter) -> None:
        self.text = text
        self.title = title
        self.policy = policy
        self.counter = counter
        self.count = counter.count
        self.target = policy.target_tokens
        self.prefix_tokens: dict[str, int] = {"": 0}

    # -- the section loop -------------------------------------------------------------

    def split(self, sections: Sequence[Section]) -> Iterator[Draft]:
        for section in sections:
            yield from self.split_section(section)

    def split_section(self, section: Section) -> list[Draft]:
        prefix = self.prefix(section)
        if prefix not in self.prefix_tokens:
            self.prefix_tokens[prefix] = self.count(prefix)
        budget = max(self.target - self.prefix_tokens[prefix] - 1, 1)
        pieces: list[Piece] = []
        heading_tokens = 0
        for bi, block in enumerate(section.blocks):
            first_budget = budget
            if bi == 1 and section.blocks[0].kind == "heading" and budget - heading_tokens > 16:
                first_budget = budget - heading_tokens - 1  # so the heading can lead the piece
            new = list(self.pieces_of(block, bi, block.kind, budget, first_budget))
            if bi == 0 and block.kind == "heading":
                heading_tokens = sum(p.tokens for p in new)
            pieces.extend(new)
        return self.pack(section, pieces, prefix, budget)

    def prefix(self, section: Section) -> str:
        """``fileTitle > headerBreadcrumb`` and a blank line, cut to a share of the target.

        When the first heading is the file title (the usual H1), it is said once.
        """
        if not self.policy.context_prefix:
            return ""
        titles = section.titles
        if titles and titles[0] == self.title:
            titles = titles[1:]
        line = " > ".join((self.title, *titles))
        limit = self.target // _PREFIX_SHARE
        if self.count(line) > limit:
            while line and self.count(line + "…") > limit:
                line = line[: len(line) * 3 // 4]
            line += "…"
        return line + "\n\n"

    # -- blocks → pieces ---------------------------------------------------------------

    def pieces_of(
        self, block: Block, bi: int, top: BlockKind, budget: int, first_budget: int
    ) -> Iterator[Piece]:
        text = self.text[block.start : block.end]
        if block.children and len(text) > _LONGEST_TOKEN * first_budget:
            tokens = first_budget + 1  # surely over: skip counting a container at every depth
        else:
            tokens = self.count(text)
        kind: BlockKind = block.kind if block.kind in ATOMIC_KINDS or block.kind == "table" else top
        if block.kind == "image":
            yield Piece(block.start, block.end, "image", bi, tokens, atomic=True, solo=True)
        elif block.kind in ATOMIC_KINDS:
            yield Piece(block.start, block.end, kind if tokens > budget else top, bi, tokens, atomic=True)
        elif tokens <= first_budget:
            yield Piece(block.start, block.end, top, bi, tokens, atomic=block.kind == "table")
        elif block.kind == "table":
            if tokens < 2 * self.target:  # rule 3 counts tokens (a CJK table is dense)
                yield Piece(block.start, block.end, "table", bi, tokens, atomic=True)
            else:
                yield from self.table_rows(block, bi, budget)
        elif block.children:
            for i, child in enumerate(block.children):
                yield from self.pieces_of(child, bi, top, budget, first_budget if i == 0 else budget)
        else:
            yield from self.text_pieces(block.start, block.end, top, bi, budget, first_budget)

    def table_rows(self, block: Block, bi: int, budget: int) -> Iterator[Piece]:
        """A table of twice the target or more splits between rows; the header rides along."""
        rows: list[tuple[int, int]] = []
        pos = block.start
        while pos < block.end:
            nl = self.text.find("\n", pos, block.end)
            end = block.end if nl < 0 else nl
            if self.text[pos:end].strip():
                rows.append((pos, end))
            pos = end + 1
        head_end = rows[min(1, len(rows) - 1)][1]
        header = self.text[block.start : head_end]
        room = max(budget - self.count(header) - 1, 1)
        start, end, used = block.start, head_end, 0
        for s, e in rows[2:]:
            t = self.count(self.text[s:e]) + 1
            if used and used + t > room:
                yield Piece(
                    start,
                    end,
                    "table",
                    bi,
                    self.count(self.text[start:end]),
                    atomic=True,
                    table_header=header if start != block.start else "",
                )
                start, used = s, 0
            end, used = e, used + t
        yield Piece(
            start,
            end,
            "table",
            bi,
            self.count(self.text[start:end]),
            atomic=True,
            table_header=header if start != block.start else "",
        )

    def text_pieces(
        self, start: int, end: int, kind: BlockKind, bi: int, budget: int, first_budget: int
    ) -> Iterator[Piece]:
        """Split text at sentence ends, then spaces, then anywhere; overlap between pieces."""
        units = self.units(start, end, min(budget, first_budget), 0)
        overlap = self.policy.overlap_tokens
        i, n = 0, len(units)
        room = first_budget
        prev_start = prev_end = -1
        resume = 0  # the first unit after the last piece: where to go on without overlap
        while i < n:
            j, used = i, 0
            while j < n and (j == i or used + units[j][2] + 1 <= room):
                used += units[j][2] + (1 if j > i else 0)
                j += 1
            j = self._fit(units, i, j, room)
            s, e = units[i][0], units[j - 1][1]
            if e <= prev_end:  # only the overlap fit: drop it rather than repeat it alone
                i = resume
                continue
            if s > prev_start:
                yield Piece(s, e, kind, bi, self.count(self.text[s:e]))
                prev_start, prev_end = s, e
            if j >= n:
                break
            if overlap and units[j - 1][2] > overlap:  # too big to repeat whole: repeat its end
                a, b = units[j - 1][0], units[j - 1][1]
                words = self.cut(a, b, 1)
                finer = [(x, y, self.count(self.text[x:y])) for x, y in words] if len(words) > 1 else []
                units[j - 1 : j] = finer or self.hard(a, b, overlap)
                j, n = j + len(units) - n, len(units)
            resume = j
            k, back = j, 0  # step back over trailing units that fit the overlap
            while k - 1 > i and back + units[k - 1][2] <= overlap:
                k -= 1
                back += units[k][2]
            i = k
            room = budget

    def _fit(self, units: list[tuple[int, int, int]], i: int, j: int, room: int) -> int:
        """The largest ``j`` (up to the one given) whose span ``units[i:j]`` fits ``room``; ``i + 1`` at least.

        Steps back a unit at a time, since the estimate is nearly right; after a few steps
        (units far apart, as lines under deep indentation are) it bisects instead, so a
        hostile document costs a few counts per piece, not one per unit.
        """
        start = units[i][0]
        for step in range(8):
            if j - 1 <= i:
                return j
            tokens = self.count(self.text[start : units[j - 1][1]])
            if tokens <= room:
                return j
            j -= 1
            if step == 0 and tokens > 2 * room:
                break  # far off: bisect at once, first where the count says
        lo, hi = i + 1, j  # the span up to ``lo`` fits (one unit always goes); ``hi`` may not
        guess = i + (j + 1 - i) * room // max(tokens, 1)
        while lo < hi:
            mid = guess if lo < guess <= hi else (lo + hi + 1) // 2
            guess = 0
            if self.count(self.text[start : units[mid - 1][1]]) <= room:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def units(self, start: int, end: int, budget: int, level: int) -> list[tuple[int, int, int]]:
        """``(start, end, tokens)`` units no larger than ``budget``, finest level as needed."""
        out: list[tuple[int, int, int]] = []
        for s, e in self.cut(start, end, level):
            tokens = self.count(self.text[s:e])
            if tokens <= budget or (level == 2 and e - s == 1):
                out.append((s, e, tokens))
            else:
                out.extend(self.units(s, e, budget, level + 1) if level < 2 else self.hard(s, e, budget))
        return out

    def cut(self, start: int, end: int, level: int) -> list[tuple[int, int]]:
        """Spans of ``text[start:end]`` between split points, blanks trimmed."""
        if level >= 2:
            return [(start, end)]
        pattern = _SENTENCE_END if level == 0 else _SPACE
        spans, pos = [], start
        for m in pattern.finditer(self.text, start, end):
            if m.start() > pos:
                spans.append((pos, m.start()))
            pos = max(pos, m.end())
        if pos < end:
            spans.append((pos, end))
        return [(s, e) for s, e in spans if self.text[s:e].strip()]

    def hard(self, start: int, end: int, budget: int) -> list[tuple[int, int, int]]:
        """A run with no split point: cut by length, each piece within the budget."""
        out = []
        while start < end:
            size = min(end - start, budget * 2)
            while size > 1 and self.count(self.text[start : start + size]) > budget:
                size = size * 3 // 4
            out.append((start, start + size, self.count(self.text[start : start + size])))
            start += size
        return out

    # -- pieces → drafts ---------------------------------------------------------------

    def pack(self, section: Section, pieces: list[Piece], prefix: str, budget: int) -> list[Draft]:
        """Greedy packing in order; a chunk goes over the target only for one big atomic block."""
        drafts: list[Draft] = []
        i, n = 0, len(pieces)
        while i < n:
            j, used = i + 1, pieces[i].tokens
            if pieces[i].table_header:  # a split table's header rides along in embedText
                used += self.count(pieces[i].table_header) + 1
            if not pieces[i].solo and used <= budget:
                while j < n and not pieces[j].solo:
                    nxt = pieces[j]
                    if nxt.tokens > budget:  # a big atomic block: only the heading may lead it
                        j += i == 0 and j == 1 and pieces[0].kind == "heading"
                        break
                    if used + nxt.tokens + 1 > budget:
                        break
                    used += nxt.tokens + 1
                    j += 1
            draft = self.draft(section, pieces, i, j, prefix)
            while draft.tokens > self.target and j - i > 1 and draft.block_type not in _EXEMPT:
                j -= 1  # the estimate was short: give the last piece to the next chunk
                draft = self.draft(section, pieces, i, j, prefix)
            drafts.append(draft)
            i = j
        return drafts

    def draft(self, section: Section, pieces: list[Piece], i: int, j: int, prefix: str) -> Draft:
        run = tuple(pieces[i:j])
        start, end = run[0].start, max(p.end for p in run)
        body = self.text[start:end]
        header = run[0].table_header
        embed = prefix + (header + "\n" + body if header else body)
        kinds = {_OUTPUT_KIND[p.kind] for p in run if p.kind != "heading"}
        block_type: ChunkType = kinds.pop() if len(kinds) == 1 else ("heading" if not kinds else "mixed")
        tokens = self.count(embed)
        return Draft(section, run, i, block_type, embed, tokens)


_EXEMPT = frozenset({"code", "table", "image", "html", "formula"})
