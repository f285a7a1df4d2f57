"""What chunkyard could do at search time, measured on the same chunks (issue 17, point 4).

Each variant is built from an already indexed chunk set, so it costs no new chunking, and
embeds only what it adds:

- ``<set>+expand<B>``: the search's items expanded by ``pipeline.index.expand`` (the hit
  plus its neighbours in the same section, one citation span, at most ``B`` tokens).
- ``search``: not the bench's stand-in retriever but chunkyard's own index and search with
  **default settings** (``chunkyard index``: SQLite FTS5 + sqlite-vec; ``Searcher()``, so
  passages merged as ``chunkyard search`` returns them) over the folder of ``DEFAULT_SET``
  (the ingest default's budget), with the bench's cached embedder. Options after ``+``,
  joined by ``+``, change one setting each: ``merge<B>`` (passage budget; ``merge0`` = plain
  chunks), ``expand<B>`` (plain search, then growth into unranked neighbours too),
  ``rrf<K>`` (reciprocal rank fusion with constant K instead of the default z-score fusion), ``wd<W>`` (dense weight in tenths, BM25 weight 1),
  ``prompt<P>`` (the prompt the passages share, ``expand.shared_budget``; ``prompt0``: fixed passages),
  ``floor<F>`` (a later passage of a shared prompt takes at least F tokens, not half the budget),
  ``win<N>`` (BM25 windows of N neighbours a side; ``win0``: each chunk alone),
  ``section`` (passages kept inside the hit's section instead of growing across headings
  within its document), ``lang<code>`` (the index built with ``--lang <code>``: ``langen`` the
  default analyzer, ``langzh`` the CJK bigrams; without it the language is detected), and
  ``@<set>`` at the end another chunk set (``search+merge512@chunkyard-256``).
- ``<set>+merge<B>``: the same, growing only into neighbours that the search ranked too
  (adjacent hits merge into one passage; no budget spent on unranked text).
- ``<set>+zscore``: the stand-in's BM25 and dense lists fused by z-score, as ``chunkyard
  search`` fuses since issue 17 (the peers' rows use reciprocal rank fusion, k = 60).
- ``<set>+multi<W>``: several vectors per chunk: the chunk's text cut into windows of at
  most ``W`` of the embedder's wordpieces (whole paragraphs when they fit), each embedded
  with the chunk's breadcrumb line; a chunk's dense score is the best of its windows
  (max-pooled at query time). BM25 is unchanged.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import orjson

from pipeline.evaluate.chunks import EvalChunk, iter_chunk_files
from pipeline.index.expand import ChunkSpan, chunk_spans, expand


def _default_set() -> str:
    from pipeline.models import Policy

    return f"chunkyard-{Policy().target_tokens}"


#: The chunk set the ``search`` rows run over unless ``@<set>`` names another: the ingest default.
DEFAULT_SET = _default_set()


def spans_of(chunk_dir: Path, count: Callable[[str], int]) -> dict[str, ChunkSpan]:
    """The chunk folder's spans, tokens counted with ``count`` (the metrics' cl100k, whatever the policy's)."""
    records = [orjson.loads(p.read_bytes()) for p in iter_chunk_files(chunk_dir)]
    for rec in records:
        rec["tokenStats"] = {**rec["tokenStats"], "tokens": count(rec["originalText"])}
    return chunk_spans(records)


class Expanded:
    """A search whose items are expanded into same-section passages of at most ``budget`` tokens."""

    def __init__(self, search: Any, spans: Mapping[str, ChunkSpan], budget: int, ranked_only: bool = False) -> None:
        self.search = search
        self.ranked_only = ranked_only
        self.spans = spans
        self.budget = budget
        self.modes: tuple[str, ...] = search.modes

    def __call__(self, query: str, mode: str, k: int) -> list[dict[str, Any]]:
        return expand(self.search(query, mode, k), self.spans.get, self.budget, ranked_only=self.ranked_only)


_PARAGRAPH = re.compile(r"\n\s*\n")


