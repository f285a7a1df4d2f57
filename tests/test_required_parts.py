"""Under ``CI=true`` a required part that is really missing fails its tests, naming the part.

Each case runs a small pytest in a subprocess where the part is truly absent — Chromium
pointed at a path with nothing there, ``unshare`` refused because the run is not root
(the user ``nobody``) — and reads its exit status and its last lines. Without ``CI`` the
same tests skip, saying why; ``CHUNKYARD_REQUIRE`` names parts one by one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

BROWSER_TEST = "tests/test_view_browser.py::test_search_page"
RAY_TEST = "tests/test_ray.py::test_a_node_without_the_shared_file_system_is_refused"


def pytest_run(tmp_path: Path, test: str, env: dict[str, str], *, as_nobody: bool = False) -> tuple[int, str]:
    """``pytest TEST`` in a fresh process with ``env`` over a clean copy of ours (no CI, no REQUIRE)."""
    base = {k: v for k, v in os.environ.items() if k not in ("CI", "CHUNKYARD_REQUIRE", "CHROMIUM")}
    base = {k: v for k, v in base.items() if not k.startswith("PYTEST_")}
    temp = tmp_path / "pytest-temp"
    prefix: list[str] = []
    if as_nobody and os.geteuid() == 0:  # not root: unshare is refused to us already
        # root without CAP_SYS_ADMIN: the kernel refuses unshare --net --pid, and the clone
        # (in a folder only its owner may enter, as CI's) stays readable, as it would not be to nobody
        prefix = ["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin"]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={temp}", test]
    try:
        proc = subprocess.run(
            [*prefix, *cmd],
            cwd=ROOT,
            env={**base, "PYTHONDONTWRITEBYTECODE": "1", **env},
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
    finally:
        if prefix:
            shutil.rmtree(temp.parent, ignore_errors=True)
    return proc.returncode, proc.stdout + proc.stderr


def summary_line(output: str, part: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith(f"{part} ")]
    assert lines, f"no line for {part} in the required-parts summary:\n{output[-3000:]}"
    return lines[-1]


def test_ci_fails_when_chromium_is_missing(tmp_path: Path) -> None:
    nowhere = str(tmp_path / "no-chromium-here")
    code, out = pytest_run(tmp_path, BROWSER_TEST, {"CI": "true", "CHROMIUM": nowhere})
    assert code == 1, out[-3000:]
    assert "required part 'chromium'" in out and "no Chromium" in out, out[-3000:]
    assert summary_line(out, "chromium").startswith("chromium  [required] MISSING (no Chromium")


def test_outside_ci_a_missing_chromium_skips_and_says_why(tmp_path: Path) -> None:
    code, out = pytest_run(tmp_path, BROWSER_TEST, {"CHROMIUM": str(tmp_path / "nothing")})
    assert code == 0 and "1 skipped" in out and "chromium: no Chromium" in out, out[-3000:]
    assert summary_line(out, "chromium").startswith("chromium  [optional] MISSING")


def test_chunkyard_require_names_one_part(tmp_path: Path) -> None:
    code, out = pytest_run(
        tmp_path, BROWSER_TEST, {"CHUNKYARD_REQUIRE": "chromium", "CHROMIUM": str(tmp_path / "nothing")}
    )
    assert code == 1 and "required part 'chromium'" in out, out[-3000:]
    code, out = pytest_run(
        tmp_path, BROWSER_TEST, {"CHUNKYARD_REQUIRE": "tmpfs", "CHROMIUM": str(tmp_path / "nothing")}
    )
    assert code == 0 and "1 skipped" in out, out[-3000:]  # chromium not named: it may skip


def test_a_misspelt_part_stops_the_run(tmp_path: Path) -> None:
    code, out = pytest_run(tmp_path, BROWSER_TEST, {"CHUNKYARD_REQUIRE": "chromum"})
    assert code != 0 and "unknown parts ['chromum']" in out, out[-3000:]


@pytest.mark.slow
def test_ci_fails_when_unshare_is_refused(tmp_path: Path) -> None:
    """Run without CAP_SYS_ADMIN: the kernel really refuses ``unshare --net --pid``; the Ray test fails on it."""
    code, out = pytest_run(tmp_path, RAY_TEST, {"CI": "true"}, as_nobody=True)
    assert code == 1, out[-3000:]
    assert "required part 'netns'" in out and "not permitted" in out, out[-3000:]
    assert summary_line(out, "netns").startswith("netns     [required] MISSING")
