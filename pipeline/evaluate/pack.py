"""004's metrics pack: one JSON record per evaluation, committed per change (``schemas/metrics.schema.json``).

The record carries 004's envelope (``schema_version``, ``event``, ``ts``, ``trace_id``,
``agent_id``, ``mem_rev``, ``mem_hash``), the headline metrics of one mode at the top level
(as 004's example: ``"nDCG@10": 0.62``), every mode under ``modes``, and with
``per_query`` one row per question and mode. ``mem_hash`` is the gold file's sha256, so
two packs compare only when they were scored on the same questions; ``mem_rev`` is the
index's ``index_hash`` when there is one.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

from .metrics import BUDGETS, HIT_COVERAGE, STRICT_COVERAGE, ModeReport

SCHEMA_ID = "https://chunkyard.dev/schemas/metrics.schema.json"
SCHEMA_VERSION = "1.0.0"
#: The mode whose metrics are the pack's headline, the first present in this order.
HEADLINE_ORDER = ("hybrid", "dense", "bm25")


def gold_digest(path: Path) -> str:
    """``sha256:<hex>`` of a gold file's bytes."""
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def headline_mode(reports: Mapping[str, ModeReport]) -> str:
    """``hybrid`` if evaluated, else ``dense``, else ``bm25``, else the first mode."""
    return next((m for m in HEADLINE_ORDER if m in reports), next(iter(reports)))


def _round(metrics: Mapping[str, float]) -> dict[str, float]:
    return {k: round(v, 5) for k, v in metrics.items()}  # 5 places, as BEIR reports


def metrics_pack(
    reports: Mapping[str, ModeReport],
    *,
    dataset: str,
    gold_hash: str,
    index: Mapping[str, Any] | None = None,
    budgets: Sequence[int] = BUDGETS,
    tokenizer: str = "cl100k_base",
    per_query: bool = False,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Build the pack from ``evaluate_modes``' reports (at least one mode)."""
    if not reports:
        raise ValueError("metrics_pack needs at least one mode")
    head = headline_mode(reports)
    first = reports[head]
    stamp = (now or datetime.now(UTC)).astimezone(UTC)
    pack: dict[str, Any] = {
        "$schema": SCHEMA_ID,
        "schema_version": SCHEMA_VERSION,
        "event": "eval.run",
        "ts": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "trace_id": str(uuid.uuid4()),
        "agent_id": "system",
        "mem_rev": (index or {}).get("index_hash"),
        "mem_hash": gold_hash,
        "dataset": dataset,
        "questions": first.questions,
        "hit_rule": {"coverage": HIT_COVERAGE, "strict_coverage": STRICT_COVERAGE, "unit": "char"},
        "budgets": {"tokens": list(budgets), "tokenizer": tokenizer},
        "index": dict(index) if index else None,
        "mode": head,
        **_round(first.metrics),
        "modes": {
            mode: {"questions": r.questions, "metrics": _round(r.metrics), "strict": _round(r.strict)}
            for mode, r in reports.items()
        },
    }
    if per_query:
        pack["per_query"] = [
            {
                "mode": mode,
                "id": s.id,
                "retrieved": s.retrieved,
                "first_hit": s.first_hit,
                "first_full_hit": s.first_full_hit,
                "citation": s.citation,
                "metrics": _round(s.metrics()),
            }
            for mode, r in reports.items()
            for s in r.per_query
        ]
    return pack


def pack_json(pack: Mapping[str, Any]) -> str:
    """The pack as stable, readable JSON (keys in the order built, UTF-8)."""
    return json.dumps(pack, ensure_ascii=False, indent=2) + "\n"


def metrics_schema() -> dict[str, Any]:
    """``schemas/metrics.schema.json`` (shipped in the wheel as ``pipeline/metrics.schema.json``)."""
    shipped = resources.files("pipeline") / "metrics.schema.json"
    if shipped.is_file():
        data: dict[str, Any] = json.loads(shipped.read_text(encoding="utf-8"))
        return data
    repo = Path(__file__).resolve().parents[2] / "schemas" / "metrics.schema.json"
    data = json.loads(repo.read_text(encoding="utf-8"))
    return data
