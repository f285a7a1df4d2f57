"""A wheel holds the schemas where the code looks for them outside a checkout.

In a checkout the code reads ``schemas/``; an installed wheel has no such folder, so each
module falls back to the copy ``pyproject.toml`` force-includes into the package. A
fallback path that names no included file breaks ``pip install .`` (it did: ``ingest``
stopped with ``FileNotFoundError`` on ``pipeline/run/chunk.schema.json``).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from pipeline.audit import answer
from pipeline.run import emit

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pipeline"


def included() -> dict[str, str]:
    """Wheel path → repository file, as ``pyproject.toml`` force-includes them."""
    build = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["hatch"]["build"]
    return {dest: src for src, dest in build["targets"]["wheel"]["force-include"].items()}


@pytest.mark.parametrize("module", [emit, answer], ids=lambda m: m.__name__)
def test_the_packaged_schema_path_is_one_the_wheel_holds(module: object) -> None:
    packaged: Path = getattr(module, "_PACKAGED_SCHEMA")  # noqa: B009 - the fallback is private
    in_wheel = packaged.resolve().relative_to(PACKAGE.parent).as_posix()
    wheel = included()
    assert in_wheel in wheel, f"{in_wheel} is not in the wheel (force-include: {sorted(wheel)})"
    assert (ROOT / wheel[in_wheel]).name == packaged.name
    assert (ROOT / wheel[in_wheel]).is_file()


def test_the_check_sees_a_path_the_wheel_lacks() -> None:
    """The rule can fail: the old fallback (beside ``run/emit.py``) is not in the wheel."""
    old = (PACKAGE / "run" / "chunk.schema.json").relative_to(PACKAGE.parent).as_posix()
    assert old not in included()
