"""Golden files are only compared in CI: fail if CHUNKYARD_REGEN=1 is left on (it rewrites them)."""

from __future__ import annotations

import os


def test_regen_flag_is_off() -> None:
    assert os.environ.get("CHUNKYARD_REGEN") != "1", (
        "CHUNKYARD_REGEN=1 rewrote the golden files instead of checking them: "
        "review `git diff tests/`, then run the tests again without it"
    )
