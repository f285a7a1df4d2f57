"""Chunk lists for ``make bench-retrieval``: chunkyard's and its peers', each chunk with exact offsets.

Every chunker gets the same documents (every ``*.md`` of a corpus, as canonical text:
strict UTF-8, BOM dropped, CRLF/CR → LF) and returns ``EvalChunk``s: corpus-relative
source, ``[start, end)`` into that text, the text itself, and what to embed.

- ``chunkyard-512`` / ``chunkyard-256``: ``chunkyard ingest --target-tokens N`` into a
  scratch folder, read back from the chunk files (``charOffsets``; ``embedText`` with the
  breadcrumb). ``chunkyard-256-original`` embeds ``originalText`` (no breadcrumb).
- ``langchain-header-recursive``: ``MarkdownHeaderTextSplitter`` (h1-h6, its defaults, so
  headings are stripped from the text) then ``RecursiveCharacterTextSplitter`` (512 cl100k
  tokens, 64 overlap). The header splitter rewrites whitespace and gives no offsets:
  **offsets are recovered** by searching the chunk in the source (below).
- ``langchain-recursive``: ``RecursiveCharacterTextSplitter`` alone, same settings, with
  ``add_start_index=True``; its start index is used when it slices the source to the text.
- ``llamaindex-markdown-sentence``: ``MarkdownNodeParser`` then ``SentenceSplitter(512)``
  (its default overlap of 200), cl100k tokens. Node offsets are missing for most nodes
  after the markdown parser: **offsets are recovered** by search.
- ``chonkie-recursive``: ``RecursiveChunker(chunk_size=512)`` with cl100k; its
  ``start_index``/``end_index`` slice the source exactly.
- ``fixed-800-400`` / ``fixed-256``: windows of 800 cl100k tokens every 400 tokens, and of
  256 tokens without overlap, cut with tiktoken's own token offsets (exact).

Recovery (``locate``): the exact text searched from the previous chunk's start; else the
text's non-whitespace characters searched among the source's (a splitter that re-spaced
lines); else its first and last 48 non-whitespace characters as anchors. How many chunks
each way took is reported per chunker (``Recovery``); a chunk found no way is dropped and
counted.
"""

from __future__ import annotations

import bisect
import re
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from pipeline.evaluate.chunks import EvalChunk, load_chunk_files
from pipeline.stages.normalize import decode

TARGET = 512
OVERLAP = 64
ANCHOR = 48

Doc = tuple[str, str]  #: (corpus-relative path, canonical text)


def markdown_files(corpus: Path) -> list[str]:
    """Every Markdown document of a corpus, corpus-relative, in path order."""
    return sorted(p.relative_to(corpus).as_posix() for p in [*corpus.rglob("*.md"), *corpus.rglob("*.markdown")])


def documents(corpus: Path) -> list[Doc]:
    """Every Markdown document of a corpus, in path order, as canonical text."""
    return [(rel, decode((corpus / rel).read_bytes(), rel)) for rel in markdown_files(corpus)]


@dataclass(slots=True)
class Recovery:
    """How a chunker's offsets were obtained: given, exact search, whitespace-blind, anchors, lost."""

    given: int = 0
    exact: int = 0
    spacing: int = 0
    anchors: int = 0
    lost: int = 0
    lost_examples: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, int]:
        """Counts only."""
        return {k: getattr(self, k) for k in ("given", "exact", "spacing", "anchors", "lost")}


class Skeleton:
    """A source's non-whitespace characters and where each one is, for whitespace-blind search."""

    def __init__(self, text: str) -> None:
        self.pos = [i for i, c in enumerate(text) if not c.isspace()]
        self.chars = "".join(text[i] for i in self.pos)

    def find(self, squeezed: str, from_char: int) -> tuple[int, int] | None:
        """``[start, end)`` in the source of the squeezed text, at or after ``from_char``."""
        k = self.chars.find(squeezed, bisect.bisect_left(self.pos, from_char))
        if k < 0 or not squeezed:
            return None
        return self.pos[k], self.pos[k + len(squeezed) - 1] + 1


