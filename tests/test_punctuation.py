"""mistletoe imported through ``pipeline.stages.mdpatch.punctuation`` ends with the set it builds itself."""

from __future__ import annotations

import subprocess
import sys
import unicodedata

import pytest

from pipeline.stages.mdpatch import punctuation

ASCII = set("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")


def mistletoes_own() -> set[str]:
    """``mistletoe.core_tokens.punctuation`` as its module body computes it."""
    cats = unicodedata.category
    return ASCII | {chr(i) for i in range(sys.maxunicode + 1) if cats(chr(i)).startswith("P")}


def test_the_table_row_for_this_python_is_mistletoes_set() -> None:
    row = punctuation._RANGES.get(unicodedata.unidata_version)
    if row is None:
        pytest.skip(f"no row for Unicode {unicodedata.unidata_version}: mistletoe scans, as before")
    assert ASCII | punctuation.decode(row) == mistletoes_own()


def test_mistletoe_ends_with_its_full_set_and_sys_is_left_as_it_was() -> None:
    from mistletoe import core_tokens

    import pipeline.stages.parse  # noqa: F401 - imports mistletoe through punctuation.import_mistletoe

    assert sys.maxunicode == 0x10FFFF
    assert core_tokens.punctuation == mistletoes_own()
    assert {"«", "、", "¿", "‘", "\U0001e95e"} <= core_tokens.punctuation
    assert "a" not in core_tokens.punctuation and "€" not in core_tokens.punctuation  # Sc, not P


def test_a_fresh_process_imports_mistletoe_without_its_scan_and_whole() -> None:
    """Fast by construction, not by the clock: ``unicodedata.category`` is counted while a fresh
    process imports the parser; mistletoe's own scan would ask it about 1,114,112 code points."""
    code = (
        "import sys, unicodedata; calls = [0]; real = unicodedata.category\n"
        "def category(c):\n    calls[0] += 1\n    return real(c)\n"
        "unicodedata.category = category\n"
        "import pipeline.stages.parse; from mistletoe import core_tokens as c\n"
        "print(len(c.punctuation), sys.maxunicode, 'mistletoe.core_tokens' in sys.modules, calls[0])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    size, maxunicode, imported, calls = out.stdout.split()
    assert [size, maxunicode, imported] == [str(len(mistletoes_own())), str(0x10FFFF), "True"]
    has_row = unicodedata.unidata_version in punctuation._RANGES
    assert int(calls) <= 1 if has_row else int(calls) > 0x10FFFF, f"{calls} category lookups"


@pytest.mark.parametrize(
    ("chars", "ranges"),
    [({"¡"}, "a1"), ({"¡", "¢", "£"}, "a1-a3"), ({"¡", "§", "\U0001e95f"}, "a1,a7,1e95f")],
)
def test_ranges_round_trip(chars: set[str], ranges: str) -> None:
    assert punctuation.encode(chars) == ranges
    assert punctuation.decode(ranges) == chars


def test_an_emphasis_flanked_by_unicode_punctuation_parses_as_mistletoe_says() -> None:
    from pipeline.stages.parse import heading_title

    class Tok:  # a heading token as mistletoe leaves it: raw text children
        def __init__(self) -> None:
            self.children = [type("Raw", (), {"content": "«*quoted*»_x_"})()]

    assert heading_title(Tok()) == "«quoted»x"
