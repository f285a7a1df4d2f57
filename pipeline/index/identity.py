"""Index identity (001 rule 6): what ``index_hash`` covers, and the refusals it backs.

``index_hash`` = ``<store kind>:`` + 16 hex of blake3 over the index's configuration —
embedder name, dimension, normalisation, the BM25 analyzer, the chunk policies
(``policyHash`` of the indexed chunks) — and a digest of the indexed ``(chunk_id, hash)``
set (a sum of per-pair hashes, updated by each run's changes). It is recomputed in every commit and stored in the index's meta; a citation whose
``index_hash`` differs was retrieved from another index (another model, or other chunks).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import blake3
import orjson

from pipeline.index.rows import RowState
from pipeline.index.vector_store import IndexMismatchError

FORMAT = "1"  #: the store layout's version, in meta ``format``


def embedder_config(embedder: Any) -> dict[str, str]:
    """The meta strings that pin the embedder: name, dimension, normalisation, window."""
    return {
        "embed_model": str(embedder.name),
        "dim": str(int(embedder.dim)),
        "normalized": "true" if embedder.normalized else "false",
        "max_tokens": str(int(embedder.max_tokens)),
    }


#: ``set_digest`` is a sum of per-pair hashes modulo 2**128: order-free, and a run updates
#: it by the pairs it removes and adds (``digest_add`` / ``digest_remove``) instead of
#: hashing every indexed pair again (O(changes), not O(index)).
_MOD = 1 << 128


def pair_term(chunk_id: str, chunk_hash: str) -> int:
    """One ``(chunk_id, hash)`` pair's share of ``set_digest`` (128 bits of blake3)."""
    return int.from_bytes(blake3.blake3(f"{chunk_id}\t{chunk_hash}\n".encode()).digest()[:16], "big")


def set_digest(pairs: Iterable[tuple[str, str]]) -> str:
    """The indexed ``(chunk_id, hash)`` set as 32 hex: the sum of ``pair_term`` modulo 2**128.

    Equal sets give equal digests whatever the order; one changed pair changes it.
    """
    return digest_update("", add=pairs)


def digest_update(
    digest: str,
    *,
    add: Iterable[tuple[str, str]] = (),
    remove: Iterable[tuple[str, str]] = (),
) -> str:
    """``digest`` (a ``set_digest``; ``""`` = the empty set) with pairs added and removed."""
    total = int(digest, 16) if digest else 0
    for cid, h in add:
        total += pair_term(cid, h)
    for cid, h in remove:
        total -= pair_term(cid, h)
    return format(total % _MOD, "032x")


def index_hash(kind: str, meta: Mapping[str, str], policies: Iterable[str], content: str) -> str:
    """``<kind>:<16 hex>`` over the configuration in ``meta``, the chunk policies and ``content``."""
    config = {
        "embed_model": meta.get("embed_model", ""),
        "dim": meta.get("dim", ""),
        "normalized": meta.get("normalized", ""),
        "analyzer": meta.get("analyzer", ""),
        "policies": sorted(set(policies)),
        "content": content,
    }
    return f"{kind}:{blake3.blake3(orjson.dumps(config, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]}"


def rebuild_hint(out: str, store: str | None, spec: str | None) -> str:
    """The command that rebuilds the index with the given embedder."""
    parts = ["chunkyard index", f"--out {out}"]
    if store:
        parts.append(f"--store {store}")
    if spec:
        parts.append(f"--embedder {spec}")
    return " ".join([*parts, "--rebuild"])