def locate(
    text: str, chunk: str, cursor: int, skeleton: Callable[[], Skeleton], rec: Recovery
) -> tuple[int, int] | None:
    """Where ``chunk`` lies in ``text`` (searching from ``cursor``, then from the start)."""
    for origin in (cursor, 0):
        at = text.find(chunk, origin)
        if at >= 0:
            rec.exact += 1
            return at, at + len(chunk)
    squeezed = "".join(chunk.split())
    sk = skeleton()
    for origin in (cursor, 0):
        span = sk.find(squeezed, origin)
        if span:
            rec.spacing += 1
            return span
    for origin in (cursor, 0):
        head = sk.find(squeezed[:ANCHOR], origin)
        if head:
            tail = sk.find(squeezed[-ANCHOR:], head[0])
            if tail:
                rec.anchors += 1
                return head[0], tail[1]
    rec.lost += 1
    if len(rec.lost_examples) < 3:
        rec.lost_examples.append(chunk[:80])
    return None


Piece = tuple[str, int | None] | tuple[str, int | None, str]  #: (text, start or None[, embed text])


def place(name: str, docs: Iterable[Doc], split: Callable[[str], list[Piece]], rec: Recovery) -> list[EvalChunk]:
    """Run ``split`` (text → [(chunk text, start or None[, embed text])]) per document, pin each chunk down."""
    out: list[EvalChunk] = []
    for rel, text in docs:
        cache: list[Skeleton] = []

        def skeleton(text: str = text, cache: list[Skeleton] = cache) -> Skeleton:
            if not cache:
                cache.append(Skeleton(text))
            return cache[0]

        cursor = 0
        for n, got in enumerate(split(text)):
            piece, start = got[0], got[1]
            embed = got[2] if len(got) == 3 else piece  # type: ignore[misc]
            if not piece.strip():
                continue
            if start is not None and text[start : start + len(piece)] == piece:
                rec.given += 1
                span: tuple[int, int] | None = (start, start + len(piece))
            else:
                span = locate(text, piece, cursor, skeleton, rec)
            if span is None:
                continue
            cursor = span[0]
            out.append(EvalChunk(f"{name}:{rel}#{n}", rel, span[0], span[1], text[span[0] : span[1]], embed))
    return out


# -- the chunkers ---------------------------------------------------------------------------


def _encoding():  # type: ignore[no-untyped-def]
    from pipeline.stages.tokens import get_encoding

    return get_encoding("cl100k_base")


def _count() -> Callable[[str], int]:
    encode = _encoding().encode_ordinary
    return lambda t: len(encode(t))


def langchain_header_recursive(docs: list[Doc], rec: Recovery) -> list[EvalChunk]:
    from langchain_text_splitters import MarkdownHeaderTextSplitter, RecursiveCharacterTextSplitter

    headers = MarkdownHeaderTextSplitter([("#" * n, f"h{n}") for n in range(1, 7)])
    rec_split = RecursiveCharacterTextSplitter(chunk_size=TARGET, chunk_overlap=OVERLAP, length_function=_count())

    def split(text: str) -> list[Piece]:
        return [(d.page_content, None) for d in rec_split.split_documents(headers.split_text(text))]

    return place("lc-hr", docs, split, rec)


def langchain_recursive(docs: list[Doc], rec: Recovery) -> list[EvalChunk]:
    from langchain_text_splitters import RecursiveCharacterTextSplitter

    splitter = RecursiveCharacterTextSplitter(
        chunk_size=TARGET, chunk_overlap=OVERLAP, length_function=_count(), add_start_index=True
    )

    def split(text: str) -> list[Piece]:
        return [(d.page_content, d.metadata.get("start_index")) for d in splitter.create_documents([text])]

    return place("lc-r", docs, split, rec)


