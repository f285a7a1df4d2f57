"""Rank fusion and score normalisation for ``chunkyard search``.

Hybrid fusion: each ranker's list is turned into z-scores (its score minus the list's mean,
over the list's standard deviation), a chunk missing from one list counts ``MISSING_Z`` there,
and the fused score is the weighted sum (equal weights by default). Unlike reciprocal rank
fusion it keeps how far a hit stands out: a chunk far ahead in one list is not overtaken by
chunks that are middling in both (the comparison with RRF on the gold sets is in
``docs/benchmarks.md``). ``fusion="rrf"`` keeps reciprocal rank fusion (``rrf_k``).

Scores: ``score_raw`` is the ranker's own (BM25 positive, higher is better; cosine
similarity; the fused z-score sum, or the RRF sum); ``score_norm`` maps it into [0, 1]
without looking at the other hits (BM25 s/(1+s), cosine (1+c)/2, the logistic function of
the z-score sum over the weights' sum, RRF divided by its maximum), so it never makes ties
that the raw scores did not have.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

MODES = ("hybrid", "dense", "bm25")
#: Hybrid fusion: ``zscore`` (the default) or ``rrf`` (reciprocal rank, ``RRF_K``).
FUSIONS = ("zscore", "rrf")
RRF_K = 60
#: A chunk missing from one ranker's list counts this z-score there (below almost all it holds).
MISSING_Z = -3.0

#: ``(chunk_id, score_raw, features {bm25, dense}, k_pos)``: a candidate before the tie-break.
Candidate = tuple[str, float, dict[str, float | None], int]


def fuse(
    bm25: Sequence[tuple[str, float]],
    dense: Sequence[tuple[str, float]],
    mode: str,
    weights: tuple[float, float] = (1.0, 1.0),
    fusion: str = "zscore",
    rrf_k: int = RRF_K,
) -> list[Candidate]:
    """The candidates of one query from the rankers' lists (best first each), by chunk id:
    ``mode`` ``bm25`` or ``dense`` keeps that list's scores, ``hybrid`` fuses both."""
    lex = {cid: (rank, score) for rank, (cid, score) in enumerate(bm25, 1)}
    vec = {cid: (rank, score) for rank, (cid, score) in enumerate(dense, 1)}
    z_lex, z_vec = zscores(bm25), zscores(dense)
    out: list[Candidate] = []
    for cid in sorted(lex.keys() | vec.keys()):
        features = {
            "bm25": lex[cid][1] if cid in lex else None,
            "dense": vec[cid][1] if cid in vec else None,
        }
        if mode == "bm25":
            out.append((cid, lex[cid][1], features, lex[cid][0]))
        elif mode == "dense":
            out.append((cid, vec[cid][1], features, vec[cid][0]))
        else:
            pairs = [(w, p[0]) for w, p in zip(weights, (lex.get(cid), vec.get(cid)), strict=True) if p]
            if fusion == "rrf":
                fused = sum(w / (rrf_k + r) for w, r in pairs)
            else:
                w_lex, w_vec = weights
                fused = w_lex * z_lex.get(cid, MISSING_Z) + w_vec * z_vec.get(cid, MISSING_Z)
            out.append((cid, fused, features, min(r for _, r in pairs)))
    return out


def score_norm(
    score: float, mode: str, rrf_k: int = RRF_K, weight_sum: float = 2.0, fusion: str = "zscore"
) -> float:
    """``score_norm`` in [0, 1] from the raw score alone (see the module docstring): a z-score
    sum through the logistic function (over ``weight_sum``), an RRF sum divided by its maximum,
    ``weight_sum / (rrf_k + 1)``."""
    if mode == "bm25":
        return score / (1.0 + score) if score > 0 else 0.0
    if mode == "dense":
        return min(1.0, max(0.0, (1.0 + score) / 2.0))
    if fusion == "rrf":
        return min(1.0, score / (weight_sum / (rrf_k + 1)))
    return 1.0 / (1.0 + math.exp(-score / (weight_sum or 1.0)))


def zscores(ranked: Sequence[tuple[str, float]]) -> dict[str, float]:
    """Each chunk's score in one ranker's list as a z-score within that list (0 for all when
    the scores are all equal)."""
    if not ranked:
        return {}
    scores = [score for _, score in ranked]
    mean = sum(scores) / len(scores)
    sd = math.sqrt(sum((x - mean) ** 2 for x in scores) / len(scores))
    return {cid: (score - mean) / sd if sd > 0 else 0.0 for cid, score in ranked}
