"""``make bench-old-vs-new``'s driver: pairs in swapped order, ratios per pair, a 10× corpus grown in parts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

DRIVER = Path(__file__).resolve().parent.parent / "bench" / "old_vs_new.py"


def driver() -> ModuleType:
    spec = importlib.util.spec_from_file_location("old_vs_new", DRIVER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_pairs_alternate_which_checkout_runs_first() -> None:
    d = driver()
    trees = ["old", "new"]
    assert [d.ordered(trees, pair) for pair in range(3)] == [["old", "new"], ["new", "old"], ["old", "new"]]


def test_a_row_gives_medians_their_ratio_and_each_pairs_ratio() -> None:
    d = driver()
    r = d.row("wall", [10.0, 12.0, 11.0], [11.0, 12.0, 9.9])
    assert (r["old_median"], r["new_median"]) == (11.0, 11.0)
    assert r["ratio"] == 1.0
    assert [round(p, 2) for p in r["pair_ratios"]] == [1.1, 1.0, 0.9]
    table = d.render([r, d.row("feed lines", [53804.0], [53804.0], "lines")])
    assert "| wall | 11 s; 10–12 (20 %) | 11 s; 9.9–12 (21 %) | **1.00** | 1.10, 1.00, 0.90 |" in table
    assert "53,804 lines; 53,804–53,804 (0 %)" in table


def test_a_checkout_without_its_environment_is_refused_with_the_fix(tmp_path: Path) -> None:
    d = driver()
    with pytest.raises(SystemExit, match=r"python3 -m venv .*/\.venv && .*pip install -e"):
        d.Tree("old", tmp_path)


def test_grow_adds_only_the_copies_not_there_yet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = driver()
    corpora = tmp_path / "corpora"
    (corpora / "one").mkdir(parents=True)
    (corpora / "one" / "a.md").write_text("# A\n", encoding="utf-8")
    monkeypatch.setattr(d.bench_scale, "CORPORA", corpora)
    home = tmp_path / "10x" / "old"
    d.grow(home, 2)
    first = (home / "corpus" / "copy-00" / "one" / "a.md").stat()
    assert first.st_ino == (corpora / "one" / "a.md").stat().st_ino  # a hard link, not a copy
    d.grow(home, 4)
    assert sorted(p.name for p in (home / "corpus").iterdir()) == [f"copy-0{i}" for i in range(4)]
    assert (home / "corpus" / "copy-00" / "one" / "a.md").stat().st_mtime_ns == first.st_mtime_ns
