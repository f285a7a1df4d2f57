"""Gold sets: a question plus where its answer lives in the source, never a chunk id.

The contract: docs/spec.md, "Index, search and evaluation".

A gold file is JSON Lines; each line is an object with

- ``id``: unique within the file;
- ``question``: the question as a user would ask it;
- ``source``: the document's path relative to the corpus root (``/``-separated);
- ``quote``: the answer's text, verbatim, found exactly once in the source's canonical text
  (strict UTF-8, BOM dropped, CRLF/CR → LF), **or** ``start``/``end``: character offsets
  (Unicode code points) into that text; with both, they must agree;
- ``kind`` (optional): ``code``, ``table``, ``list`` or ``prose``.

Other fields are ignored, blank lines and lines starting with ``#`` are skipped. Because the
answer is anchored in the source, a gold set outlives re-chunking, policy changes and
redirects; only an edit of the answer's own text breaks it, and then ``load_gold`` says which
line and how to fix it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from ..errors import UsageError
from ..stages.mint import text_rev
from ..stages.normalize import decode

KINDS = frozenset({"code", "table", "list", "prose"})
#: A quote this short is too easily ambiguous, and too small to judge a chunk by.
MIN_QUOTE_CHARS = 20


class GoldError(UsageError):
    """A gold line is malformed or does not resolve against the corpus (exit code 2)."""

    def __init__(self, where: str, problem: str, hint: str) -> None:
        super().__init__(f"{where}: gold: {problem} (hint: {hint})")
        self.where = where
        self.problem = problem
        self.hint = hint


@dataclass(frozen=True, slots=True)
class GoldQuestion:
    """One resolved gold line: the answer is ``canonical(source)[start:end]``."""

    id: str
    question: str
    source: str
    start: int
    end: int
    text: str
    """The answer's text, ``canonical[start:end]``."""
    kind: str | None
    line: int
    """1-based line of the gold file (0 when built in code)."""


@dataclass(frozen=True, slots=True)
class SourceText:
    """A source document's canonical text and its ``rev``."""

    path: str
    text: str
    rev: str


