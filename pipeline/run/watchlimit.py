"""Watch past the inotify limit: find the folders inotify refused, and poll those (docs/spec.md, Watch).

inotify needs one watch per folder, and the kernel caps them per user
(``fs.inotify.max_user_watches``). watchdog reports a refused root, but drops a refused
subfolder silently, so a watch could miss saves with no word said. After the observer has
started, ``unwatched`` compares the folders under the corpus with the watches this process
holds (``/proc/self/fdinfo``: each watch's device and inode), and ``FolderPoller`` polls
the folders inotify does not cover, so every save is still seen; ``limit_warning`` is the
one message that says so, and how to raise the limit.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

#: Where the kernel's limit is read (Linux).
MAX_WATCHES = Path("/proc/sys/fs/inotify/max_user_watches")


def max_user_watches() -> int | None:
    try:
        return int(MAX_WATCHES.read_text().strip())
    except (OSError, ValueError):
        return None


def watched_inodes() -> set[tuple[int, int]] | None:
    """``(st_dev, st_ino)`` of every folder this process's inotify instances watch; None off Linux."""
    fd_dir = "/proc/self/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return None
    found: set[tuple[int, int]] = set()
    for fd in fds:
        try:
            if os.readlink(f"{fd_dir}/{fd}") != "anon_inode:inotify":
                continue
            with open(f"/proc/self/fdinfo/{fd}") as fh:
                lines = fh.read().splitlines()
        except OSError:
            continue
        for line in lines:
            if not line.startswith("inotify wd:"):
                continue
            fields = dict(part.split(":", 1) for part in line.split()[1:] if ":" in part)
            sdev = int(fields.get("sdev", "0"), 16)  # the kernel's encoding: major << 20 | minor
            found.add((os.makedev(sdev >> 20, sdev & 0xFFFFF), int(fields.get("ino", "0"), 16)))
    return found


def folders_under(root: str, skip: Callable[[str], bool]) -> list[str]:
    """Every folder under ``root`` (itself included) that watch cares about, as watchdog walks them."""
    out = [root]
    for dirpath, dirnames, _ in os.walk(root):
        dirnames[:] = [d for d in dirnames if not skip(os.path.join(dirpath, d))]
        out.extend(os.path.join(dirpath, d) for d in dirnames if not os.path.islink(os.path.join(dirpath, d)))
    return out


def unwatched(root: str, skip: Callable[[str], bool]) -> tuple[list[str], int] | None:
    """The folders under ``root`` no inotify watch covers, and how many folders there are."""
    watched = watched_inodes()
    if watched is None:
        return None
    folders = folders_under(root, skip)
    missing = []
    for folder in folders:
        try:
            st = os.stat(folder)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) not in watched:
            missing.append(folder)
    return missing, len(folders)


def limit_warning(missing: int, total: int, *, root_refused: bool = False) -> str:
    """The one warning: what was refused, the limit, and the sysctl that raises it."""
    limit = max_user_watches()
    shown = f"{limit:,}" if limit is not None else "unknown"
    what = (
        "inotify refused to watch the corpus folder itself, so every folder is polled instead"
        if root_refused
        else f"inotify could watch only {total - missing:,} of the corpus's {total:,} folders; "
        f"the other {missing:,} are polled instead"
    )
    want = max(2 * total, (limit or 0) * 2, 65536)
    return (
        f"watch: {what} (the inotify watch limit, fs.inotify.max_user_watches, is {shown}; "
        f"others may use part of it). Saves there are seen within about a poll interval, at "
        f"some CPU. To raise the limit: sudo sysctl fs.inotify.max_user_watches={want}"
    )


class FolderPoller:
    """Polls a set of folders (not their subfolders, unless new ones appear) for changes.

    Each round lists every folder; an entry that is new, gone, or has a new mtime or size
    is reported to ``on_change(path, is_dir)``. A folder that appears in a polled folder is
    polled from then on (inotify did not watch its parent, so it will not watch it either).
    """

    def __init__(self, folders: list[str], interval: float, on_change: Callable[[str, bool], None]) -> None:
        self.interval = interval
        self.on_change = on_change
        self._snap: dict[str, dict[str, tuple[bool, int, int]]] = {f: self._scan(f) for f in folders}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chunkyard-poll", daemon=True)

    @property
    def folders(self) -> list[str]:
        return sorted(self._snap)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    @staticmethod
    def _scan(folder: str) -> dict[str, tuple[bool, int, int]]:
        entries: dict[str, tuple[bool, int, int]] = {}
        try:
            with os.scandir(folder) as it:
                for e in it:
                    try:
                        st = e.stat(follow_symlinks=True)
                    except OSError:
                        continue
                    is_dir = e.is_dir(follow_symlinks=False)
                    entries[e.name] = (is_dir, st.st_mtime_ns, 0 if is_dir else st.st_size)
        except OSError:
            pass
        return entries

    def poll_once(self) -> None:
        for folder in list(self._snap):
            old, new = self._snap[folder], self._scan(folder)
            self._snap[folder] = new
            for name in old.keys() | new.keys():
                a, b = old.get(name), new.get(name)
                if a == b:
                    continue
                path = os.path.join(folder, name)
                is_dir = bool((b or a or (False, 0, 0))[0])
                if is_dir and (a is None or not a[0]) and b is not None:
                    for sub in folders_under(path, lambda _p: False):
                        self._snap.setdefault(sub, self._scan(sub))
                if is_dir and b is not None and a is not None:
                    continue  # a subfolder's own mtime: its contents are polled on their own
                self.on_change(path, is_dir)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll_once()
