"""``make bench-search-scale``: search at 100k and 1M chunks (issue 31), inside a haystack.

    python bench/search_scale.py [--sizes 100000 1000000] [--keep DIR] [--distinct 4000] [--queries 0]

1. **Real chunks.** The three gold corpora (the part ``make bench-retrieval`` uses: 1.6 MB,
   PowerShell's 1 MB) are chunked with ``chunkyard ingest``; the other corpora of
   ``../shared/corpora`` are chunked too and ``--distinct`` of their chunks (a fixed
   pseudo-random draw) are the haystack's originals.
2. **Real vectors, each text once.** Every gold chunk and every original is embedded with
   the default ONNX embedder through ``bench/embed_cache.py`` (a rerun embeds nothing).
3. **The haystack.** Copies of the originals fill the index up to each size: a copy's
   text has a few words changed (three words swapped for words drawn from the haystack's
   vocabulary, seeded), its vector is the original's plus small Gaussian noise,
   renormalised, so near duplicates cluster as they do in a real corpus and ANN recall
   means something. The gold chunks sit inside with their real vectors. The store is the
   SQLite store, filled through its own ``commit``; the scale indexes (BM25 on Tantivy,
   HNSW through usearch) are then built from the store as ``chunkyard index`` builds them.
4. **Measured per size:** BM25 / dense / hybrid latency p50 / p95 inside one ``Searcher``
   (chunks, not passages: the ranking's cost), each with the scale indexes and with the
   exact path (FTS5 and the brute-force matrix; skipped past ``--exact-max`` chunks, where
   it takes seconds a query); the searcher's RSS; ANN recall@10 against exact dense search;
   each gold set's nDCG@10 in the haystack (scale and exact) and in its corpus alone.

``--only build|scale|exact|edit`` runs one phase per size (``--keep``: the results so far
are kept in ``DIR/result-<size>.json``, the rankings merged question by question, so a phase
may be run for one gold set at a time), so a million is built under ``nice`` and measured in
locked runs of a few minutes; ``--only alone`` ranks each gold set in its corpus alone
(``DIR/gold-alone.json``: the haystack's cost). ``--keep DIR`` leaves the chunks, the embedding cache and the built stores in DIR; a rerun
re-uses each store whose size and seed match. ``--candidates N`` (Tantivy's candidates per row asked) and ``--counted``
(document counts counted, as after a deletion) probe the scale BM25's two costs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

CORPORA = REPO.parent / "shared" / "corpora"
GOLD = HERE / "gold"
RESULTS = HERE / "results"
GOLD_SETS = {"rust-book": "rust-book.jsonl", "fastapi-en": "fastapi-en.jsonl", "powershell-docs": "powershell-docs.jsonl"}
MAX_BYTES = {"powershell-docs": 1_000_000}
DEFAULT_MAX_BYTES = 1_600_000
MODES = ("bm25", "dense", "hybrid")
#: The gold sets whose questions time the searches (400 questions; later sets are left out so
#: that the figures stay comparable from run to run)
LATENCY_SETS = ("d2l-zh", "fastapi-en", "fastapi-zh-ja", "powershell-docs", "rust-book")
NOISE = 0.02  #: per-dimension standard deviation of a copy's noise (unit vectors of 384 dims)
CHANGED_WORDS = 3
NOISE_BATCH = 10_000
STORE_BATCH = 50_000  #: rows per store transaction while the haystack is built


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- 1. real chunks -----------------------------------------------------------------------


def ingest(corpus: Path, out: Path) -> Path:
    from pipeline.api import ingest as run_ingest

    if not (out / ".chunkyard").is_dir():
        log(f"ingest {corpus} -> {out}")
        run_ingest(str(corpus), str(out))
    return out


def chunk_rows(out: Path) -> list[Any]:
    """Every chunk file of ``out`` as a ``ChunkRow`` (sorted by file)."""
    import orjson

    from pipeline.index.rows import ChunkRow

    rows = []
    for root, dirs, files in os.walk(out):
        dirs[:] = sorted(d for d in dirs if d != ".chunkyard")
        for name in sorted(files):
            if name.endswith(".json"):
                path = Path(root) / name
                record = orjson.loads(path.read_bytes())
                rows.append(ChunkRow.from_record(record, path.relative_to(out).as_posix()))
    return rows


def gold_corpora(scratch: Path, names: Sequence[str]) -> dict[str, tuple[Path, Path]]:
    """Per gold set: (the corpus part, its chunk folder)."""
    from retrieval import bench_corpus

    found = {}
    for name in names:
        gold = GOLD_SETS[name]
        part = bench_corpus(CORPORA / name, GOLD / gold, MAX_BYTES.get(name, DEFAULT_MAX_BYTES), scratch)
        found[name] = (part, ingest(part, scratch / f"chunks-{name}"))
    return found


def haystack_originals(scratch: Path, distinct: int) -> list[Any]:
    """``distinct`` chunks of the corpora without a gold set (a fixed draw by chunk-id hash)."""
    others = scratch / "haystack-corpus"
    if not others.is_dir():
        others.mkdir(parents=True)
        for corpus in sorted(CORPORA.iterdir()):
            if corpus.is_dir() and corpus.name not in GOLD_SETS:
                (others / corpus.name).symlink_to(corpus)
    rows = chunk_rows(ingest(others, scratch / "chunks-haystack"))
    rows.sort(key=lambda r: hashlib.sha256(r.chunk_id.encode()).hexdigest())
    return rows[:distinct]


# --- 2. vectors -----------------------------------------------------------------------------


def embedder(scratch: Path) -> Any:
    from embed_cache import CachedEmbed

    from pipeline.index.embedders import make_embedder

    return CachedEmbed(make_embedder("default"), scratch / "embed-cache.sqlite")


# --- 3. the haystack ------------------------------------------------------------------------


def vocabulary(rows: Sequence[Any]) -> list[str]:
    words: set[str] = set()
    for row in rows:
        words.update(w for w in row.embed_text.split() if w.isalpha() and 3 <= len(w) <= 12)
    return sorted(words)


def copies(originals: Sequence[Any], vectors: Any, count: int, seed: int) -> Iterator[tuple[Any, Any]]:
    """``count`` copies of the originals, round robin: words changed, vectors perturbed."""
    import dataclasses

    import numpy as np

    from pipeline.index.rows import digest_text

    rng = random.Random(seed)
    noise = np.random.default_rng(seed)
    vocab = vocabulary(originals)
    perturbed = np.empty((0, vectors.shape[1] if count else 0), dtype=np.float32)
    for n in range(count):
        if n % NOISE_BATCH == 0:  # the noise of a batch of copies at once (one numpy call, not one a row)
            rows = np.arange(n, min(count, n + NOISE_BATCH)) % len(originals)
            perturbed = vectors[rows] + noise.normal(0.0, NOISE, (len(rows), vectors.shape[1])).astype(np.float32)
            perturbed /= np.linalg.norm(perturbed, axis=1, keepdims=True)
        i = n % len(originals)
        row = originals[i]
        words = row.embed_text.split(" ")
        for _ in range(CHANGED_WORDS):
            if words:
                words[rng.randrange(len(words))] = rng.choice(vocab)
        text = " ".join(words)
        copy_no = n // len(originals) + 1
        cid = f"haystack/c{copy_no:04d}/{row.chunk_id}"
        vector = perturbed[n % NOISE_BATCH]
        yield (
            dataclasses.replace(
                row,
                chunk_id=cid,
                id=cid,
                file=f"haystack/c{copy_no:04d}/{row.file}",
                source_file=f"haystack/c{copy_no:04d}/{row.source_file}",
                digest=digest_text(text),
                embed_text=text,
                text=text,
            ),
            vector.astype(np.float32),
        )


def build_store(
    path: Path, gold: Sequence[tuple[Any, Any]], originals: Sequence[Any], vectors: Any, size: int, seed: int,
    config: dict[str, str],
) -> float:
    """The SQLite store at ``path``: the gold rows, then copies up to ``size`` chunks (seconds taken)."""
    from pipeline.index.identity import index_hash
    from pipeline.index.sqlite_store import SqliteStore

    stamp = path.with_name(path.name + ".built")
    wanted = f"{size} {seed} {len(gold)} {len(originals)}"
    if stamp.exists() and stamp.read_text() == wanted and path.exists():
        log(f"re-using {path}")
        return 0.0
    for p in (path, Path(str(path) + "-wal"), Path(str(path) + "-shm")):
        p.unlink(missing_ok=True)
    store = SqliteStore(path, dim=int(config["dim"]))
    model = config["embed_model"]
    meta = {**config, "embed_spec": "default", "analyzer": store.analyzer, "format": "1", "out": str(path.parent)}
    generation = 0
    batch: list[tuple[Any, Any]] = list(gold)
    started = time.perf_counter()
    done = 0
    for pair in copies(originals, vectors, max(0, size - len(gold)), seed):
        batch.append(pair)
        if len(batch) >= STORE_BATCH:
            generation += 1
            store.commit(batch, (), {**meta, "generation": str(generation), "chunks": str(done + len(batch))},
                         model=model)
            done += len(batch)
            batch = []
            log(f"  store: {done} rows ({time.perf_counter() - started:.0f} s)")
    generation += 1
    done += len(batch)
    final = {**meta, "generation": str(generation), "chunks": str(done)}
    final["index_hash"] = index_hash("sqlite-vec", final, [], str(size))
    store.commit(batch, (), final, model=model)
    store.close()
    stamp.write_text(wanted)
    log(f"store {path}: {done} rows in {time.perf_counter() - started:.0f} s")
    return time.perf_counter() - started


# --- 4. measured -------------------------------------------------------------------------


def build_scale(path: Path) -> dict[str, float]:
    """Both scale indexes built from the store, as ``chunkyard index`` builds them."""
    from pipeline.index import ann, bm25_tantivy
    from pipeline.index.scale import SCALE_ENV, ScaleSync, stamp
    from pipeline.index.sqlite_store import SqliteStore

    db = SqliteStore(path)
    meta = db.meta()
    db.close()
    taken: dict[str, float] = {}
    os.environ[SCALE_ENV] = "on"
    sync = ScaleSync(path, int(meta["dim"]))
    graph = ann.HnswIndex(path, int(meta["dim"]))
    lexical_current = bm25_tantivy.TantivyBm25(bm25_tantivy.folder_for(path)).generation() == stamp(meta)
    graph_current = graph.generation() == stamp(meta) and bool(graph.state().get("vectors"))
    if not (lexical_current and graph_current):  # a kept store: only what is missing is built
        started = time.perf_counter()
        if not lexical_current:
            bm25_tantivy.remove(bm25_tantivy.folder_for(path))
        if graph.generation() != stamp(meta):
            graph.remove()
        sync.settle(meta)
        taken["scale_build_s"] = round(time.perf_counter() - started, 1)
        taken |= {f"{name}_s": round(s, 1) for name, s in sync.seconds.items()}
        log(f"scale indexes built in {taken['scale_build_s']} s")
    folder = bm25_tantivy.folder_for(path)
    taken["tantivy_mb"] = round(sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 1e6, 1)
    state = ann.HnswIndex(path, int(meta["dim"])).state()
    taken["hnsw_mb"] = round((path.parent / state["file"]).stat().st_size / 1e6, 1)
    taken["store_mb"] = round(path.stat().st_size / 1e6, 1)
    return taken


def probe(spec_path: Path) -> None:
    """In a process of its own (its RSS is the searcher's): every question in every mode."""
    spec = json.loads(spec_path.read_text())
    from embed_cache import CachedEmbed

    from pipeline.index import Searcher
    from pipeline.index.embedders import make_embedder

    embed = CachedEmbed(make_embedder("default"), Path(spec["cache"]), quiet=True)
    questions: list[str] = spec["questions"]
    embed(questions)  # the query vectors come from the cache: the timing is the search's
    if spec.get("ef"):  # --ef: the graph's search breadth for this probe (ann.EXPANSION_SEARCH)
        from pipeline.index import ann

        ann.EXPANSION_SEARCH = int(spec["ef"])
    if spec.get("candidates") or spec.get("counted"):
        from pipeline.index import bm25_tantivy

        if spec.get("candidates"):  # --candidates: Tantivy's candidates per row asked
            bm25_tantivy.CANDIDATES = int(spec["candidates"])
        if spec.get("counted"):  # --counted: document counts as after a deletion (counted, not looked up)
            opened = bm25_tantivy.TantivyBm25._open

            def counted(self: Any) -> Any:
                searcher = opened(self)
                self._deleted = max(self._deleted, 1)
                return searcher

            bm25_tantivy.TantivyBm25._open = counted  # type: ignore[method-assign]
    ask = Searcher(Path(spec["out"]), f"sqlite:{spec['store']}", embed, expand_tokens=0)
    if not spec["scale"] and ask._scale is not None:
        ask._scale.close()
        ask._scale = None
    if spec.get("share"):
        share_rankings(ask)
    result: dict[str, Any] = {"scale": spec["scale"], "modes": {}, "runs": {}}
    for mode in spec["modes"]:
        for q in questions[:5]:
            ask.record(q, 10, mode)
        times, runs = [], {}
        for n, q in enumerate(questions):
            if spec.get("progress"):  # a long probe (the exact path at 1M) says how far it is
                with open(spec["progress"], "a") as progress:
                    progress.write(f"{time.strftime('%H:%M:%S')} {mode} {n}/{len(questions)}\n")
            started = time.perf_counter()
            record = ask.record(q, 10, mode)
            times.append((time.perf_counter() - started) * 1000)
            runs[q] = [{"chunk_id": it["chunk_id"], "file": it["file"], "offsets": it["offsets"],
                        "tokens": it["tokens"]} for it in record["items"]]
        times.sort()
        result["modes"][mode] = {"p50_ms": round(statistics.median(times), 1),
                                 "p95_ms": round(times[int(0.95 * (len(times) - 1))], 1),
                                 "max_ms": round(times[-1], 1), "queries": len(times)}
        result["runs"][mode] = runs
    result["rss_mb"] = round(_rss_mb(), 1)
    result["rss_anon_mb"] = round(_rss_mb("RssAnon"), 1)
    result["rss_file_mb"] = round(_rss_mb("RssFile"), 1)
    result["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    result["rss_by_mapping_mb"] = _rss_by_mapping(Path(spec["store"]))
    ask.close()
    print(json.dumps(result))


def share_rankings(ask: Any) -> None:
    """One BM25 and one dense ranking per question, shared by the modes (asked hybrid first, at
    the fusion's depth; BM25 and dense take its head): the exact path at 1M costs seconds a
    ranking, and nDCG needs the rankings, not their time. The timings of such a probe mean
    nothing."""
    lexical_of: dict[str, tuple[int, list[Any], bool]] = {}
    dense_of: dict[bytes, tuple[int, list[Any]]] = {}
    lexical, dense = ask._lexical, ask.db.dense

    def shared_lexical(db: Any, query: str, depth: int) -> tuple[list[Any], bool]:
        if query not in lexical_of or lexical_of[query][0] < depth:
            lexical_of[query] = (depth, *lexical(db, query, depth))
        _, hits, by_substring = lexical_of[query]
        return hits[:depth], by_substring

    def shared_dense(vector: Any, k: int) -> list[Any]:
        key = bytes(memoryview(vector))
        if key not in dense_of or dense_of[key][0] < k:
            dense_of[key] = (k, dense(vector, k))
        return dense_of[key][1][:k]

    ask._lexical = shared_lexical
    ask.db.dense = shared_dense


def _rss_mb(field: str = "VmRSS") -> float:
    """The process's resident memory (``RssAnon``: its own; ``RssFile``: mapped file pages, which
    the kernel may drop and read again)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def _rss_by_mapping(store: Path) -> dict[str, float]:
    """The resident memory split by what is mapped (``/proc/self/smaps``): the HNSW graph, its
    vectors file, Tantivy's segments, the store, other files (libraries, the model), anonymous."""
    sizes: dict[str, float] = {}
    where = "anonymous"
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            path = head[5] if len(head) > 5 else ""
            if not path.startswith("/"):
                where = "anonymous"
            elif ".hnsw-" in path:
                where = "hnsw vectors file" if path.endswith(".f32") else "hnsw graph"
            elif ".tantivy" in path or "tantivy" in Path(path).parent.name:
                where = "tantivy"
            elif path.startswith(str(store)):
                where = "store"
            else:
                where = "other files"
        elif line.startswith("Rss:"):
            sizes[where] = sizes.get(where, 0.0) + int(head[1]) / 1024
    return {k: round(v, 1) for k, v in sorted(sizes.items())}


def run_probe(scratch: Path, out: Path, store: Path, questions: list[str], modes: Sequence[str],
              scale: bool, ef: int = 0, share: bool = False, bm25: dict[str, int] | None = None) -> dict[str, Any]:
    import subprocess

    spec = scratch / f"probe-{os.getpid()}.json"  # a probe of its own: phases may run side by side
    spec.write_text(json.dumps({"cache": str(scratch / "embed-cache.sqlite"), "out": str(out), "store": str(store),
                                "questions": questions, "modes": list(modes), "scale": scale, "ef": ef,
                                "share": share, "progress": str(scratch / "probe-progress.log"),
                                **(bm25 or {})}))
    done = subprocess.run([sys.executable, __file__, "--probe", str(spec)], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise SystemExit(f"probe failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def ndcg(runs: dict[str, list[dict[str, Any]]], gold: list[Any]) -> float:
    from pipeline.evaluate.metrics import evaluate_run

    report = evaluate_run(gold, {q.id: runs.get(q.question, []) for q in gold})
    return round(100 * report.metrics["nDCG@10"], 2)


def recall_at_10(approx: dict[str, list[dict[str, Any]]], exact: dict[str, list[dict[str, Any]]]) -> float:
    found = total = 0
    for q, items in exact.items():
        want = {it["chunk_id"] for it in items[:10]}
        got = {it["chunk_id"] for it in approx.get(q, [])[:10]}
        found += len(want & got)
        total += len(want)
    return round(found / max(1, total), 4)


def measure_size(
    scratch: Path, corpora: dict[str, tuple[Path, Path]], gold: list[tuple[Any, Any]], originals: list[Any],
    vectors: Any, size: int, args: argparse.Namespace,
) -> dict[str, Any]:
    """One size, every phase, or only ``args.only``'s (``--keep``: each phase's result is kept in
    ``result-<size>.json`` and the probes' rankings beside it, so a 1M run can be split into
    locked measurements of a few minutes and unlocked builds)."""
    from pipeline.evaluate.gold import load_gold
    from pipeline.index.embedders import make_embedder
    from pipeline.index.identity import embedder_config

    phases = [args.only] if args.only else ["build", "scale", "exact", "edit"]
    config = embedder_config(make_embedder("default"))
    store = scratch / f"store-{size}" / "index.sqlite"
    store.parent.mkdir(parents=True, exist_ok=True)
    out = next(iter(corpora.values()))[1]
    kept = scratch / f"result-{size}.json"
    row: dict[str, Any] = json.loads(kept.read_text()) if kept.exists() and args.only else {"size": size}
    row[f"load_before_{'+'.join(phases)}"] = os.getloadavg()
    if "build" in phases:
        row["store_build_s"] = round(build_store(store, gold, originals, vectors, size, args.seed, config), 1)
        row |= build_scale(store)
    sets = {name: load_gold(GOLD / GOLD_SETS[name], part) for name, (part, _) in corpora.items()}
    every = [json.loads(line)["question"] for g in sorted(GOLD / f"{name}.jsonl" for name in LATENCY_SETS)
             for line in g.read_text().splitlines() if line.strip() and not line.startswith("#")]
    questions = every[: args.queries] if args.queries else every
    asked = list(dict.fromkeys(questions + [q.question for qs in sets.values() for q in qs]))
    runs_of = {side: scratch / f"runs-{size}-{side}.json" for side in ("scale", "exact")}
    if "scale" in phases:
        log(f"{size}: probing with the scale indexes, {' '.join(args.modes)} ({len(asked)} questions)")
        scaled = run_probe(scratch, out, store, asked, args.modes, True, args.ef,
                           bm25={"candidates": args.candidates, "counted": int(args.counted)})
        if args.ef:
            row["scale"] = row.get("scale", {}) | {"ef": args.ef}
        row["scale"] = row.get("scale", {}) | {"bm25_candidates": args.candidates or "default",
                                               "bm25_counted": args.counted}
        memory = {k: v for k, v in scaled.items() if k.endswith("_mb")}
        row.setdefault("scale", {}).update(scaled["modes"])
        row["scale"]["memory"] = {**row["scale"].get("memory", {}), "+".join(args.modes): memory}
        found = json.loads(runs_of["scale"].read_text()) if runs_of["scale"].exists() and args.only else {}
        runs_of["scale"].write_text(json.dumps(merge_runs(found, scaled["runs"])))
    if "exact" in phases:
        exact_questions = asked if size <= args.exact_max else [q.question for qs in sets.values() for q in qs]
        part, parts = (int(v) for v in args.part.split("/"))
        exact_questions = exact_questions[(part - 1) * len(exact_questions) // parts :
                                          part * len(exact_questions) // parts]  # fmt: skip
        found = json.loads(runs_of["exact"].read_text()) if runs_of["exact"].exists() and args.only else {}
        if size > args.exact_max:  # rankings only: one BM25 and one dense ranking per question
            modes = sorted(args.modes, key=lambda m: m != "hybrid")
            log(f"{size}: ranking on the exact path, {' '.join(modes)} ({len(exact_questions)} questions)")
            exact = run_probe(scratch, out, store, exact_questions, modes, False, share=True)
            found = merge_runs(found, exact["runs"])
            runs_of["exact"].write_text(json.dumps(found))
        for mode in args.modes if size <= args.exact_max else ():
            log(f"{size}: probing the exact path, {mode} ({len(exact_questions)} questions)")
            exact = run_probe(scratch, out, store, exact_questions, [mode], False)
            row.setdefault("exact", {})[mode] = exact["modes"][mode]
            row["exact"][f"rss_mb_{mode}"] = exact["rss_mb"]
            found = merge_runs(found, exact["runs"])
            runs_of["exact"].write_text(json.dumps(found))
    if all(p.exists() for p in runs_of.values()):
        scaled_runs, exact_runs = (json.loads(p.read_text()) for p in (runs_of["scale"], runs_of["exact"]))
        if "dense" in exact_runs and "dense" in scaled_runs:
            row["ann_recall@10"] = recall_at_10(scaled_runs["dense"], exact_runs["dense"])
        for name, qs in sets.items():  # per set and mode, once both sides asked every question
            asked_both = [mode for mode in MODES if all(
                q.question in runs.get(mode, {}) for runs in (scaled_runs, exact_runs) for q in qs)]
            row.setdefault("ndcg@10", {})[name] = {
                **row.get("ndcg@10", {}).get(name, {}),
                **{mode: {"scale": ndcg(scaled_runs[mode], qs), "exact": ndcg(exact_runs[mode], qs)}
                   for mode in asked_both},
            }
    if "edit" in phases:
        row["edit"] = edit_cost(store, gold)
    row[f"load_after_{'+'.join(phases)}"] = os.getloadavg()
    if kept.exists() and args.only:  # another phase may have finished meanwhile: keep its results
        latest = json.loads(kept.read_text())
        row = {**latest, **row, "ndcg@10": {**latest.get("ndcg@10", {}), **row.get("ndcg@10", {})}}
    kept.write_text(json.dumps(row, indent=2))
    log(json.dumps(row))
    return row


def merge_runs(kept: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The rankings of ``new`` over those of ``kept``, mode by mode and question by question
    (a phase run for one gold set keeps the other sets' rankings)."""
    return {mode: {**kept.get(mode, {}), **new.get(mode, {})} for mode in {*kept, *new}}


def edit_cost(store: Path, gold: list[tuple[Any, Any]]) -> dict[str, float]:
    """One document's chunks changed (a word appended, the vector nudged) and committed the way
    ``chunkyard index`` commits (store, then both scale indexes, no rebuild), then put back:
    seconds for each (embedding and planning excluded: they do not depend on the index size)."""
    import dataclasses

    import numpy as np

    from pipeline.index.identity import index_hash
    from pipeline.index.rows import digest_text
    from pipeline.index.scale import SCALE_ENV, ScaleSync
    from pipeline.index.sqlite_store import SqliteStore

    os.environ[SCALE_ENV] = "on"
    doc = gold[0][0].source_file
    rows = [(r, v) for r, v in gold if r.source_file == doc]
    edited = []
    for r, v in rows:
        text = r.embed_text + " zanzibarian"
        nudged = np.asarray(v, dtype=np.float32) + np.float32(0.01)
        edited.append((dataclasses.replace(r, embed_text=text, digest=digest_text(text)),
                       nudged / np.linalg.norm(nudged)))
    taken: dict[str, float] = {"chunks": float(len(rows))}
    for name, upserts in (("edit", edited), ("undo", rows)):
        db = SqliteStore(store)
        stored = db.meta()
        meta = {**stored, "generation": str(int(stored["generation"]) + 1)}
        meta["index_hash"] = index_hash("sqlite-vec", meta, [], meta["generation"])
        sync = ScaleSync(store, int(meta["dim"]))
        started = time.perf_counter()
        replaced = sync.before(upserts, ())
        db.commit(upserts, (), meta, model=meta["embed_model"])
        committed = time.perf_counter()
        sync.after(replaced, upserts, meta, stored)
        done = time.perf_counter()
        db.close()
        assert not sync.rebuilt, sync.rebuilt
        taken[f"{name}_store_s"] = round(committed - started, 3)
        taken[f"{name}_scale_s"] = round(done - committed, 3)
        taken |= {f"{name}_{index}_s": round(s, 3) for index, s in sync.seconds.items()}
        if name == "edit":  # a new searcher finds the edited chunks through both scale indexes
            taken["edit_searchable_s"] = round(_found(store, edited) - started, 3)
    return taken


def _found(store: Path, edited: list[tuple[Any, Any]]) -> float:
    """When a new ``ScaleSearch`` (current, not stale) finds the edit: BM25 on the appended
    word returns the edited chunks, dense search on an edited vector returns its chunk first."""
    from pipeline.index.scale import ScaleSearch

    search = ScaleSearch(store, len(edited[0][1]))
    try:
        lexical = search.lexical(["zanzibarian"], len(edited)) or []
        dense = search.dense(edited[0][1], 1) or []
        assert not search.stale, search.stale
        assert {c for c, _ in lexical} == {r.chunk_id for r, _ in edited}, lexical
        assert dense and dense[0][0] == edited[0][0].chunk_id, dense
        return time.perf_counter()
    finally:
        search.close()


def gold_alone(scratch: Path, corpora: dict[str, tuple[Path, Path]], gold: list[tuple[Any, Any]]) -> dict[str, Any]:
    """Each gold set's nDCG@10 in its corpus part alone (exact search): the haystack's cost."""
    from pipeline.evaluate.gold import load_gold
    from pipeline.index.embedders import make_embedder
    from pipeline.index.identity import embedder_config

    config = embedder_config(make_embedder("default"))
    found: dict[str, Any] = {}
    for name, (part, out) in corpora.items():
        rows = [(r, v) for r, v in gold if r.file and (out / r.file).exists()]
        store = scratch / f"alone-{name}" / "index.sqlite"
        store.parent.mkdir(parents=True, exist_ok=True)
        build_store(store, rows, [], None, len(rows), 0, config)
        qs = load_gold(GOLD / GOLD_SETS[name], part)
        exact = run_probe(scratch, out, store, [q.question for q in qs], MODES, False)
        found[name] = {mode: ndcg(exact["runs"][mode], qs) for mode in MODES}
    return found


def bm25_gold_sets(scratch: Path) -> dict[str, Any]:
    """Each gold set's BM25 nDCG@10 in its corpus alone, FTS5's ``bm25()`` against Tantivy's
    (no vectors needed: the rows carry a constant vector nothing reads)."""
    import numpy as np

    from pipeline.evaluate.gold import load_gold
    from pipeline.index import bm25_tantivy
    from pipeline.index.embedders import make_embedder
    from pipeline.index.identity import embedder_config
    from pipeline.index.scale_reader import StoreReader

    config = embedder_config(make_embedder("default"))
    unit = np.zeros(int(config["dim"]), dtype=np.float32)
    unit[0] = 1.0
    found: dict[str, Any] = {}
    for name, (part, out) in gold_corpora(scratch, sorted(GOLD_SETS)).items():
        rows = [(r, unit) for r in chunk_rows(out)]
        store = scratch / f"bm25-{name}" / "index.sqlite"
        store.parent.mkdir(parents=True, exist_ok=True)
        build_store(store, rows, [], None, len(rows), 0, config)
        reader = StoreReader(store)
        lexical = bm25_tantivy.TantivyBm25(bm25_tantivy.folder_for(store))
        lexical.rebuild(reader.texts(), reader.generation(), chunks=len(rows))
        lexical.close()
        reader.close()
        qs = load_gold(GOLD / GOLD_SETS[name], part)
        questions = [q.question for q in qs]
        fts5 = run_probe(scratch, out, store, questions, ["bm25"], False)
        tantivy = run_probe(scratch, out, store, questions, ["bm25"], True)
        found[name] = {"chunks": len(rows), "fts5": ndcg(fts5["runs"]["bm25"], qs),
                       "tantivy": ndcg(tantivy["runs"]["bm25"], qs)}
        log(f"{name}: {found[name]}")
    return found


# --- main -----------------------------------------------------------------------------------


def prepare(
    scratch: Path, distinct: int, names: Sequence[str]
) -> tuple[dict[str, tuple[Path, Path]], list[tuple[Any, Any]], list[Any], Any]:
    """The gold corpora, their rows with real vectors, the haystack's originals and their vectors."""
    import numpy as np

    corpora = gold_corpora(scratch, names)
    gold_rows = [row for _, out in corpora.values() for row in chunk_rows(out)]
    originals = haystack_originals(scratch, distinct)
    embed = embedder(scratch)
    log(f"embedding {len(gold_rows)} gold chunks and {len(originals)} originals (cached ones are free)")
    started = time.perf_counter()
    texts = [r.embed_text for r in gold_rows] + [r.embed_text for r in originals]
    vectors = np.asarray(embed(texts), dtype=np.float32)
    log(f"embedded in {time.perf_counter() - started:.0f} s ({embed.misses} new)")
    gold = list(zip(gold_rows, vectors[: len(gold_rows)], strict=True))
    return corpora, gold, originals, vectors[len(gold_rows) :]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", type=int, default=[100_000])
    parser.add_argument("--keep", type=Path, help="build (or re-use) chunks, vectors and stores here")
    parser.add_argument("--distinct", type=int, default=1000, help="haystack originals (each embedded once)")
    parser.add_argument("--gold", nargs="+", default=["rust-book"], choices=sorted(GOLD_SETS),
                        help="gold sets inside the haystack (every chunk of each is embedded)")
    parser.add_argument("--queries", type=int, default=0, help="questions per gold set (0: all)")
    parser.add_argument("--exact-max", type=int, default=200_000, help="largest size the exact path is timed at")
    parser.add_argument("--seed", type=int, default=31)
    parser.add_argument("--prepare-only", action="store_true", help="chunk and embed, then stop")
    parser.add_argument("--only", choices=["build", "scale", "exact", "edit", "alone"],
                        help="one phase per size (the others' results kept in DIR/result-<size>.json); "
                             "alone: each gold set in its corpus alone (DIR/gold-alone.json)")
    parser.add_argument("--part", default="1/1", help="K/N: the exact phase asks the K-th of N slices of "
                        "its questions (the rankings are merged, nDCG is given once a set is whole)")
    parser.add_argument("--ef", type=int, default=0, help="the HNSW search's breadth (0: ann.EXPANSION_SEARCH)")
    parser.add_argument("--candidates", type=int, default=0,
                        help="Tantivy's candidates per row asked (0: bm25_tantivy.CANDIDATES)")
    parser.add_argument("--counted", action="store_true",
                        help="BM25's document counts counted, as after a deletion (not Tantivy's doc_freq)")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES,
                        help="the modes probed (--only scale / exact)")
    parser.add_argument("--probe", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--bm25-gold", action="store_true",
                        help="only: each gold set's BM25 nDCG@10 alone, FTS5 against Tantivy (no embedding)")
    args = parser.parse_args()
    if args.probe:
        probe(args.probe)
        return
    scratch = args.keep or Path(tempfile.mkdtemp(prefix="bench-search-scale-"))
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        if args.bm25_gold:
            print(json.dumps({"load": os.getloadavg(), "bm25_ndcg@10": bm25_gold_sets(scratch)}, indent=2))
            return
        corpora, gold, originals, vectors = prepare(scratch, args.distinct, args.gold)
        if args.prepare_only:
            return
        alone = gold_alone(scratch, corpora, gold) if args.only in (None, "alone") else {}
        if alone:
            log(f"gold sets alone: {alone}")
            kept = scratch / "gold-alone.json"
            earlier = json.loads(kept.read_text()) if kept.exists() else {}
            kept.write_text(json.dumps({**earlier, **alone, "load_after": os.getloadavg()}, indent=2))
        results = [] if args.only == "alone" else [
            measure_size(scratch, corpora, gold, originals, vectors, size, args) for size in args.sizes]
        print(json.dumps({"load": os.getloadavg(), "gold_alone_ndcg@10": alone, "sizes": results}, indent=2))
    finally:
        if args.keep is None:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
