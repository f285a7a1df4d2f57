"""Import mistletoe without its scan of every Unicode code point.

``mistletoe.core_tokens`` builds its ``punctuation`` set at import by asking
``unicodedata.category`` about every code point up to ``sys.maxunicode``: the largest
part of a process start that chunks (``docs/benchmarks.md`` has the figure). The set
depends only on the Unicode database Python ships (``unicodedata.unidata_version``), so
it is stored below as ranges per version.

``import_mistletoe`` runs ``core_tokens``' own (cached) code with one difference: inside
that module, ``import sys`` gives a stand-in whose ``maxunicode`` is 0, so the scan covers
one code point; then it fills the very same set object in from the table, so mistletoe
ends with the set it would have built. Nothing outside that module changes: the real
``sys`` is never touched and the module's ``sys`` is the real one afterwards. A Unicode
version not in the table (a newer Python) takes mistletoe's own path, as slow as before
and as right.

``python -m pipeline.stages.mdpatch.punctuation`` prints what the running Python's Unicode
adds to the newest older version in the table (its ``_ADDED`` entry);
``tests/test_punctuation.py`` checks the row against mistletoe's own computation.
"""

from __future__ import annotations

import builtins
import importlib.machinery
import importlib.util
import sys
import threading
import types
import unicodedata
from typing import Any

#: Code point ranges (hex ``first-last``) of the categories P* in Unicode 14.0 (Python 3.11),
#: less ASCII (mistletoe lists ASCII punctuation itself).
_UNICODE_14 = (
    "a1,a7,ab,b6-b7,bb,bf,37e,387,55a-55f,589-58a,5be,5c0,5c3,5c6,5f3-5f4,609-60a,60c-60d,"
    "61b,61d-61f,66a-66d,6d4,700-70d,7f7-7f9,830-83e,85e,964-965,970,9fd,a76,af0,c77,c84,"
    "df4,e4f,e5a-e5b,f04-f12,f14,f3a-f3d,f85,fd0-fd4,fd9-fda,104a-104f,10fb,1360-1368,1400,"
    "166e,169b-169c,16eb-16ed,1735-1736,17d4-17d6,17d8-17da,1800-180a,1944-1945,1a1e-1a1f,"
    "1aa0-1aa6,1aa8-1aad,1b5a-1b60,1b7d-1b7e,1bfc-1bff,1c3b-1c3f,1c7e-1c7f,1cc0-1cc7,1cd3,"
    "2010-2027,2030-2043,2045-2051,2053-205e,207d-207e,208d-208e,2308-230b,2329-232a,"
    "2768-2775,27c5-27c6,27e6-27ef,2983-2998,29d8-29db,29fc-29fd,2cf9-2cfc,2cfe-2cff,2d70,"
    "2e00-2e2e,2e30-2e4f,2e52-2e5d,3001-3003,3008-3011,3014-301f,3030,303d,30a0,30fb,"
    "a4fe-a4ff,a60d-a60f,a673,a67e,a6f2-a6f7,a874-a877,a8ce-a8cf,a8f8-a8fa,a8fc,a92e-a92f,"
    "a95f,a9c1-a9cd,a9de-a9df,aa5c-aa5f,aade-aadf,aaf0-aaf1,abeb,fd3e-fd3f,fe10-fe19,"
    "fe30-fe52,fe54-fe61,fe63,fe68,fe6a-fe6b,ff01-ff03,ff05-ff0a,ff0c-ff0f,ff1a-ff1b,"
    "ff1f-ff20,ff3b-ff3d,ff3f,ff5b,ff5d,ff5f-ff65,10100-10102,1039f,103d0,1056f,10857,1091f,"
    "1093f,10a50-10a58,10a7f,10af0-10af6,10b39-10b3f,10b99-10b9c,10ead,10f55-10f59,"
    "10f86-10f89,11047-1104d,110bb-110bc,110be-110c1,11140-11143,11174-11175,111c5-111c8,"
    "111cd,111db,111dd-111df,11238-1123d,112a9,1144b-1144f,1145a-1145b,1145d,114c6,"
    "115c1-115d7,11641-11643,11660-1166c,116b9,1173c-1173e,1183b,11944-11946,119e2,"
    "11a3f-11a46,11a9a-11a9c,11a9e-11aa2,11c41-11c45,11c70-11c71,11ef7-11ef8,11fff,"
    "12470-12474,12ff1-12ff2,16a6e-16a6f,16af5,16b37-16b3b,16b44,16e97-16e9a,16fe2,1bc9f,"
    "1da87-1da8b,1e95e-1e95f"
)
#: What each later version added to the one before it (none has taken any away so far).
_ADDED = {"15.0.0": "11b00-11b09,11f43-11f4f", "15.1.0": ""}


