"""Stage sections: top-level blocks → the section tree (docs/spec.md, "Stages"; ``s=`` in "Ids")."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

from pipeline.models import Block, Section, SourceDoc

#: Unicode categories github-slugger keeps: letters, marks, numbers, connector punctuation.
_SLUG_KEEP = ("L", "M", "N", "Pc")
_ASCII_DROP = re.compile(r"[^a-z0-9_ \-]")


def slugify(title: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces → hyphens."""
    if title.isascii():  # the same rule, at C speed: ASCII L/M/N/Pc are [A-Za-z0-9_]
        return _ASCII_DROP.sub("", title.lower()).replace(" ", "-")
    out = []
    for ch in title.lower():
        if ch in " -":
            out.append("-")
        elif unicodedata.category(ch).startswith(_SLUG_KEEP):
            out.append(ch)
    return "".join(out)


class Slugger:
    """De-duplicates slugs within one document: ``a``, ``a-1``, ``a-2`` (as GitHub does)."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    def slug(self, title: str) -> str:
        base = slugify(title)
        slug = base
        while slug in self.seen:
            self.seen[base] += 1
            slug = f"{base}-{self.seen[base]}"
        self.seen[slug] = 0
        return slug


def build_sections(blocks: Sequence[Block]) -> tuple[Section, ...]:
    """Group blocks under their headings; number sections by their place in the tree.

    A heading of level L closes every open section of level ≥ L; its path is its
    parent's path plus its rank among the parent's children (``1.2.3``). Text
    before the first heading is section ``0``.
    """
    sections: list[Section] = []
    slugger = Slugger()
    # open headings: (level, path parts, title, slug); children count per path
    stack: list[tuple[int, tuple[int, ...], str, str]] = []
    children: dict[tuple[int, ...], int] = {}
    current: list[Block] = []
    head: tuple[str, tuple[str, ...], tuple[int, ...], tuple[str, ...]] = ("0", (), (), ())

    def close() -> None:
        if current:
            sections.append(Section(head[0], head[1], head[2], head[3], tuple(current)))

    for block in blocks:
        if block.kind != "heading":
            current.append(block)
            continue
        close()
        while stack and stack[-1][0] >= block.level:
            stack.pop()
        parent = stack[-1][1] if stack else ()
        children[parent] = children.get(parent, 0) + 1
        parts = (*parent, children[parent])
        stack.append((block.level, parts, block.title, slugger.slug(block.title)))
        head = (
            ".".join(map(str, parts)),
            tuple(s[2] for s in stack),
            tuple(s[0] for s in stack),
            tuple(s[3] for s in stack),
        )
        current = [block]
    close()
    return tuple(sections)


def file_title(doc: SourceDoc, blocks: Sequence[Block]) -> str:
    """Front matter ``title``, else the first H1, else the file stem (docs/spec.md, "Chunk files")."""
    front = doc.front_matter or {}
    title = front.get("title")
    if isinstance(title, str | int | float) and str(title).strip():
        return " ".join(str(title).split())
    for block in blocks:
        if block.kind == "heading" and block.level == 1 and block.title:
            return block.title
    return doc.doc_name.rsplit("/", 1)[-1]


def outline(blocks: Sequence[Block]) -> str:
    """The document outline that ``r=`` hashes: heading levels and texts, in order."""
    return "\n".join(f"{b.level} {' '.join(b.title.split())}" for b in blocks if b.kind == "heading")
