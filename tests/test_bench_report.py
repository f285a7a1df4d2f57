"""``make bench``'s report: its goals read as they are met, and round by round."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parent.parent / "bench" / "run.py"


def bench_run() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_run", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return module


def row(tool: str, seconds: list[float]) -> dict[str, object]:
    runs = [{"seconds": s, "cpu": s} for s in seconds] if tool.startswith("chunkyard") else seconds
    middle = sorted(seconds)[len(seconds) // 2]
    return {"tool": tool, "seconds": middle, "cpu": middle, "rss_mb": 80.0, "pss_mb": 150.0, "runs": runs}


def test_each_ratio_comes_with_its_rounds_and_a_miss_never_reads_as_the_goal() -> None:
    bench = bench_run()
    rows = [
        row("chunkyard jobs=1", [7.33, 7.12, 7.23]),
        row("chunkyard jobs=2", [4.59, 4.22, 4.21]),
        row("mistletoe", [7.00, 6.97, 6.97]),
        row("langchain", [5.06, 5.05, 5.20]),
    ]
    checks = {c["ratio"]: c for c in bench.ratios(rows, 18.11, 2)}
    langchain, jobs = checks["jobs=cores vs LangChain"], checks["jobs=2 vs jobs=1"]
    assert not langchain["met"] and round(langchain["value"], 2) == 1.2  # 5.06 / 4.22 = 1.1991
    assert bench.check_line(langchain).startswith("- jobs=cores vs LangChain: **1.199×** (goal ≥ 1.2) MISSED")
    assert jobs["met"] and [round(v, 2) for v in jobs["rounds"]] == [1.6, 1.69, 1.72]
    assert bench.check_line(jobs) == (
        "- jobs=2 vs jobs=1: **1.71×** (goal ≥ 1.7) ok; round by round 1.60, 1.69, 1.72"
    )