def windows(embed_text: str, count: Callable[[str], int], size: int) -> list[str]:
    """``embed_text`` as windows of at most ``size`` wordpieces, each led by its breadcrumb line."""
    head, sep, body = embed_text.partition("\n\n")
    if not sep:
        head, body = "", embed_text
    budget = max(16, size - count(head))
    out: list[str] = []
    current: list[str] = []
    used = 0
    for para in _PARAGRAPH.split(body):
        n = count(para)
        if n > budget:  # a long paragraph or code block: cut by words
            if current:
                out.append("\n\n".join(current))
                current, used = [], 0
            words = para.split(" ")
            piece: list[str] = []
            for word in words:
                piece.append(word)
                if count(" ".join(piece)) > budget:
                    piece.pop()
                    if piece:
                        out.append(" ".join(piece))
                    piece = [word]
            if piece:
                out.append(" ".join(piece))
            continue
        if used + n > budget and current:
            out.append("\n\n".join(current))
            current, used = [], 0
        current.append(para)
        used += n
    if current:
        out.append("\n\n".join(current))
    return [f"{head}\n\n{w}" if head else w for w in out] or [embed_text]


def multi_vector(base: Any, chunks: Sequence[EvalChunk], embed: Any, size: int) -> Any:
    """``base`` (a ``MemoryRetriever``) with each chunk's dense score the max over its windows."""
    import numpy as np

    count = embed.model.count_tokens
    owner: list[int] = []
    texts: list[str] = []
    for i, chunk in enumerate(chunks):
        for w in windows(chunk.embed, count, size):
            owner.append(i)
            texts.append(w)
    vectors = embed(texts)
    owners = np.asarray(owner)

    class MultiVector(type(base)):  # type: ignore[misc]
        def dense(self, query: str) -> list[tuple[int, float]]:
            sims = vectors @ self.embed([query])[0]
            best = np.full(len(self.chunks), -np.inf, dtype=np.float32)
            np.maximum.at(best, owners, sims)
            return self._top(enumerate(best.tolist()))

    clone = object.__new__(MultiVector)
    clone.__dict__.update(base.__dict__)
    return clone


def _refused(base: Any, fusion: str) -> Any:
    """``base`` (a ``MemoryRetriever``) with another hybrid fusion, sharing its index and vectors."""
    clone = object.__new__(type(base))
    clone.__dict__.update(base.__dict__)
    clone.fusion = fusion
    return clone