def check_compatible(stored: Mapping[str, str], wanted: Mapping[str, str], *, where: str, hint: str) -> None:
    """Refuse another embedder (``mismatch_index_hash``) or analyzer (``analyzer_mismatch``).

    ``stored``: the index's meta (empty for a new index: anything goes). ``wanted``: the
    run's or the query's embedder config plus ``analyzer``.
    """
    if not stored.get("embed_model"):
        return
    for key in ("embed_model", "dim", "normalized"):
        if key in wanted and stored.get(key) != wanted[key]:
            raise IndexMismatchError(
                "mismatch_index_hash",
                f"{where}: the index was built with {key} {stored.get(key)!r}, this run uses "
                f"{wanted[key]!r}: vectors of two models never mix (hint: rebuild it: `{hint}`)",
            )
    if "analyzer" in wanted and stored.get("analyzer") != wanted["analyzer"]:
        raise IndexMismatchError(
            "analyzer_mismatch",
            f"{where}: the index's BM25 analyzer is {stored.get('analyzer')!r}, this chunkyard reads with "
            f"{wanted['analyzer']!r} (hint: rebuild it: `{hint}`)",
        )


@dataclass(slots=True)
class IndexSummary:
    """What ``index_hash`` and the report say about the whole index after a run.

    Kept in meta (``chunks``, ``truncated``, ``policy_counts``, ``content``) so that an
    incremental run updates it by the rows it changes instead of reading every row.
    """

    chunks: int
    truncated: int
    policy_counts: dict[str, int]
    content: str  #: ``set_digest`` of the indexed (chunk_id, hash) pairs

    @property
    def policies(self) -> list[str]:
        return sorted(p for p, n in self.policy_counts.items() if n > 0)

    def meta(self) -> dict[str, str]:
        return {
            "chunks": str(self.chunks),
            "truncated": str(self.truncated),
            "policies": ",".join(self.policies),
            "policy_counts": orjson.dumps(
                {p: n for p, n in self.policy_counts.items() if n > 0}, option=orjson.OPT_SORT_KEYS
            ).decode(),
            "content": self.content,
        }


SUMMARY_KEYS = ("chunks", "truncated", "policy_counts", "content")


def summarize(
    stored: Mapping[str, str],
    every: Mapping[str, RowState] | None,
    read_every: Callable[[], Mapping[str, RowState]],
    doomed: Collection[str],
    before: Mapping[str, RowState],
    written: Mapping[str, RowState],
    window: int,
) -> IndexSummary:
    """The index's summary after a run: from scratch when ``every`` stored row is given (a full
    run) or the stored meta has no summary yet (an index written before it was kept: then
    ``read_every`` row once), else the stored summary plus the run's changes.

    ``doomed``: ids deleted; ``before``: the stored state of every id the run touched;
    ``written``: the rows it writes; ``window``: a row past it counts as truncated.
    """
    if every is None and not all(stored.get(k) for k in SUMMARY_KEYS):
        every = read_every()
    if every is not None:
        after = {cid: s for cid, s in every.items() if cid not in doomed} | dict(written)
        counts: dict[str, int] = {}
        for s in after.values():
            counts[s.policy_hash] = counts.get(s.policy_hash, 0) + 1
        return IndexSummary(
            chunks=len(after),
            truncated=sum(1 for s in after.values() if s.model_tokens > window),
            policy_counts=counts,
            content=set_digest((c, s.hash) for c, s in after.items()),
        )
    summary = IndexSummary(
        chunks=int(stored["chunks"]),
        truncated=int(stored["truncated"]),
        policy_counts={str(k): int(v) for k, v in orjson.loads(stored["policy_counts"]).items()},
        content=stored["content"],
    )
    gone = [(cid, before[cid]) for cid in sorted(set(doomed) | set(written)) if cid in before]
    for sign, pairs in ((-1, gone), (1, sorted(written.items()))):
        for _cid, s in pairs:
            summary.chunks += sign
            summary.truncated += sign * (s.model_tokens > window)
            summary.policy_counts[s.policy_hash] = summary.policy_counts.get(s.policy_hash, 0) + sign
    summary.content = digest_update(
        summary.content,
        add=[(c, s.hash) for c, s in written.items()],
        remove=[(c, s.hash) for c, s in gone],
    )
    return summary