def llamaindex_markdown_sentence(docs: list[Doc], rec: Recovery) -> list[EvalChunk]:
    from llama_index.core import Document
    from llama_index.core.node_parser import MarkdownNodeParser, SentenceSplitter
    from llama_index.core.schema import MetadataMode

    markdown = MarkdownNodeParser()
    sentences = SentenceSplitter(chunk_size=TARGET, tokenizer=_encoding().encode_ordinary)

    def split(text: str) -> list[Piece]:
        nodes = sentences.get_nodes_from_documents(markdown.get_nodes_from_documents([Document(text=text)]))
        # what LlamaIndex embeds by default: the text with its metadata (the header path)
        return [(n.get_content(), None, n.get_content(MetadataMode.EMBED)) for n in nodes]

    return place("li-ms", docs, split, rec)


def chonkie_recursive(docs: list[Doc], rec: Recovery) -> list[EvalChunk]:
    from chonkie import RecursiveChunker

    chunker = RecursiveChunker(tokenizer=_encoding(), chunk_size=TARGET)  # type: ignore[arg-type]

    def split(text: str) -> list[Piece]:
        return [(c.text, c.start_index) for c in chunker.chunk(text)]

    return place("chonkie", docs, split, rec)


def fixed_windows(size: int, step: int) -> Callable[[list[Doc], Recovery], list[EvalChunk]]:
    def chunk(docs: list[Doc], rec: Recovery) -> list[EvalChunk]:
        enc = _encoding()

        def split(text: str) -> list[Piece]:
            tokens = enc.encode_ordinary(text)
            if not tokens:
                return []
            decoded, starts = enc.decode_with_offsets(tokens)
            assert decoded == text, "tiktoken round trip"
            out = []
            for i in range(0, len(tokens), step):
                a = starts[i]
                b = starts[i + size] if i + size < len(tokens) else len(text)
                out.append((text[a:b], a))
                if i + size >= len(tokens):
                    break
            return out

        return place(f"fixed{size}", docs, split, rec)

    return chunk


PEERS: dict[str, Callable[[list[Doc], Recovery], list[EvalChunk]]] = {
    "langchain-header-recursive": langchain_header_recursive,
    "langchain-recursive": langchain_recursive,
    "llamaindex-markdown-sentence": llamaindex_markdown_sentence,
    "chonkie-recursive": chonkie_recursive,
    "fixed-800-400": fixed_windows(800, 400),
    "fixed-256": fixed_windows(256, 256),
}


CHUNKYARD = re.compile(r"chunkyard-(wp)?(\d+)(-original|-lead|-desc)?")
#: chunkyard's own sets by default: the default policy (512 cl100k), 256, and 256 embedding originalText.
DEFAULT_OURS = ("chunkyard-512", "chunkyard-256", "chunkyard-256-original")


