"""The runner: the one place that knows the stage order (docs/spec.md, "Stages").

``chunk_document`` is the pure function every executor maps over:
normalize → parse → sections → split → mint. It touches no disk: the I/O ends
(read, schema check, emit) are ``run.worker.process_document``'s, and a whole
corpus (discovery, the pool, state, feed) is ``run.ingest``'s.

Each stage takes the previous stage's value and returns a new one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pipeline._version import __version__
from pipeline.models import Chunk, Policy, SourceDoc
from pipeline.stages.mint import doc_uid, mint, sha1_8
from pipeline.stages.normalize import normalize
from pipeline.stages.parse import Lines, parse
from pipeline.stages.sections import build_sections, file_title, outline
from pipeline.stages.split import Splitter
from pipeline.stages.tokens import Counter

STAGES = ("read", "normalize", "parse", "sections", "split", "tokenize", "mint", "schema", "write")


@dataclass(slots=True)
class Timer:
    """Seconds spent per stage, summed over documents (for ``make bench``)."""

    seconds: dict[str, float] = field(default_factory=dict)
    _last: float = field(default_factory=time.perf_counter)

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + now - self._last
        self._last = now

    def move(self, source: str, stage: str, seconds: float) -> None:
        """Book ``seconds`` of ``source`` to ``stage`` instead (tokenizing, out of splitting)."""
        self.seconds[source] = self.seconds.get(source, 0.0) - seconds
        self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds


def chunk_document(
    raw: bytes,
    rel_path: str,
    policy: Policy,
    *,
    processed_at: str = "1970-01-01T00:00:00Z",
    rev_width: int = 8,
    timer: Timer | None = None,
) -> tuple[SourceDoc, list[Chunk]]:
    """Bytes of one Markdown file → its chunks. Pure: same input, same output."""
    t0 = time.perf_counter()
    timer = timer or Timer()
    doc = normalize(raw, rel_path)
    timer.lap("normalize")
    lines = Lines(doc.text)  # line arithmetic, shared by parse and mint
    blocks = parse(doc, lines)
    timer.lap("parse")
    sections = build_sections(blocks)
    title = file_title(doc, blocks)
    timer.lap("sections")
    tokens = counter(policy.tokenizer)
    spent = tokens.seconds
    splitter = Splitter(doc.text, title, policy, tokens)
    drafts = list(splitter.split(sections))
    timer.lap("split")
    timer.move("split", "tokenize", tokens.seconds - spent)
    chunks = mint(
        doc,
        drafts,
        title=title,
        outline_hash=sha1_8(outline(blocks), rev_width),
        policy=policy,
        uid=doc_uid(doc),
        processed_at=processed_at,
        processing_ms=round((time.perf_counter() - t0) * 1000, 3),
        version=__version__,
        lines=lines,
    )
    timer.lap("mint")
    return doc, chunks


_COUNTERS: dict[str, Counter] = {}


def counter(name: str) -> Counter:
    """One token counter per tokenizer per process (loading a vocabulary is slow)."""
    if name not in _COUNTERS:
        _COUNTERS[name] = Counter(name)
    return _COUNTERS[name]
