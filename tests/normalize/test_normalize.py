"""Stage normalize: bytes → canonical text + front matter (SPEC §1), golden files and units."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipeline.errors import StageError
from pipeline.stages.normalize import decode, front_matter_end, normalize, read_source

CASES = sorted(Path(__file__).parent.joinpath("cases").glob("*.md"))


def normalized(raw: bytes, rel_path: str) -> dict[str, Any]:
    """What ``normalize`` makes of one input, or the error it raises, as plain JSON."""
    try:
        doc = normalize(raw, rel_path)
    except StageError as exc:
        return {
            "error": {"stage": exc.stage, "where": exc.where, "problem": exc.problem, "message": str(exc)}
        }
    return {
        "rel_path": doc.rel_path,
        "doc_name": doc.doc_name,
        "text": doc.text,
        "body_start": doc.body_start,
        "front_matter_text": doc.text[: doc.body_start],
        "body": doc.text[doc.body_start :],
        "front_matter": doc.front_matter,
        "warnings": list(doc.warnings),
    }


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_normalize_matches_golden(case: Path, golden) -> None:
    golden(case.with_suffix(".golden.json"), normalized(case.read_bytes(), f"cases/{case.name}"))


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_only_bom_and_line_endings_change(case: Path) -> None:
    """SPEC §1: strict UTF-8, BOM stripped, CRLF/CR → LF; nothing else changes."""
    raw = case.read_bytes()
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):  # a UTF-16 mark: refused, saying so
        with pytest.raises(StageError, match="UTF-16"):
            normalize(raw, case.name)
        return
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        with pytest.raises(StageError, match="UTF-8"):
            normalize(raw, case.name)
        return
    if "\x00" in text:  # binary: refused at the first NUL, never chunked
        with pytest.raises(StageError, match="NUL") as info:
            normalize(raw, case.name)
        nul = raw.index(b"\x00")
        assert info.value.where == f"{case.name}:byte {nul}"
        return
    expected = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    assert normalize(raw, case.name).text == expected


@pytest.mark.parametrize(
    ("raw", "offset", "line"),
    [
        (b"\xff", 0, 1),
        (b"abc\xe9def", 3, 1),
        (b"line 1\nline 2\n\xc3(\n", 14, 3),
        ("na\u00efve\n".encode() + b"\x80", 7, 2),
        (b"ok \xe2\x82", 3, 1),
        (b"\xed\xa0\x80 surrogate", 0, 1),
    ],
)
def test_invalid_utf8_names_the_byte_offset(raw: bytes, offset: int, line: int) -> None:
    with pytest.raises(StageError) as info:
        decode(raw, "bad.md")
    err = info.value
    assert err.stage == "normalize"
    assert err.where == f"bad.md:byte {offset} (line {line})"
    assert "UTF-8" in err.problem
    assert err.hint  # every error says how to fix it
    assert str(err).startswith(f"bad.md:byte {offset}")


def test_nul_byte_is_binary_with_offset() -> None:
    with pytest.raises(StageError) as info:
        decode(b"# x\n\x00", "bin.md")
    assert info.value.where == "bin.md:byte 4"
    assert "NUL" in info.value.problem


@pytest.mark.parametrize("bom", [b"\xff\xfe", b"\xfe\xff"])
def test_utf16_is_refused(bom: bytes) -> None:
    with pytest.raises(StageError, match="UTF-16"):
        decode(bom + "x".encode("utf-16-le"), "u16.md")


def test_only_one_bom_is_dropped() -> None:
    """A second BOM is content (U+FEFF), not an encoding mark."""
    assert decode(b"\xef\xbb\xbf\xef\xbb\xbfx", "b.md") == "\ufeffx"


@pytest.mark.parametrize(
    ("text", "end", "kind"),
    [
        ("---\na: 1\n---\nbody", 13, "yaml"),
        ("---\na: 1\n...\nbody", 13, "yaml"),
        ("+++\na = 1\n+++\nbody", 14, "toml"),
        ("+++\na = 1\n...\nbody", 0, ""),  # TOML closes with +++ only
        ("---\na: 1\n---", 12, "yaml"),
        ("---\na: 1\n", 0, ""),
        ("---\n", 0, ""),
        ("--- \na: 1\n---\n", 0, ""),  # the opening fence is exactly ---
        (" ---\na: 1\n---\n", 0, ""),
        ("---\n---\n", 8, "yaml"),
        ("text\n---\na: 1\n---\n", 0, ""),
        ("", 0, ""),
    ],
)
def test_front_matter_end(text: str, end: int, kind: str) -> None:
    assert front_matter_end(text) == (end, kind)


def test_front_matter_agrees_with_the_checker(checker) -> None:
    for case in CASES:
        try:
            doc = normalize(case.read_bytes(), case.name)
        except StageError:
            continue
        assert doc.body_start == checker.front_matter_end(doc.text), case.name


def test_front_matter_values_become_json() -> None:
    doc = normalize(b"---\nd: 2024-01-02\nn: .nan\ns: !!set {a: null}\nk: {1: x}\n---\n", "fm.md")
    assert doc.front_matter == {"d": "2024-01-02", "n": None, "s": ["a"], "k": {"1": "x"}}


def test_unsafe_yaml_is_not_executed() -> None:
    doc = normalize(b"---\nx: !!python/object/apply:os.system ['true']\n---\nBody\n", "evil.md")
    assert doc.front_matter is None
    assert doc.warnings and "not valid YAML" in doc.warnings[0]
    assert doc.body_start == doc.text.index("Body")


def test_doc_name_drops_only_the_extension() -> None:
    assert normalize(b"x", "a/b.c/d.e.md").doc_name == "a/b.c/d.e"
    assert normalize(b"x", "..md").doc_name == "."
    assert normalize(b"x", "dir/README.markdown").doc_name == "dir/README"


def test_read_source_limits(tmp_path: Path) -> None:
    big = tmp_path / "big.md"
    big.write_bytes(b"x" * 101)
    with pytest.raises(StageError, match="over the 100-byte limit") as info:
        read_source(big, "big.md", max_bytes=100)
    assert info.value.stage == "read"
    assert read_source(big, "big.md", max_bytes=101) == b"x" * 101
    with pytest.raises(StageError, match="vanished"):
        read_source(tmp_path / "gone.md", "gone.md")
    with pytest.raises(StageError, match="directory"):
        read_source(tmp_path, "dir.md")