class Sources:
    """Canonical source texts under one corpus root, read once each."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._cache: dict[str, SourceText] = {}

    def get(self, source: str, where: str = "") -> SourceText:
        """The canonical text of ``source``; ``GoldError`` if it is not a readable document."""
        hit = self._cache.get(source)
        if hit is not None:
            return hit
        rel = PurePosixPath(source)
        if not source or rel.is_absolute() or ".." in rel.parts or "\\" in source:
            raise GoldError(
                where or source,
                f"source {source!r} is not a corpus-relative path",
                "write the path relative to the corpus root with '/' separators",
            )
        path = self.root.joinpath(*rel.parts)
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise GoldError(
                where or source,
                f"source {source!r} cannot be read under {self.root} ({exc.strerror})",
                "check the path (it is relative to the corpus root) and the corpus argument",
            ) from None
        text = decode(raw, source)
        doc = SourceText(source, text, text_rev(text))
        self._cache[source] = doc
        return doc


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def resolve_quote(text: str, quote: str, where: str, source: str) -> tuple[int, int]:
    """The ``[start, end)`` of ``quote`` in ``text``; it must occur exactly once."""
    quote = quote.replace("\r\n", "\n").replace("\r", "\n")
    first = text.find(quote)
    if first < 0:
        squeezed = " ".join(quote.split())
        near = " ".join(text.split()).find(squeezed)
        hint = (
            "the text is there with other whitespace or line breaks: copy it from the file verbatim"
            if near >= 0
            else "the answer's text was edited or moved: copy the current text from the file, "
            "or give start/end offsets"
        )
        raise GoldError(where, f"quote not found in {source}", hint)
    second = text.find(quote, first + 1)
    if second >= 0:
        count, at = 2, second
        while (at := text.find(quote, at + 1)) >= 0:  # overlapping occurrences count too
            count += 1
        raise GoldError(
            where,
            f"quote occurs {count} times in {source} (lines {_line_of(text, first)} and "
            f"{_line_of(text, second)}{' …' if count > 2 else ''})",
            "lengthen the quote with nearby text until it is unique",
        )
    return first, first + len(quote)


def _field(obj: dict[str, Any], name: str, where: str, required: bool = True) -> Any:
    value = obj.get(name)
    if value is None and required:
        raise GoldError(where, f"missing field {name!r}", f'add "{name}" to the line')
    return value


def parse_line(obj: Any, where: str, line: int, sources: Sources) -> GoldQuestion:
    """Validate one decoded gold line and resolve its answer span."""
    if not isinstance(obj, dict):
        raise GoldError(
            where, f"a line is a {type(obj).__name__}, not an object", "write one JSON object per line"
        )
    qid = _field(obj, "id", where)
    if isinstance(qid, int) and not isinstance(qid, bool):
        qid = str(qid)
    question = _field(obj, "question", where)
    source = _field(obj, "source", where)
    for name, value in (("id", qid), ("question", question), ("source", source)):
        if not isinstance(value, str) or not value.strip():
            raise GoldError(where, f"{name!r} must be a non-empty string", f"fix the {name!r} field")
    kind = obj.get("kind")
    if kind is not None and kind not in KINDS:
        raise GoldError(
            where, f"kind {kind!r} is unknown", f"use one of {', '.join(sorted(KINDS))} or drop it"
        )
    doc = sources.get(source, where)
    quote, start, end = obj.get("quote"), obj.get("start"), obj.get("end")
    if quote is None and (start is None or end is None):
        raise GoldError(where, "no answer span", 'add a verbatim "quote", or "start" and "end" offsets')
    if quote is not None:
        if not isinstance(quote, str) or len(quote.strip()) < MIN_QUOTE_CHARS:
            raise GoldError(
                where,
                f"quote is shorter than {MIN_QUOTE_CHARS} characters",
                "quote the whole answer (a sentence, a list item, a code line or a table row)",
            )
        q_start, q_end = resolve_quote(doc.text, quote, where, source)
        if start is not None and (start, end) != (q_start, q_end):
            raise GoldError(
                where,
                f"start/end {start}..{end} disagree with the quote, found at {q_start}..{q_end}",
                "drop start/end, or fix them",
            )
        start, end = q_start, q_end
    if (
        not (isinstance(start, int) and isinstance(end, int))
        or isinstance(start, bool)
        or isinstance(end, bool)
    ):
        raise GoldError(where, "start/end must be integers", "give character offsets as integers")
    if not 0 <= start < end <= len(doc.text):
        raise GoldError(
            where,
            f"offsets {start}..{end} are outside {source} ({len(doc.text)} characters)",
            "offsets count code points of the canonical text, start < end",
        )
    return GoldQuestion(qid, question, source, start, end, doc.text[start:end], kind, line)


def parse_gold(lines: Iterable[str], name: str, corpus: Path) -> list[GoldQuestion]:
    """Parse gold lines (``name`` is used in messages) and resolve them against ``corpus``."""
    sources = Sources(corpus)
    out: list[GoldQuestion] = []
    seen: dict[str, int] = {}
    for n, raw in enumerate(lines, 1):
        text = raw.strip()
        if not text or text.startswith("#"):
            continue
        where = f"{name}:{n}"
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise GoldError(
                where, f"not valid JSON ({exc.msg}, column {exc.colno})", "fix the line"
            ) from None
        q = parse_line(obj, where, n, sources)
        if q.id in seen:
            raise GoldError(
                where, f"id {q.id!r} already used on line {seen[q.id]}", "give each question its own id"
            )
        seen[q.id] = n
        out.append(q)
    if not out:
        raise GoldError(name, "no gold lines", "write one JSON object per line")
    return out


def load_gold(path: Path, corpus: Path) -> list[GoldQuestion]:
    """Read and resolve a gold file against the corpus root its ``source`` paths are relative to."""
    try:
        data = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise GoldError(str(path), f"cannot read the gold file ({exc})", "check the path") from None
    return parse_gold(data.splitlines(), str(path), corpus)
