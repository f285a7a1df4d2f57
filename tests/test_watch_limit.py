"""watch past the inotify watch limit: one clear warning, and the refused folders polled (SPEC §6).

The limit is made in-process: watchdog's ``inotify_add_watch`` fails with ENOSPC (what the
kernel says past ``fs.inotify.max_user_watches``) after N watches. Everything else is real:
the kernel's inotify for the first N folders, the files, the sync.
"""

from __future__ import annotations

import ctypes
import errno
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from watchdog.observers import inotify_c

from pipeline.models import Policy
from pipeline.run.ingest import Options
from pipeline.run.watch import SyncReport, Watcher

FOLDERS = ("", "a", "b", "b/c", "d", "d/e/f")


def limit_watches(monkeypatch: pytest.MonkeyPatch, limit: int) -> None:
    real = inotify_c.inotify_add_watch
    added = [0]

    def limited(fd: int, path: bytes, mask: int) -> int:
        if added[0] >= limit:
            ctypes.set_errno(errno.ENOSPC)
            return -1
        wd = real(fd, path, mask)
        added[0] += wd != -1
        return int(wd)

    monkeypatch.setattr(inotify_c, "inotify_add_watch", limited)


def wait_until(check: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def shows(out: Path, rel: str, needle: str) -> bool:
    folder, _, name = rel.rpartition("/")
    stem = name.rsplit(".", 1)[0]
    texts = []
    for path in (out / folder).glob(f"doc_{stem}__ch*.json"):
        try:
            texts.append(json.loads(path.read_bytes())["originalText"])
        except (OSError, ValueError):
            return False
    return needle in "\n".join(texts)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    for folder in FOLDERS:
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / "doc.md").write_text(f"# In {folder or 'the root'}\n\nFirst words.\n")
    return root


def watching(corpus: Path, out: Path) -> tuple[Watcher, list[str], list[SyncReport]]:
    warnings: list[str] = []
    reports: list[SyncReport] = []
    opts = Options(corpus, out, Policy(target_tokens=64, overlap_tokens=8), jobs=1)
    watcher = Watcher(opts, on_sync=reports.append, on_warning=warnings.append)
    return watcher, warnings, reports


def save_everywhere(corpus: Path, out: Path, word: str) -> None:
    for folder in FOLDERS:
        rel = f"{folder}/doc.md" if folder else "doc.md"
        (corpus / rel).write_text(f"# In {folder or 'the root'}\n\nFirst words.\n\nNow {word}.\n")
    for folder in FOLDERS:
        rel = f"{folder}/doc.md" if folder else "doc.md"
        wait_until(lambda rel=rel: shows(out, rel, f"Now {word}."), f"{rel} to be synced")


@pytest.fixture
def limited_run(
    request: pytest.FixtureRequest, corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Watcher, list[str], Path]]:
    limit_watches(monkeypatch, request.param)
    watcher, warnings, _ = watching(corpus, tmp_path / "out")
    with watcher:
        yield watcher, warnings, tmp_path / "out"


@pytest.mark.parametrize("limited_run", [3], indirect=True)
def test_folders_past_the_limit_are_polled_with_one_warning(
    limited_run: tuple[Watcher, list[str], Path], corpus: Path
) -> None:
    watcher, warnings, out = limited_run
    assert len(warnings) == 1, warnings
    total = len(FOLDERS) + 1  # d/e is a folder too
    assert f"only 3 of the corpus's {total} folders" in warnings[0]
    assert (
        "fs.inotify.max_user_watches" in warnings[0]
        and "sudo sysctl fs.inotify.max_user_watches=" in warnings[0]
    )
    save_everywhere(corpus, out, "saved once")  # every folder, watched or polled, is synced
    (corpus / "d" / "new").mkdir()  # a folder made under a polled one is polled too
    (corpus / "d" / "new" / "late.md").write_text("# Late\n\nArrived later.\n")
    wait_until(lambda: shows(out, "d/new/late.md", "Arrived later."), "a document in a new folder")
    save_everywhere(corpus, out, "saved twice")
    assert not watcher.failing and watcher.fatal is None
    assert len(watcher.warnings) == 1


@pytest.mark.parametrize("limited_run", [0], indirect=True)
def test_a_refused_root_falls_back_to_polling_everything(
    limited_run: tuple[Watcher, list[str], Path], corpus: Path
) -> None:
    watcher, warnings, out = limited_run
    assert len(warnings) == 1 and "refused to watch the corpus folder itself" in warnings[0]
    assert "fs.inotify.max_user_watches" in warnings[0]
    save_everywhere(corpus, out, "polled")
    assert not watcher.failing and watcher.fatal is None


def test_no_warning_when_every_folder_is_watched(corpus: Path, tmp_path: Path) -> None:
    watcher, warnings, _ = watching(corpus, tmp_path / "out")
    with watcher:
        save_everywhere(corpus, tmp_path / "out", "watched")
    assert warnings == []