def chunkyard(corpus: Path, scratch: Path, name: str) -> tuple[list[EvalChunk], Path]:
    """``chunkyard ingest`` per ``name`` into ``scratch``, read back from the chunk files, and the folder.

    ``chunkyard-N``: ``--target-tokens N`` (cl100k); ``chunkyard-wpN``: ``--tokenizer wordpiece
    --target-tokens N`` (the embedder's own units); a ``-original`` suffix embeds
    ``originalText`` instead of ``embedText`` (no breadcrumb); ``-lead`` adds the section's
    first sentence after the breadcrumb of a chunk that does not start its section;
    ``-desc`` adds the document's front-matter ``description`` (when it has one).
    """
    m = CHUNKYARD.fullmatch(name)
    if m is None:
        raise SystemExit(f"{name}: not a chunkyard set (hint: chunkyard-N, chunkyard-wpN, chunkyard-N-original)")
    wordpiece, target = bool(m.group(1)), int(m.group(2))
    out = scratch / f"{corpus.name}-{'wp' if wordpiece else ''}{target}"
    extra = ["--tokenizer", "wordpiece"] if wordpiece else []
    overlap = ["--overlap-tokens", str(min(64, target // 4))]
    subprocess.run(
        [sys.executable, "-m", "pipeline", "ingest", str(corpus), "--out", str(out), "--target-tokens", str(target),
         *overlap, *extra, "--quiet"],
        check=True,
        cwd=REPO,
    )
    chunks = load_chunk_files(out, embed_original=m.group(3) == "-original")
    if m.group(3) in ("-lead", "-desc"):
        chunks = with_context(out, chunks, corpus, m.group(3))
    if wordpiece:  # the metrics' budgets are in cl100k: count the text again, not in wordpieces
        count = _count()
        chunks = [replace(c, tokens=count(c.text)) for c in chunks]
    return chunks, out


_SENTENCE = re.compile(r"(.+?[.!?])(\s|$)", re.DOTALL)
_DESCRIPTION = re.compile(r"^description:\s*(.+)$", re.MULTILINE)


def with_context(out: Path, chunks: list[EvalChunk], corpus: Path, how: str) -> list[EvalChunk]:
    """``chunks`` whose embedded text carries one more line of context after the breadcrumb."""

    from pipeline.chunkfolder import iter_chunk_files, read_chunk_file

    records = {r["chunk_id"]: r for r in (read_chunk_file(out / rel) for rel in iter_chunk_files(out))}
    extra: dict[str, str] = {}
    if how == "-lead":
        lead: dict[tuple[str, str], str] = {}
        for r in sorted(records.values(), key=lambda r: (r["metadata"]["sourceFile"], r["charOffsets"]["charStart"])):
            key = (r["metadata"]["sourceFile"], r["section_id"])
            if key in lead:
                extra[r["chunk_id"]] = lead[key]
                continue
            body = "\n".join(line for line in r["originalText"].splitlines() if not line.startswith("#")).strip()
            found = _SENTENCE.match(" ".join(body.split()))
            lead[key] = found.group(1)[:300] if found else ""
    else:
        for source in {c.source for c in chunks}:
            head = (corpus / source).read_text(encoding="utf-8", errors="replace")[:3000]
            found = _DESCRIPTION.search(head.split("\n---", 1)[0]) if head.startswith("---") else None
            if found:
                for c in chunks:
                    if c.source == source:
                        extra[c.chunk_id] = found.group(1).strip().strip("'\"")
    out_chunks = []
    for c in chunks:
        line = extra.get(c.chunk_id)
        if line:
            head, sep, body = c.embed.partition("\n\n")
            c = replace(c, embed=f"{head}\n{line}{sep}{body}" if sep else f"{line}\n\n{c.embed}")
        out_chunks.append(c)
    return out_chunks


def chunk_sets(
    corpus: Path, scratch: Path, names: Iterable[str] | None = None
) -> tuple[dict[str, list[EvalChunk]], dict[str, dict[str, int]], dict[str, Path]]:
    """Every chunker's chunks of ``corpus`` (peers whose package is missing are skipped, with a note),
    the offsets' recovery per peer, and chunkyard's chunk folders."""
    sets: dict[str, list[EvalChunk]] = {}
    recovery: dict[str, dict[str, int]] = {}
    dirs: dict[str, Path] = {}
    wanted = list(names) if names else [*DEFAULT_OURS, *PEERS]
    for name in wanted:
        if name.startswith("chunkyard-"):
            sets[name], dirs[name] = chunkyard(corpus, scratch, name)
    docs = documents(corpus)
    for name, make in PEERS.items():
        if name not in wanted:
            continue
        rec = Recovery()
        try:
            sets[name] = make(docs, rec)
        except ImportError as exc:
            print(f"  {name}: skipped ({exc.name} is not installed: pip install -e '.[bench]')", file=sys.stderr)
            continue
        recovery[name] = rec.as_dict()
    return sets, recovery, dirs
