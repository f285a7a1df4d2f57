"""One document's whole job in a worker: read, chunk, check, write (docs/spec.md, Runs).

``process_document`` adds the two I/O ends to the pure ``runner.chunk_document``:
it reads the source, checks every record against the schema, and writes the
document's chunk files all or none. Every executor (the local guard pool, Ray)
runs exactly this function, so the output is the same whichever runs it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import orjson
import xxhash

from pipeline.errors import PipelineError, SchemaError, StageError
from pipeline.models import Chunk, Policy
from pipeline.run.emit import check_record, dumps, fast_validator, stable_digest, unchanged, write_all_atomic
from pipeline.run.model import DocResult, Job
from pipeline.run.redirects import Chunklet, match
from pipeline.run.state import read_journal, write_journal
from pipeline.runner import Timer, chunk_document, counter
from pipeline.stages.mdpatch import install_patches
from pipeline.stages.normalize import read_stamped

__all__ = ["DocResult", "Job", "prepare", "process_document"]  # Job and DocResult live in model.py


def prepare(policy: Policy) -> None:
    """Load everything processing a document needs, before the first document is read.

    Called in the parent before any worker forks (the workers inherit it all), so a worker
    never imports in the middle of a run: a venv replaced under a long ``watch``, or a
    process whose privileges dropped, cannot fail a document with ``ModuleNotFoundError``.
    """
    # the executors: starting a forked worker, the local pool's queues and locks (the guard
    # pool's own module is loaded by whoever makes one, before it forks)
    import concurrent.futures.process  # noqa: F401
    import multiprocessing.popen_fork
    import multiprocessing.queues
    import multiprocessing.synchronize  # noqa: F401

    install_patches()  # mistletoe's block readers, patched once before any fork
    fast_validator()  # jsonschema-rs and the compiled chunk schema
    counter(policy.tokenizer)  # the tokenizer's vocabulary


def process_document(job: Job, before_write: Callable[[], None] | None = None) -> DocResult:
    """Read, chunk, check and write one document. Never raises for bad input.

    ``before_write`` is called once the chunks are ready, before the first file is
    touched (the guard gives the write phase its own deadline, see ``guard.py``).
    """
    result = DocResult(job.rel_path)
    timer = Timer()
    try:
        raw, result.mtime_ns = read_stamped(Path(job.path), job.rel_path, job.max_bytes)
        result.size = len(raw)
        result.source_hash = xxhash.xxh3_64_hexdigest(raw)
        timer.lap("read")
        doc, chunks = chunk_document(
            raw,
            job.rel_path,
            job.policy,
            processed_at=job.processed_at,
            rev_width=job.rev_width,
            timer=timer,
        )
        result.warnings.extend(doc.warnings)
        for chunk in chunks:  # check them all before writing any: a document is all or nothing
            check_record(chunk.record, f"{job.rel_path}: {chunk.rel_file}")
        timer.lap("schema")
        for chunk in chunks:
            rec = chunk.record
            result.files.append(chunk.rel_file)
            result.ids.append(rec["id"])
            result.chunk_ids.append(rec["chunk_id"])
            result.hashes.append(rec["hash"])
            result.digests.append(stable_digest(rec))
            result.embeds.append(xxhash.xxh3_64_hexdigest(rec["embedText"].encode("utf-8")))
            result.tokens += rec["tokenStats"]["tokens"]
        if chunks:
            result.uid_rev = chunks[0].record["chunk_id"].split("|s=", 1)[0]
        result.redirects = _redirects(job, chunks)  # before any old file is overwritten
        timer.lap("mint")
        if before_write is not None:
            before_write()
        _write(job, chunks, result)
        timer.lap("write")
    except (StageError, SchemaError) as exc:
        result.error = str(exc)
    except RecursionError:
        result.error = f"{job.rel_path}: parse: nesting too deep (hint: flatten nested quotes or lists)"
    except OSError as exc:
        result.error = f"{job.rel_path}: write: {exc.strerror or exc} (hint: check the output folder)"
    except PipelineError as exc:
        result.error = str(exc)
    result.seconds = timer.seconds
    return result


def _write(job: Job, chunks: list[Chunk], result: DocResult) -> None:
    """Write the chunk files whose content moved, all or none (docs/spec.md, minimal writes).

    The change feed's view (``added``/``changed``) compares with the state, so a
    loader hears of every change even when a run that died had already written it.
    """
    digests = job.old_digests
    before = {f: digests[i] if i < len(digests) else "" for i, f in enumerate(job.old_files)}
    pending: list[tuple[str, bytes]] = []
    for chunk, digest in zip(chunks, result.digests, strict=True):
        target = f"{job.out}/{chunk.rel_file}"  # a str: a Path per chunk costs more than its write
        was = before.get(chunk.rel_file)  # None: a new file; "": digest unknown
        if job.output_was_empty:
            on_disk = False
        elif job.trusted and was:
            on_disk = was == digest and os.path.exists(target)
        else:
            on_disk = unchanged(Path(target), chunk.record)
        if was is None:
            result.added.append(chunk.rel_file)
        elif (was != digest) if was else not on_disk:
            result.changed.append(chunk.rel_file)
        if not on_disk:
            pending.append((target, dumps(chunk.record)))
    try:
        write_all_atomic(pending, new=job.output_was_empty, chunks=True)
    except OSError:
        result.unsafe = True
        raise
    result.written = len(pending)


def _redirects(job: Job, chunks: list[Chunk]) -> dict[str, tuple[str, str]]:
    """Match the old ids this version no longer has to new chunks, by content (docs/spec.md, Redirects)."""
    live = {c.record["chunk_id"] for c in chunks}
    gone = [i for i, cid in enumerate(job.old_chunk_ids) if cid not in live]
    if not gone or not chunks:
        return {}
    texts = _old_texts(job, gone)
    old = [
        Chunklet(job.old_chunk_ids[i], job.old_hashes[i], texts.get(job.old_chunk_ids[i], ("", None))[1])
        for i in gone
        if i < len(job.old_hashes)
    ]
    new = [Chunklet(c.record["chunk_id"], c.record["hash"], c.record["originalText"]) for c in chunks]
    return {cid: (r.new, r.how) for cid, r in match(old, new).items()}


def _old_texts(job: Job, gone: list[int]) -> dict[str, tuple[str, str | None]]:
    """The old texts of vanished chunks: from the journal of a run that died, else the old files.

    Each text is checked against the state's hash, so a file that a dead run already
    overwrote is never taken for the old text. What is found is journaled before any
    file is overwritten, so a crash from here on loses nothing.
    """
    out = Path(job.out)
    want = {
        job.old_chunk_ids[i]: (job.old_files[i], job.old_hashes[i])
        for i in gone
        if i < len(job.old_files) and i < len(job.old_hashes)
    }
    found: dict[str, tuple[str, str | None]] = {}
    journal = read_journal(out, job.rel_path)
    for cid, (digest, text) in journal.items():
        if cid in want and want[cid][1] == digest:
            found[cid] = (digest, text)
    read_now = False
    for cid, (file, digest) in want.items():
        if cid in found:
            continue
        try:
            rec = orjson.loads((out / file).read_bytes())
        except (OSError, orjson.JSONDecodeError):
            continue
        if isinstance(rec, dict) and rec.get("chunk_id") == cid and rec.get("hash") == digest:
            found[cid] = (digest, str(rec.get("originalText", "")))
            read_now = True
    if read_now:
        write_journal(out, job.rel_path, {cid: (d, t or "") for cid, (d, t) in found.items()})
    return found
