"""The answer side of ``check-citations``: its return codes, findings, report, and schema check.

A RAG answer's citation block (001's payload; docs/spec.md, "Audit") is first checked
against ``schemas/answer.schema.json``: its shape, the required fields, the offsets. Schema
errors come back as 001's codes (``empty_citations``, ``missing_<field>``, ``bad_offsets``).
What each citation says is then checked against the chunk folder (``citations.py``).
"""

from __future__ import annotations

import json
from collections import Counter as Tally
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema

from pipeline.errors import UsageError

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "schemas" / "answer.schema.json"
_PACKAGED_SCHEMA = Path(__file__).resolve().parents[1] / "answer.schema.json"  #: in a wheel (pyproject.toml)
#: 001's payload fields the chunk store verifies; a citation without one fails ``missing_<field>``.
REQUIRED = ("snippet_id", "section_id", "source_url", "offsets", "tokens", "rev", "analyzer")
#: 001's fields that describe the loader's index and read path: optional here, only type-checked.
LOADER_SIDE = ("index_hash", "embed_model", "score_raw", "score_norm", "k_pos", "k_final")

_REBUILD = "copy the field from the chunk (`chunkyard resolve SNIPPET --json`)"
#: Return code → (what it means, the next step); 001's codes plus those the chunk store adds.
CODES: dict[str, tuple[str, str]] = {
    "ok": ("every citation checks out against the chunk store", "nothing to do"),
    "invalid_json": ("the answer file is not JSON", "emit the answer as one JSON object"),
    "schema_invalid": ("the answer does not match schemas/answer.schema.json", "fix the field's type"),
    "empty_citations": ("the model skipped the citation block", "enforce cite-first in the prompt contract"),
    "bad_offsets": (
        "span math is broken: start ≥ end, a unit other than char, or outside the chunk's charOffsets",
        "cite character offsets inside the chunk: " + _REBUILD,
    ),
    "cross_section_reuse": (
        "one segment cites several sections",
        "split the segment, or whitelist it with --allow-cross-section",
    ),
    "analyzer_mismatch": ("the analyzer differs from the chunk's (read path ≠ write path)", _REBUILD),
    "rev_mismatch": (
        "revision lock: rev is not the revision that produced the chunk",
        "re-retrieve against the current index, or re-ingest so the chunk matches its source",
    ),
    "unknown_snippet": ("no chunk has this snippet_id", "cite a live chunk_id (see the suggestions)"),
    "redirected_snippet": (
        "the snippet_id is stale: the redirect map sends it to a new chunk_id",
        "cite the new chunk_id and re-check its text",
    ),
    "section_mismatch": ("section_id is not the chunk's section_id", _REBUILD),
    "doc_mismatch": ("doc_id is not the doc_uid of the chunk", _REBUILD),
    "source_mismatch": ("source_url is not the chunk's source_url", _REBUILD),
    "tokens_mismatch": ("tokens differs from the chunk's count for the whole chunk", _REBUILD),
    "bad_passage": (
        "chunk_ids does not name one run of chunks of the cited chunk's document, snippet_id among them",
        "copy the passage from `chunkyard search --json` (chunk_ids, offsets and tokens together)",
    ),
    "unreadable_chunk": ("the chunk file behind the snippet cannot be read", "run `chunkyard validate`"),
    "mismatch_index_hash": (
        "index_hash is not the live index's: the citation came from another index (model or chunks)",
        "search again against the live index (`chunkyard search ... --json`), or rebuild the index",
    ),
}
for _f in REQUIRED:
    CODES[f"missing_{_f}"] = (f"the citation has no {_f}", "enforce required fields at the chain boundary")


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem with one citation (or with the answer as a whole)."""

    code: str
    where: str  #: a JSON path: ``citations[2]``, ``segments[1].citations[0]``, or ``(answer)``
    field: str
    message: str

    @property
    def fix(self) -> str:
        return CODES[self.code][1]

    def as_dict(self) -> dict[str, str]:
        return {
            "code": self.code,
            "where": self.where,
            "field": self.field,
            "message": self.message,
            "fix": self.fix,
        }


@dataclass(slots=True)
class CitationReport:
    """What ``check-citations`` found; ``code`` is 001's single return code (the first failure)."""

    answer: str
    segments: int = 0
    citations: int = 0
    problems: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def code(self) -> str:
        return self.problems[0].code if self.problems else "ok"

    def counts(self) -> dict[str, int]:
        return dict(Tally(p.code for p in self.problems).most_common())

    def as_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "ok": self.ok,
            "answer": self.answer,
            "segments": self.segments,
            "citations": self.citations,
            "counts": self.counts(),
            "problems": [p.as_dict() for p in self.problems],
        }


