"""Compare two chunkyard output folders: chunk files byte for byte, state + feed row by row.

Usage: python bench/compare_outputs.py OLD_OUT NEW_OUT
       python bench/compare_outputs.py OLD_ROOT NEW_ROOT --all   (each subfolder: one output)

For a change that must not move behaviour (a refactoring): ingest every corpus of
``../shared/corpora`` with the old commit and with the new one, then compare.

Volatile fields ignored:
- chunk files: the values of ``"processedAt"`` and ``"processingTimeMs"`` (the run's clock
  and the document's timing); every other byte must match;
- state: meta rows written_at, written_at_epoch, run_id; folders.mtime_ns (the output
  folders' own mtimes); feed lines' ``ts`` and ``trace_id`` (the run's clock and id).
Everything else (docs, chunks, redirects, inflight, srcdirs, feed seq/key/kind/text/line,
sqlite_sequence, the remaining meta rows) must be equal, row for row.
Prints one line per difference (the first 20 per kind) and a summary; exits 1 on any.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import sys
from pathlib import Path
from typing import Any

#: The run's clock and the document's timing, inside each chunk's metadata.
VOLATILE_CHUNK = re.compile(rb'"processedAt": *"[^"]*"|"processingTimeMs": *[0-9.eE+-]+')
VOLATILE_META = {"written_at", "written_at_epoch", "run_id"}
VOLATILE_EVENT = {"ts", "trace_id"}


def files_under(root: Path) -> dict[str, Path]:
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".chunkyard"]
        for name in filenames:
            path = Path(dirpath) / name
            found[str(path.relative_to(root))] = path
    return found


def rows(conn: sqlite3.Connection, sql: str) -> list[tuple[Any, ...]]:
    return conn.execute(sql).fetchall()


def state_rows(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        tables = [t for (t,) in rows(conn, "SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
        out: dict[str, list[tuple[Any, ...]]] = {"(tables)": [(t,) for t in tables]}
        for t in tables:
            if t == "feed":
                feed = []
                for seq, key, kind, text, line in rows(
                    conn, "SELECT seq, key, kind, text, line FROM feed ORDER BY seq"
                ):
                    event = json.loads(line)
                    for k in VOLATILE_EVENT:
                        event.pop(k, None)
                    feed.append((seq, key, kind, text, json.dumps(event, sort_keys=True)))
                out[t] = feed
            elif t == "meta":
                out[t] = [
                    r
                    for r in rows(conn, "SELECT key, value FROM meta ORDER BY key")
                    if r[0] not in VOLATILE_META
                ]
            elif t == "folders":
                out[t] = rows(conn, "SELECT folder FROM folders ORDER BY folder")
            else:
                out[t] = sorted(rows(conn, f"SELECT * FROM {t}"), key=repr)
        out["(indexes)"] = rows(
            conn, "SELECT name, tbl_name, sql FROM sqlite_master WHERE type='index' ORDER BY name"
        )
        return out
    finally:
        conn.close()


def compare(old: Path, new: Path) -> tuple[int, int, int, int]:
    """(chunk files compared, state rows compared, differences, feed lines)."""
    diffs: list[str] = []
    a, b = files_under(old), files_under(new)
    for name in sorted(a.keys() - b.keys()):
        diffs.append(f"only in old: {name}")
    for name in sorted(b.keys() - a.keys()):
        diffs.append(f"only in new: {name}")
    for name in sorted(a.keys() & b.keys()):
        x, y = a[name].read_bytes(), b[name].read_bytes()
        if x != y and VOLATILE_CHUNK.sub(b"", x) != VOLATILE_CHUNK.sub(b"", y):
            diffs.append(f"chunk file differs: {name}")
    sa, sb = state_rows(old / ".chunkyard/state.sqlite"), state_rows(new / ".chunkyard/state.sqlite")
    compared = 0
    for table in sorted(sa.keys() | sb.keys()):
        ra, rb = sa.get(table, []), sb.get(table, [])
        compared += max(len(ra), len(rb))
        if ra != rb:
            sra, srb = set(ra), set(rb)
            only_a, only_b = [r for r in ra if r not in srb], [r for r in rb if r not in sra]
            diffs.append(
                f"state table {table}: {len(ra)} vs {len(rb)} rows; {len(only_a)} only old, {len(only_b)} only new"
            )
            for r in only_a[:5]:
                diffs.append(f"    old: {str(r)[:300]}")
            for r in only_b[:5]:
                diffs.append(f"    new: {str(r)[:300]}")
            if not only_a and not only_b:
                diffs.append("    (same rows, another order)")
    for line in diffs[:40]:
        print(f"  {line}")
    return len(a), compared, len(diffs), len(sa.get("feed", []))


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    old, new = Path(args[0]), Path(args[1])
    pairs = (
        [(old / c, new / c) for c in sorted(p.name for p in old.iterdir() if p.is_dir())]
        if "--all" in sys.argv
        else [(old, new)]
    )
    total = 0
    for o, n in pairs:
        if not n.exists():
            print(f"{n.name}: MISSING new output {n}")
            total += 1
            continue
        files, state, d, feed = compare(o, n)
        print(f"{o.name}: {files} chunk files, {state} state rows ({feed} feed lines): {d} differences")
        total += d
    print(f"TOTAL differences: {total}")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
