"""emit's atomic writes: named temp files renamed over, or unnamed files linked into a fresh folder."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

import pipeline.run.emit as emit_mod
from pipeline.run.emit import write_all_atomic

needs_unnamed = pytest.mark.skipif(not emit_mod._unnamed_usable, reason="no O_TMPFILE here (Linux only)")


def _items(folder: Path, n: int, sub: str = "") -> list[tuple[str, bytes]]:
    return [(f"{folder}/{sub}doc_a__ch{i}.json", b'{"n": %d}\n' % i) for i in range(n)]


def _names(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.fixture(autouse=True)
def _own_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with emit's per-process flags as a fresh worker has them, and
    leaves them as it found them."""
    monkeypatch.setattr(emit_mod, "_unnamed_usable", emit_mod._unnamed_usable)
    monkeypatch.setattr(emit_mod, "_unnamed_proven", False)


def _no_named_temps(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*a: Any) -> str:
        raise AssertionError("a named temp file was made")

    monkeypatch.setattr(emit_mod, "_write_temp", refuse)


@needs_unnamed
def test_a_fresh_folder_gets_unnamed_files_linked_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sub").mkdir()
    items = _items(tmp_path, 3) + _items(tmp_path, 2, "sub/")
    _no_named_temps(monkeypatch)
    write_all_atomic(items, new=True)
    assert _names(tmp_path) == [
        "doc_a__ch0.json",
        "doc_a__ch1.json",
        "doc_a__ch2.json",
        "sub",
        "sub/doc_a__ch0.json",
        "sub/doc_a__ch1.json",
    ]
    assert emit_mod._unnamed_proven  # from now on a failure in this process is a real one
    for path, data in items:
        assert Path(path).read_bytes() == data
        assert Path(path).stat().st_mode & 0o777 == 0o644 & ~_umask()


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old


@needs_unnamed
def test_a_document_with_nothing_to_write_proves_nothing(tmp_path: Path) -> None:
    write_all_atomic([], new=True)
    assert emit_mod._unnamed_proven is False  # a later failure still falls back to named temps


@needs_unnamed
def test_a_target_that_exists_after_all_is_replaced(tmp_path: Path) -> None:
    items = _items(tmp_path, 3)
    Path(items[1][0]).write_bytes(b"old")
    write_all_atomic(items, new=True)
    assert [Path(p).read_bytes() for p, _ in items] == [d for _, d in items]
    assert _names(tmp_path) == ["doc_a__ch0.json", "doc_a__ch1.json", "doc_a__ch2.json"]


@needs_unnamed
def test_a_failed_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = emit_mod._write_fd
    calls: list[int] = []

    def disk_full_on_the_third(fd: int, data: bytes) -> None:
        calls.append(fd)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, data)

    monkeypatch.setattr(emit_mod, "_unnamed_proven", True)  # unnamed files worked before
    monkeypatch.setattr(emit_mod, "_write_fd", disk_full_on_the_third)
    with pytest.raises(OSError, match="No space"):
        write_all_atomic(_items(tmp_path, 5), new=True)
    assert _names(tmp_path) == []


@needs_unnamed
def test_a_failed_link_takes_back_the_names_it_gave(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.link
    links: list[str] = []

    def link(src: str, dst: str, **kw: Any) -> None:
        links.append(dst)
        if len(links) == 3:
            raise OSError(errno.EMLINK, "Too many links")
        real(src, dst, **kw)

    monkeypatch.setattr(emit_mod, "_unnamed_proven", True)  # unnamed files worked before
    monkeypatch.setattr(emit_mod.os, "link", link)
    with pytest.raises(OSError, match="Too many links"):
        write_all_atomic(_items(tmp_path, 5), new=True)
    assert len(links) == 3
    assert _names(tmp_path) == []


@needs_unnamed
def test_unnamed_files_that_fail_before_they_ever_worked_give_way_to_named_temps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A /proc that is not procfs, say: the first document is written the other way,
    and so is every later one, with nothing of the failed attempt left behind."""
    real = os.link
    links: list[str] = []

    def link(src: str, dst: str, **kw: Any) -> None:
        links.append(dst)
        if src.startswith("/proc/") and len(links) == 2:
            raise OSError(errno.EPERM, "Operation not permitted")
        real(src, dst, **kw)

    monkeypatch.setattr(emit_mod.os, "link", link)
    items = _items(tmp_path, 3)
    write_all_atomic(items, new=True)
    assert [Path(p).read_bytes() for p, _ in items] == [d for _, d in items]
    assert _names(tmp_path) == ["doc_a__ch0.json", "doc_a__ch1.json", "doc_a__ch2.json"]
    assert emit_mod._unnamed_usable is False
    write_all_atomic(_items(tmp_path / "x", 2), new=True)
    assert len(links) == 2 and (tmp_path / "x" / "doc_a__ch1.json").exists()


def test_a_file_system_without_unnamed_files_gets_named_temps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.open
    unnamed = getattr(os, "O_TMPFILE", 0)
    refused: list[str] = []

    def no_tmpfile(path: str, flags: int, *a: Any, **kw: Any) -> int:
        if unnamed and flags & unnamed == unnamed:
            refused.append(path)
            raise OSError(errno.EOPNOTSUPP, "Operation not supported")
        return real(path, flags, *a, **kw)

    monkeypatch.setattr(emit_mod.os, "open", no_tmpfile)
    tries_unnamed = emit_mod._unnamed_usable  # Linux: it asks for an unnamed file first
    items = _items(tmp_path, 3)
    write_all_atomic(items, new=True)
    assert [Path(p).read_bytes() for p, _ in items] == [d for _, d in items]
    assert _names(tmp_path) == ["doc_a__ch0.json", "doc_a__ch1.json", "doc_a__ch2.json"]
    assert len(refused) == (1 if tries_unnamed else 0)
    assert emit_mod._unnamed_usable is False  # asked once at most, then never again in this process
    write_all_atomic(_items(tmp_path / "x", 2), new=True)
    assert len(refused) == (1 if tries_unnamed else 0)
    assert (tmp_path / "x" / "doc_a__ch1.json").exists()


def test_a_document_with_very_many_files_takes_named_temps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*a: Any) -> None:
        raise AssertionError("more files than descriptors allowed at once")

    monkeypatch.setattr(emit_mod, "_write_all_new", refuse)
    items = _items(tmp_path, emit_mod._UNNAMED_AT_ONCE + 1)
    write_all_atomic(items, new=True)
    assert len(_names(tmp_path)) == len(items)


def test_existing_targets_are_renamed_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    items = _items(tmp_path, 3)
    for path, _ in items:
        Path(path).write_bytes(b"old")

    def refuse(*a: Any) -> None:
        raise AssertionError("not a fresh folder")

    monkeypatch.setattr(emit_mod, "_write_all_new", refuse)
    write_all_atomic(items)
    assert [Path(p).read_bytes() for p, _ in items] == [d for _, d in items]
    assert _names(tmp_path) == ["doc_a__ch0.json", "doc_a__ch1.json", "doc_a__ch2.json"]
