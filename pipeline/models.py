"""Frozen values passed between the stages (docs/spec.md, "Stages")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

BlockKind = Literal[
    "heading",
    "paragraph",
    "list",
    "item",
    "code",
    "table",
    "quote",
    "html",
    "formula",
    "image",
    "thematic",
    "linkdef",
]
ChunkType = Literal[
    "paragraph",
    "list",
    "code",
    "table",
    "quote",
    "html",
    "formula",
    "image",
    "heading",
    "mixed",
]

#: Files larger than this are refused (``--max-bytes``).
DEFAULT_MAX_BYTES = 20 * 1024 * 1024

#: Block kinds that are never split (docs/spec.md, "Splitting" rules 2, 3, 5).
ATOMIC_KINDS = frozenset({"code", "html", "formula", "image"})


@dataclass(frozen=True, slots=True)
class Policy:
    """The chunking policy; its canonical JSON is hashed into ``policyHash``."""

    target_tokens: int = 256
    overlap_tokens: int = 64
    tokenizer: str = "cl100k_base"
    context_prefix: bool = True
    lang: str = "en"

    def as_dict(self) -> dict[str, Any]:
        """The effective options, as written to ``metadata.chunkingOptions``."""
        return {
            "target_tokens": self.target_tokens,
            "overlap_tokens": self.overlap_tokens,
            "tokenizer": self.tokenizer,
            "context_prefix": self.context_prefix,
            "lang": self.lang,
        }


@dataclass(frozen=True, slots=True)
class SourceDoc:
    """One document after normalization.

    ``text`` is the canonical text (BOM stripped, LF only); every offset
    anywhere in chunkyard is a code-point index into it.
    """

    rel_path: str  #: corpus-relative POSIX path, e.g. ``guides/intro.md``
    doc_name: str  #: ``rel_path`` without its extension
    text: str
    body_start: int = 0  #: char offset where the front matter ends
    front_matter: dict[str, Any] | None = None
    warnings: tuple[str, ...] = ()


class Block(NamedTuple):
    """A Markdown block with its exact place in the canonical text.

    ``[start, end)`` is a char span with trailing blank lines dropped; lines are
    1-based and inclusive. Containers (list, item, quote) carry their children.
    A named tuple, not a frozen dataclass: as immutable, and built several times
    faster (a corpus makes hundreds of thousands of blocks and pieces).
    """

    kind: BlockKind
    start: int
    end: int
    line_start: int
    line_end: int
    children: tuple[Block, ...] = ()
    level: int = 0  #: heading level 1-6, else 0
    title: str = ""  #: heading text without Markdown syntax


@dataclass(frozen=True, slots=True)
class Section:
    """A heading and the top-level blocks under it, up to the next heading."""

    path: str  #: ``1``, ``1.2``... or ``0`` for text before the first heading
    titles: tuple[str, ...]
    depths: tuple[int, ...]
    slugs: tuple[str, ...]
    blocks: tuple[Block, ...]  #: the heading block first, when there is one


class Piece(NamedTuple):
    """A unit the splitter packs: a whole block or a piece of one (a named tuple, as ``Block``)."""

    start: int
    end: int
    kind: BlockKind
    block_index: int  #: index of the top-level block within its section
    tokens: int
    atomic: bool = False  #: never packed with a neighbour over the target
    solo: bool = False  #: always a chunk of its own (images)
    table_header: str = ""  #: header rows repeated in embedText for a split table


@dataclass(frozen=True, slots=True)
class Draft:
    """A chunk before ids are minted: a run of pieces of one section."""

    section: Section
    pieces: tuple[Piece, ...]
    first_piece: int  #: index of the first piece among the section's pieces
    block_type: ChunkType
    embed_text: str
    tokens: int

    @property
    def start(self) -> int:
        return self.pieces[0].start

    @property
    def end(self) -> int:
        return max(p.end for p in self.pieces)


@dataclass(frozen=True, slots=True)
class Chunk:
    """A minted chunk: its JSON record and the file it goes to."""

    rel_file: str  #: output-relative POSIX path of the chunk file
    record: dict[str, Any] = field(hash=False)
