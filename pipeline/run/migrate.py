"""From ``manifest.json`` to the state database, once, without re-chunking anything.

An output written by a chunkyard before the state database holds ``.chunkyard/manifest.json``
(and maybe ``redirects.json``, ``inflight.json``, ``changes.jsonl``). The first session that
opens it copies the manifest's documents, the redirect map and the in-flight record into
``state.sqlite`` in one transaction, starts the feed with one ``ingest.write`` per chunk
file (so a reader starting at seq 0 ends in the current state), and only then removes the
old files (``changes.jsonl`` is renamed ``changes.jsonl.pre-seq``: its byte cursors are
void, as the feed now has sequence numbers). A run killed in the middle migrates again.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

from pipeline.run.db import StateDB
from pipeline.run.state import FEED, INFLIGHT, MANIFEST, REDIRECTS, event, now_iso, state_dir

MIGRATED_FEED = FEED + ".pre-seq"


def _load(path: Path) -> Any:
    try:
        return orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None


def migrate(out: Path, db: StateDB) -> str | None:
    """Copy an old ``manifest.json`` into ``db`` (empty so far); a note for the run's output, or None."""
    folder = state_dir(out)
    manifest = _load(folder / MANIFEST)
    if not isinstance(manifest, dict) or manifest.get("format") != 1 or db.has_docs():
        return None
    docs: dict[str, dict[str, Any]] = manifest.get("docs") or {}
    generation = int(manifest.get("generation", 0))
    redirects = (_load(folder / REDIRECTS) or {}).get("redirects") or {}
    inflight = _load(folder / INFLIGHT)
    run_id = "migration-" + str(manifest.get("run_id", ""))
    chunks = 0
    with db.transaction():
        rows: list[tuple[str, str, int, bytes]] = []  #: feed rows (``feed.append``)
        for rel in sorted(docs):
            entry = docs[rel]
            db.put_doc(rel, entry, generation)
            base = event("ingest.write", run_id, generation, ts=now_iso())
            files, ids, cids, hashes = (entry.get(k) or [] for k in ("files", "ids", "chunk_ids", "hashes"))
            for i, file in enumerate(files):
                line = {**base, "mem_hash": hashes[i], "file": file, "id": ids[i], "chunk_id": cids[i]}
                line.update(hash=hashes[i], source=rel, change="text")
                rows.append(("f\x1f" + file, "w", 1, orjson.dumps(line)))
            chunks += len(files)
        from pipeline.run import feed as feed_mod

        feed_mod.append(db, rows)
        for old, new in redirects.items():
            if isinstance(new, str):
                db.set_redirect(str(old), new)
        if isinstance(inflight, dict) or (folder / INFLIGHT).exists():
            rels = inflight.get("docs") if isinstance(inflight, dict) else None
            sweep = bool(inflight.get("sweep", True)) if isinstance(inflight, dict) else True
            db.set_inflight([str(r) for r in rels or ()], sweep=sweep)
        header = {k: manifest[k] for k in ("version", "policy_hash", "corpus") if k in manifest}
        policy = orjson.dumps(manifest.get("policy") or {}, option=orjson.OPT_SORT_KEYS).decode()
        db.set_meta(
            generation=generation, policy=policy, written_at_epoch=manifest.get("written_at_epoch", 0.0)
        )
        db.set_meta(**header)
    for name in (MANIFEST, REDIRECTS, INFLIGHT):
        (folder / name).unlink(missing_ok=True)
    if (folder / FEED).exists():
        os.replace(folder / FEED, folder / MIGRATED_FEED)
    return (
        f"{folder}: migrated {MANIFEST} ({len(docs):,} documents, {chunks:,} chunk files, "
        f"{len(redirects):,} redirects) to the state database {db.path.name}; nothing was re-chunked. "
        f"The change feed now has sequence numbers (read it with pipeline.run.feed.read_feed); "
        f"the old {FEED} is kept as {MIGRATED_FEED}"
    )