def _rows() -> dict[str, str]:
    """The ranges per Unicode version: 14.0's, then each version's additions on top."""
    rows = {"14.0.0": _UNICODE_14}
    row = _UNICODE_14
    for version, added in _ADDED.items():
        row = rows[version] = f"{row},{added}" if added else row
    return rows


_RANGES = _rows()

_LOCK = threading.Lock()


def _scan() -> set[str]:
    """Every non-ASCII code point whose category starts with ``P`` (mistletoe's rule)."""
    cat = unicodedata.category
    return {c for c in map(chr, range(0x80, sys.maxunicode + 1)) if cat(c)[0] == "P"}


def encode(chars: set[str]) -> str:
    """``chars`` as ``first-last`` hex ranges, comma-separated."""
    points = sorted(map(ord, chars))
    parts: list[str] = []
    i = 0
    while i < len(points):
        j = i
        while j + 1 < len(points) and points[j + 1] == points[j] + 1:
            j += 1
        parts.append(f"{points[i]:x}" if i == j else f"{points[i]:x}-{points[j]:x}")
        i = j + 1
    return ",".join(parts)


def decode(ranges: str) -> set[str]:
    out: set[str] = set()
    for part in ranges.split(","):
        first, _, last = part.partition("-")
        out.update(map(chr, range(int(first, 16), int(last or first, 16) + 1)))
    return out


def import_mistletoe() -> None:
    """Import ``mistletoe`` (once per process), its punctuation from the table when it can."""
    if "mistletoe.core_tokens" in sys.modules:
        return
    ranges = _RANGES.get(unicodedata.unidata_version)
    if ranges is None:
        import mistletoe.core_tokens  # the slow scan, for a Unicode we have no row for

        return
    with _LOCK:
        if "mistletoe.core_tokens" not in sys.modules:
            _load_core_tokens(decode(ranges))
    import mistletoe

    setattr(mistletoe, "core_tokens", sys.modules["mistletoe.core_tokens"])  # noqa: B010 - as an import binds it


def _load_core_tokens(table: set[str]) -> None:
    """Execute ``mistletoe.core_tokens`` before its package, with its ``sys`` a stand-in for the scan.

    The module is found without importing ``mistletoe`` (whose ``__init__`` imports it);
    its code runs in a namespace whose builtins answer ``import sys`` with the stand-in. The
    functions it defines keep that builtins mapping, which afterwards imports as Python does.
    """
    spec = importlib.util.find_spec("mistletoe")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("mistletoe is not installed (hint: pip install chunkyard)")
    found = importlib.machinery.PathFinder.find_spec("mistletoe.core_tokens", spec.submodule_search_locations)
    if found is None or found.loader is None:
        raise ImportError("mistletoe.core_tokens not found (hint: reinstall mistletoe)")
    module = importlib.util.module_from_spec(found)
    real_import = builtins.__import__
    stand_in = types.SimpleNamespace(maxunicode=0)

    def import_with_stand_in(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "sys":
            return stand_in
        return real_import(name, *args, **kwargs)

    own_builtins = {**builtins.__dict__, "__import__": import_with_stand_in}
    module.__dict__["__builtins__"] = own_builtins
    sys.modules[found.name] = module
    try:
        found.loader.exec_module(module)
    except BaseException:
        del sys.modules[found.name]
        raise
    finally:
        own_builtins["__import__"] = real_import
        module.__dict__["__builtins__"] = builtins.__dict__
    module.__dict__["sys"] = sys
    module.punctuation.update(table)  # the same set object mistletoe's parser uses


if __name__ == "__main__":

    def _version(v: str) -> tuple[int, ...]:
        return tuple(map(int, v.split(".")))

    older = [v for v in _RANGES if _version(v) < _version(unicodedata.unidata_version)]
    before = decode(_RANGES[max(older, key=_version)]) if older else set()
    now = _scan()
    if before - now:
        print(f"removed since {max(older, key=_version)}: {encode(before - now)} (_ADDED cannot say so)")
    print(f"{unicodedata.unidata_version!r}: {encode(now - before) if now - before else ''!r}")
