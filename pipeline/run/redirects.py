"""Redirects: old ``chunk_id`` → new ``chunk_id`` after an edit (docs/spec.md, Addresses that survive edits).

When an edit moves the outline (a heading added, renamed, moved or removed), ``r=``
changes and with it every ``chunk_id`` of the document; an edit may also shift
``s=`` or ``b=``. Each old id that no longer exists is matched to a new chunk by
content: an equal ``hash`` first, then the greatest text overlap (word shingles:
how much of the old text the new chunk contains), then, for a chunk whose text
was rewritten in place (a renamed heading), the new chunk at the same section
path and block index. Chains are collapsed, so a redirect map always points at
live ids. Everything here is pure; ``ingest`` does the I/O.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass

#: A match must cover at least this share of the old chunk's shingles...
MIN_SHARE = 0.5
#: ...unless it is the only candidate holding anything of the old text at all.
MIN_SHARE_LAST_RESORT = 0.25

_CJK = "\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef"
#: A word: a CJK character alone (no spaces there), else a run of other non-blanks.
_WORD = re.compile(f"[{_CJK}]|[^\\s{_CJK}]+")


@dataclass(frozen=True, slots=True)
class Chunklet:
    """What matching needs of a chunk: its id, its hash and (when known) its text."""

    chunk_id: str
    hash: str
    text: str | None = None


@dataclass(frozen=True, slots=True)
class Redirect:
    """Where an old id now points, and how the match was made."""

    new: str
    how: str  #: ``hash``, ``overlap``, ``position`` or ``rename``


def words(text: str) -> list[str]:
    return _WORD.findall(text)


def shingles(text: str, k: int = 3) -> frozenset[int]:
    """Hashed ``k``-word shingles (the whole text as one shingle when it is shorter)."""
    ws = words(text)
    if len(ws) <= k:
        return frozenset({hash(tuple(ws))}) if ws else frozenset()
    return frozenset(hash(tuple(ws[i : i + k])) for i in range(len(ws) - k + 1))


def place(chunk_id: str) -> str:
    """The ``chunk_id`` without ``r=``: the same section path and block index."""
    head, _, rest = chunk_id.partition("|r=")
    return f"{head}|{rest.partition('|')[2]}"


def match(
    old: Sequence[Chunklet], new: Sequence[Chunklet], *, min_share: float = MIN_SHARE
) -> dict[str, Redirect]:
    """Map each old chunk to the new chunk of the same document that holds its text.

    ``old`` are the chunks whose ids vanished, ``new`` all chunks of the new
    version. One-to-one where possible: a new chunk already claimed is used again
    only when nothing else holds the old text. Old chunks whose text went, and
    which have no counterpart in place, are left out.
    """
    out: dict[str, Redirect] = {}
    claimed: set[int] = set()
    by_hash: dict[str, list[int]] = defaultdict(list)
    for j, n in enumerate(new):
        by_hash[n.hash].append(j)
    new_place = {place(n.chunk_id): j for j, n in enumerate(new)}

    # 1. equal hash: the same text, wherever it went
    for o in old:
        cands = by_hash.get(o.hash)
        if not cands:
            continue
        free = [j for j in cands if j not in claimed]
        same_place = [j for j in free if place(new[j].chunk_id) == place(o.chunk_id)]
        j = (same_place or free or cands)[0]
        claimed.add(j)
        out[o.chunk_id] = Redirect(new[j].chunk_id, "hash")

    # 2. greatest overlap: the share of the old text's shingles a new chunk holds
    rest = [o for o in old if o.chunk_id not in out and o.text]
    best: dict[int, tuple[float, int]] = {}  # old → (share, new) of its best holder
    if rest:
        index: dict[int, list[int]] = defaultdict(list)
        new_sh = [shingles(n.text or "") for n in new]
        for j, sh in enumerate(new_sh):
            for s in sh:
                index[s].append(j)
        scored: list[tuple[float, float, int, int]] = []  # (-share, -density, old, new)
        for i, o in enumerate(rest):
            sh = shingles(o.text or "")
            if not sh:
                continue
            counts: dict[int, int] = defaultdict(int)
            for s in sh:
                for j in index.get(s, ()):
                    counts[j] += 1
            for j, c in counts.items():
                scored.append((-c / len(sh), -c / max(len(new_sh[j]), 1), i, j))
        scored.sort()
        for neg_share, _, i, j in scored:  # one-to-one first, best pairs first
            best.setdefault(i, (-neg_share, j))
            if -neg_share < min_share or rest[i].chunk_id in out or j in claimed:
                continue
            claimed.add(j)
            out[rest[i].chunk_id] = Redirect(new[j].chunk_id, "overlap")
        for i, (share, j) in best.items():  # then the best holder, even if shared
            o = rest[i]
            if o.chunk_id not in out and share >= min_share:
                out[o.chunk_id] = Redirect(new[j].chunk_id, "overlap")

    # 3. the same place, for text rewritten in place (a renamed heading)
    for o in old:
        if o.chunk_id in out:
            continue
        j_place = new_place.get(place(o.chunk_id))
        if j_place is not None and j_place not in claimed:
            claimed.add(j_place)
            out[o.chunk_id] = Redirect(new[j_place].chunk_id, "position")

    # 4. a weaker overlap, when it is all that is left of the old text
    for i, (share, j) in best.items():
        o = rest[i]
        if o.chunk_id not in out and share >= MIN_SHARE_LAST_RESORT:
            out[o.chunk_id] = Redirect(new[j].chunk_id, "overlap")
    return out


def match_by_hash(old: Iterable[tuple[str, str]], new: Iterable[tuple[str, str]]) -> dict[str, Redirect]:
    """Chunks of a deleted document found again, byte for byte, in another one (a rename).

    Both sides are ``(chunk_id, hash)`` pairs; the first new chunk with an equal hash wins.
    """
    target: dict[str, str] = {}
    for cid, digest in new:
        target.setdefault(digest, cid)
    return {cid: Redirect(target[digest], "rename") for cid, digest in old if digest in target}


def collapse(current: Mapping[str, str], fresh: Mapping[str, str], live: Container[str]) -> dict[str, str]:
    """The redirect map after this run: chains collapsed, every target live.

    ``current`` is the map so far, ``fresh`` the redirects found now, ``live`` every
    ``chunk_id`` that exists after the run. An old id that exists again is dropped
    (it resolves directly); a redirect whose target vanished follows that target's
    own redirect, or is dropped when the target's text went.
    """

    def follow(cid: str) -> str | None:
        seen = {cid}
        while cid not in live:
            nxt = fresh.get(cid)
            if nxt is None or nxt in seen:
                return None
            seen.add(nxt)
            cid = nxt
        return cid

    out: dict[str, str] = {}
    for old, target in (*current.items(), *fresh.items()):
        if old in live:
            continue
        final = follow(target)
        if final is not None and final != old:
            out[old] = final
    return out


def changes(before: Mapping[str, str], after: Mapping[str, str]) -> dict[str, str]:
    """The entries that are new or point elsewhere now (one ``ingest.redirect`` event each)."""
    return {old: new for old, new in after.items() if before.get(old) != new}