class IndexSearch:
    """chunkyard's own index over a chunk folder, asked as a ``Search`` (``Searcher`` with ``options``)."""

    modes: tuple[str, ...] = ("bm25", "dense", "hybrid")

    def __init__(
        self, chunk_dir: Path, embed: Any, options: Mapping[str, Any], grow: int = 0, lang: str | None = None
    ) -> None:
        from pipeline.evaluate.run import prompt_search

        options = dict(options)
        self.floor: int | None = options.pop("floor", None)
        from pipeline.index.query import Searcher
        from pipeline.index.sync import index

        # one index per embedder and language, so that runs with another --embedder or +lang coexist
        slug = re.sub(r"[^A-Za-z0-9]+", "-", f"{embed.name}-{lang or 'auto'}")
        store = str(chunk_dir / ".chunkyard" / f"index-{slug}.sqlite")
        report = index(chunk_dir, store, embedder=embed, lang=lang)
        print(f"    index: {report}"[:300], file=sys.stderr)
        from pipeline.audit.chunk_state import open_store

        corpus = open_store(chunk_dir).corpus
        self.searcher = Searcher(chunk_dir, store, embedder=embed, corpus=corpus, **options)
        # the prompt's view: tokens counted again in cl100k; ``grow``: into unranked neighbours too
        self.search = prompt_search(self.searcher, chunk_dir, corpus, grow, ranked_only=False)

    def __call__(self, query: str, mode: str, k: int) -> list[dict[str, Any]]:
        if self.floor is None:
            return list(self.search(query, mode, k))
        import pipeline.index.expand as expand_module

        shared, floor = expand_module.shared_budget, self.floor
        # the bench only: the floor of ``shared_budget`` replaced while this search runs
        expand_module.shared_budget = lambda budget, prompt, used: max(floor, min(budget, (prompt - used) // 2))
        try:
            return list(self.search(query, mode, k))
        finally:
            expand_module.shared_budget = shared


def search_options(rest: str) -> tuple[dict[str, Any], int, str | None] | None:
    """``merge768+rrf30@chunkyard-256`` → (Searcher options, unranked growth, chunk set); None if malformed.
    ``lang<code>`` (``langen``, ``langzh``) goes into the options as ``lang`` (the index's ``--lang``)."""
    rest, _, source = rest.partition("@")
    options: dict[str, Any] = {}
    grow = 0
    for part in [p for p in rest.split("+") if p]:
        if part == "section":  # passages kept inside the hit's section (the default before they crossed headings)
            options["passage_scope"] = "section"
            continue
        if part.startswith("lang") and part[4:].isalpha():
            options["lang"] = part[4:]
            continue
        m = re.fullmatch(r"(merge|expand|rrf|wd|win|prompt|floor)(\d+)", part)
        if m is None:
            return None
        value = int(m.group(2))
        if m.group(1) == "merge":
            options["expand_tokens"] = value
        elif m.group(1) == "expand":
            options["expand_tokens"], grow = 0, value
        elif m.group(1) == "rrf":
            options["rrf_k"], options["fusion"] = value, "rrf"
        elif m.group(1) == "win":
            options["bm25_window"] = value
        elif m.group(1) == "prompt":  # the prompt the passages share (0: fixed passages)
            options["prompt"] = value
        elif m.group(1) == "floor":  # a later passage's least share of that prompt (IndexSearch)
            options["floor"] = value
        else:
            options["weights"] = (1.0, value / 10)
    return options, grow, source or None


def variant_searches(
    names: Sequence[str], built: Mapping[str, Any], sets: Mapping[str, Sequence[EvalChunk]],
    chunk_dirs: Mapping[str, Path], embed: Any, count: Callable[[str], int],
) -> dict[str, tuple[str, Callable[[], Any]]]:
    """``name → (base set, make search)`` for each variant name like ``chunkyard-256+expand512``."""
    out: dict[str, tuple[str, Callable[[], Any]]] = {}
    for name in names:
        base, _, rest = name.partition("+")
        if base == "search" or base.startswith("search@"):
            rest = rest + base.removeprefix("search")  # ``search@set`` carries its set in the base
            parsed = search_options(rest)
            source = (parsed[2] if parsed else None) or DEFAULT_SET
            if parsed is None or source not in chunk_dirs or embed is None:
                print(f"  {name}: skipped (malformed, or needs the {source} set and an embedder)", file=sys.stderr)
                continue
            options, grow = dict(parsed[0]), parsed[1]
            lang = options.pop("lang", None)
            out[name] = (source, lambda d=chunk_dirs[source], o=options, g=grow, la=lang: IndexSearch(d, embed, o, g, la))
            continue
        if base not in built:
            print(f"  {name}: skipped (no chunk set {base})", file=sys.stderr)
            continue
        if rest == "zscore":  # the stand-in's lists fused as chunkyard search fuses them
            out[name] = (base, lambda b=base: _refused(built[b], "zscore"))
            continue
        kind = re.fullmatch(r"(expand|merge|multi)(\d+)", rest)
        if kind is None:
            raise SystemExit(f"{name}: unknown variant (hint: <set>+expand<B> or <set>+multi<W>)")
        size = int(kind.group(2))
        if kind.group(1) in ("expand", "merge") and base in chunk_dirs:
            directory, merge = chunk_dirs[base], kind.group(1) == "merge"
            out[name] = (base, lambda b=base, d=directory, s=size, m=merge: Expanded(built[b], spans_of(d, count), s, m))
        elif kind.group(1) == "multi" and embed is not None:
            out[name] = (base, lambda b=base, s=size: multi_vector(built[b], sets[b], embed, s))
        else:
            print(f"  {name}: skipped (expand needs chunkyard's chunk files, multi an embedder)", file=sys.stderr)
    return out
