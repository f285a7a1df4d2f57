"""Stages split and mint, through the pure ``chunk_document`` (SPEC §2-4): golden records.

Each case runs with the policy below (the default elsewhere); the golden file holds
every chunk record, volatile fields (``processedAt``, ``processingTimeMs``) left out.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import chunk_md, stable

from pipeline.models import Policy

CASES = sorted(Path(__file__).parent.joinpath("cases").glob("*.md"))
POLICIES = {
    "long-section": Policy(target_tokens=128, overlap_tokens=16),
    "big-list": Policy(target_tokens=64, overlap_tokens=8),
    "big-table": Policy(target_tokens=64, overlap_tokens=8),
    "atomic": Policy(target_tokens=64, overlap_tokens=8),
    "cjk": Policy(target_tokens=48, overlap_tokens=12),
    "no-prefix": Policy(target_tokens=48, overlap_tokens=12, context_prefix=False),
}


def run(case: Path):
    return chunk_md(case.read_bytes(), f"cases/{case.name}", POLICIES.get(case.stem, Policy()))


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_chunks_match_golden(case: Path, golden) -> None:
    golden(case.with_suffix(".golden.json"), [stable(r) for r in run(case).records])


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_chunks_keep_the_invariants(case: Path, invariants) -> None:
    assert invariants(run(case)) == []


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_golden_records_match_the_schema(case: Path, validate_schema) -> None:
    for record in run(case).records:
        assert validate_schema(record) == [], record["id"]
