"""``--tokenizer wordpiece``: chunk budgets in the default embedder's own units (issue 16, point 3).

all-MiniLM-L6-v2 sees at most 256 wordpieces ([CLS] and [SEP] included); a cl100k budget of
512 overflows that window for most chunks. Counting the budget in the model's WordPiece
units makes chunks that fit it, except the blocks the split rules never cut (SPEC §4).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import ATOMIC_TYPES, SAMPLE_CORPUS, Chunked, reference_encoder, schema_errors
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.errors import UsageError
from pipeline.models import Policy
from pipeline.stages import wordpiece
from pipeline.stages.tokens import TOKENIZERS, Counter, get_encoding
from pipeline.stages.wordpiece import MODEL_WINDOW

WINDOW_TEXT = MODEL_WINDOW - 2  # room for the text between [CLS] and [SEP]
reference = reference_encoder("wordpiece")

EDGES = [
    "",
    "a",
    "Hello, world.\n\n",
    "unbelievably tokenizable ##pieces [CLS] [SEP] [MASK] <|endoftext|>",
    "x" * 101,  # one word over WordPiece's 100-char limit: a single [UNK]
    "ownership " * 400,
    "文字化け、日本語のテキスト。中文分词",
    "👩‍👩‍👧‍👦 family é\u0301 ﬁ ǅ İstanbul straße",
    "\ufeffBOM \x00\x01\x1f \x7f del",
    "https://example.com/a/b?c=d&e=f#g `code_span()` **bold** [link](x.md)",
]


@pytest.mark.parametrize("text", EDGES, ids=range(len(EDGES)))
def test_counts_are_the_tokenizers_count_without_special_tokens(text: str) -> None:
    assert Counter("wordpiece").count(text) == len(reference(text))


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=300))
def test_counts_match_the_reference_on_any_text(text: str) -> None:
    assert Counter("wordpiece").count(text) == len(reference(text))


def test_long_text_is_counted_whole_not_cut_at_the_files_128() -> None:
    assert Counter("wordpiece").count("ownership " * 400) == 400


def test_wordpiece_is_a_policy_tokenizer_but_not_a_tiktoken_encoding() -> None:
    assert "wordpiece" in TOKENIZERS
    with pytest.raises(UsageError, match="unknown tiktoken encoding 'wordpiece'"):
        get_encoding("wordpiece")


def test_missing_tokenizers_package_is_a_usage_error_naming_the_extra() -> None:
    code = (
        "import sys; sys.modules['tokenizers'] = None\n"
        "from pipeline.errors import UsageError\n"
        "from pipeline.stages.tokens import Counter\n"
        "try:\n    Counter('wordpiece')\nexcept UsageError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "needs the 'tokenizers' package" in out and "chunkyard[embed]" in out


LONG_DOC = (
    "# Ownership\n\n"
    + " ".join(f"Sentence {i} explains how ownership moves a value into function number {i}." for i in range(120))
    + "\n\n## Borrowing\n\n"
    + "\n".join(f"- item {i}: a reference borrows without taking ownership of the value" for i in range(80))
    + "\n\n```rust\n"
    + "\n".join(f"let v{i} = vec![{i}; {i}]; // a line of a code block that is never split" for i in range(60))
    + "\n```\n"
)


def test_chunks_keep_the_budget_in_wordpieces(
    chunk: Callable[..., Chunked], invariants: Callable[..., list[str]]
) -> None:
    result = chunk(LONG_DOC, policy=Policy(target_tokens=200, tokenizer="wordpiece"))
    assert invariants(result) == []  # tokens == the reference count, and ≤ 200 unless atomic
    kinds = {r["block_type"] for r in result.records}
    assert {"paragraph", "list", "code"} <= kinds
    for r in result.records:
        assert r["tokenStats"]["tokenizer"] == "wordpiece"
        if r["block_type"] not in ATOMIC_TYPES:
            assert len(reference(r["embedText"])) <= 200
    code = [r for r in result.records if r["block_type"] == "code"]
    assert len(code) == 1 and len(reference(code[0]["embedText"])) > WINDOW_TEXT  # never split (rule 2)


def chunk_records(out: Path) -> list[dict[str, Any]]:
    files = [p for p in out.rglob("doc_*.json") if ".chunkyard" not in p.parts]
    return [json.loads(p.read_text(encoding="utf-8")) for p in files]


def test_ingest_with_wordpiece_makes_schema_valid_chunks_that_fit_the_window(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for src in SAMPLE_CORPUS.rglob("*.md"):
        dest = corpus / src.relative_to(SAMPLE_CORPUS)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(src.read_bytes())
    (corpus / "long.md").write_text(LONG_DOC, encoding="utf-8")
    out = tmp_path / "chunks"
    args = ["ingest", str(corpus), "--out", str(out), "--tokenizer", "wordpiece", "--target-tokens", "200"]
    result = CliRunner().invoke(app, [*args, "--quiet"])
    assert result.exit_code == 0, result.output
    records = chunk_records(out)
    assert len(records) > 20
    for r in records:
        assert schema_errors(r) == [], r["id"]
        assert r["tokenStats"]["tokenizer"] == "wordpiece"
        assert r["metadata"]["chunkingOptions"]["tokenizer"] == "wordpiece"
        assert r["tokenStats"]["tokens"] == len(reference(r["embedText"]))
        if r["block_type"] not in ATOMIC_TYPES:
            assert r["tokenStats"]["tokens"] <= 200, r["id"]
    over = [r for r in records if r["tokenStats"]["tokens"] > WINDOW_TEXT]
    assert over and {r["block_type"] for r in over} <= ATOMIC_TYPES  # the long code block, nothing else


@pytest.mark.corpora
def test_on_the_rust_book_only_atomic_blocks_overflow_the_window(corpora_dir: Path, tmp_path: Path) -> None:
    """The issue's measurement: 73 % of 512-cl100k chunks overflow; with wordpiece 254 only unsplittable blocks do."""
    book = corpora_dir / "rust-book"
    share = {}
    for tokenizer, target in (("cl100k_base", "512"), ("wordpiece", str(WINDOW_TEXT))):
        out = tmp_path / tokenizer
        args = ["ingest", str(book), "--out", str(out), "--tokenizer", tokenizer, "--target-tokens", target]
        result = CliRunner().invoke(app, [*args, "--quiet"])
        assert result.exit_code == 0, result.output
        records = chunk_records(out)
        over = [r for r in records if len(reference(r["embedText"])) > WINDOW_TEXT]
        share[tokenizer] = len(over) / len(records)
        if tokenizer == "wordpiece":  # unsplittable blocks, and tables under 2 x target (SPEC §4 rule 3)
            unsplittable = [r for r in over if r["block_type"] in ATOMIC_TYPES]
            whole_tables = [
                r for r in over if r["block_type"] == "table" and r["tokenStats"]["tokens"] < 2 * WINDOW_TEXT
            ]
            assert len(unsplittable) + len(whole_tables) == len(over), [r["id"] for r in over]
    assert share["cl100k_base"] > 0.6
    assert share["wordpiece"] < 0.02


