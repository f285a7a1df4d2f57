"""Pages for search results and evaluations, from their documented JSON shapes (001, 004).

The contract: docs/spec.md, "Index, search and evaluation".

``render_search`` takes 004's retrieval result record whose ``items`` carry 001's citation
payload (``doc_id``, ``section_id``, ``snippet_id``, ``source_url``, ``offsets {start, end,
unit}``, ``tokens``, ``index_hash``, ``embed_model``, ``analyzer``, ``rev``, ``score_raw``,
``score_norm``, ``k_pos``, ``k_final``) and optionally ``text``; each hit is shown inside
its source (read through the chunk store, so offsets are into the canonical text).

``render_eval`` takes 004's metrics pack and the per-question results. The pack is
chunkyard's (``schemas/metrics.schema.json``: one run per entry of ``modes``), or flat
(``{"dataset": …, "recall@10": 0.9, …}``: one run), or holds one object of metrics or one
pack per chunker (``{"md-heading-v1": {…}, "langchain": {…}}``). A per-question entry is
``{"id", "question", "source", "start", "end", "quote"?, "mode"?, "first_hit"?, "items"}``
(``eval_rows`` builds them from gold questions and runs) with ``items`` in rank order, each
a search item or citation payload with an optional ``hit`` flag; a missing ``hit`` is
worked out with the gold set's rule (the item's span in the answer's source covers at least
half of the answer's span), a missing ``first_hit`` taken from the pack's ``per_query`` row.
The item's path and span are read as ``evaluate`` reads them (``file`` before ``source`` and
``source_url``; ``offsets``, ``charOffsets`` or ``start``/``end``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from pipeline.audit.chunk_state import ChunkStore
from pipeline.view.page import page_bytes

CONTEXT_CHARS = 400  #: source text shown either side of a hit
HIT_COVERAGE = 0.5  #: the gold set's hit rule: the item covers at least half of the answer


def _first(item: Mapping[str, Any], *names: str) -> Any:
    """The first of the (dotted) fields ``names`` that ``item`` has."""
    for name in names:
        value: Any = item
        for part in name.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        if value is not None:
            return value
    return None


def _path_of(item: Mapping[str, Any]) -> str:
    """The corpus-relative source path: ``file`` (chunkyard search), a chunk record's
    ``metadata.sourceFile``, then ``source`` / ``source_url`` (as ``evaluate`` reads items)."""
    return str(_first(item, "file", "metadata.sourceFile", "sourceFile", "source", "source_url") or "")


def _span_of(item: Mapping[str, Any]) -> tuple[int, int] | None:
    start = _first(item, "offsets.start", "charOffsets.charStart", "charStart", "start")
    end = _first(item, "offsets.end", "charOffsets.charEnd", "charEnd", "end")
    if isinstance(start, int) and isinstance(end, int) and not isinstance(start | end, bool):
        return start, end
    return None


def hit_context(
    item: Mapping[str, Any], text: str | None, context_chars: int = CONTEXT_CHARS
) -> dict[str, Any] | None:
    """The hit's span with ``context_chars`` of source either side, or None without a source."""
    span = _span_of(item)
    if text is None or span is None:
        return None
    start, end = span
    if not 0 <= start <= end <= len(text):
        return {
            "text": "",
            "offset": 0,
            "hit_start": start,
            "hit_end": end,
            "note": f"offsets [{start}, {end}) lie outside the source ({len(text)} chars): re-index",
        }
    lo, hi = max(0, start - context_chars), min(len(text), end + context_chars)
    ctx: dict[str, Any] = {"text": text[lo:hi], "offset": lo, "hit_start": start, "hit_end": end}
    said = _first(item, "originalText", "text")
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

    The source of an item is its corpus-relative path (``file``, else ``source`` or
    ``source_url``: see ``_path_of``), looked up in ``sources`` (path → canonical text)
    first, then in ``store``'s corpus.
    """
    items = [it for it in record.get("items") or () if isinstance(it, Mapping)]
    texts: dict[str, str | None] = dict(sources or {})
    contexts: list[dict[str, Any] | None] = []
    for it in items:
        path = _path_of(it)
        if path not in texts:
            doc = store.source(path) if store is not None and path else None
            texts[path] = doc.text if doc is not None else None
        ctx = hit_context(it, texts[path], context_chars)
        if ctx is not None:
            ctx["path"] = path
        contexts.append(ctx)
    plain = {k: v for k, v in record.items() if k != "items"}
    meta = {"kind": "search", "record": {**plain, "items": items}, "contexts": contexts}
    query = record.get("query") or record.get("text") or record.get("q_id") or ""
    return page_bytes(title or f"chunkyard search: {query}", meta)


#: Metric names as the metrics pack's schema admits them; other packs' 0–1 scores also count.
METRIC = re.compile(r"^(recall@[0-9]+(tok)?|MRR@[0-9]+|nDCG@[0-9]+|citation_match)$")
NOT_METRICS = frozenset({"questions", "retrieved", "k", "k_pos", "k_final", "first_hit", "first_full_hit"})


def _metrics(obj: Mapping[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in obj.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or k in NOT_METRICS:
            continue
        if METRIC.match(k) or 0 <= v <= 1:
            out[k] = float(v)
    return out


def _modes(pack: Mapping[str, Any], prefix: str = "") -> dict[str, dict[str, float]]:
    """``modes: {name: {"metrics": {…}}}`` (chunkyard's pack) or ``{name: {metric: value}}``."""
    series = {}
    for name, sub in (pack.get("modes") or {}).items():
        if isinstance(sub, Mapping):
            inner = sub.get("metrics")
            values = _metrics(inner if isinstance(inner, Mapping) else sub)
            if values:
                series[f"{prefix}{name}"] = values
    return series


def metric_series(pack: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Run name → metric → value, from a metrics pack (see the module docstring).

    chunkyard's pack (``schemas/metrics.schema.json``): one run per entry of ``modes``. A
    flat pack (004's example): one run, named by its ``mode`` or ``all``. Otherwise one
    run per top-level object of metrics, or per pack (``{"md-heading-v1": pack, …}``:
    one run per chunker and mode).
    """
    if isinstance(pack.get("modes"), Mapping):
        series = _modes(pack)
        if series:
            return series
    flat = _metrics(pack)
    if flat:
        return {str(pack.get("mode") or pack.get("run") or pack.get("chunker") or "all"): flat}
    series = {}
    for key, value in pack.items():
        if not isinstance(value, Mapping):
            continue
        if isinstance(value.get("modes"), Mapping):
            series.update(_modes(value, f"{key} · "))
        elif all(isinstance(v, Mapping) for v in value.values()) and value:
            series.update({f"{name}": _metrics(sub) for name, sub in value.items() if _metrics(sub)})
        elif _metrics(value):
            series[str(key)] = _metrics(value)
    return series


def _item_row(item: Mapping[str, Any], q: Mapping[str, Any]) -> dict[str, Any]:
    """What the page shows of one ranked item, and whether it hits the answer (the gold rule)."""
    path = _path_of(item)
    span = _span_of(item)
    hit = item.get("hit")
    if not isinstance(hit, bool):
        start, end = q.get("start"), q.get("end")
        hit = False
        if (
            span
            and isinstance(start, int)
            and isinstance(end, int)
            and end > start
            and path == q.get("source")
        ):
            hit = max(0, min(span[1], end) - max(span[0], start)) / (end - start) >= HIT_COVERAGE
    score = _first(item, "score_norm", "score", "score_raw")
    return {
        "id": str(_first(item, "snippet_id", "chunk_id", "id") or ""),
        "path": path,
        "start": span[0] if span else None,
        "end": span[1] if span else None,
        "score": score if isinstance(score, int | float) else None,
        "hit": hit,
    }


def _question(q: Mapping[str, Any], scored: Mapping[tuple[str, str], Mapping[str, Any]]) -> dict[str, Any]:
    items = [_item_row(it, q) for it in q.get("items") or () if isinstance(it, Mapping)]
    row = {k: v for k, v in q.items() if k != "items"}
    row["items"] = items
    for key, value in scored.get((str(q.get("mode") or ""), str(q.get("id"))), {}).items():
        row.setdefault(key, value)
    if row.get("first_hit") is None:
        row["first_hit"] = next((n for n, it in enumerate(items, 1) if it["hit"]), None)
    return row


def eval_rows(
    gold: Sequence[Any], runs: Mapping[str, Mapping[str, Sequence[Mapping[str, Any]]]], top: int = 10
) -> list[dict[str, Any]]:
    """``render_eval``'s per-question entries from gold questions (``id``, ``question``,
    ``source``, ``start``, ``end``, ``text`` attributes) and runs (mode → question id →
    ranked items), each question's first ``top`` items per mode."""
    rows = []
    for mode, run in runs.items():
        for g in gold:
            rows.append(
                {
                    "id": g.id,
                    "question": g.question,
                    "source": g.source,
                    "start": g.start,
                    "end": g.end,
                    "quote": getattr(g, "text", None),
                    "mode": mode,
                    "items": list(run.get(g.id, ()))[:top],
                }
            )
    return rows


def render_eval(
    metrics_pack: Mapping[str, Any],
    per_query: Sequence[Mapping[str, Any]] = (),
    *,
    title: str | None = None,
) -> bytes:
    """One page for an evaluation: a bar chart per metric across runs, then each question's hits.

    Without ``per_query`` the pack's own ``per_query`` rows are shown (ranks only); with
    it, the pack's rows fill in what an entry lacks (``first_hit``, ``first_full_hit``,
    ``citation``), matched by mode and question id.
    """
    series = metric_series(metrics_pack)
    metrics: list[str] = []
    for values in series.values():
        metrics += [m for m in values if m not in metrics]
    packed = [r for r in metrics_pack.get("per_query") or () if isinstance(r, Mapping)]
    scored = {
        (str(r.get("mode") or ""), str(r.get("id"))): {
            k: r[k] for k in ("first_hit", "first_full_hit", "citation", "retrieved") if k in r
        }
        for r in packed
    }
    entries = per_query or packed
    dataset = str(metrics_pack.get("dataset") or "")
    meta = {
        "kind": "eval",
        "eval": {
            "dataset": dataset,
            "series": series,
            "metrics": metrics,
            "queries": [_question(q, scored) for q in entries if isinstance(q, Mapping)],
        },
    }
    return page_bytes(title or f"chunkyard eval: {dataset or 'gold set'}", meta)
