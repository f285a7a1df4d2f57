"""Pages for search results and evaluations, from their documented JSON shapes (SPEC §9, 001, 004).

``render_search`` takes 004's retrieval result record whose ``items`` carry 001's citation
payload (``doc_id``, ``section_id``, ``snippet_id``, ``source_url``, ``offsets {start, end,
unit}``, ``tokens``, ``index_hash``, ``embed_model``, ``analyzer``, ``rev``, ``score_raw``,
``score_norm``, ``k_pos``, ``k_final``) and optionally ``text``; each hit is shown inside
its source (read through the chunk store, so offsets are into the canonical text).

``render_eval`` takes 004's metrics pack and the per-question results. The pack is either
flat (``{"dataset": …, "recall@10": 0.9, …}``: one run) or holds one object of metrics per
run — per chunker or retrieval mode — at its top level or one level down
(``{"dataset": …, "modes": {"dense": {…}, "hybrid": {…}}}``). A per-question entry is
``{"id", "question", "source", "quote" | "start"/"end", "mode"?, "first_hit"?, "items": [...]}``
with ``items`` in rank order, each a citation payload with an optional ``hit`` flag; a
missing ``first_hit`` or ``hit`` is worked out with the gold set's rule (the item's span in
the answer's source covers at least half of the answer's span).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pipeline.audit.store import ChunkStore
from pipeline.view.page import page_bytes

CONTEXT_CHARS = 400  #: source text shown either side of a hit
HIT_COVERAGE = 0.5


def _offsets(item: Mapping[str, Any]) -> tuple[int, int] | None:
    off = item.get("offsets")
    if isinstance(off, Mapping) and isinstance(off.get("start"), int) and isinstance(off.get("end"), int):
        return int(off["start"]), int(off["end"])
    return None


def hit_context(
    item: Mapping[str, Any], text: str | None, context_chars: int = CONTEXT_CHARS
) -> dict[str, Any] | None:
    """The hit's span with ``context_chars`` of source either side, or None without a source."""
    span = _offsets(item)
    if text is None or span is None:
        return None
    start, end = span
    if not 0 <= start <= end <= len(text):
        return {
            "text": "",
            "offset": 0,
            "hit_start": 0,
            "hit_end": 0,
            "note": f"offsets [{start}, {end}) lie outside the source ({len(text)} chars): re-index",
        }
    lo, hi = max(0, start - context_chars), min(len(text), end + context_chars)
    ctx: dict[str, Any] = {"text": text[lo:hi], "offset": lo, "hit_start": start, "hit_end": end}
    said = item.get("text")
    if isinstance(said, str) and said != text[start:end]:
        ctx["note"] = "the source changed since this was indexed: the highlighted span is today's text"
    return ctx


def render_search(
    record: Mapping[str, Any],
    store: ChunkStore | None = None,
    *,
    sources: Mapping[str, str] | None = None,
    context_chars: int = CONTEXT_CHARS,
    title: str | None = None,
) -> bytes:
    """One page for a retrieval result record: each hit highlighted in its source, with its payload.

    The source of an item is its ``source_url`` (a corpus-relative path for chunkyard),
    looked up in ``sources`` (path → canonical text) first, then in ``store``'s corpus.
    """
    items = [it for it in record.get("items") or () if isinstance(it, Mapping)]
    texts: dict[str, str | None] = dict(sources or {})
    contexts: list[dict[str, Any] | None] = []
    for it in items:
        url = str(it.get("source_url") or "")
        if url not in texts:
            doc = store.source(url) if store is not None and url else None
            texts[url] = doc.text if doc is not None else None
        contexts.append(hit_context(it, texts[url], context_chars))
    plain = {k: v for k, v in record.items() if k != "items"}
    meta = {"kind": "search", "record": {**plain, "items": items}, "contexts": contexts}
    query = record.get("query") or record.get("text") or record.get("q_id") or ""
    return page_bytes(title or f"chunkyard search: {query}", meta)


def _numbers(obj: Mapping[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in obj.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def metric_series(pack: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Run name → metric → value, from a flat or nested metrics pack (see the module docstring)."""
    series: dict[str, dict[str, float]] = {}
    flat = _numbers(pack)
    if flat:
        series[str(pack.get("run") or pack.get("mode") or pack.get("chunker") or "all")] = flat
    for key, value in pack.items():
        if not isinstance(value, Mapping):
            continue
        nested = {k: v for k, v in value.items() if isinstance(v, Mapping)}
        if nested:
            for name, sub in nested.items():
                if _numbers(sub):
                    series[str(name)] = _numbers(sub)
        elif _numbers(value):
            series[str(key)] = _numbers(value)
    return series


def _coverage(item: Mapping[str, Any], q: Mapping[str, Any]) -> float:
    span = _offsets(item)
    start, end = q.get("start"), q.get("end")
    source = item.get("source_url") or item.get("source")
    if span is None or not isinstance(start, int) or not isinstance(end, int) or end <= start:
        return 0.0
    if source != q.get("source"):
        return 0.0
    return max(0, min(span[1], end) - max(span[0], start)) / (end - start)


def _question(q: Mapping[str, Any]) -> dict[str, Any]:
    items = []
    first = q.get("first_hit")
    for rank, it in enumerate(q.get("items") or (), 1):
        if not isinstance(it, Mapping):
            continue
        hit = it.get("hit")
        if not isinstance(hit, bool):
            hit = _coverage(it, q) >= HIT_COVERAGE
        items.append({**it, "hit": hit})
        if first is None and hit:
            first = rank
    return {**q, "items": items, "first_hit": first if isinstance(first, int) else None}


def render_eval(
    metrics_pack: Mapping[str, Any],
    per_query: Sequence[Mapping[str, Any]] = (),
    *,
    title: str | None = None,
) -> bytes:
    """One page for an evaluation: a bar chart per metric across runs, then each question's hits."""
    series = metric_series(metrics_pack)
    metrics: list[str] = []
    for values in series.values():
        metrics += [m for m in values if m not in metrics]
    dataset = str(metrics_pack.get("dataset") or "")
    meta = {
        "kind": "eval",
        "eval": {
            "dataset": dataset,
            "series": series,
            "metrics": metrics,
            "queries": [_question(q) for q in per_query if isinstance(q, Mapping)],
        },
    }
    return page_bytes(title or f"chunkyard eval: {dataset or 'gold set'}", meta)