def test_ingest_without_tokenizers_exits_2_naming_the_extra(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['tokenizers'] = None\n"
        "from pipeline.cli.app import run\n"
        f"sys.argv = ['chunkyard', 'ingest', {str(SAMPLE_CORPUS)!r}, '--out', {str(tmp_path / 'out')!r},"
        " '--tokenizer', 'wordpiece']\n"
        "run()\n"
    )
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "needs the 'tokenizers' package: pip install 'chunkyard[embed]'" in proc.stderr
    assert "Traceback" not in proc.stderr


# -- the fast path: tokie counts text made of TOKIE_RANGES, tokenizers the rest ----------------

needs_tokie = pytest.mark.skipif(
    importlib.util.find_spec("tokie") is None, reason="tokie not installed (extra 'embed'): only the exact path runs"
)
TOKIE_CODEPOINTS = [c for a, b in wordpiece.TOKIE_RANGES for c in range(a, b + 1)]


@needs_tokie
def test_the_fast_path_is_on_when_the_checked_tokie_is_installed() -> None:
    assert wordpiece._tokie_counter() is not None
    assert wordpiece._TOKIE_TEXT.fullmatch("Ownership — “moves” the value; 所有権 🎉 →")
    for outside in ("\x7f", "\u0378", "\u2e52", "\U0002b73a", "\ufffe"):  # tokie and tokenizers disagree here
        assert not wordpiece._TOKIE_TEXT.fullmatch(f"abc{outside}def")


@needs_tokie
@pytest.mark.parametrize("context", ["{c}", "ab{c}cd {c} {c}{c}x", "{c}ing", "x{c}" * 40])
def test_tokie_counts_every_code_point_of_its_ranges_as_tokenizers_does(context: str) -> None:
    import tokie

    fast = tokie.Tokenizer.from_json(str(Path(wordpiece.__file__).with_name(wordpiece.TOKENIZER_FILE)))
    texts = [context.format(c=chr(c)) for c in TOKIE_CODEPOINTS]
    want = [len(ids) for ids in map(reference, texts)]
    got = fast.count_tokens_batch(texts)
    wrong = [hex(c) for c, w, g in zip(TOKIE_CODEPOINTS, want, got, strict=True) if w != g]
    assert wrong == []


@settings(max_examples=300, deadline=None)
@given(
    text=st.lists(
        st.sampled_from([chr(c) for c in TOKIE_CODEPOINTS[::7]]) | st.sampled_from(list("ab z.,'\n-")),
        max_size=300,
    ).map("".join)
)
def test_mixes_of_the_ranges_count_as_tokenizers_does(text: str) -> None:
    assert wordpiece._TOKIE_TEXT.fullmatch(text)
    assert Counter("wordpiece").count(text) == len(reference(text))


@pytest.mark.corpora
def test_every_corpus_paragraph_counts_as_tokenizers_does(corpora_dir: Path) -> None:
    fresh = Counter("wordpiece")
    first_seen: dict[str, Path] = {}  # each distinct paragraph once (the reference is the slow side)
    for path in sorted(corpora_dir.rglob("*.md")):
        text = path.read_bytes().decode("utf-8", "replace").replace("\r\n", "\n")
        for para in text.split("\n\n"):
            first_seen.setdefault(para, path)
    for para, path in first_seen.items():
        assert fresh.count(para) == len(reference(para)), (path, para[:80])
    assert len(first_seen) > 100_000