@lru_cache(maxsize=1)
def answer_validator() -> jsonschema.protocols.Validator:
    """``schemas/answer.schema.json``, compiled once."""
    path = SCHEMA_PATH if SCHEMA_PATH.exists() else _PACKAGED_SCHEMA
    schema = json.loads(path.read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def load_answer(path: Path) -> tuple[Any, CitationReport | None]:
    """The parsed answer, or a failed report when it is not JSON; ``UsageError`` when there is no file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{path}: no such answer file (hint: pass the JSON the model returned)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read the answer ({exc})") from None
    try:
        return json.loads(text), None  # json keeps key order, orjson too; json names the line
    except json.JSONDecodeError as exc:
        report = CitationReport(str(path))
        report.problems.append(Finding("invalid_json", "(answer)", "(file)", f"line {exc.lineno}: {exc.msg}"))
        return None, report


def path_key(where: str) -> tuple[int, ...]:
    """Sort findings by citation position: ``segments[1].citations[2]`` → (1, 2)."""
    digits = "".join(c if c.isdigit() else " " for c in where).split()
    return tuple(int(d) for d in digits) if digits else (-1,)


def schema_findings(answer: Any) -> list[Finding]:
    """Schema errors as 001 codes: ``empty_citations``, ``missing_<field>``, ``bad_offsets``."""
    found: list[Finding] = []
    for error in sorted(
        answer_validator().iter_errors(answer), key=lambda e: list(map(str, e.absolute_path))
    ):
        path = list(error.absolute_path)
        where, depth = _where(path), _citation_depth(path)
        rest = [str(p) for p in path[depth:]] if depth else []
        instance = error.instance if isinstance(error.instance, dict) else {}
        if (
            (error.validator == "anyOf" and not path)
            or (error.validator == "minItems" and path and path[-1] == "citations")
            or (error.validator == "required" and not depth and "citations" not in instance)
        ):
            found.append(
                Finding("empty_citations", where, "citations", "no citations: cite first, then explain")
            )
        elif error.validator == "required" and depth and depth == len(path):
            found.extend(
                Finding(f"missing_{name}", where, name, f"the citation has no {name}")
                for name in error.validator_value
                if name not in instance
            )
        elif rest and rest[0] == "offsets":
            found.append(Finding("bad_offsets", where, ".".join(rest), error.message))
        else:
            fld = ".".join(rest) if rest else ".".join(map(str, path)) or "(answer)"
            found.append(Finding("schema_invalid", where, fld, error.message[:300]))
    return found


def _citation_depth(path: list[Any]) -> int:
    """How many path steps lead to a citation object (0 when the path is not inside one)."""
    if len(path) >= 2 and path[0] == "citations" and isinstance(path[1], int):
        return 2
    if len(path) >= 4 and path[0] == "segments" and path[2] == "citations" and isinstance(path[3], int):
        return 4
    return 0


def _where(path: list[Any]) -> str:
    depth = _citation_depth(path)
    head = path[:depth] if depth else path
    out = ""
    for step in head:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else str(step))
    return out or "(answer)"
