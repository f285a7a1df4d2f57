"""Index identity (001 rule 6): what ``index_hash`` covers, and the refusals it backs.

``index_hash`` = ``<store kind>:`` + 16 hex of blake3 over the index's configuration —
embedder name, dimension, normalisation, the BM25 analyzer, the chunk policies
(``policyHash`` of the indexed chunks) — and a digest of the indexed ``(chunk_id, hash)``
set (a sum of per-pair hashes, updated by each run's changes). It is recomputed in every commit and stored in the index's meta; a citation whose
``index_hash`` differs was retrieved from another index (another model, or other chunks).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import blake3
import orjson

from pipeline.index.store import IndexMismatchError

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
